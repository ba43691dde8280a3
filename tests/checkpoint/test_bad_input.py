"""Bad input fails with a one-line InputError that names the file/tensor, and leaves no output files."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.checkpoint import EagleOptions, MedusaOptions, convert_checkpoint
from pipeline.errors import InputError
from tests.checkpoint.conftest import eagle_drafter_dir


def expect_error(src: Path, out: Path, *patterns: str, **kw) -> str:
    kw = {"tp": 1, "pp": 1, "dtype": "float32", **kw}
    with pytest.raises(InputError) as info:
        convert_checkpoint(src, out, **kw)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for pattern in patterns:
        assert pattern in msg, msg
    assert list(out.iterdir()) == [], "a failed conversion must not leave files behind"
    return msg


@pytest.fixture
def out(tmp_path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def _rewrite(path: Path, edit) -> None:
    weights = load_file(str(path))
    edit(weights)
    save_file(weights, str(path))


def test_missing_tensor(tiny_llama, out):
    tiny = tiny_llama()
    _rewrite(tiny.path / "model.safetensors", lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    expect_error(tiny.path, out, "model.layers.1.mlp.up_proj.weight is missing", str(tiny.path))


def test_extra_unexpected_tensor(tiny_llama, out):
    tiny = tiny_llama()
    _rewrite(
        tiny.path / "model.safetensors",
        lambda w: w.__setitem__("model.layers.0.self_attn.q_norm.weight", torch.ones(16)),
    )
    expect_error(tiny.path, out, "model.layers.0.self_attn.q_norm.weight: unexpected tensor", "model.safetensors")


def test_shape_mismatch_with_config(tiny_llama, out):
    tiny = tiny_llama()
    _rewrite(
        tiny.path / "model.safetensors",
        lambda w: w.__setitem__("model.layers.0.mlp.down_proj.weight", torch.zeros(64, 95)),
    )
    expect_error(tiny.path, out, "model.layers.0.mlp.down_proj.weight: shape [64, 95]", "[64, 96]")


def test_truncated_safetensors(tiny_llama, out):
    tiny = tiny_llama()
    path = tiny.path / "model.safetensors"
    os.truncate(path, path.stat().st_size - 1000)
    expect_error(tiny.path, out, f"{path}: truncated safetensors file")


@pytest.mark.parametrize(
    "garbage,pattern",
    [
        (b"\xff" * 8, "header length"),  # absurd length field
        (None, "corrupt safetensors header"),  # JSON destroyed
    ],
)
def test_corrupt_header(tiny_llama, out, garbage, pattern):
    tiny = tiny_llama()
    path = tiny.path / "model.safetensors"
    data = bytearray(path.read_bytes())
    if garbage is not None:
        data[:8] = garbage
    else:
        data[8:40] = b"#" * 32
    path.write_bytes(bytes(data))
    expect_error(tiny.path, out, str(path), pattern)


def test_unsupported_architecture(tiny_llama, out):
    tiny = tiny_llama()
    cfg = json.loads((tiny.path / "config.json").read_text())
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    cfg["model_type"] = "qwen2"
    (tiny.path / "config.json").write_text(json.dumps(cfg))
    expect_error(tiny.path, out, "unsupported architecture Qwen2ForCausalLM", "supports LlamaForCausalLM")


def test_tp_must_divide_heads(tiny_llama, out):
    tiny = tiny_llama()
    expect_error(tiny.path, out, "num_attention_heads 4 is not divisible by tp=3", "[1, 2, 4]", tp=3)


def test_kv_heads_cannot_be_replicated(tiny_llama, out):
    tiny = tiny_llama(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    expect_error(tiny.path, out, "tp=3 is not a multiple of num_key_value_heads 2", tp=3)


class Exploit:
    """Unpickling this would create a marker file: a stand-in for arbitrary code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_malicious_pickle_is_refused_and_never_executed(tmp_path, tiny_llama, out, kind):
    tiny = tiny_llama()
    marker = tmp_path / "pwned"
    heads = tmp_path / "heads"
    heads.mkdir()
    payload = {"0.0.linear.weight": torch.zeros(64, 64), "evil": Exploit(str(marker))}
    name = "medusa_lm_head.pt" if kind == "medusa" else "pytorch_model.bin"
    torch.save(payload, heads / name)  # zip-format pickle, as real checkpoints are
    (heads / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "intermediate_size": 96,
                "vocab_size": 96,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
            }
        )
    )
    opts = {"medusa": MedusaOptions(heads)} if kind == "medusa" else {"eagle": EagleOptions(heads)}
    expect_error(tiny.path, out, str(heads / name), "refusing to unpickle", "convert it to safetensors", **opts)
    assert not marker.exists()
    # The legacy (non-zip) pickle format goes through the same safe loader.
    with open(heads / name, "wb") as f:
        pickle.dump(payload, f)
    expect_error(tiny.path, out, "refusing to unpickle", **opts)
    assert not marker.exists()


