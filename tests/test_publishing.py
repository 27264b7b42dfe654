"""Publishing: the workflow that builds the book and deploys it to GitHub Pages, and runs the tests; BOOK_URL and
the Colab badges follow REPO_URL in tools/notebooks.py, the one place a fork changes."""

from pathlib import Path

import pytest
import yaml

from tools import notebooks

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"


def workflow():
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def runs(job):
    return [step.get("run", "") for step in job["steps"]]


def uses(job):
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


def test_the_workflow_runs_on_every_push_to_main():
    assert workflow()["on"]["push"]["branches"] == ["main"]


def test_it_builds_the_book_with_make_book_on_python_311_and_uploads_the_html():
    job = workflow()["jobs"]["book"]
    assert "make book" in runs(job)
    python = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python"))
    assert str(python["with"]["python-version"]) == "3.11"
    upload = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "book/_build/html"
    assert not any("VIT_COURSE_DATA" in run or "data.load" in run for run in runs(job))  # the book needs no data


def test_it_deploys_to_pages_with_the_permissions_pages_asks_for_one_at_a_time():
    data = workflow()
    job = data["jobs"]["deploy"]
    assert job["needs"] == "book" and uses(job) == ["actions/deploy-pages"]
    assert job["permissions"] == {"pages": "write", "id-token": "write"}
    assert job["environment"]["name"] == "github-pages"
    assert job["concurrency"] == {"group": "pages", "cancel-in-progress": False}
    assert data["permissions"] == {"contents": "read"}  # everything else reads only


def test_it_runs_make_test_with_datasets_from_the_courses_own_downloader():
    job = workflow()["jobs"]["test"]
    assert "make test" in runs(job) and "actions/cache" in uses(job)
    text = WORKFLOW.read_text()
    assert "../shared" not in text  # the lab's offline copy does not exist on GitHub
    assert any("data.load(" in run for run in runs(job)) and job["env"]["VIT_COURSE_CI"] == "1"
    assert job["env"]["VIT_COURSE_DATA"].endswith("/.data")
    assert ".data/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("repo, pages", [
    ("https://github.com/vit-course/vit-from-scratch", "https://vit-course.github.io/vit-from-scratch"),
    ("https://github.com/A-Fork/course.git", "https://a-fork.github.io/course"),
    ("https://github.com/someone/someone.github.io", "https://someone.github.io"),
])
def test_pages_address_of_a_repository(repo, pages):
    assert notebooks.pages_url(repo) == pages


def test_book_url_comes_from_repo_url_unless_overridden():
    assert notebooks.BOOK_URL == (notebooks.BOOK_URL_OVERRIDE or notebooks.pages_url(notebooks.REPO_URL))
    assert notebooks.colab_badge("01_x").count(notebooks.REPO_URL.removeprefix("https://github.com/")) == 1


def test_the_readme_tells_a_fork_what_to_change():
    text = (ROOT / "README.md").read_text()
    assert "`REPO_URL`" in text and "python -m tools.notebooks" in text and "*GitHub Actions*" in text
