"""`specdeploy engine` end to end on a tiny model: every stage for real (ModelOpt FP8 PTQ,
convert at tp 2, reference build, Triton package), then a re-run that skips them all."""

from __future__ import annotations

import json

import pytest

from tests.quantize.conftest import build_tiny_llama


@pytest.mark.slow
def test_fp8_tp2_engine_runs_every_stage_then_skips(cli, write_spec, tmp_path):
    model = build_tiny_llama(tmp_path / "tiny")
    spec = write_spec(f"""
        name: tiny-fp8
        model: {{path: {model}, dtype: bfloat16}}
        quantization: {{weights: fp8, kv_cache: fp8, calibration: {{size: 8, max_seq_len: 64}}}}
        parallel: {{tp: 2}}
        build: {{max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
        target: reference
        """)
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    for stage in ("quantize", "convert", "build", "package"):
        assert f"[tiny-fp8] {stage}: done" in out
    engine = tmp_path / "engines" / "tiny-fp8" / "engine"
    config = json.loads((engine / "config.json").read_text())
    assert config["pretrained_config"]["quantization"]["quant_algo"] == "FP8"
    assert config["pretrained_config"]["mapping"]["tp_size"] == 2
    assert sorted(p.name for p in engine.glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    assert (tmp_path / "triton_repo" / "tiny-fp8" / "tensorrt_llm" / "config.pbtxt").exists()

    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err
    assert out.count("up to date, skipped") == 4


def test_engine_without_weights_says_what_is_missing(cli, write_spec):
    # Not a failed stage (1) but "cannot run on this host" (3), at the first stage that needs them.
    spec = write_spec("name: big\nmodel: {path: /nonexistent/llama, preset: llama-3.1-8b}\n")
    rc, out, err = cli("engine", str(spec))
    assert rc == 3, err
    line = next(line for line in out.splitlines() if "weights are not on this host" in line)
    assert line.startswith(
        "[big] convert: the model weights are not on this host (/nonexistent/llama): put the "
        "Hugging Face checkpoint there (model.path)"
    )


def test_engine_without_heads_stops_at_convert_with_exit_3(cli, write_spec, hf_config_dir, tmp_path):
    model = hf_config_dir()
    spec = write_spec(
        f"name: h\nmodel: {{path: {model}}}\nheads: {{eagle: {{path: {tmp_path}/no-heads}}}}\ntarget: reference\n"
    )
    rc, out, err = cli("engine", str(spec))
    assert rc == 3, err
    assert (
        f"[h] convert: the speculative heads are not on this host ({tmp_path}/no-heads): put the heads "
        "there (heads.<method>.path)" in out
    )
    assert not (tmp_path / "engines" / "h" / "checkpoint").exists()
