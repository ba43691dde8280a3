"""Choosing by predicted speedup, and the release gates (literal candidate records)."""

from __future__ import annotations

from pipeline.evaluation.choose import Choice, Gates, choose


def record(
    name: str,
    method: str,
    al: float,
    speedup: dict[int, float],
    lossless: bool = True,
    band: tuple[float, float] | None = None,  # (low, high) as fractions of the point
) -> dict:
    out = {
        "name": name,
        "method": method,
        "mean_acceptance_length": al,
        "identity": {"lossless": lossless},
        "predicted_speedup": {str(b): s for b, s in speedup.items()},
    }
    if band:
        out["predicted_interval"] = {
            str(b): {"point": s, "low": s * band[0], "high": s * band[1]} for b, s in speedup.items()
        }
    return out


RECORDS = [
    record("plain", "none", 1.0, {1: 1.0, 32: 1.0}),
    record("lookahead(4,3,4)", "lookahead", 1.5, {1: 1.45, 32: 0.9}),
    record("eagle[t]", "eagle", 2.4, {1: 1.9, 32: 0.7}),
    record("medusa[t]", "medusa", 1.8, {1: 1.6, 32: 0.8}),
]


def test_best_takes_the_highest_predicted_speedup():
    choice = choose(RECORDS, 1, "l40s", Gates())
    assert (choice.candidate, choice.method, choice.failed) == ("eagle[t]", "eagle", None)
    assert "1.90x on l40s at batch 1" in choice.reason and "2.40" in choice.reason


def test_nothing_beats_plain_at_high_concurrency():
    choice = choose(RECORDS, 32, "l40s", Gates())
    assert choice.candidate == "plain" and "no candidate beats plain decoding" in choice.reason


def test_gate_miss_falls_back_to_the_next_best_that_passes():
    choice = choose(RECORDS, 1, "l40s", Gates(min_acceptance_length=2.5, min_speedup=1.4))
    assert choice.candidate == "plain"  # eagle misses AL 2.5, the others AL too
    choice = choose(RECORDS, 1, "l40s", Gates(min_acceptance_length=1.7))
    assert choice.candidate == "eagle[t]"
    choice = choose(RECORDS, 1, "l40s", Gates(min_acceptance_length=1.5, min_speedup=1.95))
    assert choice.candidate == "plain" and "min_speedup 1.95: predicted 1.90x at batch 1" in choice.reason
    choice = choose([*RECORDS[:2], record("eagle[t]", "eagle", 2.4, {1: 1.9}, lossless=False)], 1, "l40s", Gates())
    assert choice.candidate == "lookahead(4,3,4)" and "lossless" in choice.reason


def test_max_batch_for_speculation_and_on_fail():
    paying = [RECORDS[0], record("lookahead(4,3,4)", "lookahead", 1.5, {32: 1.2})]
    assert choose(paying, 32, "l40s", Gates()).candidate == "lookahead(4,3,4)"
    choice = choose(paying, 32, "l40s", Gates(max_batch_for_speculation=8))
    assert choice.candidate == "plain"
    assert "max_batch_for_speculation 8: the expected concurrency is 32" in choice.reason
    failed = choose(RECORDS, 1, "l40s", Gates(min_speedup=2.0, on_fail="fail"))
    assert (
        isinstance(failed, Choice)
        and failed.failed == "eagle[t] misses release gate min_speedup 2.0: predicted 1.90x at batch 1"
    )


def test_a_planned_method_is_judged_by_the_same_gates():
    choice = choose(RECORDS, 1, "l40s", Gates(min_acceptance_length=2.0), planned="medusa[t]")
    assert choice.candidate == "eagle[t]" and "medusa[t] misses release gate min_acceptance_length 2.0" in choice.reason
    assert choose(RECORDS, 1, "l40s", Gates(), planned="medusa[t]").candidate == "medusa[t]"


def test_a_chosen_candidate_becomes_the_plan_config():
    from pipeline import trees
    from pipeline.evaluation.apply import candidate_build, config_of
    from pipeline.evaluation.candidates import Candidate
    from pipeline.methods.drafting import Drafting
    from pipeline.methods.eagle import EagleConfig
    from pipeline.methods.lookahead import LookaheadConfig
    from pipeline.methods.medusa import MedusaConfig
    from pipeline.plan.speculative import SpeculativeConfig
    from pipeline.runtime.spec_decode.factory import MethodSettings

    tree = trees.CPU_SMALL_10_DEPTH_3
    heads = SpeculativeConfig("eagle", "heads", eagle=EagleConfig(tree, trees.tree_depth(tree), 10, 10, False, 10))
    dynamic = Candidate(
        "eagle2(top_k 4)", "eagle", MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=4),
        Drafting.plain(),
    )  # fmt: skip
    chosen = config_of(candidate_build(dynamic), heads, "why")
    assert chosen.method == "eagle" and chosen.reason == "why"
    assert chosen.eagle.dynamic_tree and chosen.eagle.tree is None and chosen.eagle.dynamic_tree_max_top_k == 4
    look = Candidate(
        "lookahead(2,3,2)", "lookahead", MethodSettings("lookahead", lookahead=LookaheadConfig(4, 3, 4)),
        Drafting.plain(), LookaheadConfig(2, 3, 2),
    )  # fmt: skip
    assert config_of(candidate_build(look), heads, "why").lookahead == LookaheadConfig(2, 3, 2)
    plain = Candidate("plain", "none", MethodSettings(), Drafting.plain())
    assert config_of(candidate_build(plain), heads, "why") == SpeculativeConfig("none", "why")
    medusa_heads = SpeculativeConfig("medusa", "heads", medusa=MedusaConfig(3, 1, tree, 16))
    other = trees.SMOLLM2_MEDUSA_10
    medusa = Candidate("medusa[x]", "medusa", MethodSettings("medusa", medusa_choices=other), Drafting.plain())
    assert config_of(candidate_build(medusa), medusa_heads, "why").medusa.tree == other
    assert config_of(candidate_build(medusa), heads, "why") is None  # not from EAGLE heads


