"""Markers shared by the tests. Outside CI a test that needs the real datasets skips without them; in CI
(`VIT_COURSE_CI=1`) tests/conftest.py turns that skip into a failure, matching the reason's opening words."""

import contextlib
import os

import pytest

NO_DATA = "VIT_COURSE_DATA is not set"
needs_data = pytest.mark.skipif(not os.environ.get("VIT_COURSE_DATA"),
                                reason=f"{NO_DATA}: no real MNIST/CIFAR-10 to load (CI sets it)")


def skip_without_data(error):
    """Skip the running test if ``error`` (an exception, or a notebook's CellExecutionError) is a DatasetNotFound
    and VIT_COURSE_DATA is not set: the datasets are not in the cache folder and could not be downloaded (offline).
    With VIT_COURSE_DATA set, a missing dataset is the test's failure; nothing happens here."""
    if getattr(error, "ename", type(error).__name__) == "DatasetNotFound" and not os.environ.get("VIT_COURSE_DATA"):
        why = str(getattr(error, "evalue", error)).split(". To provide", 1)[0]
        pytest.skip(f"{NO_DATA} and the dataset could not be downloaded ({why})")


@contextlib.contextmanager
def data_or_skip():
    """Around code that loads a dataset (possibly in a notebook kernel): skip_without_data on what it raises."""
    try:
        yield
    except Exception as error:
        skip_without_data(error)
        raise
