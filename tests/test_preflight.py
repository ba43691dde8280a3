"""`validate` tells the whole truth before a byte is written: everything but the weights' values.

Each case is a spec or an input folder that used to pass ``validate`` and fail only in ``engine``
(often after writing a checkpoint); now ``validate`` refuses it with exit 2, located at the spec
line, and ``engine`` writes nothing.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.checkpoint.conftest import eagle_drafter_dir, random_llama
from tests.preflight_fixtures import VOCAB, model, spec_for, write_tokenizer  # noqa: F401  (model: a fixture)


@pytest.fixture
def validate(cli, write_spec, tmp_path):
    """validate(spec_text) -> (rc, stderr); the spec lives next to the model folder."""

    def run(text: str, command: str = "validate") -> tuple[int, str]:
        rc, _, err = cli(command, str(write_spec(text)))
        return rc, err

    return run


def refused(validate, text: str, *patterns: str) -> str:
    """The error lines (stderr also holds transformers' progress bars from writing the fixture)."""
    rc, err = validate(text)
    assert rc == 2, err
    assert "Traceback" not in err
    err = "\n".join(line for line in err.splitlines() if line.startswith("error: "))
    for pattern in patterns:
        assert pattern in err, err
    return err


def edit_config(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


def test_a_good_tiny_model_validates(validate, model):
    rc, err = validate(spec_for(model))
    assert rc == 0, err


# -- build.extra_flags against the flag table, with file:line --------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        ("{max_seqlen: 4}", "build.extra_flags.max_seqlen: not a trtllm-build 1.2"),
        ("{max_batch_size: 4}", "build.extra_flags.max_batch_size: set by the plan (build.max_batch_size)"),
        ("{gemm_plugin: float16}", "build.extra_flags.gemm_plugin: set by the plan"),
        ("{use_fused_mlp: on}", "YAML reads on/off/yes/no as booleans"),
        ("{use_fused_mlp: maybe}", "'maybe' is not legal; allowed: one of enable, disable"),
        ("{low_latency_gemm_plugin: fp8}", "needs FP8 weights"),
        ("{gather_context_logits: true}", "context logits with speculative decoding"),
    ],
)
def test_extra_flags_are_checked_at_validate_time_with_their_line(validate, model, flags, message):
    err = refused(validate, spec_for(model, f"build:\n  extra_flags: {flags}\n"), message)
    assert ".yaml:9:17 build.extra_flags." in err and "[variant tiny]" in err


def test_extra_flags_of_a_preset_plan_are_checked_too(validate):
    text = "name: p\nmodel: {preset: llama-3-8b}\nbuild:\n  extra_flags:\n    nonsense_flag: 1\n"
    assert ".yaml:5:5 build.extra_flags.nonsense_flag: not a trtllm-build" in refused(validate, text)


# -- absurd numbers against TensorRT-LLM's limits and memory ---------------------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        ("max_batch_size: 1000000000000000000000000000000", "max_batch_size: must be <= 2147483647"),
        ("max_seq_len: 100000000000000000000000000", "max_seq_len: must be <= 2147483647"),
        ("{max_batch_size: 2000000, max_seq_len: 4096, max_input_len: 16}", "does not fit on any GPU"),
        ("{max_batch_size: 65536, max_seq_len: 65536, max_input_len: 16}", "int32"),
    ],
)
def test_absurd_build_numbers_are_refused(validate, build, message):
    text = f"name: p\nmodel: {{preset: smollm2-135m-instruct}}\ntarget: reference\nbuild:\n  {build}\n"
    refused(validate, text, message)


def test_huge_lookahead_window_is_refused_before_building(validate, model):
    text = spec_for(model, "")
    text = text.replace(
        "  method: lookahead\n",
        "  method: lookahead\n  lookahead: {window: 100000, ngram: 100000, verification_set: 100000}\n",
    )
    refused(validate, text, "does not fit on any GPU")


def test_too_big_for_the_named_gpu_and_for_any_gpu(validate):
    base = "name: p\nmodel: {preset: llama-3.1-70b}\n"
    refused(validate, base + "gpu: {type: l4}\n", "does not fit on l4")
    refused(
        validate,
        base + "build: {max_batch_size: 4096, max_seq_len: 131072, max_input_len: 1024}\n",
        "does not fit on any GPU",
    )


