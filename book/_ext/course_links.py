"""Where the book's Colab and Binder links lead: the repository named by `VIT_COURSE_REPO` at build time.

`python -m tools.notebooks` writes each chapter's Colab badge from `REPO_URL` and `BRANCH` in
tools/notebooks.py. The setup cell installs the course on Colab from `VIT_COURSE_REPO` when that is set;
the book reads the same variable when it is built, so a fork that publishes the course sets one value:

    VIT_COURSE_REPO=git+https://github.com/you/vit-from-scratch@main make book

and every chapter's Colab badge and the introduction's Colab and Binder links open the fork's student
notebooks (`@ref` picks the branch; without it the notebooks' own branch stays). Unset or empty, the links are
the ones the notebooks hold. A value that names no GitHub repository (a local path, a package index, another
host) is a warning, so an error under the book's -W: Colab and Binder open notebooks from GitHub only.
"""

import os
import re

from sphinx.util import logging

logger = logging.getLogger(__name__)

SETTING = "VIT_COURSE_REPO"
COLAB_LINK = re.compile(
    r"https://colab\.research\.google\.com/github/(?P<repo>[\w.-]+/[\w.-]+)/blob/(?P<branch>[^/\s\"']+)/"
    r"(?P<path>[^?#\s\"')]+\.ipynb)"
)
# What pip accepts for a GitHub repository (git+https://, git+ssh://git@, optional .git and @ref), and the plain URL.
GITHUB_SOURCE = re.compile(
    r"^(?:git\+)?(?:https?://(?:[^@/\s]+@)?|ssh://git@)github\.com/(?P<repo>[\w.-]+/[\w.-]+?)(?:\.git)?/?"
    r"(?:@(?P<ref>[^\s#@]+))?(?:#\S*)?$"
)


def github_target(source):
    """A pip source such as "git+https://github.com/you/fork@main" -> ("you/fork", "main"); ref None if absent.

    Raises ValueError when the source is not a GitHub repository.
    """
    match = GITHUB_SOURCE.match(source.strip())
    if not match:
        raise ValueError(f"{SETTING}={source!r} names no GitHub repository (expected e.g. "
                         f"git+https://github.com/OWNER/REPO@BRANCH): the book's Colab and Binder links need one")
    return match["repo"], match["ref"]


def colab_url(repo, branch, path):
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/{path}"


def binder_url(repo, branch, path):
    return f"https://mybinder.org/v2/gh/{repo}/{branch}?urlpath=lab/tree/{path}"


def point_links(text, source):
    """Text with every Colab link moved to the repository (and ref, if any) of the pip source; "" changes nothing."""
    if not source.strip():
        return text
    repo, ref = github_target(source)
    return COLAB_LINK.sub(lambda m: colab_url(repo, ref or m["branch"], m["path"]), text)


def check_setting(app):
    try:
        point_links("", app.config.course_repo)
    except ValueError as err:
        logger.warning("%s", err)


def on_source_read(app, docname, source):
    """Point the Colab links of a page (a notebook's JSON or markdown) at course_repo, before it is parsed."""
    try:
        source[0] = point_links(source[0], app.config.course_repo)
    except ValueError:
        pass  # check_setting has warned once


def setup(app):
    # An "env" value: a new one re-reads every page, so an incremental build never keeps the old links.
    app.add_config_value("course_repo", os.environ.get(SETTING, ""), "env", types=[str])
    app.connect("builder-inited", check_setting)
    app.connect("source-read", on_source_read, priority=400)  # before course_chapters reads the links
    return {"parallel_read_safe": True, "parallel_write_safe": True}