def test_gates_check_the_lower_bound_by_default():
    """A point estimate of 1.62x with a lower bound of 1.30x passes min_speedup 1.5 only when the spec asks
    for the point."""
    records = [RECORDS[0], record("lookahead(4,3,4)", "lookahead", 1.7, {1: 1.62}, band=(0.8, 1.05))]
    low = choose(records, 1, "h100-sxm-80gb", Gates(min_speedup=1.5))
    assert low.candidate == "plain" and low.speedup_bound == "low"
    assert "min_speedup 1.5: predicted 1.62x (1.30-1.70) at batch 1, lower bound 1.30x" in low.reason
    point = choose(records, 1, "h100-sxm-80gb", Gates(min_speedup=1.5, speedup_bound="point"))
    assert point.candidate == "lookahead(4,3,4)" and point.to_dict()["speedup_bound"] == "point"
    assert "1.62x (1.30-1.70)" in point.reason


def test_overlapping_intervals_take_the_tie_rule():
    """Lookahead 1.62x and EAGLE 1.41x with intervals that overlap: not separable, so the one with less
    to maintain (Lookahead) is taken; when EAGLE's interval is clear of the others, EAGLE wins on its
    point; evaluation.prefer reorders the rule."""
    wide = [
        RECORDS[0],
        record("eagle[t]", "eagle", 2.4, {1: 1.70}, band=(0.85, 1.05)),
        record("medusa[t]", "medusa", 1.8, {1: 1.60}, band=(0.9, 1.05)),
        record("lookahead(4,3,4)", "lookahead", 1.5, {1: 1.20}, band=(0.9, 1.05)),
    ]
    choice = choose(wide, 1, "l40s", Gates())
    assert choice.candidate == "medusa[t]" and set(choice.not_separable) == {"eagle[t]", "medusa[t]"}
    assert "not separable by the model's error" in choice.reason
    assert "tie rule plain < lookahead < ngram < medusa < eagle < eagle3: medusa[t]" in choice.reason
    assert choose(wide, 1, "l40s", Gates(), prefer=["eagle"]).candidate == "eagle[t]"
    narrow = [RECORDS[0], record("eagle[t]", "eagle", 2.4, {1: 1.9}, band=(0.97, 1.02)), wide[2]]
    clear = choose(narrow, 1, "l40s", Gates())
    assert clear.candidate == "eagle[t]" and clear.not_separable == [] and "not separable" not in clear.reason
    near_plain = [RECORDS[0], record("eagle[t]", "eagle", 2.4, {1: 1.04}, band=(0.9, 1.05))]
    assert choose(near_plain, 1, "l40s", Gates()).candidate == "plain"


def test_preference_order():
    from pipeline.evaluation.choose import preference

    assert preference(None) == ("none", "lookahead", "ngram", "medusa", "eagle", "eagle3")
    assert preference(["eagle", "none"]) == ("eagle", "none", "lookahead", "ngram", "medusa", "eagle3")


def test_a_measured_eagle3_tree_becomes_the_plan_config():
    from pathlib import Path

    from pipeline.evaluation.apply import candidate_build, config_of
    from pipeline.evaluation.candidates import Candidate
    from pipeline.methods.eagle3 import Eagle3Config
    from pipeline.plan.speculative import SpeculativeConfig
    from pipeline.runtime.spec_decode.factory import MethodSettings

    tree, chain = Eagle3Config(3, (1, 2), True, 4, 10), Eagle3Config(3, (1, 2))
    drafter = SpeculativeConfig("eagle3", "a drafter", eagle3=tree)
    for config in (tree, chain):
        settings = MethodSettings(eagle3=config, eagle3_drafter=Path("d"))
        measured = Candidate("eagle3", "eagle3", settings, config.drafting())
        assert candidate_build(measured)["eagle3"] == ([3, 4, 10] if config is tree else [3])
        assert config_of(candidate_build(measured), drafter, "why").eagle3 == config
    illegal = {"method": "eagle3", "eagle3": [3, 4, 13]}  # more nodes than 4 x 3
    assert config_of(illegal, drafter, "why") is None
