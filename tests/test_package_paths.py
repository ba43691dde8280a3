"""Every module-level path of ``pipeline/`` that names a place in the checkout (data files, the Triton
models, the specs) exists: a module moved to another folder keeps finding what it names."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pipeline.docs_gen.layers import import_graph

REPO = Path(__file__).resolve().parents[1]


def module_paths() -> list[tuple[str, str, Path]]:
    found = []
    for name in sorted(import_graph()):
        if name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra (ray) this environment lacks
            continue
        for attr, value in vars(module).items():
            if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(REPO):
                found.append((name, attr, value))
    return found


PATHS = module_paths()


def test_the_package_names_places_in_the_checkout():
    assert any(attr == "PROMPTS_DIR" for _, attr, _ in PATHS)  # the scan sees the constants it checks


@pytest.mark.parametrize(("module", "attr", "path"), PATHS, ids=[f"{m}.{a}" for m, a, _ in PATHS])
def test_every_path_a_module_names_exists(module, attr, path):
    assert path.exists(), f"{module}.{attr} = {path} does not exist"
