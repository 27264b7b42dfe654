"""Markers shared by the tests. Outside CI a test that needs the real datasets skips without them; in CI
(`VIT_COURSE_CI=1`) tests/conftest.py turns that skip into a failure, matching the reason's opening words."""

import os

import pytest

needs_data = pytest.mark.skipif(not os.environ.get("VIT_COURSE_DATA"),
                                reason="VIT_COURSE_DATA is not set: no real MNIST/CIFAR-10 to load (CI sets it)")
