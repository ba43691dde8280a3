"""The six format fine-tunes (adapters/smollm2-<task>) and specs/smollm2-lora-fleet.yaml: small, trained as
their reports say, and planned as ONE LoRA group of eight on one engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.plan.adapters import check_adapter_folder
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

REPO = Path(__file__).resolve().parents[2]
FORMAT_TASKS = ("yaml", "xml", "bullets", "tldr", "numbered", "heading")
FINE_TUNES = ("code", "json", *FORMAT_TASKS)


@pytest.mark.parametrize("task", FORMAT_TASKS)
def test_format_adapter_is_small_and_learned_its_format(task):
    folder = REPO / "adapters" / f"smollm2-{task}"
    config = check_adapter_folder(folder)
    assert config.base_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    size = (folder / "adapter_model.safetensors").stat().st_size
    assert size <= 2 * 2**20
    report = json.loads((folder / "training_report.json").read_text())
    assert report["task"] == task and report["adapter_bytes"] == size  # the file it measured
    assert f"--task {task} --out adapters/smollm2-{task}" in report["command"]
    assert report["heldout_loss_after"] < report["heldout_loss_before"]
    assert report[f"eval_answers_{task}_after"] > report[f"eval_answers_{task}_before"]


def test_fleet_spec_plans_one_group_of_eight_on_one_engine(tmp_path):
    spec = load_spec(REPO / "specs" / "smollm2-lora-fleet.yaml")
    plan = make_plan(spec, OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    (group,) = plan.lora_groups
    assert group.base_variant == "base"
    assert sorted(m.variant for m in group.members) == sorted(FINE_TUNES)
    task_ids = [m.task_id for m in group.members]
    assert len(set(task_ids)) == len(FINE_TUNES)
    engines = {v.stage("build").output for v in plan.variants}
    assert len(engines) == 1  # base and every fine-tune: the group's engine
    assert not any(s.name == "merge" for v in plan.variants for s in v.stages)
