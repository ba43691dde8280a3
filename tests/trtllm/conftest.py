"""Fixtures for the TensorRT-LLM contract tests: plans from YAML text or example specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, VariantPlan
from pipeline.spec.document import load_spec

# Hypothesis keeps a cache of its own even without an example database; keep it inside the
# already-ignored pytest cache instead of a new .hypothesis/ folder in the repository.
set_hypothesis_home_dir(str(Path(__file__).resolve().parents[2] / ".pytest_cache" / "hypothesis"))


@pytest.fixture
def roots(tmp_path) -> OutputRoots:
    return OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")


@pytest.fixture
def plan_text(roots, write_spec):
    """Plan a spec given as YAML text; returns the variants."""
    counter = iter(range(1_000_000))

    def plan(text: str) -> tuple[VariantPlan, ...]:
        return make_plan(load_spec(write_spec(text, name=f"spec{next(counter)}.yaml")), roots).variants

    return plan


@pytest.fixture
def plan_example(roots):
    def plan(path: Path) -> tuple[VariantPlan, ...]:
        return make_plan(load_spec(path), roots).variants

    return plan
