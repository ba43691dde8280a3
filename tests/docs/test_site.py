"""The documentation site builds strictly, and the README stays a first screen that links into it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

README_MAX_LINES = 150
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(project / "mkdocs.yml")]
        + ["--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # no end-of-life banner in the output
    )


def test_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    built = _mkdocs_build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()

    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "concepts" / "methods.md").open("a") as page:
        page.write("\nSee [the rules](../reference/no-such-page.md) and [a section](stages.md#no-such-anchor).\n")
    broken = _mkdocs_build(copy, tmp_path / "broken-site")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stderr and "no-such-anchor" in broken.stderr


def test_readme_is_a_first_screen_that_links_into_the_site():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    targets = [t for t in LINK.findall(readme) if "://" not in t]
    pages = [t for t in targets if t.startswith("docs/") and t.split("#")[0].endswith(".md")]
    assert len(pages) >= 10, pages
    for target in targets:
        path = REPO / target.split("#")[0]
        assert path.is_file(), f"README.md links to {target}, which does not exist"
    assert "docs/img/pipeline.png" in targets
    assert "make engine" in readme and "make test" in readme and "specdeploy query" in readme
