"""Hostile checkpoint files: non-regular files never hang the converter, and non-finite weights
are refused (exit 2, naming the tensor) while they stream through, leaving no output behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.checkpoint import EagleOptions, MedusaOptions, convert_checkpoint
from pipeline.errors import InputError
from tests.checkpoint.conftest import eagle_drafter_dir


@pytest.fixture
def out(tmp_path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def refused(src: Path, out: Path, *patterns: str, **kw) -> str:
    kw = {"tp": 1, "pp": 1, "dtype": "float32", **kw}
    with pytest.raises(InputError) as info:
        convert_checkpoint(src, out, **kw)
    message = str(info.value)
    assert "\n" not in message, message
    assert InputError.exit_code == 2
    for pattern in patterns:
        assert pattern in message, message
    assert list(out.iterdir()) == [], "a refused conversion must leave nothing behind"
    return message


def poke(path: Path, name: str, value: float, index: tuple[int, ...] = (0,)) -> None:
    weights = load_file(str(path))
    weights[name][index] = value
    save_file(weights, str(path))


def medusa_heads(tmp_path: Path, hidden: int = 64, vocab: int = 96) -> Path:
    heads = tmp_path / "medusa"
    heads.mkdir()
    save_file(
        {
            "0.0.linear.weight": torch.randn(hidden, hidden) * 0.01,
            "0.0.linear.bias": torch.zeros(hidden),
            "0.1.weight": torch.randn(vocab, hidden) * 0.01,
        },
        str(heads / "medusa_lm_head.safetensors"),
    )
    return heads


# -- files that are not files ---------------------------------------------------------------------


def test_fifo_as_model_safetensors_is_refused_without_blocking(tiny_llama, out):
    tiny = tiny_llama()
    weights = tiny.path / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    refused(tiny.path, out, str(weights), "FIFO (named pipe), not a regular file")


def test_character_device_behind_a_symlink_is_refused(tiny_llama, out):
    tiny = tiny_llama()
    weights = tiny.path / "model.safetensors"
    weights.unlink()
    weights.symlink_to("/dev/zero")
    refused(tiny.path, out, str(weights), "character device")


def test_dangling_symlink_weights_name_the_link(tiny_llama, out):
    tiny = tiny_llama()
    weights = tiny.path / "model.safetensors"
    weights.rename(tiny.path / "moved.bin.away")
    weights.symlink_to(tiny.path / "gone.safetensors")
    refused(tiny.path, out, str(weights), "dangling symlink")


def test_fifo_config_json_is_refused(tiny_llama, out):
    tiny = tiny_llama()
    (tiny.path / "config.json").unlink()
    os.mkfifo(tiny.path / "config.json")
    refused(tiny.path, out, "config.json", "FIFO")


@pytest.mark.parametrize("name", ["medusa_lm_head.safetensors", "medusa_lm_head.pt"])
def test_fifo_as_medusa_head_file(tmp_path, tiny_llama, out, name):
    tiny = tiny_llama()
    heads = tmp_path / "heads"
    heads.mkdir()
    os.mkfifo(heads / name)
    refused(tiny.path, out, str(heads / name), "FIFO", medusa=MedusaOptions(heads))


def test_fifo_as_eagle_weights_and_config(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = eagle_drafter_dir(tmp_path)
    (heads / "model.safetensors").unlink()
    os.mkfifo(heads / "model.safetensors")
    refused(tiny.path, out, "model.safetensors", "FIFO", eagle=EagleOptions(heads))
    (heads / "config.json").unlink()
    os.mkfifo(heads / "config.json")
    refused(tiny.path, out, "config.json", "FIFO", eagle=EagleOptions(heads))


def test_nested_json_bomb_config_is_one_line(tiny_llama, out):
    tiny = tiny_llama()
    (tiny.path / "config.json").write_text("[" * 200_000)
    refused(tiny.path, out, "config.json")


def test_truncated_json_config_names_line_and_column(tiny_llama, out):
    tiny = tiny_llama()
    text = (tiny.path / "config.json").read_text()
    (tiny.path / "config.json").write_text(text[: len(text) // 2])
    message = refused(tiny.path, out, "config.json:", "not valid JSON")
    assert message.split(" ")[0].count(":") == 2  # path:line:col


# -- values inside the tensors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "tensor, value",
    [
        ("model.layers.1.mlp.down_proj.weight", float("nan")),
        ("model.layers.0.self_attn.q_proj.weight", float("inf")),
        ("model.embed_tokens.weight", float("-inf")),
        ("model.norm.weight", float("nan")),
        ("lm_head.weight", float("nan")),
    ],
)
def test_non_finite_base_weight_is_refused_naming_the_tensor(tiny_llama, out, tensor, value):
    tiny = tiny_llama()
    poke(tiny.path / "model.safetensors", tensor, value, (3,) if "norm" in tensor else (5, 7))
    message = refused(tiny.path, out, f"tensor {tensor}", "NaN or Inf", "model.safetensors")
    assert "at row" in message


@pytest.mark.parametrize("tp, dtype", [(2, "bfloat16"), (1, "float16")])
def test_non_finite_is_caught_in_sharded_and_cast_conversions(tiny_llama, out, tp, dtype):
    tiny = tiny_llama()
    poke(tiny.path / "model.safetensors", "model.layers.0.mlp.down_proj.weight", float("nan"), (63, 95))
    refused(tiny.path, out, "model.layers.0.mlp.down_proj.weight", "NaN or Inf", "at row 63", tp=tp, dtype=dtype)


def test_value_overflowing_float16_is_named_as_overflow(tiny_llama, out):
    tiny = tiny_llama()
    poke(tiny.path / "model.safetensors", "model.layers.0.mlp.up_proj.weight", 1e6, (2, 3))
    refused(tiny.path, out, "model.layers.0.mlp.up_proj.weight", "overflows float16", "wider dtype", dtype="float16")
    out2 = out.parent / "out2"
    out2.mkdir()
    convert_checkpoint(tiny.path, out2, tp=1, pp=1, dtype="bfloat16")  # bf16 holds 1e6
    assert (out2 / "config.json").is_file()


def test_finite_weights_whose_sum_overflows_are_not_refused(tiny_llama, out):
    # two finite float32 values of 3e38 in one chunk: their float32 sum is inf, the weights are fine
    tiny = tiny_llama()
    poke(tiny.path / "model.safetensors", "model.layers.0.mlp.up_proj.weight", 3e38, (2, 3))
    poke(tiny.path / "model.safetensors", "model.layers.0.mlp.up_proj.weight", 3e38, (4, 5))
    convert_checkpoint(tiny.path, out, tp=1, pp=1, dtype="float32")
    assert (out / "config.json").is_file()


def test_bf16_source_copied_as_is_is_still_checked(tiny_llama, out):
    tiny = tiny_llama(torch_dtype="bfloat16")
    weights = load_file(str(tiny.path / "model.safetensors"))
    weights = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    weights["model.layers.1.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(weights, str(tiny.path / "model.safetensors"))
    refused(tiny.path, out, "model.layers.1.self_attn.o_proj.weight", "NaN or Inf", dtype="bfloat16")


def test_sharded_checkpoint_names_the_shard(tiny_llama, out):
    tiny = tiny_llama(save_kwargs={"max_shard_size": "100KB"})
    index = json.loads((tiny.path / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.layers.1.mlp.gate_proj.weight"]
    poke(tiny.path / shard, "model.layers.1.mlp.gate_proj.weight", float("inf"), (1, 1))
    refused(tiny.path, out, shard, "model.layers.1.mlp.gate_proj.weight", "NaN or Inf")


def test_non_finite_medusa_head_is_refused(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = medusa_heads(tmp_path)
    poke(heads / "medusa_lm_head.safetensors", "0.0.linear.weight", float("nan"), (1, 2))
    refused(
        tiny.path,
        out,
        "medusa_lm_head.safetensors: tensor 0.0.linear.weight",
        "NaN or Inf",
        medusa=MedusaOptions(heads),
    )


def test_non_finite_pickled_medusa_head_is_refused(tmp_path, tiny_llama, out):
    tiny = tiny_llama()
    heads = tmp_path / "medusa"
    heads.mkdir()
    bias = torch.zeros(64)
    bias[4] = float("inf")
    torch.save(
        {"0.0.linear.weight": torch.zeros(64, 64), "0.0.linear.bias": bias, "0.1.weight": torch.zeros(96, 64)},
        heads / "medusa_lm_head.pt",
    )
    refused(tiny.path, out, "medusa_lm_head.pt", "0.0.linear.bias", "NaN or Inf", medusa=MedusaOptions(heads))


@pytest.mark.parametrize("tensor", ["fc.weight", "layers.0.mlp.down_proj.weight", "fc.bias"])
def test_non_finite_eagle_drafter_is_refused(tmp_path, tiny_llama, out, tensor):
    tiny = tiny_llama()
    heads = eagle_drafter_dir(tmp_path)
    poke(heads / "model.safetensors", tensor, float("nan"), (0,) if tensor == "fc.bias" else (0, 0))
    refused(tiny.path, out, tensor, "NaN or Inf", eagle=EagleOptions(heads))


def test_finite_model_still_converts(tiny_llama, out):
    tiny = tiny_llama()
    summary = convert_checkpoint(tiny.path, out, tp=2, pp=1, dtype="float16")
    assert summary.num_tensors > 0 and (out / "config.json").is_file()


def test_safetensors_header_nesting_bomb_is_one_line(tiny_llama, out):
    import struct

    tiny = tiny_llama()
    header = b"[" * 100_000 + b"]" * 100_000
    (tiny.path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    refused(tiny.path, out, "model.safetensors", "corrupt safetensors header")