def test_medusa_shape_mismatch_with_base(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = tmp_path / "medusa"
    heads.mkdir()
    save_file(
        {
            "0.0.linear.weight": torch.zeros(64, 64),
            "0.0.linear.bias": torch.zeros(64),
            "0.1.weight": torch.zeros(97, 64),
        },
        str(heads / "medusa_lm_head.safetensors"),
    )
    expect_error(
        tiny.path,
        out,
        "medusa_lm_head.safetensors: tensor 0.1.weight: shape [97, 64]",
        "[96, 64]",
        "different base model",
        medusa=MedusaOptions(heads),
    )


def test_medusa_incomplete_head(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = tmp_path / "medusa"
    heads.mkdir()
    sd = {
        "0.0.linear.weight": torch.zeros(64, 64),
        "0.0.linear.bias": torch.zeros(64),
        "0.1.weight": torch.zeros(96, 64),
        "1.0.linear.weight": torch.zeros(64, 64),
        "1.1.weight": torch.zeros(96, 64),
    }
    save_file(sd, str(heads / "medusa_lm_head.safetensors"))
    expect_error(tiny.path, out, "1.0.linear.bias is missing", medusa=MedusaOptions(heads))


def test_eagle_shape_mismatches(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = eagle_drafter_dir(tmp_path, fc_shape=(64, 64))
    expect_error(tiny.path, out, "fc.weight: shape [64, 64]", "[64, 128]", eagle=EagleOptions(heads))
    cfg = json.loads((heads / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (heads / "config.json").write_text(json.dumps(cfg))
    expect_error(tiny.path, out, "drafter vocab_size 1000 != base vocab_size 96", eagle=EagleOptions(heads))


def test_eagle_needs_pp1_and_no_fp8_kv(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = eagle_drafter_dir(tmp_path)
    expect_error(tiny.path, out, "EAGLE needs pp=1", eagle=EagleOptions(heads), pp=2)


def test_eagle_unexpected_tensor(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = eagle_drafter_dir(tmp_path)
    _rewrite(heads / "model.safetensors", lambda w: w.__setitem__("layers.0.input_layernorm.weight", torch.ones(64)))
    expect_error(tiny.path, out, "unexpected tensor layers.0.input_layernorm.weight", eagle=EagleOptions(heads))


def test_bad_arguments(tiny_llama, out, tmp_path):
    tiny = tiny_llama()
    expect_error(tiny.path, out, "dtype 'fp8' is not supported", dtype="fp8")
    expect_error(tiny.path, out, "tp must be a positive integer", tp=0)
    expect_error(tiny.path, out, "kv_cache_fp8 needs a ModelOpt FP8 export", kv_cache_fp8=True)
    expect_error(tiny.path, out, "pp=3 exceeds num_hidden_layers 2", pp=3)
    (out / "leftover").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        convert_checkpoint(tiny.path, out, tp=1, pp=1, dtype="float32")
    with pytest.raises(InputError, match="must exist"):
        convert_checkpoint(tiny.path, tmp_path / "nope", tp=1, pp=1, dtype="float32")


def test_unsupported_quantization(tiny_llama, out):
    tiny = tiny_llama()
    (tiny.path / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})
    )
    expect_error(tiny.path, out, "hf_quant_config.json: quant_algo 'NVFP4' is not supported")


def test_pickle_only_base_and_bad_index(tiny_llama, out):
    tiny = tiny_llama(save_kwargs={"max_shard_size": "40KB"})
    index = json.loads((tiny.path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (tiny.path / victim).unlink()
    expect_error(tiny.path, out, f"{victim}: listed in model.safetensors.index.json but missing")
    for f in tiny.path.glob("*.safetensors*"):
        f.unlink()
    torch.save({}, tiny.path / "pytorch_model.bin")
    expect_error(tiny.path, out, "only pickle weights", "must be safetensors")


def test_failure_while_writing_leaves_nothing(tiny_llama, out):
    """The source shrinks under us mid-conversion: the error names the file, partial files are removed."""
    tiny = tiny_llama()
    src = tiny.path / "model.safetensors"
    calls = []

    def progress(done: int, total: int) -> None:
        if not calls:
            os.truncate(src, src.stat().st_size // 2)
        calls.append(done)

    expect_error(tiny.path, out, str(src), "ended early", progress=progress)
    assert calls
