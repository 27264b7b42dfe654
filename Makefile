# Quick start: `make book` builds the book, `make test` runs every test, `make lab` opens the student notebooks
# in JupyterLab. Each sets up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch from this machine's disk; elsewhere set e.g. TORCH=torch to get PyPI's default build.
TORCH ?= torch==2.13.0

.PHONY: setup test lint book browser execute notebooks lab clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	# dev: tests, linter, book; lab: JupyterLab and nbconvert, to work through notebooks/ (`make lab`)
	$(PY) -m pip install --quiet -e ".[dev,lab]"
	# timm is a test-only reference (tests/test_timm.py, benchmarks/): --no-deps keeps torchvision out
	$(PY) -m pip install --quiet --no-deps "timm==1.0.31"
	touch $@

# Unit tests, the checks' own tests, student-notebook sync, the book, and every solution notebook re-run by nbval.
test: setup
	$(PY) -m ruff check .
	$(PY) -m tools.notebooks --check
	$(PY) -m tools.diagrams --check
	$(PY) -m pytest tests solutions -m "not browser" --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg \
		--durations=15

# The built book in headless Chromium (Debian's chromium; .ci/browser.sh installs it). Screenshots: book/_build/screenshots/
browser: book
	$(PY) -m pytest -m browser tests/test_browser.py

# Re-execute the solution notebooks in place (their stored outputs are what nbval and the book show),
# then regenerate the student notebooks. Never edit outputs by hand.
execute: setup
	$(PY) -m tools.notebooks --execute

notebooks: setup
	$(PY) -m tools.notebooks

# The student notebooks in JupyterLab (the same as `.venv/bin/jupyter lab notebooks/`).
lab: setup
	$(VENV)/bin/jupyter lab notebooks/

lint: setup
	$(PY) -m ruff check .

# Offline, without executing notebooks, warnings as errors; prints where the book is (book/_build/html).
# A fork's Colab and Binder links: VIT_COURSE_REPO=git+https://github.com/OWNER/REPO@BRANCH make book
book: setup
	$(PY) book/build.py

clean:
	rm -rf book/_build .pytest_cache
