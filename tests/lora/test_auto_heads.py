"""serving.lora auto with speculative.method auto and heads to train: the merged option is priced with
every method its engine could run (the best taken), and a training the decision leaves unused (shared,
or merged with another method) is dropped, said in the decision, and not planned.

Small fleets as a user writes them: the Llama-3.1-8B preset without weights, four fine-tunes whose
folders hold adapter_config.json only (adapters/llama8b-fleet/), one with 90% of the traffic."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters" / "llama8b-fleet"


def fleet_plan(write_spec, tmp_path, gpu: str, heads: str):
    spec = write_spec(
        f"""
        name: fleet
        model: {{path: /models/Llama-3.1-8B-Instruct, preset: llama-3.1-8b, dtype: float16}}
        build: {{max_batch_size: 16, max_input_len: 2048, max_seq_len: 4096}}
        target: tensorrt
        gpu: {gpu}
        evaluation: {{batch_sizes: [4]}}
        serving: {{lora: auto}}
        variants:
          - name: base
          - name: support
            model: {{adapter: {ADAPTERS / "support"}}}
            traffic: {{share: 0.9}}
            heads: {heads}
          - name: sql
            model: {{adapter: {ADAPTERS / "sql"}}}
          - name: email
            model: {{adapter: {ADAPTERS / "email-reply"}}}
          - name: json
            model: {{adapter: {ADAPTERS / "json-extract"}}}
        """
    )
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))


def support(plan) -> tuple[dict, list[str]]:
    """support's decision and its plan's stage names."""
    decision = json.loads(plan.to_json())["lora_decisions"][0]["variants"]["support"]
    return decision, [s.name for s in next(v for v in plan.variants if v.name == "support").stages]


def compared(reason: str) -> dict[str, float]:
    found = re.search(r"merged methods compared: ([^(;]+) \(the best taken\)", reason)
    assert found, reason
    return {m: float(x) for m, x in re.findall(r"(\w+) ([\d.]+)x", found.group(1))}


def test_a_merged_fine_tune_takes_the_best_method_its_engine_could_run_not_heads_first(write_spec, tmp_path):
    # 2 x L40S: the heads-first rule merged support with Medusa at 1.42x where merged Lookahead is 1.50x
    plan = fleet_plan(write_spec, tmp_path, "{type: l40s, count: 2}", "{medusa: {num_heads: 4, train: {init: random}}}")
    chosen, stages = support(plan)
    speedups = compared(chosen["reason"])
    assert set(speedups) == {"medusa", "lookahead"}
    assert chosen["choice"] == "merged" and chosen["method"] == "lookahead"
    assert speedups["lookahead"] > speedups["medusa"] and round(chosen["predicted_speedup"], 2) == max(
        speedups.values()
    )
    # the unused training is part of the decision, with its numbers, and is not planned
    assert (
        f"heads.medusa.train dropped (no train-heads stage): merged lookahead {speedups['lookahead']:.2f}x "
        f"beats medusa {speedups['medusa']:.2f}x with trained heads"
    ) in chosen["reason"]
    assert "train-heads" not in stages and stages[0] == "merge"
    assert next(v for v in plan.variants if v.name == "support").speculative.method == "lookahead"


def test_a_fine_tune_shared_for_memory_drops_its_heads_training_instead_of_failing(write_spec, tmp_path):
    # 1 x L40S: no merged copy fits beside the shared engine; the plan failed on heads.eagle.train before
    plan = fleet_plan(write_spec, tmp_path, "{type: l40s, count: 1}", "{eagle: {train: {init: random}}}")
    chosen, stages = support(plan)
    assert chosen["choice"] == "shared"
    assert re.search(
        r"needs \+[\d.]+ GiB on 1 GPU\(s\) beside the engines chosen \(GPU 0 [\d.]+ GiB free\)", chosen["reason"]
    )
    assert (
        "heads.eagle.train dropped (no train-heads stage): the fine-tune is shared, and the LoRA engine runs "
        "none of its own eagle heads"
    ) in chosen["reason"]
    assert "train-heads" not in stages
    assert all("train-heads" not in [s.name for s in v.stages] for v in plan.variants)


def test_trained_heads_that_win_and_fit_keep_their_training(write_spec, tmp_path):
    plan = fleet_plan(write_spec, tmp_path, "{type: l40s, count: 2}", "{eagle: {train: {init: random}}}")
    chosen, stages = support(plan)
    speedups = compared(chosen["reason"])
    assert chosen["choice"] == "merged" and chosen["method"] == "eagle" and speedups["eagle"] > speedups["lookahead"]
    assert "dropped" not in chosen["reason"]
    assert stages[:2] == ["merge", "train-heads"]


def test_an_explicitly_shared_fine_tune_still_refuses_heads_training(write_spec, tmp_path):
    # serving.lora shared is the user's choice, not the decision's: the training is refused, not dropped
    heads = "{eagle: {train: {init: random}}}\n            serving: {lora: shared}"
    with pytest.raises(InputError, match=r"heads.eagle.train: the variant decodes with none"):
        fleet_plan(write_spec, tmp_path, "{type: l40s, count: 1}", heads)
