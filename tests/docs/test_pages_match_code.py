"""The hand-written pages that describe the code's shape are held to the code, so they cannot drift:
the repository layout names every module and package of ``pipeline/`` (and nothing that is gone),
the stages page and the pipeline figure name every stage the runner has, and each navigation
title is its page's title."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from pipeline.stages.execute import STAGE_BODIES

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipeline"
DOCS = REPO / "docs"


def test_the_layout_page_names_every_module_and_package_and_nothing_that_is_gone():
    page = (DOCS / "reference" / "layout.md").read_text()
    modules = {p.name for p in PIPELINE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    packages = {p.name for p in PIPELINE.iterdir() if (p / "__init__.py").is_file()}
    runtime = {p.name for p in (PIPELINE / "runtime").iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(
        [m for m in modules if not re.search(rf"\b{re.escape(m)}\b", page)]
        + [f"{p}/" for p in packages | runtime if f"{p}/" not in page]
    )
    assert missing == [], f"docs/reference/layout.md does not name: {', '.join(missing)}"
    named = set(re.findall(r"\b([a-z_]+\.py)\b", page))
    everywhere = {p.name for folder in ("pipeline", "scripts", "tests") for p in (REPO / folder).rglob("*.py")}
    gone = sorted(named - everywhere - {"conftest.py"})
    assert gone == [], f"docs/reference/layout.md names modules that do not exist: {', '.join(gone)}"


def _stage_rows(page: str) -> list[str]:
    return re.findall(r"^\| ([a-z-]+) \|", page, flags=re.MULTILINE)


def test_the_stages_page_lists_every_stage_the_runner_has():
    page = (DOCS / "concepts" / "stages.md").read_text()
    rows = [row for row in _stage_rows(page) if row in STAGE_BODIES or row not in ("stage",)]
    table = rows[: len(STAGE_BODIES)]
    assert sorted(table) == sorted(STAGE_BODIES), f"stages table {table}, runner {sorted(STAGE_BODIES)}"
    count = re.search(r"up to (\w+) stages", page)
    words = {"seven": 7, "eight": 8, "nine": 9, "ten": 10}
    assert count and words.get(count.group(1)) == len(STAGE_BODIES), count and count.group(0)
    order = re.search(r"^`([a-z -]+(?:-> [a-z\[\]-]+ ?)+)`", page, flags=re.MULTILINE)
    assert order, "the stages page states the order as `a -> b -> ...`"
    assert {name.strip("[] ") for name in order.group(1).split("->")} == set(STAGE_BODIES)


def test_the_pipeline_figure_draws_every_stage():
    source = (REPO / "scripts" / "pipeline_figure.py").read_text()
    titles = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert set(STAGE_BODIES) <= titles, sorted(set(STAGE_BODIES) - titles)


def _nav(entries: list, found: dict[str, str]) -> dict[str, str]:
    for entry in entries:
        ((title, target),) = entry.items()
        if isinstance(target, list):
            _nav(target, found)
        else:
            found[target] = title
    return found


def test_each_navigation_title_is_its_pages_title():
    nav = _nav(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"], {})
    wrong = []
    for target, title in nav.items():
        if target in ("index.md",):
            continue  # the home page is "Home" in the navigation
        heading = re.search(r"^# (.+)$", (DOCS / target).read_text(), flags=re.MULTILINE)
        if heading is None or heading.group(1).strip() != title:
            wrong.append(f"{target}: nav {title!r}, page {heading.group(1) if heading else None!r}")
    assert wrong == []
