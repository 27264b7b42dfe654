"""In CI (`VIT_COURSE_CI=1`, set by .ci/run) a test skipped because the datasets, timm or the browser are missing,
or something the repository holds (a chapter, a shipped checkpoint, git history) is, is a failure: CI installs
the first and clones the second, so such a skip means something went wrong, not that the test may be left out."""

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The tests run on one torch thread: they check behaviour on tiny tensors, where a second thread only waits for
    work (tests/test_checks_catalogue.py took 109 s with torch's two threads on a loaded 2-core machine, 10 s with
    one). The notebooks nbval runs are other processes, with their own threads."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _default_device():
    """VIT_COURSE_TEST_DEVICE=cuda runs the tests with that device as torch's default, in full float32 (no TF32):
    benchmarks/gpu_check.py runs tests/test_timm.py on the GPU so."""
    name = os.environ.get("VIT_COURSE_TEST_DEVICE")
    if not name:
        yield
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_default_device(name)
    yield
    torch.set_default_device(None)

MISSING = ("VIT_COURSE_DATA is not set", "no MNIST under", "timm not installed", "is not installed here",
           "no chromium at", "playwright is not installed", "the book is not built and cannot be yet",
           "is not written yet", "is not committed yet", "solutions/ is still empty", "no shipped",
           "needs git and commit")


def _fail_in_ci(report):
    if os.environ.get("VIT_COURSE_CI") and report.skipped and any(m in str(report.longrepr) for m in MISSING):
        report.outcome = "failed"
        report.longrepr = f"skipped, but CI has everything these tests need (VIT_COURSE_CI=1): {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    _fail_in_ci((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    _fail_in_ci((yield).get_result())
