"""``serving.lora_client_adapters`` holds on a GPU too: a LoRA engine's models declare a client's own
adapter (``lora_weights``, ``lora_config``) only when the spec allows it, so Triton itself refuses one
before any backend sees it.

TensorRT-LLM 1.2.1's LoRA cache evicts its least recently used adapters, the prefetched ones included
(loraCache.cpp), and its backend has no setting to refuse adapters from clients: the config is the only
place the refusal can live on a GPU. The refusal by a running tritonserver is in test_lora_triton.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.spec.document import load_spec
from pipeline.triton import contract, pbtxt
from pipeline.triton.repository import emit_repository
from tests.lora.helpers import make_adapter
from tests.runtime.fixtures import make_hf_model
from tests.triton.triton_fixtures import fake_engine, make_tokenizer

peft = pytest.importorskip("peft")

ADAPTER_INPUTS = {"lora_weights", "lora_config"}
MODELS = ("ensemble", "tensorrt_llm", "tensorrt_llm_bls")  # the three NVIDIA declares them on


def lora_plan(root: Path, base_serving: str) -> Plan:
    """A float16 LoRA group for the GPU (target tensorrt): ``base`` and one shared fine-tune ``qv``."""
    from transformers import LlamaForCausalLM

    hf = make_hf_model(root / "hf")
    make_adapter(LlamaForCausalLM.from_pretrained(hf).eval(), root / "qv", 1, r=4, target_modules=["q_proj", "v_proj"])
    spec = root / "spec.yaml"
    spec.write_text(
        f"name: tenants\nmodel: {{path: {hf}, dtype: float16}}\ntarget: tensorrt\n"
        "build: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
        f"variants:\n  - name: base\n    serving: {base_serving}\n"
        f"  - name: qv\n    model: {{adapter: {root / 'qv'}}}\n    serving: {{lora: shared}}\n"
    )
    return make_plan(load_spec(spec), OutputRoots(root / "engines", root / "triton_repo", root / "cache"))


def declared_adapter_inputs(plan: Plan, root: Path) -> dict[str, dict[str, set[str]]]:
    """Variant -> model -> which of ADAPTER_INPUTS its packaged config declares."""
    tokenizer = make_tokenizer(root / "tokenizer")
    found = {}
    for variant in plan.variants:
        package = variant.stage("package")
        engine = fake_engine(variant, package.inputs["engine"])
        repo = root / "packaged" / variant.name
        emit_repository(
            variant, repo, engine_dir=engine, tokenizer_dir=tokenizer, lora_task_id=package.params.get("lora_task_id")
        )
        found[variant.name] = {
            model: {t.name for t in pbtxt.load(repo / model / "config.pbtxt").input} & ADAPTER_INPUTS
            for model in MODELS
        }
    return found


def test_nvidia_declares_the_withheld_inputs_optional():
    """What makes withholding them safe: NVIDIA's templates mark both optional on every model that has them
    (triton_backend/all_models/inflight_batcher_llm/{tensorrt_llm,ensemble,tensorrt_llm_bls}/config.pbtxt,
    tensorrt_llm's at commit 0c8de69a1ca6213eebb20a51873890ff128666c2: pipeline/triton/contract.py), so the
    backend reads them only when a request carries them, and a request without them is NVIDIA's own."""
    for model in MODELS:
        withheld = [t for t in contract.CONTRACT[model][0] if t.name in ADAPTER_INPUTS]
        assert {t.name for t in withheld} == ADAPTER_INPUTS and all(t.optional for t in withheld), model


def test_by_default_no_model_of_a_lora_engine_takes_a_clients_adapter(tmp_path):
    plan = lora_plan(tmp_path, "{}")
    found = declared_adapter_inputs(plan, tmp_path)
    assert found == {name: {model: set() for model in MODELS} for name in ("base", "qv")}
    # The deployed fine-tune is still reached by its task id alone (prefetched from lora_prefetch_dir).
    ensemble = pbtxt.load(tmp_path / "packaged" / "base" / "ensemble" / "config.pbtxt")
    assert "lora_task_id" in {t.name for t in ensemble.input}


def test_allowed_on_the_engines_variant_its_models_take_one_and_the_fine_tunes_still_do_not(tmp_path):
    plan = lora_plan(tmp_path, "{lora_client_adapters: true}")
    found = declared_adapter_inputs(plan, tmp_path)
    assert found["base"] == {model: ADAPTER_INPUTS for model in MODELS}
    # A fine-tune's models set its own task id: a client's weights there would replace its adapter.
    assert found["qv"] == {model: set() for model in MODELS}


def test_the_setting_where_it_opens_no_server_is_said(tmp_path):
    """Only a LoRA group's base opens the group's server to clients' adapters; set elsewhere, the plan says so."""
    note = "serving.lora_client_adapters: true does nothing here"
    on = "{lora_client_adapters: true}"
    plan = lora_plan(tmp_path / "base", on)  # on the base: it holds, nothing to say
    assert not [n for v in plan.variants for n in v.notes if note in n]
    plan = lora_plan(tmp_path / "member", "{}")  # the same on the fine-tune alone
    spec = Path(plan.spec_file)
    spec.write_text(
        spec.read_text().replace("serving: {lora: shared}", "serving: {lora: shared, lora_client_adapters: true}")
    )
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")
    notes = {v.name: [n for n in v.notes if note in n] for v in make_plan(load_spec(spec), roots).variants}
    assert notes == {"base": [], "qv": [f"{note}: its LoRA group's server is variant base's: set it there"]}
    spec.write_text(spec.read_text().replace("lora: shared, lora_client_adapters: true", "lora: merged"))
    spec.write_text(spec.read_text().replace("serving: {}", f"serving: {on}"))  # on the base, but no group
    (base, _) = make_plan(load_spec(spec), roots).variants
    assert [n for n in base.notes if note in n] == [
        f"{note}: no LoRA engine serves this variant"
        + (" (it opens a serving.lora: shared group's server, set on the group's base)")
    ]
