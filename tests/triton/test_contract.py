"""Every emitted config.pbtxt declares NVIDIA's contract (pipeline/triton/contract.py), field by field.

For each example spec's variants (Medusa, EAGLE, Lookahead) and a plain ``method: none`` one, the
repository the package stage writes is parsed back with Triton's schema and compared with the
table: every contract tensor with its data type, dims, optional flag, reshape and ragged flag;
nothing else but specdeploy's listed extensions; the ensemble's wiring a superset of NVIDIA's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from triton_fixtures import fake_engine, plan_spec, tiny_plan, triton_specs
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.triton import contract
from pipeline.triton.configs import BLS, BLS_STEPS_PARAMETER
from pipeline.triton.pbtxt import DTYPES
from pipeline.triton.repository import emit_repository, model_steps

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPECS = triton_specs()
NONE_SPEC = """
name: plain
model: {path: model, dtype: float32}
speculative: {method: none}
build: {max_batch_size: 4, max_input_len: 32, max_seq_len: 96, max_num_tokens: 128}
serving: {decoupled: false, model_name: chat}
target: reference
"""


def _load(repo: Path) -> dict[str, mc.ModelConfig]:
    return {
        path.parent.name: text_format.Parse(path.read_text(), mc.ModelConfig())
        for path in sorted(repo.glob("*/config.pbtxt"))
    }


def _fields(tensor, is_input: bool) -> dict:
    fields = {"data_type": tensor.data_type, "dims": list(tensor.dims)}
    if is_input:
        fields.update(
            optional=tensor.optional,
            ragged=tensor.allow_ragged_batch,
            reshape=list(tensor.reshape.shape) if tensor.HasField("reshape") else None,
        )
    return fields


def _expected(tensor: contract.Tensor, is_input: bool, dtype: str) -> dict:
    # lora_weights in the engine's dtype: FP32 for a float32 engine, NVIDIA's FP16 otherwise.
    variables = {contract.LORA_WEIGHTS: "FP32" if dtype == "float32" else "FP16"}
    fields = {"data_type": DTYPES[contract.data_type(tensor, variables)], "dims": list(tensor.dims)}
    if is_input:
        fields.update(
            optional=tensor.optional,
            ragged=tensor.ragged,
            reshape=None if tensor.reshape is None else list(tensor.reshape),
        )
    return fields


# A LoRA engine's models without serving.lora_client_adapters: a client's own adapter is refused by Triton.
CLIENT_ADAPTER_INPUTS = frozenset({"lora_weights", "lora_config"})


def check_contract(
    configs: dict[str, mc.ModelConfig],
    ensemble_name: str,
    lookahead: bool,
    dtype: str,
    withheld: frozenset[str] = frozenset(),
) -> None:
    for model, (inputs, outputs) in contract.CONTRACT.items():
        config = configs[ensemble_name if model == "ensemble" else model]
        extra_inputs, extra_outputs = contract.extensions(model, lookahead)
        for declared, table, extra, is_input in (
            (config.input, inputs, extra_inputs, True),
            (config.output, outputs, extra_outputs, False),
        ):
            names = [t.name for t in declared]
            assert len(names) == len(set(names)), f"{model}: a tensor is declared twice"
            emitted = {t.name: _fields(t, is_input) for t in declared}
            wanted = {t.name: _expected(t, is_input, dtype) for t in table + extra if t.name not in withheld}
            assert set(emitted) == set(wanted), (model, set(emitted) ^ set(wanted))
            for name, fields in wanted.items():
                assert emitted[name] == fields, f"{model}.{name}: emitted {emitted[name]}, contract {fields}"


def check_wiring(ensemble: mc.ModelConfig, withheld: frozenset[str] = frozenset()) -> None:
    steps = {model: (inputs, outputs) for model, inputs, outputs in model_steps(ensemble, Path("repo"))}
    assert list(steps) == ["preprocessing", "tensorrt_llm", "postprocessing"]
    nvidia = {
        "preprocessing": (contract.PREPROCESSING_STEP_INPUTS, contract.PREPROCESSING_STEP_OUTPUTS),
        "tensorrt_llm": (
            {k: v for k, v in contract.TENSORRT_LLM_STEP_INPUTS.items() if k not in withheld},
            contract.TENSORRT_LLM_STEP_OUTPUTS,
        ),
        "postprocessing": (contract.POSTPROCESSING_STEP_INPUTS, contract.POSTPROCESSING_STEP_OUTPUTS),
    }
    for model, (inputs, outputs) in nvidia.items():
        assert inputs.items() <= steps[model][0].items(), model
        assert outputs.items() <= steps[model][1].items(), model
    # Every declared client input reaches a model, every declared output comes from one.
    consumed = {outer for inputs, _ in steps.values() for outer in inputs.values()}
    produced = {outer for _, outputs in steps.values() for outer in outputs.values()}
    assert {t.name for t in ensemble.input} <= consumed
    assert {t.name for t in ensemble.output} <= produced


def check_bls(configs: dict[str, mc.ModelConfig]) -> None:
    bls = configs[BLS]
    assert bls.backend == "python"
    assert bls.model_transaction_policy.decoupled is configs["tensorrt_llm"].model_transaction_policy.decoupled
    steps = json.loads(bls.parameters[BLS_STEPS_PARAMETER].string_value)
    assert [step["model"] for step in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    inputs = {t.name for t in bls.input}
    for step in steps:
        model_inputs = {t.name for t in configs[step["model"]].input}
        assert set(step["inputs"]) <= model_inputs
        assert all(outer.startswith("_") or outer in inputs for outer in step["inputs"].values())
    assert {
        "accumulate_tokens",
        "tensorrt_llm_model_name",
        "tensorrt_llm_draft_model_name",
        "multimodal_encoders_name",
    } <= set(bls.parameters)


def _emit(variant, folder: Path) -> dict[str, mc.ModelConfig]:
    engine = fake_engine(variant, folder / "engine")
    emit_repository(variant, folder / "repo", engine_dir=engine, tokenizer_dir=variant.model_dir)
    return _load(folder / "repo")


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=[p.stem for p in EXAMPLE_SPECS])
def test_example_spec_repositories_declare_the_contract(spec, tmp_path, tokenizer_dir):
    for variant in plan_spec(spec, tmp_path).variants:
        folder = tmp_path / variant.name
        engine = fake_engine(variant, folder / "engine")
        emit_repository(variant, folder / "repo", engine_dir=engine, tokenizer_dir=tokenizer_dir)
        configs = _load(folder / "repo")
        lookahead = variant.speculative.lookahead is not None
        lora_engine = "lora" in variant.stage("package").params
        assert not (lora_engine and variant.serving.lora_client_adapters)  # the shipped specs keep them off
        withheld = CLIENT_ADAPTER_INPUTS if lora_engine else frozenset()
        check_contract(configs, variant.serving.model_name, lookahead, variant.build.dtype, withheld)
        check_wiring(configs[variant.serving.model_name], withheld)
        check_bls(configs)


def test_plain_non_decoupled_repository_declares_the_contract(tmp_path):
    variant = tiny_plan(tmp_path, NONE_SPEC)
    configs = _emit(variant, tmp_path)
    check_contract(configs, "chat", lookahead=False, dtype="float32")
    check_wiring(configs["chat"])
    check_bls(configs)
    assert configs[BLS].model_transaction_policy.decoupled is False


def test_the_checks_fail_on_a_config_that_strays_from_the_contract(tmp_path):
    """The comparison is field by field: one dropped reshape or one wrong dtype is reported."""
    variant = tiny_plan(tmp_path)
    configs = _emit(variant, tmp_path)
    check_contract(configs, "ensemble", lookahead=True, dtype=variant.build.dtype)
    beam = next(t for t in configs["tensorrt_llm"].input if t.name == "beam_width")
    beam.ClearField("reshape")
    with pytest.raises(AssertionError, match="beam_width"):
        check_contract(configs, "ensemble", lookahead=True, dtype=variant.build.dtype)
    beam.reshape.SetInParent()
    output = next(t for t in configs["ensemble"].output if t.name == "batch_index")
    output.data_type = mc.TYPE_INT64
    with pytest.raises(AssertionError, match="batch_index"):
        check_contract(configs, "ensemble", lookahead=True, dtype=variant.build.dtype)


def test_table_names_what_the_clients_send():
    """The tensors the issue's clients send or read, by name (a typo in the table would break them)."""
    llm_inputs = {t.name for t in contract.TENSORRT_LLM_INPUTS}
    assert {
        "beam_width",
        "num_return_sequences",
        "return_context_logits",
        "return_generation_logits",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "decoder_input_ids",
        "embedding_bias",
        *contract.LOOKAHEAD_CLIENT_INPUTS,
    } <= llm_inputs
    ensemble_inputs = {t.name for t in contract.ENSEMBLE_INPUTS}
    assert {"embedding_bias_words", "embedding_bias_weights", "beam_width"} <= ensemble_inputs
    for outputs in (contract.ENSEMBLE_OUTPUTS, contract.TENSORRT_LLM_OUTPUTS):
        assert {
            "batch_index",
            "sequence_index",
            "context_logits",
            "generation_logits",
            "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks",
        } <= {t.name for t in outputs}
    assert len(contract.TENSORRT_LLM_INPUTS) == 62 and len(contract.TENSORRT_LLM_OUTPUTS) == 21
    assert len(contract.ENSEMBLE_INPUTS) == 36 and len(contract.ENSEMBLE_OUTPUTS) == 19
    assert len(contract.BLS_INPUTS) == 42 and len(contract.PREPROCESSING_OUTPUTS) == 20
