"""heads.<method>.train in a spec: the train-heads stage trains a variant's heads against its own merged target."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.heads.eagle import EagleDrafter
from pipeline.heads.export import export_eagle
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from pipeline.stages.runner import FINGERPRINT_FILE
from tests.quantize.conftest import build_tiny_llama

peft = pytest.importorskip("peft")


def _adapter(model_dir, folder) -> None:
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(copy.deepcopy(base), lora)
    model.save_pretrained(folder)


def _base_heads(model_dir, folder) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    torch.manual_seed(2)
    drafter = EagleDrafter(ModelGeometry.from_hf(config, "config.json", require_architecture=False))
    export_eagle(drafter, folder, info={}, readme="")


@pytest.fixture
def fleet(tmp_path, write_spec):
    model = build_tiny_llama(tmp_path / "tiny", tie_word_embeddings=True)
    _adapter(model, tmp_path / "ft")
    _base_heads(model, tmp_path / "base-eagle")
    spec = write_spec(f"""
        name: tiny-heads
        model: {{path: {model}, dtype: float32}}
        heads: {{eagle: {{path: {tmp_path / "base-eagle"}}}}}
        speculative: {{eagle: {{choices: chain_3}}, medusa: {{choices: chain_3}}}}
        build: {{max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
        target: reference
        variants:
          - name: base
          - name: ft-refreshed
            model: {{adapter: {tmp_path / "ft"}}}
            heads: {{eagle: {{train: {{init: base, data: fixed-text, tokens: 1500, epochs: 1}}}}}}
          - name: ft-medusa
            model: {{adapter: {tmp_path / "ft"}}}
            heads:
              eagle: null
              medusa: {{num_heads: 3, train: {{init: random, data: self-distill, tokens: 400, epochs: 1}}}}
        """)
    return spec


def _roots(tmp_path) -> OutputRoots:
    return OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache")


def test_plan_trains_after_merge_and_converts_the_trained_heads(fleet, tmp_path):
    base, refreshed, medusa = make_plan(load_spec(fleet), _roots(tmp_path)).variants
    assert [s.name for s in base.stages] == ["convert", "build", "package"]
    assert [s.name for s in refreshed.stages] == ["merge", "train-heads", "convert", "build", "package"]
    train = refreshed.stage("train-heads")
    assert train.output == tmp_path / "engines" / "ft-refreshed" / "heads"
    assert train.inputs["model"] == refreshed.stage("merge").output  # the fine-tune's own target
    assert train.inputs["init"] == tmp_path / "base-eagle"  # init: base = the inherited heads
    assert refreshed.stage("convert").inputs["heads"] == train.output
    assert medusa.method == "medusa" and "init" not in medusa.stage("train-heads").inputs
    assert train.params["labels"] == "target-top-10"  # fingerprinted: heads trained on other labels retrain


def test_engine_trains_heads_once_and_convert_reads_them(fleet, cli, tmp_path):
    rc, out, err = cli("engine", str(fleet))
    assert rc == 0, err
    assert "[ft-refreshed] train-heads: done" in out and "[ft-medusa] train-heads: done" in out
    trained = tmp_path / "engines" / "ft-refreshed" / "heads"
    init = load_file(str(tmp_path / "base-eagle" / "model.safetensors"))
    refreshed = load_file(str(trained / "model.safetensors"))
    assert set(refreshed) == set(init)
    assert not torch.equal(refreshed["fc.weight"], init["fc.weight"])  # trained, from the base's weights
    info = json.loads((trained / "manifest.json").read_text())
    assert info["data"]["source"] == "fixed-text" and info["settings"]["init"].endswith("base-eagle")
    assert info["data"]["labels"] == "target top-10"  # distilled from the fine-tune, not the text's tokens
    recorded = json.loads((tmp_path / "engines" / "ft-refreshed" / "checkpoint" / FINGERPRINT_FILE).read_text())
    assert recorded["inputs"]["heads"]["path"] == str(trained)
    medusa_config = json.loads((tmp_path / "engines" / "ft-medusa" / "heads" / "config.json").read_text())
    assert medusa_config["medusa_num_heads"] == 3
    medusa_info = json.loads((tmp_path / "engines" / "ft-medusa" / "heads" / "manifest.json").read_text())
    assert medusa_info["data"]["source"] == "self-distill" and medusa_info["data"]["labels"] == "target top-10"
    assert 0 < medusa_info["data"]["teacher_mass"] <= 1.001  # the share of the target's probability kept
    assert list((tmp_path / "engines" / "ft-medusa" / ".heads-data").glob("refresh-*.json"))  # kept for a re-run
    rc, out, err = cli("engine", str(fleet))
    assert rc == 0, err
    assert "[ft-refreshed] train-heads: up to date, skipped" in out


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ("{eagle: {train: {init: base}}}", "give 'path' (the heads folder), which train.init: base starts from"),
        ("{eagle: {path: PATH, train: {tokens: 10}}}", "must be >= 64"),
        ("{eagle: {path: PATH, train: {device: tpu}}}", "must be one of 'cpu' or 'cuda'"),
        ("{medusa: {train: {init: random}}}", "train.init: random needs num_heads"),
        ("{eagle: {path: PATH, train: {data: missing.txt}}}", "missing.txt: not found; give self-distill"),
        ("{eagle: {path: PATH, train: {}}, medusa: {path: PATH, train: {}}}", "would be trained for nothing"),
        ("{eagle: {path: nowhere, train: {}}}", "no heads there to warm-start from"),
    ],
)
def test_bad_training_settings_are_one_line_errors(tmp_path, write_spec, heads, message):
    model = build_tiny_llama(tmp_path / "tiny", tie_word_embeddings=True)
    _base_heads(model, tmp_path / "base-eagle")
    spec = write_spec(f"""
        name: bad
        model: {{path: {model}, dtype: float32}}
        heads: {heads.replace("PATH", str(tmp_path / "base-eagle"))}
        speculative: {{eagle: {{choices: chain_3}}, medusa: {{choices: chain_3}}}}
        target: reference
        """)
    with pytest.raises(InputError) as caught:
        make_plan(load_spec(spec), _roots(tmp_path))
    assert message in str(caught.value)
    assert all(line.startswith(str(spec)) for line in str(caught.value).splitlines())
