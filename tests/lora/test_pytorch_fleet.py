"""serving.lora auto on the PyTorch backend, where the shared LoRA engine speculates: each fine-tune is
weighed between the shared engine and an engine of its own (with every method that engine could run,
a refreshed EAGLE-3 drafter among them), and the shared engine itself with every method it could run
(the base's EAGLE-3 drafter, NGram, plain), the best fleet speedup taken.

The fleet as a user writes it: the Llama-3.1-8B preset without weights, on 2 x L40S, a base that trains
an EAGLE-3 drafter, three fine-tunes whose folders hold adapter_config.json only, one with 90% of the
traffic and a drafter of its own to train."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.fleet.lora_decision import LoraDecision
from pipeline.lora.auto import best_shared_engine
from pipeline.lora.types import AutoDecision
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters" / "llama8b-fleet"


def fleet_plan(write_spec, tmp_path):
    spec = write_spec(
        f"""
        name: fleet
        model: {{path: /models/Llama-3.1-8B-Instruct, preset: llama-3.1-8b, dtype: bfloat16}}
        build: {{max_batch_size: 16, max_input_len: 2048, max_seq_len: 4096}}
        target: pytorch
        gpu: {{type: l40s, count: 2}}
        evaluation: {{batch_sizes: [4]}}
        serving: {{lora: auto}}
        heads: {{eagle3: {{train: {{init: random}}}}}}
        variants:
          - name: base
          - name: support
            model: {{adapter: {ADAPTERS / "support"}}}
            traffic: {{share: 0.9}}
          - name: sql
            model: {{adapter: {ADAPTERS / "sql"}}}
            heads: {{eagle3: null}}
          - name: email
            model: {{adapter: {ADAPTERS / "email-reply"}}}
            heads: {{eagle3: null}}
        """
    )
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))


def test_the_shared_engine_and_each_own_engine_are_weighed_with_every_method_they_could_run(write_spec, tmp_path):
    plan = fleet_plan(write_spec, tmp_path)
    (decision,) = json.loads(plan.to_json())["lora_decisions"]
    compared = decision["shared_methods_compared"]
    # the shared engine: the base's EAGLE-3 drafter, NGram, or plain decoding, the best fleet speedup taken
    assert set(compared) == {"eagle3", "ngram", "none"}
    assert decision["shared_method"] == max(compared, key=compared.get)
    assert math.isclose(compared[decision["shared_method"]], decision["fleet_speedup"], rel_tol=1e-3)
    by_name = {v.name: v for v in plan.variants}
    assert by_name["base"].speculative.method == decision["shared_method"]  # the engine runs what was weighed
    for name in ("sql", "email"):
        assert decision["variants"][name]["choice"] == "shared"
        assert f"shared {decision['shared_method']}" in decision["variants"][name]["reason"]
    # support's own engine was priced with its refreshed drafter and with NGram
    support = decision["variants"]["support"]["reason"]
    assert "merged methods compared: eagle3" in support and "ngram" in support
    # the base says what its shared engine runs against the others, and drops a drafter it would not run
    note = next(n for n in by_name["base"].notes if n.startswith("serving.lora auto: the shared engine runs"))
    assert all(m in note for m in ("eagle3", "ngram", "plain"))
    stages = [s.name for s in by_name["base"].stages]
    assert ("train-heads" in stages) == (decision["shared_method"] == "eagle3")
    if decision["shared_method"] != "eagle3":
        assert "heads.eagle3.train dropped" in note


def weighed(method: str, fleet_speedup: float | None) -> AutoDecision:
    solved = None
    if fleet_speedup is not None:
        solved = LoraDecision((), True, (1.0,), (2.0,), fleet_speedup, 1.0, 4)
    return AutoDecision("base", (), solved, "rule", method)


def test_the_best_shared_engine_is_the_best_fleet_speedup_ties_to_auto_s_order():
    # eagle3 1.6x, ngram 1.7x, plain 1.2x -> ngram, with every figure kept for the plan
    best = best_shared_engine([weighed("eagle3", 1.6), weighed("ngram", 1.7), weighed("none", 1.2)])
    assert best.shared_method == "ngram"
    assert best.shared_compared == (("eagle3", 1.6), ("ngram", 1.7), ("none", 1.2))
    assert best.shared_engine_text() == "ngram (fleet 1.700x; with eagle3 1.600x, plain 1.200x)"
    # a tie: the first in auto's order
    assert best_shared_engine([weighed("eagle3", 1.5), weighed("ngram", 1.5)]).shared_method == "eagle3"
    # one engine, or no GPU to weigh: the first, nothing compared
    assert best_shared_engine([weighed("none", 0.98)]).shared_compared == ()
    assert best_shared_engine([weighed("eagle3", None), weighed("ngram", None)]).shared_method == "eagle3"
