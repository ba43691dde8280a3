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


def rechosen(evaluation: dict, **release) -> dict:
    """The evaluation with other release gates, its choice made again by the real rule (choose)."""
    from pipeline.evaluation.choose import Gates, choose

    gates = {**evaluation["release"], **release}
    batch = evaluation["settings"]["batch_sizes"][0]
    choice = choose(evaluation["candidates"], batch, evaluation["gpu"]["type"], Gates.from_dict(gates))
    return {**evaluation, "release": gates, "choice": choice.to_dict()}


def run_record(evaluation_dir: Path, *, exit_code: int = 3, gate_failed: str | None = None):
    """An engine run of the rehearsal spec on a host without TensorRT-LLM: convert and evaluate ran
    (or evaluate failed its gate), build could not run here, package was not run."""
    from pipeline.release.ci.records import RunRecord, StageRecord, VariantRecord

    if gate_failed:
        stages = (
            StageRecord("evaluate", "gate failed", 144.8, gate_failed),
            StageRecord("convert", "not run", None, "evaluate stopped the variant"),
            StageRecord("build", "not run", None, "evaluate stopped the variant"),
            StageRecord("package", "not run", None, "evaluate stopped the variant"),
        )
    else:
        stages = (
            StageRecord("evaluate", "ran", 144.8),
            StageRecord("convert", "skipped", 0.2),
            StageRecord("build", "unavailable", None, "trtllm-build is not installed on this host"),
            StageRecord("package", "not run", None, "build stopped the variant"),
        )
    variant = VariantRecord(VARIANT, "eagle", stages, exit_code, evaluation_dir)
    return RunRecord("engine", VARIANT, str(SPEC), (variant,), exit_code, evaluation_dir.parent / "manifest.json")
