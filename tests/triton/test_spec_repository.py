"""The whole-spec repository triton_repo/<spec>/: every variant of a spec in one repository, one server.

Fast tests on a tiny model with fake engines: the model names, which pre/postprocessing models are
shared, the variants' own parameters, the GPU placement written into a tensorrt fleet's configs, and
the plan's naming rules. The slow test serves three real SmolLM2 variants from one tritonserver.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from triton_fixtures import fake_engine, make_model_dir, plan_spec

from pipeline.errors import InputError
from pipeline.fleet.placement import place_fleet
from pipeline.plan.types import Plan
from pipeline.stages.execute import execute_spec_repository
from pipeline.triton import pbtxt
from pipeline.triton.launch_gpu import gpu_spec_launch_argv
from pipeline.triton.repository import MANIFEST, emit_repository, model_steps, stale_models, validate_repository
from pipeline.triton.spec_repository import emit_spec_repository

FLEET = """
name: tiny-fleet
model: {path: model, dtype: float32}
speculative:
  method: lookahead
  lookahead: {window: 3, ngram: 2, verification_set: 2}
build: {max_batch_size: 8, max_input_len: 32, max_seq_len: 160, max_num_tokens: 256}
target: reference
variants:
  - name: a
  - name: b                 # the same Lookahead bounds as a: shares a's preprocessing
  - name: c                 # other bounds: its own preprocessing (it fills and bounds (w, n, g))
    speculative:
      lookahead: {window: 2, ngram: 2, verification_set: 1}
  - name: plain
    speculative: {method: none}
"""


def _packaged_plan(folder: Path, text: str = FLEET) -> Plan:
    """The plan, with every variant's own repository packaged (fake engines, the tiny tokenizer)."""
    make_model_dir(folder / "model")
    (folder / "spec.yaml").write_text(textwrap.dedent(text).lstrip())
    plan = plan_spec(folder / "spec.yaml", folder)
    for variant in plan.variants:
        engine = fake_engine(variant)
        package = variant.stage("package")
        emit_repository(variant, package.output, engine_dir=engine, tokenizer_dir=package.inputs["tokenizer"])
    return plan


