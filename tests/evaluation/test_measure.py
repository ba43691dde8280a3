"""Candidates measured from one shared prefill equal the same methods served from scratch."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import trees
from pipeline.evaluation.candidates import candidates, load
from pipeline.evaluation.measure import forward_probe, forward_rows, measure, prefill, summarize, tokens_per_step
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.runtime.serving.metrics import SpecDecodingStats
from pipeline.runtime.spec_decode.lookahead import lookahead_sweep
from tests.runtime import drive
from tests.runtime import fixtures as sf

PROMPTS = sf.test_prompts(96)[:5]
NEW = 16


def test_lookahead_sweep_is_the_spec_and_smaller_settings():
    assert lookahead_sweep(LookaheadConfig(4, 3, 4)) == [LookaheadConfig(4, 3, 4), LookaheadConfig(2, 3, 2)]
    assert lookahead_sweep(LookaheadConfig(1, 2, 0)) == [LookaheadConfig(1, 2, 0)]


def test_similar_trees_fit_the_heads_and_the_build():
    found = trees.similar_trees(trees.CPU_SMALL_10_DEPTH_3, max_depth=3, max_nodes=10)
    assert found == [trees.CPU_SMALL_10_DEPTH_3, trees.SMOLLM2_MEDUSA_10]
    assert trees.SMOLLM2_MEDUSA_15 in trees.similar_trees(trees.CPU_SMALL_10_DEPTH_3, max_depth=3, max_nodes=16)


def test_forward_rows_are_every_count_a_candidate_feeds():
    from pipeline.evaluation.candidates import Candidate
    from pipeline.methods.drafting import Drafting
    from pipeline.runtime.spec_decode.factory import MethodSettings

    server = LookaheadConfig(4, 3, 4)
    listed = [
        Candidate("plain", "none", MethodSettings(), Drafting.plain()),
        # the server's (4, 3, 4): a window of 8 rows, then 0..8 verification rows
        Candidate("lookahead(4,3,4)", "lookahead", MethodSettings(lookahead=server), Drafting.lookahead(server)),
        # (2, 3, 2) per request on that server: 4 window rows, 0..4 more
        Candidate(
            "lookahead(2,3,2)",
            "lookahead",
            MethodSettings(lookahead=server),
            Drafting.lookahead(LookaheadConfig(2, 3, 2)),
            LookaheadConfig(2, 3, 2),
        ),  # fmt: skip
        Candidate(
            "medusa[cpu_small_10_depth_3]", "medusa", MethodSettings(), Drafting.medusa(trees.CPU_SMALL_10_DEPTH_3)
        ),
    ]
    assert forward_rows(listed[:1]) == (1, 2, 4, 8, 16, 32)  # plain: the base probe alone
    assert forward_rows([listed[0], listed[3]]) == (1, 2, 4, 8, 11, 16, 32)  # the tree's root + 10 nodes
    assert forward_rows(listed) == (1, 2, *range(4, 17), 32)  # Lookahead's 4..8 and 8..16


def test_tokens_per_step_from_the_per_position_counters():
    stats = SpecDecodingStats()
    for accepted in (0, 0, 1, 3):
        stats.observe(4, accepted)
    assert tokens_per_step(stats, 4) == {"1": 0.5, "2": 0.25, "3": 0.0, "4": 0.25, "5": 0.0}


def test_a_plain_engine_lists_each_method_its_plan_holds(tiny):
    from pipeline.evaluation.candidates import Measuring
    from pipeline.methods.eagle3 import Eagle3Config
    from pipeline.methods.ngram import NGramConfig

    engine = tiny.engine(None)  # built without a speculative mode, as the PyTorch backend builds every engine
    chain = Eagle3Config(max_draft_len=3, capture_layers=(0, 1))
    configs = {"lookahead": sf.LOOKAHEAD, "ngram": NGramConfig(4), "eagle3": chain}
    listed = candidates(engine, Measuring(configs, eagle_top_k=3, heads=Path("drafter")))
    # least to most to maintain: plain, the zero-touch methods, then the drafter; no heads, no Medusa / EAGLE
    assert [c.name for c in listed] == [
        "plain",
        "lookahead(4,3,4)",
        "lookahead(2,3,2)",  # half the window and verification set, per request on the (4, 3, 4) server
        "ngram(k 4, m 2)",
        "eagle3(k 3)",
    ]
    assert listed[-1].settings.eagle3_drafter == Path("drafter")
    # without its folder an EAGLE-3 drafter cannot be measured
    assert "eagle3(k 3)" not in [c.name for c in candidates(engine, Measuring(configs, eagle_top_k=3))]


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_shared_prefill_equals_serving_from_scratch(tiny, kind):
    engine = tiny.engine(kind)
    listed = candidates(engine, sf.rehearsing(kind))
    names = [c.name for c in listed]
    assert names[:3] == ["plain", "lookahead(4,3,4)", "lookahead(2,3,2)"]
    assert names[3:] == (
        ["medusa[cpu_small_10_depth_3]", "medusa[smollm2_medusa_10]"]
        if kind == "medusa"
        else ["eagle[cpu_small_10_depth_3]", "eagle2(top_k 3)"]
    )
    loaded = [load(engine, c) for c in listed]
    found, prefill_cpu = measure(loaded, PROMPTS, NEW, end_id=None, batch=3, probe_prompts=2)
    assert prefill_cpu > 0
    plain = found["plain"]
    for item in loaded:
        measured = found[item.candidate.name]
        tally = measured.acceptance
        assert tally.outputs == plain.acceptance.outputs, item.candidate.name  # float32: every method is lossless
        # The same method and settings served from scratch (its own prefill), one request at a time: the
        # batched run from shared prefills gives the same tokens and the same counters.
        fresh = load(engine, item.candidate)
        out = drive.decode(
            fresh.engine, fresh.method, drive.requests(PROMPTS, NEW, lookahead=item.candidate.lookahead), in_flight=1
        )
        assert [out[str(i)].tokens for i in range(len(PROMPTS))] == tally.outputs
        assert drive.totals(out) == tally.stats, item.candidate.name
        assert measured.probe.outputs == tally.outputs[:2]  # the batch-1 timing probe: the first two prompts
        assert measured.probe.decode_cpu_s > 0 and measured.probe.decode_steps > 0
        record = summarize(measured, plain, item.method.draft_positions)
        assert record["cpu_probe"]["batch_invariant"] and record["cpu_probe"]["prompts"] == 2
        assert sum(record["tokens_per_step"].values()) == pytest.approx(1.0)
        assert 1 <= record["rows_per_step"] <= 1 + item.method.max_draft_len
        if item.candidate.method == "none":
            assert record["mean_acceptance_length"] == 1.0 and record["rows_per_step"] == 1.0
            assert record["cpu_speedup"] == 1.0 and record["cpu_step_cost"] == 1.0
    spec = [n for n in names if n.startswith(kind)][0]
    assert found[spec].acceptance.stats.mean_acceptance_length > 1.3  # the fitted heads are right often enough


def test_forward_probe_times_passes_by_rows_and_leaves_the_shared_cache_alone(tiny):
    engine = tiny.engine(None)
    shared = prefill(engine, PROMPTS[0])
    length = shared.cache.length
    times = forward_probe(engine, PROMPTS[0], shared, rows=(1, 4), repeats=2)
    assert set(times) == {"1", "4"} and min(times.values()) > 0
    assert shared.cache.length == length
