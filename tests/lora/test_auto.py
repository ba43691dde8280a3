"""serving.lora auto on GPUs: the planner's choice per fine-tune (pipeline/lora/auto.py) on small fleets
whose optimum is known, the shipped Llama-3.1-8B fleet of 24 adapters, and what the plan and manifest say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.io.hashing import HashCache
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.release.manifest import write_manifest
from pipeline.spec.document import load_spec
from tests.lora.helpers import make_adapter
from tests.runtime.fixtures import make_hf_model

peft = pytest.importorskip("peft")
SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.fixture(scope="module")
def tiny(module_tmp):
    from transformers import LlamaForCausalLM

    root = module_tmp("lora-auto")
    model = LlamaForCausalLM.from_pretrained(make_hf_model(root / "hf")).eval()
    make_adapter(model, root / "qv4", 1, r=4, target_modules=["q_proj", "v_proj"])
    make_adapter(
        model,
        root / "all16",
        2,
        r=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    return root


def gpu_plan(write_spec, tmp_path, root, variants: str, dtype: str = "float16", base: str = ""):
    spec = write_spec(
        f"""
        name: fleet
        model: {{path: {root / "hf"}, dtype: {dtype}}}
        build: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
        target: tensorrt
        gpu: {{type: l40s, count: 1}}
        variants:
          - name: base"""
        + base
        + "\n"
        + variants
    )
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))


def decision_of(plan, name: str) -> dict:
    return json.loads(plan.to_json())["lora_decisions"][0]["variants"][name]


def test_a_fine_tune_whose_merged_engine_is_faster_and_fits_is_merged(tiny, write_spec, tmp_path):
    # a tiny model on an L40S: a merged engine with Lookahead costs MiB, and beats the shared engine's <= 1x
    plan = gpu_plan(
        write_spec, tmp_path, tiny, f"\n          - name: qv\n            model: {{adapter: {tiny / 'qv4'}}}\n"
    )
    assert plan.lora_groups == ()
    chosen = decision_of(plan, "qv")
    assert chosen["choice"] == "merged" and chosen["method"] == "lookahead"
    assert chosen["predicted_speedup"] > 1.0 and chosen["reason"].startswith("merged: lookahead")
    assert "acceptance length 1.63 assumed (published median)" in chosen["reason"]
    assert [s.name for s in next(v for v in plan.variants if v.name == "qv").stages][0] == "merge"


def test_on_a_bfloat16_gpu_engine_every_auto_fine_tune_is_merged(tiny, write_spec, tmp_path):
    # TensorRT-LLM 1.2.1 serves no adapters to a bfloat16 engine (numpy files have no bfloat16), so the
    # traffic-free fine-tune that would share on float16 (as `idle` does in the next test) is merged.
    fine_tune = (
        f"\n          - name: qv\n            model: {{adapter: {tiny / 'qv4'}}}\n            traffic: {{share: 0}}\n"
    )
    plan = gpu_plan(write_spec, tmp_path, tiny, fine_tune, dtype="bfloat16")
    assert plan.lora_groups == ()
    chosen = decision_of(plan, "qv")
    assert chosen["choice"] == "merged"
    assert chosen["reason"] == "merged: TensorRT-LLM 1.2.1 serves no adapters to a bfloat16 engine"
    assert "set model.dtype: float16" in json.loads(plan.to_json())["lora_decisions"][0]["rule"]


def test_shared_on_a_bfloat16_gpu_engine_is_refused_at_its_line(tiny, write_spec, tmp_path):
    adapter = tiny / "qv4"
    fine_tune = f"\n          - name: qv\n            model: {{adapter: {adapter}}}\n"
    fine_tune += "            serving: {lora: shared}\n"
    with pytest.raises(InputError) as err:
        gpu_plan(write_spec, tmp_path, tiny, fine_tune, dtype="bfloat16")
    assert "[variant qv]" in str(err.value) and "serving.lora: shared on a bfloat16 engine" in str(err.value)
    assert "set model.dtype: float16" in str(err.value)


def test_a_fine_tune_without_traffic_shares_the_engine(tiny, write_spec, tmp_path):
    adapter = tiny / "qv4"
    plan = gpu_plan(
        write_spec,
        tmp_path,
        tiny,
        f"""
          - name: busy
            model: {{adapter: {adapter}}}
          - name: idle
            model: {{adapter: {adapter}}}
            traffic: {{share: 0}}
""",
    )
    assert decision_of(plan, "busy")["choice"] == "merged"
    idle = decision_of(plan, "idle")
    assert idle["choice"] == "shared" and "traffic share 0" in idle["reason"] and idle["traffic_share"] == 0
    (group,) = plan.lora_groups
    assert [m.variant for m in group.members] == ["idle"]


def test_the_decision_charges_the_cache_the_group_gets(tiny, write_spec, tmp_path):
    # rank 4 on q,v beside rank 16 on every projection: the group's cache holds min(2, max_batch_size 4)
    # slots of the largest (rank 16 on the union of modules), so each shared fine-tune is charged one
    # such slot, not its own adapter's bytes (which would under-count the cache by the rank-4 one's gap)
    fine_tunes = f"""
          - name: small
            model: {{adapter: {tiny / "qv4"}}}
            traffic: {{share: 0}}
          - name: large
            model: {{adapter: {tiny / "all16"}}}
            serving: {{lora: shared}}