def _params(config: pbtxt.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def test_every_variant_gets_its_own_models_and_shares_identical_ones(tmp_path):
    plan = _packaged_plan(tmp_path)
    assert plan.repository is not None and plan.repository.output == tmp_path / "triton_repo" / "tiny-fleet"
    out = tmp_path / "spec-repo"
    configs = emit_spec_repository(plan, out)
    assert configs == validate_repository(out)  # parses back, every ensemble wired
    assert set(configs) == {
        *("a", "b", "c", "plain"),  # the ensembles, named after the variants
        *(f"{v}-tensorrt_llm" for v in ("a", "b", "c", "plain")),
        *(f"{v}-tensorrt_llm_bls" for v in ("a", "b", "c", "plain")),
        "a-preprocessing",  # a and b (same Lookahead bounds)
        "c-preprocessing",
        "plain-preprocessing",  # no Lookahead inputs at all
        "postprocessing",  # one tokenizer: one postprocessing for all
    }
    steps = {v: [model for model, _, _ in model_steps(configs[v], out)] for v in ("a", "b", "c", "plain")}
    assert steps["a"] == ["a-preprocessing", "a-tensorrt_llm", "postprocessing"]
    assert steps["b"] == ["a-preprocessing", "b-tensorrt_llm", "postprocessing"]
    assert steps["c"] == ["c-preprocessing", "c-tensorrt_llm", "postprocessing"]
    # Each tensorrt_llm model is its variant's: its own engine and speculative parameters.
    for variant in plan.variants:
        llm = _params(configs[f"{variant.name}-tensorrt_llm"])
        assert llm["gpt_model_path"] == f"/models/engines/{variant.name}/engine"  # under deploy.mount_path
        look = variant.speculative.lookahead
        assert llm.get("lookahead_window_size") == (str(look.window) if look else None)
        bls = _params(configs[f"{variant.name}-tensorrt_llm_bls"])
        assert bls["tensorrt_llm_model_name"] == f"{variant.name}-tensorrt_llm"
        assert [s["model"] for s in json.loads(bls["specdeploy_steps"])] == steps[variant.name]
    assert _params(configs["c-preprocessing"])["lookahead_window_size"] == "2"
    for model in ("a-preprocessing", "c-preprocessing", "plain-preprocessing", "postprocessing"):
        assert (out / model / "tokenizer" / "tokenizer.json").is_file()
        assert (out / model / "1" / "model.py").is_file()
    assert stale_models(out) == []
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["spec"] == "tiny-fleet"
    assert [(e["variant"], e["models"]["preprocessing"]) for e in manifest["variants"]] == [
        ("a", "a-preprocessing"),
        ("b", "a-preprocessing"),
        ("c", "c-preprocessing"),
        ("plain", "plain-preprocessing"),
    ]


def test_one_preprocessing_when_every_variant_has_the_same(tmp_path):
    text = FLEET.split("  - name: c")[0]  # a and b only
    configs = emit_spec_repository(_packaged_plan(tmp_path, text), tmp_path / "out")
    assert {"preprocessing", "postprocessing"} <= set(configs)
    assert model_steps(configs["b"], tmp_path / "out")[0][0] == "preprocessing"


def test_the_spec_repository_runs_after_all_variants_and_skips_when_up_to_date(tmp_path):
    plan = _packaged_plan(tmp_path)
    said: list[str] = []
    assert execute_spec_repository(plan, {"a", "b"}, say=said.append) is None
    assert "c, plain not packaged in this run" in said[-1]
    everything = {variant.name for variant in plan.variants}
    assert execute_spec_repository(plan, everything, say=said.append).status == "ran"
    assert execute_spec_repository(plan, everything, say=said.append).status == "skipped"
    validate_repository(plan.repository.output)


def test_a_spec_of_one_variant_has_no_spec_repository(tmp_path):
    plan = _packaged_plan(tmp_path, FLEET.split("variants:")[0])
    assert plan.repository is None


@pytest.mark.parametrize(
    "name,message",
    [
        ("tiny-fleet", "a variant named like the spec collides with the spec's repository"),
        ("preprocessing", "'preprocessing' is a model name of the spec's repository"),
        ("x-tensorrt_llm", "'x-tensorrt_llm' is a model name of the spec's repository"),
    ],
)
def test_variant_names_that_would_collide_are_refused_at_plan_time(tmp_path, name, message):
    text = FLEET.replace("  - name: b ", f"  - name: {name} ")
    with pytest.raises(InputError, match=message) as error:
        _packaged_plan(tmp_path, text)
    assert "spec.yaml:" in str(error.value)  # located in the spec


GPU_FLEET = """
name: gpu-fleet
model: {preset: llama-3.1-8b}
gpu: {type: h100-sxm-80gb, count: 2}
build: {max_batch_size: 8, max_input_len: 2048, max_seq_len: 4096}
variants:
  - name: chat
  - name: code
  - name: wide
    parallel: {tp: 2}
"""


def test_a_gpu_fleet_is_placed_and_its_kv_caches_add_up(tmp_path):
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(GPU_FLEET).lstrip())
    plan = plan_spec(tmp_path / "spec.yaml", tmp_path)
    make_model_dir(tmp_path / "tokenizer")
    for variant in plan.variants:  # a preset has no tokenizer: package with the tiny one
        engine = fake_engine(variant)
        emit_repository(
            variant, variant.stage("package").output, engine_dir=engine, tokenizer_dir=tmp_path / "tokenizer"
        )
    configs = emit_spec_repository(plan, tmp_path / "out")
    placement = place_fleet(plan)
    for instance in placement.instances:
        llm = _params(configs[f"{instance.variant}-tensorrt_llm"])
        assert llm["gpu_device_ids"] == ",".join(str(i) for i in instance.gpus)
        assert int(llm["max_tokens_in_paged_kv_cache"]) == instance.max_tokens_in_paged_kv_cache > 0
    assert _params(configs["wide-tensorrt_llm"])["gpu_device_ids"] == "0,1"
    for gpu in range(2):  # what the limits allow fits every GPU
        assert placement.used_gib(gpu) <= placement.usable_gib
    argv = gpu_spec_launch_argv(plan, plan.variants[0], tmp_path / "out")
    assert argv[:3] == ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1"]
    assert argv.count("-n") == 1  # one tritonserver: the backend spawns every variant's ranks
    assert {"--cuda-memory-pool-byte-size=0:0", "--cuda-memory-pool-byte-size=1:0"} <= set(argv)


def test_a_gpu_fleet_that_does_not_fit_names_each_gpu(tmp_path):
    text = GPU_FLEET.replace("count: 2", "count: 1").replace("    parallel: {tp: 2}\n", "")
    text = text.replace("max_batch_size: 8", "max_batch_size: 64")
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(text).lstrip())
    plan = plan_spec(tmp_path / "spec.yaml", tmp_path)
    with pytest.raises(InputError, match=r"GPU 0 \(.*over by"):
        emit_spec_repository(plan, tmp_path / "out")


def test_engine_skips_the_spec_repository_of_variants_that_cannot_share_their_gpus(tmp_path):
    """Each variant still gets its repository and server; the run says why there is no shared one."""
    text = GPU_FLEET.replace("count: 2", "count: 1").replace("    parallel: {tp: 2}\n", "")
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(text.replace("max_batch_size: 8", "max_batch_size: 64")))
    plan = plan_spec(tmp_path / "spec.yaml", tmp_path)
    said: list[str] = []
    assert execute_spec_repository(plan, {v.name for v in plan.variants}, say=said.append) is None
    assert "whole-spec repository not written: GPU 0 (" in said[-1] and not plan.repository.output.exists()
