"""The shipped heads in heads/: small, intact, and in the layouts the planner and converter read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.geometry import ModelGeometry
from pipeline.heads.expand import compact_medusa_layout, is_compact_medusa
from pipeline.heads.export import MAX_ARTIFACT_BYTES, verify_manifest
from pipeline.methods import heads_reader
from pipeline.methods.eagle3 import modelopt_capture_layers
from pipeline.methods.eagle3_reader import read_eagle3

HEADS = Path(__file__).resolve().parents[2] / "heads"


@pytest.mark.parametrize(
    "name", ["smollm2-medusa", "smollm2-eagle", "smollm2-code-eagle", "smollm2-code-medusa", "smollm2-eagle3"]
)
def test_shipped_folder_matches_manifest_and_size(name):
    folder = HEADS / name
    assert verify_manifest(folder) == []
    for path in folder.iterdir():
        assert path.stat().st_size <= MAX_ARTIFACT_BYTES, path
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) | {"manifest.json"} == {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("name", ["smollm2-medusa", "smollm2-code-medusa"])
def test_shipped_medusa_is_three_heads_one_layer(name):
    folder = HEADS / name
    assert is_compact_medusa(folder) and compact_medusa_layout(folder) == (3, 1)
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"]) == (576, 49152)


@pytest.mark.parametrize("name", ["smollm2-eagle", "smollm2-code-eagle"])
def test_shipped_eagle_is_smollm2_shaped(name):
    folder = HEADS / name
    layout = heads_reader.inspect_eagle(folder)
    assert (layout.num_layers, layout.has_fc_bias, layout.hidden_size) == (1, True, 576)
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
        config["rope_theta"],
        config["vocab_size"],
    ) == (9, 3, 64, 1536, 100000.0, 49152)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_refreshed_code_heads_were_warm_started_from_the_base_heads_on_the_fine_tune(method):
    manifest = json.loads((HEADS / f"smollm2-code-{method}" / "manifest.json").read_text())
    assert manifest["settings"]["init"] == f"heads/smollm2-{method}"
    assert manifest["settings"]["data"] == "self-distill" and manifest["settings"]["seed"] == 0
    assert "--adapter adapters/smollm2-code" in manifest["command"]
    assert verify_manifest(HEADS / f"smollm2-code-{method}") == []


def test_shipped_eagle3_drafter_is_read_for_smollm2(smollm2_dir):
    """ModelOpt's export, read as strictly as any EAGLE-3 drafter: SmolLM2's shapes, ModelOpt's captured
    layers, a 2048-id draft vocabulary (d2t), and the command and data that made it in the manifest."""
    folder = HEADS / "smollm2-eagle3"
    config = smollm2_dir / "config.json"
    layout = read_eagle3(folder, ModelGeometry.from_hf(json.loads(config.read_text()), str(config)))
    assert layout.capture_layers == modelopt_capture_layers(30) == (1, 14, 26)
    assert layout.has_d2t and layout.draft_vocab_size == 2048
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["method"] == "eagle3" and manifest["settings"]["init"] is None
    assert manifest["settings"]["data"] == "self-distill" and manifest["train_config"]["draft_vocab"] == 2048
    assert manifest["command"].startswith("specdeploy train-heads --method eagle3 ")


@pytest.mark.slow
@pytest.mark.smollm2
def test_shipped_eagle3_drafter_serves_losslessly_and_is_accepted(smollm2_dir, tmp_path):
    """The reference EAGLE-3 loop with the shipped drafter: plain decoding's tokens, drafts accepted."""
    import torch

    from pipeline.runtime.model.engine import Engine
    from pipeline.runtime.spec_decode.base import PlainDecoding
    from tests.runtime.eagle3_fixtures import ModelOptDrafter
    from tests.runtime.fixtures import write_engine
    from tests.runtime.test_eagle3 import PROMPTS, decode, eagle3

    torch.set_num_threads(1)
    engine = Engine.load(write_engine(smollm2_dir, tmp_path / "engine"))
    plain, _ = decode(engine, PlainDecoding(), PROMPTS, batch=3)
    drafter = ModelOptDrafter(HEADS / "smollm2-eagle3", None, (1, 14, 26))
    served, stats = decode(engine, eagle3(engine, drafter), PROMPTS, batch=3)
    assert served == plain and stats.accepted_tokens > 0
