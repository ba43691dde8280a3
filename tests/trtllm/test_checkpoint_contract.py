"""The converter's config.json carries every key TensorRT-LLM 1.2's config classes read without a
default, with the types they need (pipeline/trtllm/checkpoint_fields.json), for plain Llama, Medusa,
EAGLE and FP8 checkpoints, and so does the reference build's engine config.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from trtllm_helpers import PRESET_8B

from pipeline.checkpoint import EagleOptions, MedusaOptions, convert_checkpoint
from pipeline.trtllm.checkpoint_contract import checkpoint_problems, load_contract, type_ok
from pipeline.trtllm.engine_config import predict_engine_config
from tests.checkpoint.conftest import eagle_drafter_dir, modelopt_fp8, random_llama  # noqa: F401 (fixture)
from tests.checkpoint.test_heads import medusa_weights, write_medusa_dir


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "hf"
    random_llama(seed=0).save_pretrained(path)
    return path


@pytest.fixture
def check(tmp_path, plan_text):
    """check(src, **convert kwargs) -> config.json: converted, and it and the engine's pass the contract."""
    variant = plan_text(PRESET_8B)[0]
    counter = iter(range(1000))

    def run(src: Path, *, tp: int = 1, pp: int = 1, dtype: str = "float32", **kw: Any) -> dict[str, Any]:
        out = tmp_path / f"trt{next(counter)}"
        out.mkdir()
        convert_checkpoint(src, out, tp=tp, pp=pp, dtype=dtype, **kw)
        config = json.loads((out / "config.json").read_text())
        assert checkpoint_problems(config) == []
        # The reference build writes predict_engine_config; its pretrained_config is the checkpoint's.
        engine = predict_engine_config(variant, config, output_dir=tmp_path / "engine")
        assert checkpoint_problems(engine["pretrained_config"]) == []
        return config

    return run


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_llama(tiny, check, tp, pp):
    config = check(tiny, tp=tp, pp=pp)
    assert config["architecture"] == "LlamaForCausalLM"
    assert config["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}


def test_medusa(tiny, check, tmp_path):
    heads = write_medusa_dir(tmp_path / "medusa", medusa_weights(64, 96, heads=3, layers=1), "safetensors", None)
    config = check(tiny, tp=2, medusa=MedusaOptions(heads, max_draft_len=15))
    assert config["architecture"] == "MedusaForCausalLM"
    assert (config["num_medusa_heads"], config["num_medusa_layers"], config["max_draft_len"]) == (3, 1, 15)


def test_eagle(tiny, check, tmp_path):
    eagle = EagleOptions(eagle_drafter_dir(tmp_path), num_eagle_layers=2, max_non_leaves_per_layer=4, max_draft_len=20)
    config = check(tiny, tp=2, eagle=eagle)
    assert config["architecture"] == "EagleForCausalLM"
    assert config["eagle_net_config"]["architecture"] == "LlamaForCausalLM"


@pytest.mark.slow  # the session fixture imports ModelOpt (~10 s)
@pytest.mark.parametrize("kv_cache_fp8", [True, False])
def test_fp8(modelopt_fp8, check, kv_cache_fp8):  # noqa: F811 (the fixture imported above)
    config = check(modelopt_fp8.hf_fp8_dir, dtype="bfloat16", kv_cache_fp8=kv_cache_fp8)
    assert config["quantization"]["quant_algo"] == "FP8"
    assert config["quantization"]["kv_cache_quant_algo"] == ("FP8" if kv_cache_fp8 else None)


# Literal configs: each kind of problem is caught.

LLAMA: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "dtype": "bfloat16",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
    "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
}


