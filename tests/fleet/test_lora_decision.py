"""The shared-or-merged decision per LoRA fine-tune: hand-solved cases, a brute force, refusals, 64 variants."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.fleet.lora_decision import (
    FineTune,
    LoraDecisionError,
    LoraFleet,
    MergedOption,
    SharedEngine,
    decide,
    shares,
)


def by_name(decision):
    return {c.name: c for c in decision.choices}


def test_one_gpu_room_for_one_merged_engine_goes_to_the_largest_gain():
    # GPU 0: 40 GiB free; the shared engine (20 GiB) serves the base, so it stays. Merging either
    # fine-tune adds 16.1 GiB: 20 + 0.3 + 0.3 + 16.1 = 36.7 fits, 20 + 32.2 does not.
    # Equal shares: sql merged costs 0.5 / 1.9 + 0.5 / 0.95 = 0.78947, chat merged 0.5 / 1.3 + 0.5 / 0.95
    # = 0.91093, both shared 1 / 0.95 = 1.05263. The optimum is sql merged: fleet speedup 1 / 0.78947 = 1.2667.
    d = decide(
        LoraFleet(
            [
                FineTune("sql", 0.3, 0.95, MergedOption("eagle", 1.9, 16.1)),
                FineTune("chat", 0.3, 0.95, MergedOption("eagle", 1.3, 16.1)),
            ],
            SharedEngine((0,), 20.0, required=True),
            free_gib=(40.0,),
            concurrency=8,
        )
    )
    chosen = by_name(d)
    assert chosen["sql"].choice == "merged" and chosen["chat"].choice == "shared"
    assert d.fleet_speedup == pytest.approx(1 / (0.5 / 1.9 + 0.5 / 0.95))
    assert d.all_shared_speedup == pytest.approx(0.95)
    assert d.used_gib == pytest.approx((20 + 0.3 + 16.1,))
    assert chosen["sql"].reason == "merged: eagle 1.90x vs 0.95x shared, +16.1 GiB on GPU 0 fits"
    assert chosen["chat"].reason.startswith("shared: merged eagle 1.30x needs +16.1 GiB on 1 GPU(s)")
    assert chosen["sql"].memory_gib == {0: 16.1} and chosen["chat"].memory_gib == {0: 0.3}


def test_traffic_shares_move_the_engine_to_the_busy_fine_tune():
    # chat has 90% of the traffic: sql merged costs 0.1 / 1.9 + 0.9 / 0.95 = 1.0, chat merged
    # 0.1 / 0.95 + 0.9 / 1.3 = 0.7976: chat gets the engine although sql's method is faster.
    d = decide(
        LoraFleet(
            [
                FineTune("sql", 0.3, 0.95, MergedOption("eagle", 1.9, 16.1), share=1),
                FineTune("chat", 0.3, 0.95, MergedOption("eagle", 1.3, 16.1), share=9),
            ],
            SharedEngine((0,), 20.0, required=True),
            free_gib=(40.0,),
            concurrency=8,
        )
    )
    assert by_name(d)["chat"].choice == "merged" and by_name(d)["sql"].choice == "shared"
    assert d.fleet_speedup == pytest.approx(1 / (0.1 / 0.95 + 0.9 / 1.3))
    assert "would fit" not in by_name(d)["sql"].reason  # it would not: one merged engine at most


def test_without_the_base_the_shared_engine_is_dropped_when_nothing_uses_it():
    # Not required: both merged need 32.2 GiB <= 40 and no shared engine; any shared choice would add
    # its 20 GiB. Fleet speedup 1 / (0.5 / 1.9 + 0.5 / 1.3).
    d = decide(
        LoraFleet(
            [
                FineTune("sql", 0.3, 0.95, MergedOption("eagle", 1.9, 16.1)),
                FineTune("chat", 0.3, 0.95, MergedOption("eagle", 1.3, 16.1)),
            ],
            SharedEngine((0,), 20.0),
            free_gib=(40.0,),
            concurrency=8,
        )
    )
    assert [c.choice for c in d.choices] == ["merged", "merged"]
    assert not d.shared_engine_used
    assert d.used_gib == pytest.approx((32.2,))
    assert d.fleet_speedup == pytest.approx(1 / (0.5 / 1.9 + 0.5 / 1.3))


def test_a_method_slower_than_the_shared_engine_stays_shared_even_with_room():
    # Lookahead at batch 32 predicted 0.8x: merged would cost memory and lose throughput.
    d = decide(
        LoraFleet(
            [FineTune("legal-summary", 0.2, 0.9, MergedOption("lookahead", 0.8, 16.1))],
            SharedEngine((0,), 20.0, required=True),
            free_gib=(80.0,),
            concurrency=32,
        )
    )
    (c,) = d.choices
    assert c.choice == "shared" and c.method == "lora" and c.speedup == 0.9
    assert c.reason == "shared: 0.90x >= merged lookahead 0.80x"


def test_a_merged_engine_goes_to_the_gpu_with_room():
    # The shared engine spans GPUs 0 and 1 (tp 2, 10 GiB each) with 0.5 GiB of adapter on each.
    # GPU 0: 30 free, GPU 1: 20 free. A 16 GiB merged engine fits on GPU 0 only (10 + 0.5 + 16 = 26.5;
    # GPU 1 would need 10 + 0.5 + 16 = 26.5 > 20), and only one of the two (10 + 32 > 30).
    d = decide(
        LoraFleet(
            [
                FineTune("support", 0.5, 0.97, MergedOption("medusa", 1.5, 16.0)),
                FineTune("sql", 0.5, 0.97, MergedOption("eagle", 1.8, 16.0)),
            ],
            SharedEngine((0, 1), 10.0, required=True),
            free_gib=(30.0, 20.0),
            concurrency=4,
        )
    )
    chosen = by_name(d)
    assert chosen["sql"].choice == "merged" and chosen["sql"].gpus == (0,)
    assert chosen["support"].choice == "shared" and chosen["support"].memory_gib == {0: 0.5, 1: 0.5}
    assert d.used_gib == pytest.approx((26.5, 10.5))


def test_a_two_rank_merged_engine_needs_room_on_both_gpus():
    # tp 2 merged: 8 GiB on each GPU. GPU 1 has 12 free: 10 (shared) + 8 > 12, so it stays shared.
    d = decide(
        LoraFleet(
            [FineTune("code", 0.1, 0.97, MergedOption("eagle", 2.0, 8.0, world_size=2))],
            SharedEngine((0, 1), 10.0, required=True),
            free_gib=(40.0, 12.0),
            concurrency=1,
        )
    )
    assert d.choices[0].choice == "shared"
    assert "GPU 1 2.0 GiB free" in d.choices[0].reason  # 12 - 10 once its own adapter leaves


def test_the_lora_cache_stops_growing_at_its_cap():
    # GPU 0: 22 GiB free, the shared engine 20 GiB; four fine-tunes of 1 GiB adapters, each slower merged
    # (so all share). Uncapped, their cache would take 4 GiB: 24 > 22, nothing fits. With the cache
    # capped at one batch's two adapters (2 GiB), 20 + 2 = 22 fits.
    tunes = [FineTune(f"ft{i}", 1.0, 0.95, None, allowed="shared") for i in range(4)]
    with pytest.raises(LoraDecisionError, match="do not fit"):
        decide(LoraFleet(tunes, SharedEngine((0,), 20.0, required=True), free_gib=(22.0,), concurrency=2))
    d = decide(LoraFleet(tunes, SharedEngine((0,), 20.0, True, cache_cap_gib=2.0), free_gib=(22.0,), concurrency=2))
    assert [c.choice for c in d.choices] == ["shared"] * 4 and d.used_gib == pytest.approx((22.0,))


def test_a_capped_cache_frees_nothing_when_one_more_merges():
    # The cap binds (3 adapters of 1 GiB, cap 1 GiB): merging ft0 takes its 10 GiB and frees none of the
    # cache, so with 31.5 GiB free (20 + 1 + 10 = 31 fits, and it is faster merged) ft0 merges and the
    # cache still takes 1 GiB.
    tunes = [FineTune("ft0", 1.0, 0.9, MergedOption("eagle", 2.0, 10.0))]
    tunes += [FineTune(f"ft{i}", 1.0, 0.9, None, allowed="shared") for i in (1, 2)]
    d = decide(LoraFleet(tunes, SharedEngine((0,), 20.0, True, cache_cap_gib=1.0), free_gib=(31.5,), concurrency=4))
    assert by_name(d)["ft0"].choice == "merged" and d.used_gib == pytest.approx((31.0,))


def test_an_adapter_that_just_fills_the_gpu_fits():
    # 1e-9 GiB of adapter on a GPU with nothing free: within the 1e-9 GiB tolerance of "fits" (the
    # cache's variable once sat 2**20 over the adapter's coefficient in one row, and HiGHS called it
    # infeasible)
    tunes = [FineTune("ft0", 1e-9, 1.0, None)]
    d = decide(LoraFleet(tunes, SharedEngine((0,), 0.0), free_gib=(0.0,), concurrency=4))
    assert [c.choice for c in d.choices] == ["shared"]


def test_serving_lora_fixed_per_variant_is_obeyed():
    # "merged" is forced although shared is faster; "shared" although merged is faster and fits.
    d = decide(
        LoraFleet(
            [
                FineTune("a", 0.1, 0.97, MergedOption("lookahead", 0.9, 10.0), allowed="merged"),
                FineTune("b", 0.1, 0.97, MergedOption("eagle", 2.0, 10.0), allowed="shared"),
            ],
            SharedEngine((0,), 10.0, required=True),
            free_gib=(80.0,),
            concurrency=1,
        )
    )
    assert [c.choice for c in d.choices] == ["merged", "shared"]
    assert d.choices[0].reason.startswith("merged (serving.lora: merged)")
    assert d.choices[1].reason == "shared (serving.lora: shared): 0.97x"


def test_zero_traffic_never_buys_an_engine():
    # share 0: merged or shared cost the objective nothing; the tie goes to the least memory.
    d = decide(
        LoraFleet(
            [
                FineTune("idle", 0.1, 0.97, MergedOption("eagle", 2.0, 10.0), share=0.0),
                FineTune("busy", 0.1, 0.97, None, share=1.0),
            ],
            SharedEngine((0,), 10.0),
            free_gib=(80.0,),
            concurrency=1,
        )
    )
    assert by_name(d)["idle"].choice == "shared"
    assert by_name(d)["idle"].reason == (
        "shared: merged eagle 2.00x would fit (+10.0 GiB on GPU 0) but gains nothing at traffic share 0"
    )


def test_shares_default_equal_and_fill_the_rest():
    ft = [FineTune(n, 0, 1, None, s) for n, s in (("a", 0.5), ("b", None), ("c", None))]
    assert shares(ft) == pytest.approx([0.5, 0.25, 0.25])
    assert shares([FineTune(n, 0, 1, None) for n in "abcd"]) == [0.25] * 4


def test_nothing_fits_is_one_clear_line():
    # The shared engine alone (30 GiB) exceeds GPU 0's 24 GiB and the merged engines do too.
    fleet = LoraFleet(
        [FineTune("sql", 0.3, 0.95, MergedOption("eagle", 1.9, 30.0))],
        SharedEngine((0,), 30.0, required=True),
        free_gib=(24.0,),
        concurrency=8,
    )
    with pytest.raises(LoraDecisionError) as err:
        decide(fleet)
    message = str(err.value)
    assert "\n" not in message
    assert "GPU 0 needs 30.3 of 24.0 GiB free" in message
    assert "add GPUs" in message


@pytest.mark.parametrize(
    "fleet, expected",
    [
        (LoraFleet([], SharedEngine((0,), 1.0), (10.0,), 1), "no LoRA fine-tunes"),
        (
            LoraFleet([FineTune("a", 0, 1, None), FineTune("a", 0, 1, None)], SharedEngine((0,), 1.0), (10.0,), 1),
            "names repeat",
        ),
        (LoraFleet([FineTune("a", 0, 1, None)], SharedEngine((2,), 1.0), (10.0,), 1), "must be among 0..0"),
        (LoraFleet([FineTune("a", 0, 1, None)], SharedEngine((0,), 1.0), (10.0,), 0), "concurrency must be >= 1"),
        (LoraFleet([FineTune("a", 0, 0.0, None)], SharedEngine((0,), 1.0), (10.0,), 1), "speedup must be > 0"),
        (LoraFleet([FineTune("a", -1, 1, None)], SharedEngine((0,), 1.0), (10.0,), 1), "finite and >= 0"),
        (LoraFleet([FineTune("a", 0, 1, None, share=-1)], SharedEngine((0,), 1.0), (10.0,), 1), "share must be"),
        (LoraFleet([FineTune("a", 0, 1, None, share=0)], SharedEngine((0,), 1.0), (10.0,), 1), "sum to 0"),
        (
            LoraFleet([FineTune("a", 0, 1, None, allowed="merged")], SharedEngine((0,), 1.0), (10.0,), 1),
            "no merged engine",
        ),
        (
            LoraFleet([FineTune("a", 0, 1, MergedOption("eagle", 2, 1, 3))], SharedEngine((0,), 1.0), (10.0,), 1),
            "needs that many of the 1 GPUs",
        ),
    ],
)
def test_bad_inputs_are_refused(fleet, expected):
    with pytest.raises(LoraDecisionError, match=expected):
        decide(fleet)


# --- the brute force: every combination of choices, its memory and objective computed here --------


def brute_force(fleet: LoraFleet) -> float | None:
    weights = shares(fleet.fine_tunes)
    gpus = len(fleet.free_gib)
    per_variant = []
    for f in fleet.fine_tunes:
        opts = []
        if f.allowed != "merged":
            opts.append(("shared", (), f.shared_speedup))
        if f.allowed != "shared" and f.merged is not None:
            for chosen in itertools.combinations(range(gpus), f.merged.world_size):
                opts.append(("merged", chosen, f.merged.speedup))
        per_variant.append(opts)
    best = None
    for combo in itertools.product(*per_variant):
        used = [0.0] * gpus
        shared = fleet.shared.required or any(c[0] == "shared" for c in combo)
        if shared:  # the engine, and its LoRA cache: the shared adapters up to the cap
            cache = sum(f.adapter_gib for f, (kind, _, _) in zip(fleet.fine_tunes, combo) if kind == "shared")
            for g in fleet.shared.gpus:
                used[g] += fleet.shared.per_gpu_gib + min(cache, fleet.shared.cache_cap_gib)
        for f, (kind, where, _) in zip(fleet.fine_tunes, combo):
            if kind == "merged":
                for g in where:
                    used[g] += f.merged.per_gpu_gib
        if any(u > free + 1e-9 for u, free in zip(used, fleet.free_gib)):
            continue
        speedup = 1 / sum(w / s for w, (_, _, s) in zip(weights, combo))
        best = speedup if best is None else max(best, speedup)
    return best


@st.composite
def fleets(draw):
    gpus = draw(st.integers(1, 3))
    memory = st.floats(0.0, 30.0, allow_nan=False)
    speedup = st.floats(0.3, 3.0, allow_nan=False)
    fine_tunes = []
    for i in range(draw(st.integers(1, 5))):
        merged = draw(st.none() | st.builds(MergedOption, st.just("eagle"), speedup, memory, st.integers(1, gpus)))
        allowed = draw(st.sampled_from(["auto", "auto", "shared", "merged"]))
        if allowed == "merged" and merged is None:
            allowed = "auto"
        share = draw(st.none() | st.floats(0.01, 5.0))
        fine_tunes.append(FineTune(f"ft{i}", draw(st.floats(0.0, 3.0)), draw(speedup), merged, share, allowed))
    if any(f.share is not None for f in fine_tunes):  # all given or none: partial shares must sum <= 1
        fine_tunes = [
            FineTune(f.name, f.adapter_gib, f.shared_speedup, f.merged, f.share or 1.0, f.allowed) for f in fine_tunes
        ]
    shared_gpus = tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), min_size=1))))
    free = tuple(draw(st.floats(0.0, 80.0)) for _ in range(gpus))
    cap = draw(st.just(math.inf) | st.floats(0.0, 6.0))  # the LoRA cache's most: none, or a batch's adapters
    return LoraFleet(fine_tunes, SharedEngine(shared_gpus, draw(memory), draw(st.booleans()), cap), free, 4)


@settings(max_examples=120, deadline=None)
@given(fleets())
def test_the_solver_matches_a_brute_force(fleet):
    best = brute_force(fleet)
    if best is None:
        with pytest.raises(LoraDecisionError, match="do not fit"):
            decide(fleet)
        return
    d = decide(fleet)
    assert d.fleet_speedup == pytest.approx(best, rel=1e-6)
    for g, (used, free) in enumerate(zip(d.used_gib, fleet.free_gib)):
        assert used <= free + 1e-6, f"GPU {g} over its memory"
    recomputed = [0.0] * len(fleet.free_gib)
    if d.shared_engine_used:
        cache = sum(c.memory_gib[fleet.shared.gpus[0]] for c in d.choices if c.choice == "shared")
        for g in fleet.shared.gpus:
            recomputed[g] += fleet.shared.per_gpu_gib + min(cache, fleet.shared.cache_cap_gib)
    for c in d.choices:
        for g, gib in c.memory_gib.items():
            recomputed[g] += gib if c.choice == "merged" else 0.0
    assert recomputed == pytest.approx(list(d.used_gib))


def test_64_fine_tunes_on_4_gpus_take_the_largest_gains():
    # 64 fine-tunes, equal shares, shared 0.95x; merged i is 1.0 + i / 64 faster, 16 GiB on one GPU.
    # Each GPU has 48 GiB free; the shared engine (tp 4) takes 10 + 0.1 per shared adapter on each.
    # With k merged, m of them on a GPU: 10 + 0.1 (64 - k) + 16 m <= 48. k = 8, m = 2: 47.6 fits;
    # k = 12, m = 3: 63.2 does not. So eight merged engines, two per GPU: the eight fastest.
    fine_tunes = [FineTune(f"ft{i:02d}", 0.1, 0.95, MergedOption("eagle", 1.0 + i / 64, 16.0)) for i in range(64)]
    d = decide(LoraFleet(fine_tunes, SharedEngine((0, 1, 2, 3), 10.0, required=True), (48.0,) * 4, 8))
    merged = sorted(c.name for c in d.choices if c.choice == "merged")
    assert merged == [f"ft{i}" for i in range(56, 64)]
    assert sorted(g for c in d.choices if c.choice == "merged" for g in c.gpus) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert d.used_gib == pytest.approx((47.6,) * 4)
    expected = 1 / (56 / 64 / 0.95 + sum(1 / 64 / (1.0 + i / 64) for i in range(56, 64)))
    assert d.fleet_speedup == pytest.approx(expected)
    assert math.isclose(sum(c.share for c in d.choices), 1.0)