"""
    plan = gpu_plan(write_spec, tmp_path, tiny, fine_tunes)
    (group,) = plan.lora_groups
    assert sorted(m.variant for m in group.members) == ["large", "small"]
    small, large = sorted(group.members, key=lambda m: m.rank)
    assert small.bytes_per_gpu < large.bytes_per_gpu == group.cache.max_adapter_bytes
    assert group.cache.gpu_bytes == 2 * large.bytes_per_gpu
    (decision,) = plan.lora_decisions
    base = next(v for v in plan.variants if v.name == "base")  # the group's engine, with its LoRA cache
    assert decision.decision.used_gib[0] == pytest.approx(base.memory.total_gib, rel=1e-9)
    assert {c.name: c.memory_gib[0] for c in decision.choices} == pytest.approx(
        {"small": group.cache.max_adapter_bytes / 2**30, "large": group.cache.max_adapter_bytes / 2**30}
    )


def test_a_base_with_its_own_method_keeps_it_and_its_fine_tunes_merge(tiny, write_spec, tmp_path):
    # the LoRA engine is the base's engine and decodes plainly: a base asking for Lookahead cannot be it,
    # so even a traffic-free fine-tune (which would share, as `idle` does above) gets an engine of its own
    fine_tune = f"""
          - name: idle
            model: {{adapter: {tiny / "qv4"}}}
            traffic: {{share: 0}}
"""
    plan = gpu_plan(write_spec, tmp_path, tiny, fine_tune, base="\n            speculative: {method: lookahead}")
    assert plan.lora_groups == ()
    base = next(v for v in plan.variants if v.name == "base")
    assert base.speculative.method == "lookahead"
    idle = decision_of(plan, "idle")
    assert (
        idle["choice"] == "merged" and idle["reason"] == "merged: the base's engine runs lookahead, a LoRA engine none"
    )
    assert (
        "set the base's speculative.method to auto or none" in json.loads(plan.to_json())["lora_decisions"][0]["rule"]
    )


def test_fixed_choices_are_kept_and_weighed(tiny, write_spec, tmp_path):
    adapter = tiny / "qv4"
    plan = gpu_plan(
        write_spec,
        tmp_path,
        tiny,
        f"""
          - name: pinned
            model: {{adapter: {adapter}}}
            serving: {{lora: shared}}
          - name: free
            model: {{adapter: {adapter}}}
""",
    )
    assert decision_of(plan, "pinned")["reason"] == "shared (serving.lora: shared): " + (
        f"{decision_of(plan, 'pinned')['predicted_speedup']:.2f}x"
    )
    assert decision_of(plan, "free")["choice"] == "merged"


@pytest.mark.parametrize("share, message", [(-0.1, "must be >= 0.0 (got -0.1)"), ("lots", "lots")])
def test_traffic_share_is_checked_at_its_line(tiny, write_spec, tmp_path, share, message):
    with pytest.raises(InputError) as err:
        gpu_plan(
            write_spec,
            tmp_path,
            tiny,
            f"\n          - name: qv\n            model: {{adapter: {tiny / 'qv4'}}}\n"
            f"            traffic: {{share: {share}}}\n",
        )
    assert "spec.yaml:11:15 variants[1].traffic.share" in str(err.value) and message in str(err.value)


def test_the_llama8b_fleet_of_24_adapters_fits_two_l40s_and_says_why(tmp_path):
    spec = load_spec(SPECS / "llama8b-lora-fleet.yaml")
    plan = make_plan(spec, OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    (decision,) = plan.lora_decisions
    assert len(decision.choices) == 24 and all(c.reason for c in decision.choices)
    merged = [c.name for c in decision.choices if c.choice == "merged"]
    # the heaviest traffic (support, 0.2) earns the one merged engine the second L40S holds; the rest share
    assert merged == ["support"]
    assert all(used <= free + 1e-9 for used, free in zip(decision.decision.used_gib, decision.decision.free_gib))
    (group,) = plan.lora_groups
    assert len(group.members) == 23
    from pipeline.fleet.placement import sharing_problem

    assert sharing_problem(plan) is None  # one server holds the base, 23 adapters and the merged engine
    # the manifest records the decision with its objective
    manifest = write_manifest(plan, tmp_path / "engines", {}, HashCache(None))
    recorded = json.loads(manifest.read_text())["lora_decisions"][0]
    assert recorded["objective"].startswith("maximize 1 / sum_i(share_i / speedup_i)")
    assert recorded["variants"]["support"]["choice"] == "merged"