def edited(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(base)
    for key, value in changes.items():
        if value is _DROP:
            del config[key]
        else:
            config[key] = value
    return config


_DROP = object()
EAGLE = edited(LLAMA, architecture="EagleForCausalLM", eagle_net_config=edited(LLAMA, num_hidden_layers=1))


def test_minimal_configs_pass():
    assert checkpoint_problems(LLAMA) == []
    assert checkpoint_problems(edited(LLAMA, architecture="MedusaForCausalLM")) == []
    assert checkpoint_problems(EAGLE) == []
    fp8 = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    assert checkpoint_problems(edited(LLAMA, quantization=fp8)) == []
    assert checkpoint_problems(edited(LLAMA, mapping=None, quantization=None)) == []  # both defaulted


@pytest.mark.parametrize("key", ["architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads"])
def test_missing_required_key(key):
    (problem,) = checkpoint_problems(edited(LLAMA, **{key: _DROP}))
    assert problem.startswith(f"{key}: missing;") and "PretrainedConfig" in problem and "0c8de69a1c" in problem


@pytest.mark.parametrize(
    "key,value",
    [("hidden_size", "64"), ("num_hidden_layers", 2.0), ("num_attention_heads", True), ("dtype", None)],
)
def test_wrong_type(key, value):
    (problem,) = checkpoint_problems(edited(LLAMA, **{key: value}))
    assert problem.startswith(f"{key}: {value!r} is not ")


def test_wrong_type_of_optional_keys():
    problems = checkpoint_problems(edited(LLAMA, rotary_base="10000", vocab_size=96.0, rotary_scaling=["llama3"]))
    assert sorted(p.split(":")[0] for p in problems) == ["rotary_base", "rotary_scaling", "vocab_size"]


def test_eagle_net_config():
    (problem,) = checkpoint_problems(edited(EAGLE, eagle_net_config=_DROP))
    assert problem.startswith("eagle_net_config: missing;") and "EagleConfig" in problem
    net = edited(EAGLE["eagle_net_config"], hidden_size=_DROP, num_attention_heads="4")
    assert checkpoint_problems(edited(EAGLE, eagle_net_config=net)) == [
        "eagle_net_config.hidden_size: missing; PretrainedConfig, tensorrt_llm/models/modeling_utils.py @ "
        "0c8de69a1c reads it with no default",
        "eagle_net_config.num_attention_heads: '4' is not int (PretrainedConfig, tensorrt_llm/models/"
        "modeling_utils.py @ 0c8de69a1c)",
    ]
    (problem,) = checkpoint_problems(edited(EAGLE, eagle_net_config="LlamaForCausalLM"))
    assert problem.startswith("eagle_net_config: 'LlamaForCausalLM' is not dict")


def test_medusa_and_eagle_counts_must_be_ints():
    medusa = edited(LLAMA, architecture="MedusaForCausalLM", num_medusa_heads="4", max_draft_len=None)
    assert [p.split(":")[0] for p in checkpoint_problems(medusa)] == ["num_medusa_heads", "max_draft_len"]
    (problem,) = checkpoint_problems(edited(EAGLE, num_eagle_layers=1.5))
    assert problem.startswith("num_eagle_layers: 1.5 is not int (EagleConfig")


def test_architecture_must_be_a_known_one():
    (problem,) = checkpoint_problems(edited(LLAMA, architecture="LLaMAForCausalLM"))
    assert "'LLaMAForCausalLM' is none of LlamaForCausalLM" in problem


def test_sections_are_closed_and_mapping_consistent():
    quantization = {"quant_algo": None, "kv_cache_quant_algo": None, "quant_mode": 0}
    (problem,) = checkpoint_problems(edited(LLAMA, quantization=quantization))
    assert problem.startswith("quantization.quant_mode: not a field of QuantConfig")
    (problem,) = checkpoint_problems(edited(LLAMA, mapping={"tp_size": 2, "pp_size": 1}))  # world_size defaults to 1
    assert problem == "mapping: world_size 1 != tp_size 2 * pp_size 1 * cp_size 1 (Mapping raises)"
    (problem,) = checkpoint_problems(edited(LLAMA, mapping={"world_size": 1, "tp": 2}))
    assert problem.startswith("mapping.tp: not a field of Mapping")
    (problem,) = checkpoint_problems(edited(LLAMA, mapping=[2, 1]))
    assert problem.startswith("mapping: [2, 1] is not dict|null")


def test_fp8_fields():
    bad_kv = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP16"}
    (problem,) = checkpoint_problems(edited(LLAMA, quantization=bad_kv))
    assert problem.startswith("quantization.kv_cache_quant_algo: 'FP16' is none of [None, 'FP8', 'INT8', 'NVFP4']")
    (problem,) = checkpoint_problems(edited(LLAMA, quantization={"quant_algo": "FP8", "exclude_modules": "lm_head"}))
    assert problem.startswith("quantization.exclude_modules: 'lm_head' is not list|null")


def test_type_ok_keeps_bools_out_of_numbers():
    assert type_ok(3, "float") and type_ok(3, "int") and type_ok(None, "int|null")
    assert not type_ok(True, "int") and not type_ok(False, "float") and not type_ok(1.0, "int")


def test_table_is_consistent():
    contract = load_contract()
    for arch, names in contract.architectures.items():
        assert names[0] == "PretrainedConfig" and set(names) <= set(contract.classes), arch
    for cls in contract.classes.values():
        assert len(cls.commit) == 40 and cls.file.startswith("tensorrt_llm/")
        assert not set(cls.required) & set(cls.optional), cls.name
        for spec in [*cls.required.values(), *cls.optional.values()]:
            type_ok(None, spec)  # every type name is known (KeyError otherwise)
