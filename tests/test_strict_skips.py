"""tests/conftest.py: under VIT_COURSE_CI=1 a skip for a missing dataset, timm or browser fails; other skips stay."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module", reason="playwright is not installed (pip)")\n'
TEST_SKIPS = """import pytest

@pytest.mark.skipif(True, reason="VIT_COURSE_DATA is not set")
def test_needs_data():
    pass

@pytest.mark.skipif(True, reason="the page has no math")
def test_a_fair_skip():
    pass
"""


def run(folder, ci):
    env = {k: v for k, v in os.environ.items() if k != "VIT_COURSE_CI"} | ({"VIT_COURSE_CI": "1"} if ci else {})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(folder)],
                          capture_output=True, text=True, env=env, cwd=folder).stdout


@pytest.mark.parametrize("source, outside_ci, in_ci", [
    (TEST_SKIPS, "2 skipped", "1 skipped, 1 error"),
    (MODULE_SKIP, "1 skipped", "1 error"),
])
def test_ci_fails_the_skips_it_has_what_for(tmp_path, source, outside_ci, in_ci):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(source)
    assert outside_ci in run(tmp_path, ci=False)
    out = run(tmp_path, ci=True)
    assert in_ci in out and "CI has everything these tests need" in out