# -- config.json types and values, architectures ---------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_size": "sixty-four"}, "hidden_size must be a whole number, got str 'sixty-four'"),
        ({"num_attention_heads": 4.7}, "num_attention_heads must be a whole number, got float 4.7"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be a whole number"),
        ({"vocab_size": -5}, "vocab_size must be between 1"),
        ({"intermediate_size": 10**12}, "intermediate_size must be between 1"),
        ({"rope_theta": "nan", "rope_parameters": None}, "rope_theta must be a positive finite number, got 'nan'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}}, "rope_theta must be a positive"),
        ({"rms_norm_eps": float("inf")}, "rms_norm_eps must be a positive finite number"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture MistralForCausalLM"),
        ({"architectures": "LlamaForCausalLM"}, "unsupported architecture"),
        ({"rope_scaling": [1, 2], "rope_parameters": None}, "rope_scaling must be an object"),
    ],
)
def test_config_json_types_and_values(validate, model, changes, message):
    edit_config(model, **changes)
    err = refused(validate, spec_for(model), message, str(model / "config.json"))
    assert ".yaml:3:3 model.path:" in err


def test_config_json_that_is_a_list_or_not_json(validate, model):
    (model / "config.json").write_text("[1, 2, 3]")
    refused(validate, spec_for(model), "must be a JSON object")
    (model / "config.json").write_text('{"hidden_size": 64,')
    refused(validate, spec_for(model), "config.json:1:", "not valid JSON")


# -- safetensors headers, readable without the data ------------------------------------------------


def test_truncated_weights_fail_validate(validate, model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    refused(validate, spec_for(model), "truncated safetensors file")


def test_wrong_tensor_shape_fails_validate(validate, model):
    weights = load_file(str(model / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 95)
    save_file(weights, str(model / "model.safetensors"))
    refused(validate, spec_for(model), "model.layers.1.mlp.down_proj.weight: shape [64, 95]")


def test_missing_tensor_and_unsupported_dtype_fail_validate(validate, model):
    weights = load_file(str(model / "model.safetensors"))
    del weights["model.norm.weight"]
    weights["model.layers.0.input_layernorm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(weights, str(model / "model.safetensors"))
    refused(validate, spec_for(model), "model.layers.0.input_layernorm.weight has dtype torch.int32")


def test_tp_that_the_converter_refuses_fails_validate(validate, model):
    refused(validate, spec_for(model, "parallel: {tp: 3}\n"), "parallel.tp")


# -- heads' headers against the base ---------------------------------------------------------------


def test_medusa_heads_of_another_base_fail_validate(validate, model, tmp_path):
    heads = tmp_path / "medusa"
    heads.mkdir()
    tensors = {}
    for head in range(3):
        tensors |= {
            f"{head}.0.linear.weight": torch.zeros(64, 64),
            f"{head}.0.linear.bias": torch.zeros(64),
            f"{head}.1.weight": torch.zeros(97 if head == 0 else 96, 64),
        }
    save_file(tensors, str(heads / "medusa_lm_head.safetensors"))
    text = spec_for(model, "heads:\n  medusa: {path: " + str(heads) + "}\n", method="medusa")
    text = text.replace("  method: medusa\n", "  method: medusa\n  medusa: {choices: chain_3}\n")
    err = refused(validate, text, "tensor 0.1.weight: shape [97, 64]", "different base model")
    assert "heads.medusa.path:" in err


def test_eagle_drafter_of_another_base_fails_validate(validate, model, tmp_path):
    heads = eagle_drafter_dir(tmp_path, fc_shape=(64, 64))
    text = spec_for(model, "heads:\n  eagle: {path: " + str(heads) + "}\n", method="eagle")
    text = text.replace("  method: eagle\n", "  method: eagle\n  eagle: {choices: chain_3}\n")
    assert "heads.eagle.path:" in refused(validate, text, "fc.weight: shape [64, 64]")


# -- tokenizer present and parseable ---------------------------------------------------------------


def test_missing_tokenizer_fails_validate(validate, model):
    (model / "tokenizer.json").unlink()
    refused(validate, spec_for(model), "no tokenizer", "model.path")


def test_corrupt_tokenizer_json_names_line_and_column(validate, model):
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    refused(validate, spec_for(model), "tokenizer.json:1:", "not valid JSON")


def test_tokenizer_json_that_is_json_but_not_a_tokenizer(validate, model):
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    refused(validate, spec_for(model), "tokenizer.json: not a loadable tokenizer")


def test_tokenizer_larger_than_the_vocabulary(validate, model):
    write_tokenizer(model, size=VOCAB + 10)
    refused(validate, spec_for(model), "the tokenizer has 106 tokens but the model's vocab_size is 96")


def test_corrupt_tokenizer_config_and_empty_sentencepiece(validate, model):
    (model / "tokenizer_config.json").write_text("[]")
    refused(validate, spec_for(model), "tokenizer_config.json: tokenizer file must be a JSON object")
    write_tokenizer(model)
    (model / "tokenizer.model").write_bytes(b"")
    refused(validate, spec_for(model), "tokenizer.model: SentencePiece model is empty")


# -- pickle-only base checkpoints on the FP8 path --------------------------------------------------


def test_pickle_only_base_is_refused_on_the_fp8_path(validate, model):
    weights = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    with open(model / "pytorch_model.bin", "wb") as handle:
        pickle.dump({k: v.numpy() for k, v in weights.items()}, handle)
    err = refused(validate, spec_for(model, "quantization: {weights: fp8}\n"), "only pickle weights")
    assert "Traceback" not in err


# -- every problem at once, and nothing written -----------------------------------------------------


def test_every_problem_is_reported_at_once(validate, model):
    (model / "tokenizer.json").unlink()
    err = refused(validate, spec_for(model, "build:\n  extra_flags: {bogus: 1}\n"), "no tokenizer", "bogus")
    assert len(err.splitlines()) == 2


def test_engine_refuses_before_writing_anything(validate, model, tmp_path):
    (model / "tokenizer.json").write_text("{")
    rc, err = validate(spec_for(model), command="engine")
    assert rc == 2 and "tokenizer.json" in err
    assert not (tmp_path / "engines").exists() and not (tmp_path / "triton_repo").exists()


def test_a_config_only_folder_still_plans_before_the_weights_arrive(validate, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    random_llama(0).config.to_json_file(folder / "config.json")
    rc, err = validate(spec_for(folder))
    assert rc == 0, err


def test_shipped_medusa_heads_checked_against_the_base(validate, smollm2_dir, tmp_path):
    import shutil

    from tests.conftest import REPO

    heads = tmp_path / "heads"
    shutil.copytree(REPO / "heads" / "smollm2-medusa", heads)
    text = (
        f"name: m\nmodel: {{builtin: smollm2-135m-instruct, dtype: float32}}\nheads:\n  medusa: {{path: {heads}}}\n"
        "speculative: {medusa: {choices: smollm2_medusa_10}}\ntarget: reference\n"
    )
    rc, err = validate(text)
    assert rc == 0, err
    blocks = load_file(str(heads / "medusa_resblocks.safetensors"))
    blocks["1.0.linear.weight"] = torch.zeros(576, 64)
    save_file(blocks, str(heads / "medusa_resblocks.safetensors"))
    refused(validate, text, "tensor 1.0.linear.weight has shape [576, 64]", "heads.medusa.path")


@pytest.mark.parametrize("name", ["config.json", "medusa_lm_head.safetensors"])
def test_fifo_in_a_heads_folder_fails_validate_without_hanging(validate, model, tmp_path, name):
    import os

    heads = tmp_path / "medusa"
    heads.mkdir()
    save_file(
        {
            "0.0.linear.weight": torch.zeros(64, 64),
            "0.0.linear.bias": torch.zeros(64),
            "0.1.weight": torch.zeros(96, 64),
        },
        str(heads / "medusa_lm_head.safetensors"),
    )
    (heads / name).unlink(missing_ok=True)
    os.mkfifo(heads / name)
    text = spec_for(model, "heads:\n  medusa: {path: " + str(heads) + ", num_heads: 1}\n", method="medusa")
    refused(validate, text, str(heads / name), "FIFO")


def test_fifo_tokenizer_fails_validate_without_hanging(validate, model):
    import os

    (model / "tokenizer.json").unlink()
    os.mkfifo(model / "tokenizer.json")
    refused(validate, spec_for(model), "tokenizer.json", "FIFO")


def test_a_broken_calibration_file_fails_validate_at_its_line(validate, tmp_path):
    data = tmp_path / "calib.jsonl"
    data.write_text('{"text": "fine"}\n{"text": \n')
    text = (
        f"name: p\nmodel: {{preset: llama-3-8b}}\ngpu: {{type: h100-sxm-80gb}}\n"
        f"quantization:\n  weights: fp8\n  calibration: {{data: {data}}}\n"
    )
    err = refused(validate, text, f"{data}:2: not valid JSON")
    assert ".yaml:6:" in err and "quantization.calibration.data" in err
    data.write_text('{"text": "fine"}\n')
    assert validate(text)[0] == 0
