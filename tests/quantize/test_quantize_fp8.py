"""Real ModelOpt FP8 PTQ + export on a tiny random Llama: layout, scales, accuracy, errors."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.errors import InputError, StageError
from pipeline.quantize import is_modelopt_fp8_checkpoint, quantize_fp8, verify_fp8_export

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
E4M3_MAX = 448.0


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _linear_names(num_layers: int = 2) -> list[str]:
    return [f"model.layers.{i}.{m}" for i in range(num_layers) for m in LINEARS]


def test_export_layout(tiny_fp8, tiny_llama_dir):
    import torch

    summary, out = tiny_fp8
    tensors = _tensors(out)
    for name in _linear_names():
        assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn, name
        for scale in ("weight_scale", "input_scale"):
            value = tensors[f"{name}.{scale}"]
            assert value.dtype == torch.float32 and value.ndim == 0 and float(value) > 0, (name, scale)
    for layer in range(2):
        for key in ("k_proj.k_scale", "v_proj.v_scale"):
            assert tensors[f"model.layers.{layer}.self_attn.{key}"].dtype == torch.float32
    # Everything not quantized is in the export dtype: embeddings, lm_head (untied here), norms.
    for name in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
    ):
        assert tensors[name].dtype == torch.bfloat16, name
    assert sum(t.dtype == torch.float8_e4m3fn for t in tensors.values()) == 14
    assert summary.num_quantized_linears == 14 and summary.num_quantizers == 14 * 2 + 2 * 2
    assert summary.calib_samples >= 60 and summary.calib_tokens > 1000 and summary.device == "cpu"
    assert set(summary.amax_stats) == {"weight", "input", "k_bmm", "v_bmm"}

    quant = json.loads((out / "hf_quant_config.json").read_text())
    assert quant["producer"]["name"] == "modelopt"
    assert quant["quantization"]["quant_algo"] == "FP8" and quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert {"lm_head", "model.embed_tokens"} <= set(quant["quantization"]["exclude_modules"])
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == 10000.0  # transformers-4 readers
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).is_file(), name
    assert (out / "tokenizer.json").read_bytes() == (tiny_llama_dir / "tokenizer.json").read_bytes()
    assert (
        "chat_template" in json.loads((out / "tokenizer_config.json").read_text())
        or (out / "chat_template.jinja").is_file()
    )


def test_scales_are_modelopt_amax_over_448(tiny_fp8):
    summary, out = tiny_fp8
    tensors = _tensors(out)
    amax = summary.amax
    for name in _linear_names():
        assert float(tensors[f"{name}.weight_scale"]) == pytest.approx(
            amax[f"{name}.weight_quantizer"] / E4M3_MAX, rel=1e-6
        )
        assert float(tensors[f"{name}.input_scale"]) == pytest.approx(
            amax[f"{name}.input_quantizer"] / E4M3_MAX, rel=1e-6
        )
    for layer in range(2):
        attn = f"model.layers.{layer}.self_attn"
        assert float(tensors[f"{attn}.k_proj.k_scale"]) == pytest.approx(
            amax[f"{attn}.k_bmm_quantizer"] / E4M3_MAX, rel=1e-6
        )
        assert float(tensors[f"{attn}.v_proj.v_scale"]) == pytest.approx(
            amax[f"{attn}.v_bmm_quantizer"] / E4M3_MAX, rel=1e-6
        )


def test_dequantized_weights_match_original(tiny_fp8, tiny_llama_dir):
    """w ≈ fp8 * weight_scale within E4M3 rounding: half a step (2^-4 relative for normals,
    2^-10 * scale for subnormals), i.e. the weight was rounded once, from float32."""
    import torch

    original = _tensors(tiny_llama_dir)
    tensors = _tensors(tiny_fp8[1])
    for name in _linear_names():
        w = original[f"{name}.weight"].float()
        scale = tensors[f"{name}.weight_scale"].float()
        deq = tensors[f"{name}.weight"].float() * scale
        assert float(w.abs().max()) == pytest.approx(float(scale) * E4M3_MAX, rel=1e-6)  # amax = max|w|
        bound = torch.maximum(w.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-5)
        assert bool(((deq - w).abs() <= bound).all()), name
        rel_rms = float((deq - w).norm() / w.norm())
        assert 0 < rel_rms < 0.04, (name, rel_rms)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # not quantized, only bf16-rounded
        assert torch.allclose(tensors[name].float(), original[name].float(), rtol=2**-8, atol=0)


def test_detects_modelopt_fp8(tiny_fp8, tiny_llama_dir, tmp_path):
    out = tiny_fp8[1]
    assert is_modelopt_fp8_checkpoint(out)
    assert not is_modelopt_fp8_checkpoint(tiny_llama_dir)
    only_config = tmp_path / "only-config"
    only_config.mkdir()
    shutil.copy(out / "config.json", only_config / "config.json")  # side file lost: config.json still says so
    assert is_modelopt_fp8_checkpoint(only_config)
    other = tmp_path / "other"
    other.mkdir()
    (other / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})
    )
    assert not is_modelopt_fp8_checkpoint(other)


def test_refuses_already_quantized_input(tiny_fp8, tmp_path):
    with pytest.raises(InputError, match="already a ModelOpt FP8 checkpoint; skip the quantize stage"):
        quantize_fp8(tiny_fp8[1], tmp_path / "o", kv_cache_fp8=False, calib_path=None, calib_size=4, calib_max_len=16)


def test_refuses_other_quantized_input(tiny_llama_dir, tmp_path):
    src = tmp_path / "awq"
    shutil.copytree(tiny_llama_dir, src)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="already quantized \\(quant_method 'awq'\\)"):
        quantize_fp8(src, tmp_path / "o", kv_cache_fp8=False, calib_path=None, calib_size=4, calib_max_len=16)


def test_missing_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(InputError, match=r"no config\.json"):
        quantize_fp8(
            tmp_path / "m", tmp_path / "o", kv_cache_fp8=False, calib_path=None, calib_size=4, calib_max_len=16
        )


def test_bad_calibration_file_is_one_line_naming_the_line(tiny_llama_dir, tmp_path):
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"text": "ok"}\n{"text": "broken\n')
    with pytest.raises(InputError) as info:
        quantize_fp8(
            tiny_llama_dir, tmp_path / "o", kv_cache_fp8=False, calib_path=calib, calib_size=4, calib_max_len=16
        )
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{calib}:2: not valid JSON")
    assert not (tmp_path / "o").exists()  # failed before writing anything


def test_refuses_output_folder_with_weights(tiny_llama_dir, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError, match=r"already holds \.safetensors"):
        quantize_fp8(tiny_llama_dir, out, kv_cache_fp8=False, calib_path=None, calib_size=4, calib_max_len=16)


def test_exclude_patterns_txt_calibration_no_kv(tiny_llama_dir, tmp_path):
    """Extra exclusions (glob and plain module name) stay bf16 and are listed; no KV scales."""
    import torch

    calib = tmp_path / "calib.txt"
    calib.write_text(
        "the water is blue\nwhat is the capital of france\nexplain the sky\n" + " ".join(["time"] * 40) + "\n"
    )
    exclude = ("*layers.1.mlp*", "model.layers.0.self_attn.o_proj", "*medusa_heads*")
    summary = quantize_fp8(
        tiny_llama_dir,
        tmp_path / "o",
        kv_cache_fp8=False,
        calib_path=calib,
        calib_size=3,
        calib_max_len=32,
        exclude=exclude,
    )
    assert summary.calib_samples == 3 and summary.calib_truncated == 0
    assert summary.unmatched_exclude == ("*medusa_heads*",)  # reported, not an error
    tensors = _tensors(tmp_path / "o")
    excluded = [
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.mlp.up_proj",
        "model.layers.1.mlp.down_proj",
        "model.layers.0.self_attn.o_proj",
    ]
    for name in excluded:
        assert tensors[f"{name}.weight"].dtype == torch.bfloat16, name
        assert f"{name}.weight_scale" not in tensors
    assert summary.num_quantized_linears == 14 - 4
    assert not any(k.endswith(("k_scale", "v_scale")) for k in tensors)
    quant = json.loads((tmp_path / "o" / "hf_quant_config.json").read_text())["quantization"]
    assert quant["kv_cache_quant_algo"] is None
    # ModelOpt may fold names into wildcards ("model.layers.1.mlp*"); TRT-LLM matches them with fnmatch.
    for name in excluded:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in quant["exclude_modules"]), name


def test_verify_names_the_missing_tensor(tiny_fp8, tmp_path):
    from safetensors.torch import save_file

    summary, out = tiny_fp8
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    tensors = _tensors(broken)
    del tensors["model.layers.1.self_attn.v_proj.v_scale"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    linears = [n.rsplit(".", 1)[0] for n in summary.amax if n.endswith(".weight_quantizer")]
    attention = [f"model.layers.{i}.self_attn" for i in range(2)]
    assert verify_fp8_export(out, linears, attention, kv_cache_fp8=True) > 0
    with pytest.raises(StageError, match=re.escape("missing tensor 'model.layers.1.self_attn.v_proj.v_scale'")):
        verify_fp8_export(broken, linears, attention, kv_cache_fp8=True)
    with pytest.raises(StageError, match="kv_cache_quant_algo is 'FP8', expected None"):
        verify_fp8_export(out, linears, attention, kv_cache_fp8=False)


def test_refuses_tensors_the_model_would_drop(tiny_llama_dir, tmp_path):
    """Medusa heads merged into the folder are not loaded by LlamaForCausalLM: losing them silently is worse."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "with-heads"
    shutil.copytree(tiny_llama_dir, src)
    tensors = _tensors(src)
    tensors["medusa_heads.0.0.linear.weight"] = torch.zeros(64, 64)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        InputError,
        match=re.escape("1 tensors (e.g. 'medusa_heads.0.0.linear.weight') are not part of LlamaForCausalLM"),
    ):
        quantize_fp8(src, tmp_path / "o", kv_cache_fp8=False, calib_path=None, calib_size=2, calib_max_len=16)


