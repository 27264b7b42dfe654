# Quick start: `make book` builds the book, `make test` runs the tests of what the course does, `make lab` opens the
# student notebooks in JupyterLab. Each sets up .venv first. CI (.ci/run) also runs `make check-text` (the checks of
# the repository's text), `make test-colab` (the Colab install) and the browser tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch from this machine's disk; elsewhere set e.g. TORCH=torch to get PyPI's default build.
TORCH ?= torch==2.13.0

.PHONY: setup test check-text test-colab lint book browser execute notebooks lab clean

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

# Unit tests, the checks' own tests, student-notebook sync, the book, and every solution notebook re-run by nbval:
# what the course does. The checks of its text (check-text), the Colab install (test-colab) and the browser are apart.
test: setup
	$(PY) -m ruff check .
	$(PY) -m tools.notebooks --check
	$(PY) -m tools.diagrams --check
	$(PY) -m pytest tests solutions -m "not browser and not repo_text and not colab" --nbval \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --durations=15

# The checks of the repository's text (tests marked repo_text): the README's tables and quick start, the chapters'
# numbering and links, the package's source shape, CONTRIBUTING's maps, install files that agree. A few seconds.
check-text: setup
	$(PY) -m pytest tests -m repo_text

# Chapter 01 run as Colab would, in a throwaway venv that installs $(TORCH) and the course (1-4 minutes; it clones
# this repository's HEAD, so it needs a git checkout).
test-colab: setup
	TORCH="$(TORCH)" $(PY) -m pytest -m colab tests/test_colab.py

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
