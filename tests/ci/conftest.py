"""A recorded evaluation (tests/data/evaluation/smollm2-eagle-rehearsal.json: `specdeploy evaluate
specs/smollm2-eagle-rehearsal.yaml`, 8 prompts x 32 tokens, 5 candidates) placed where the rehearsal
spec's evaluate stage writes it, so the CI outputs can be rendered without evaluating again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

RECORDED = REPO / "tests" / "data" / "evaluation" / "smollm2-eagle-rehearsal.json"
SPEC = REPO / "specs" / "smollm2-eagle-rehearsal.yaml"
VARIANT = "smollm2-eagle-rehearsal"


@pytest.fixture
def recorded() -> dict:
    return json.loads(RECORDED.read_text())


@pytest.fixture
def evaluated(tmp_path) -> Path:
    """The evaluate stage's output folder under tmp_path/engines, holding the recorded evaluation and a
    report.md (the charts are left out: the tests only link to what is there)."""
    folder = tmp_path / "engines" / VARIANT / "evaluation"
    folder.mkdir(parents=True)
    shutil.copyfile(RECORDED, folder / "evaluation.json")
    (folder / "report.md").write_text("# Evaluation\n")
    return folder