def _poke(folder: Path, name: str, value: float, index: tuple[int, ...]) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    weights[name][index] = value
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "name, value, index, row",
    [
        ("model.layers.1.mlp.down_proj.weight", float("nan"), (17, 3), 17),
        ("model.layers.0.self_attn.k_proj.weight", float("inf"), (5, 0), 5),
        ("model.embed_tokens.weight", float("-inf"), (40, 2), 40),
    ],
)
def test_non_finite_weight_is_refused_before_calibration(tiny_llama_dir, tmp_path, name, value, index, row):
    src = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, src)
    _poke(src, name, value, index)
    said: list[str] = []
    with pytest.raises(InputError) as info:
        quantize_fp8(
            src,
            tmp_path / "out",
            kv_cache_fp8=False,
            calib_path=None,
            calib_size=4,
            calib_max_len=16,
            progress=said.append,
        )
    assert str(info.value) == (
        f"{src / 'model.safetensors'}: tensor {name} holds NaN or Inf at row {row}; "
        "the weights are corrupt, re-export them"
    )
    assert not any("calibrat" in line for line in said), said  # refused before ModelOpt saw the model
    assert not (tmp_path / "out").exists()


def test_non_finite_weight_fails_the_fp8_engine_with_exit_2(tiny_llama_dir, tmp_path, cli, write_spec):
    src = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, src)
    _poke(src, "model.layers.0.mlp.up_proj.weight", float("nan"), (3, 4))
    spec = write_spec(f"name: q\nmodel: {{path: {src}}}\nquantization: {{weights: fp8}}\ntarget: reference\n")
    rc, _, err = cli("engine", str(spec))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err
    assert "tensor model.layers.0.mlp.up_proj.weight holds NaN or Inf at row 3" in errors[0]
    quantized = tmp_path / "engines" / "q" / "quantized"
    assert not quantized.exists() and not list(quantized.parent.glob(".quantized.tmp-*"))
