"""The shipped SmolLM2 adapters and specs/smollm2-fleet.yaml: small, SmolLM2-shaped, and planned as promised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.checkpoint.lora import open_adapter
from pipeline.plan.adapters import check_adapter_folder
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = ("smollm2-code", "smollm2-json")


@pytest.mark.parametrize("name", ADAPTERS)
def test_shipped_adapter_is_small_and_smollm2_shaped(name):
    folder = REPO / "adapters" / name
    config = check_adapter_folder(folder)
    assert config.base_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (folder / "adapter_model.safetensors").stat().st_size <= 5 * 2**20
    adapter = open_adapter(folder)
    try:
        shapes = {name.rsplit(".", 2)[-2]: adapter.shape(update.b)[0] for name, update in adapter.updates.items()}
    finally:
        adapter.close()
    assert shapes["q_proj"] == 576 and shapes["k_proj"] == 192 and shapes["up_proj"] == 1536
    report = json.loads((folder / "training_report.json").read_text())
    assert report["heldout_loss_after"] < report["heldout_loss_before"]
    assert report["adapter_bytes"] == (folder / "adapter_model.safetensors").stat().st_size  # the file it measured


def test_fleet_spec_plans_stale_heads_lookahead_and_one_merge_per_adapter(tmp_path):
    spec = load_spec(REPO / "specs" / "smollm2-fleet.yaml")
    plan = make_plan(spec, OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    variants = {v.name: v for v in plan.variants}
    assert {n: v.method for n, v in variants.items()} == {
        "base": "eagle",
        "base-medusa": "medusa",
        "code-stale-eagle": "eagle",
        "code-refreshed-eagle": "eagle",
        "code-stale-medusa": "medusa",
        "code-refreshed-medusa": "medusa",
        "code-lookahead": "lookahead",
        "json-lookahead": "lookahead",
    }
    assert variants["code-stale-eagle"].heads_dir == variants["base"].heads_dir
    refreshed = variants["code-refreshed-eagle"]
    assert refreshed.heads_dir.resolve() == (REPO / "heads" / "smollm2-code-eagle").resolve()  # shipped heads
    assert variants["code-stale-medusa"].heads_dir == variants["base-medusa"].heads_dir
    medusa = variants["code-refreshed-medusa"]
    assert medusa.heads_dir.resolve() == (REPO / "heads" / "smollm2-code-medusa").resolve()
    assert medusa.stage("merge") == variants["code-stale-eagle"].stage("merge")
    assert all(s.name != "train-heads" for v in plan.variants for s in v.stages)  # make engine never trains
    assert refreshed.stage("merge") == variants["code-stale-eagle"].stage("merge")
    assert variants["code-stale-eagle"].stage("merge") == variants["code-lookahead"].stage("merge")
    assert variants["json-lookahead"].stage("merge").output == tmp_path / "engines" / "json-lookahead" / "merged"
    assert all(s.name != "merge" for v in ("base", "base-medusa") for s in variants[v].stages)
