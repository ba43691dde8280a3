"""Every candidate decoded on every prompt through the reference runtime, from one shared prefill.

Each prompt is prefilled once (one engine pass, every prompt row's hidden state kept for EAGLE's
drafter); each candidate then starts every prompt from a copy of that KV cache
(``Scheduler.submit_prefilled``) and decodes greedily through the scheduler, so its acceptance
counters are the ones ``return_perf_metrics`` reports (serving/metrics.py).

Two runs per candidate, because acceptance and speed ask different things of the host:

* acceptance: all prompts in flight together (up to :data:`ACCEPTANCE_BATCH` sequences per
  verification pass), on :data:`ACCEPTANCE_THREADS` torch threads. Greedy acceptance does not
  depend on what else is in the batch, and a CPU GEMM over many rows costs far less per row than
  one over a single row (and splits well over cores), so this is where most of the tokens are
  decoded. Its outputs are the ones checked against plain decoding (stage.py); its CPU time is
  reported, not used for step costs.
* speed: the first :data:`PROBE_PROMPTS` prompts again, one request in flight, each step timed in
  this thread's CPU time: the decode-step cost of the method at batch 1, as the reference backend
  serves one request. The probe's outputs must equal the batched run's (``batch_invariant``): a
  check that batching changed nothing. Candidates are interleaved per probe prompt: this host's
  speed drifts during a run, and interleaving spreads the drift over all of them alike.

:func:`forward_probe` times bare engine passes of 1..32 rows after a prompt, and of every row count a
candidate feeds (:func:`forward_rows`: a pass's cost is a sawtooth in its rows, 80 ms at 11 rows
against 74 ms at 12 for SmolLM2 in float32, so the cost model reads the counts it prices rather than
interpolating): with the GEMM probe of pipeline/costmodel/cpu.py it gives the per-row work outside
the GEMMs (norms, rope, attention, masks), which the cost model charges for every row a method feeds.

The saving of the shared prefill is measured, not estimated: the prefill's CPU time is timed once
per prompt, and every candidate after the first would have spent it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from pipeline import methods
from pipeline.evaluation.candidates import Candidate, Loaded
from pipeline.runtime.model.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.request import FinishReason, GenerationRequest, StepOutput
from pipeline.runtime.serving.metrics import SpecDecodingStats, SpecRequestMetrics, StepStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.exactness import NEAR_TIE_BF16_STEPS, divergence

ACCEPTANCE_BATCH = 32  # sequences in flight in the acceptance run (bench/evaluate.py measured the payoff)
# torch threads for it. One: on this shared 2-core host two threads made it several times slower (a
# preempted thread stalls the other at every GEMM's barrier); more help on an idle many-core host.
ACCEPTANCE_THREADS = 1
FORWARD_PROBE_ROWS = (1, 2, 4, 8, 16, 32)  # rows of the engine passes timed for the CPU cost model
PROBE_PROMPTS = 4  # prompts decoded one at a time per candidate for its CPU step cost


@dataclass
class Prefill:
    cache: KVCache
    rows: StepRows
    cpu_s: float


@dataclass
class Tally:
    """One run's totals over its prompts (per request step: one request's part of a forward pass)."""

    stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    decode_steps: int = 0  # request steps
    decode_tokens: int = 0
    decode_cpu_s: float = 0.0
    rows_fed: int = 0  # rows fed to the target in decode steps
    outputs: list[list[int]] = field(default_factory=list)


@dataclass
class Measured:
    """One candidate: the acceptance run over every prompt and the batch-1 timing probe."""

    acceptance: Tally = field(default_factory=Tally)
    probe: Tally = field(default_factory=Tally)


def clone_cache(cache: KVCache, limit: int) -> KVCache:
    """A private copy of a prefilled cache that may grow to ``limit`` tokens."""
    return dataclasses.replace(
        cache,
        limit=max(limit, cache.capacity),
        keys=[[t.clone() for t in rank] for rank in cache.keys],
        values=[[t.clone() for t in rank] for rank in cache.values],
    )


Clock = Callable[[], float]


def step_clock(engine: Engine) -> Clock:
    """On a CPU engine, CPU time (other processes' load does not count): this thread's with one torch
    thread, the process's with more; wall time on a GPU, where the step is the GPU's work."""
    if engine.device.type != "cpu":
        return time.perf_counter
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` (at most this host's cores) inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(count, os.cpu_count() or 1)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prefill(engine: Engine, prompt: list[int], capture: tuple[int, ...] = ()) -> Prefill:
    """``capture``: the layers whose outputs a candidate drafts from (EAGLE-3's), kept with the rows."""
    clock = step_clock(engine)
    start = clock()
    cache = engine.new_cache(len(prompt))
    (rows,) = engine.forward([StepInput(cache, list(prompt), Logits.LAST, all_hidden=True, capture_layers=capture)])
    return Prefill(cache, rows, clock() - start)


def decode(
    loaded: Loaded,
    prompts: list[list[int]],
    shared: list[Prefill],
    max_new_tokens: int,
    end_id: int | None,
    tally: Tally,
    in_flight: int,
    progress: Callable[[int], None] = lambda tokens: None,
) -> None:
    """``prompts`` from their shared prefills to their ends, ``in_flight`` at a time; adds to ``tally``
    (outputs in prompt order); ``progress`` gets each step's generated tokens."""
    candidate, method = loaded.candidate, loaded.method
    limits = dataclasses.replace(loaded.engine.config.limits, max_batch_size=in_flight)
    now_s = step_clock(loaded.engine)
    clock = [0.0]

    def count(step: StepStats) -> None:
        now = now_s()
        tally.decode_steps += step.batch_size
        tally.decode_tokens += step.generated_tokens
        tally.decode_cpu_s += now - clock[0]
        tally.rows_fed += step.input_tokens - step.prefill_tokens
        clock[0] = now
        progress(step.generated_tokens)

    done: dict[str, StepOutput] = {}
    sched = Scheduler(loaded.engine, method, limits=limits, on_step=count)
    for i, (prompt, prefilled) in enumerate(zip(prompts, shared)):
        request = GenerationRequest(
            str(i),
            tuple(prompt),
            max_new_tokens,
            end_id=end_id,
            exclude_input_in_output=True,
            lookahead=candidate.lookahead,
        )
        cache = clone_cache(prefilled.cache, len(prompt) + max_new_tokens + method.max_draft_len)
        sched.submit_prefilled(request, lambda out: keep(done, out), cache, prefilled.rows)
    clock[0] = now_s()
    sched.run_until_idle()
    for i in range(len(prompts)):
        out = done[str(i)]
        if out.reason == FinishReason.ERROR:
            raise RuntimeError(f"{candidate.name}: {out.error}")
        assert isinstance(out.metrics, SpecRequestMetrics)  # what the scheduler gives every request
        tally.stats.merge(out.metrics.spec)
        tally.outputs.append(list(out.tokens))


def forward_rows(candidates: Sequence[Candidate]) -> tuple[int, ...]:
    """:data:`FORWARD_PROBE_ROWS` and the rows each candidate's verification pass feeds: a tree's root and
    nodes; Lookahead's window (W(N - 1) rows, the root the first) and up to its whole verification
    branch, as many as its pool has n-grams for.

    Lookahead (4, 3, 4) and a 10-node tree -> 1, 2, 4, 8, 9, ..., 16, 32 (8..16 from Lookahead, 11 from
    the tree)."""
    rows = set(FORWARD_PROBE_ROWS)
    for c in candidates:
        config = c.lookahead or c.settings.lookahead  # set on Lookahead's candidates only
        if config is not None:
            rows |= set(range(config.window * (config.ngram - 1), c.drafting.rows + 1))
        elif c.method != methods.PLAIN:
            rows.add(c.drafting.rows)
    return tuple(sorted(rows))


def forward_probe(
    engine: Engine,
    prompt: list[int],
    shared: Prefill,
    rows: tuple[int, ...] = FORWARD_PROBE_ROWS,
    repeats: int = 5,
    times: dict[int, list[float]] | None = None,
) -> dict[str, float]:
    """Median CPU seconds (one thread) of one engine pass feeding ``rows`` new tokens, every one with logits
    (as a verification pass), after ``prompt``'s shared prefill; row counts interleaved. ``times``: earlier
    samples to add to (the timing probe takes some after each of its prompts, so both span the same
    minutes of this host's drifting speed)."""
    times = times if times is not None else {r: [] for r in rows}
    with torch_threads(1):
        clock = step_clock(engine)
        for _ in range(repeats):
            for r in rows:
                cache = clone_cache(shared.cache, shared.cache.length + r)
                tokens = [prompt[i % len(prompt)] for i in range(r)]
                start = clock()
                engine.forward([StepInput(cache, tokens, Logits.ALL)])
                times[r].append(clock() - start)
    return {str(r): statistics.median(t) for r, t in times.items()}


def keep(done: dict[str, StepOutput], out: StepOutput) -> None:
    if out.finished:
        done[out.request_id] = out


def measure(
    loaded: list[Loaded],
    prompts: list[list[int]],
    max_new_tokens: int,
    end_id: int | None,
    say: Callable[[str], None] = lambda _: None,
    batch: int = ACCEPTANCE_BATCH,
    probe_prompts: int = PROBE_PROMPTS,
    threads: int = ACCEPTANCE_THREADS,
    forward: dict[int, list[float]] | None = None,
    progress: Callable[[int], None] = lambda tokens: None,
) -> tuple[dict[str, Measured], float]:
    """Measurements by candidate name, and the shared prefills' total CPU seconds (one thread: the
    prefills are the probe's too). ``forward``: filled with engine-pass samples (:func:`forward_probe`,
    two rounds after each timed prompt); ``progress``: the tokens generated as they come (at most
    :func:`planned_tokens`)."""
    found = {item.candidate.name: Measured() for item in loaded}
    base = loaded[0].engine
    with torch_threads(1):
        captured = {layers for item in loaded if (layers := tuple(item.method.capture_layers))}
        assert len(captured) <= 1, "candidates capturing different layers cannot share their prefills"
        shared = [prefill(base, prompt, next(iter(captured), ())) for prompt in prompts]
    with torch_threads(threads):
        for item in loaded:
            acceptance = found[item.candidate.name].acceptance
            decode(item, prompts, shared, max_new_tokens, end_id, acceptance, batch, progress)
            say(f"{item.candidate.name}: {len(prompts)} prompts decoded, {batch} in flight")
    with torch_threads(1):
        for i in range(min(probe_prompts, len(prompts))):
            for item in loaded:
                probe = found[item.candidate.name].probe
                decode(item, prompts[i : i + 1], shared[i : i + 1], max_new_tokens, end_id, probe, 1, progress)
            if forward is not None:
                forward_probe(base, prompts[i], shared[i], tuple(forward), repeats=2, times=forward)
    say(f"timed {min(probe_prompts, len(prompts))} prompts x {len(loaded)} candidates at batch 1, one thread")
    return found, sum(s.cpu_s for s in shared)


def planned_tokens(candidates: int, prompts: int, max_new_tokens: int, probe_prompts: int = PROBE_PROMPTS) -> int:
    """The tokens :func:`measure` generates when no prompt ends early: every prompt by every candidate,
    then the batch-1 probe's prompts again."""
    return candidates * (prompts + min(probe_prompts, prompts)) * max_new_tokens


def identity(engine: Engine, prompts: list[list[int]], plain: list[list[int]], other: list[list[int]]) -> dict:
    """Output identity against plain decoding: float32 engines must be token-identical; bfloat16 ones may
    differ only where plain decoding was at a near-tie (runtime/spec_decode/exactness.py)."""
    found = [divergence(engine, p, want, got) for p, want, got in zip(prompts, plain, other)]
    gaps = [d.gap_bf16_steps for d in found if d is not None]
    lossless = not gaps or (engine.bf16 and all(g <= NEAR_TIE_BF16_STEPS for g in gaps))
    return {
        "identical": sum(d is None for d in found),
        "prompts": len(found),
        "max_gap_bf16_steps": max(gaps, default=0.0),
        "lossless": lossless,
        "rule": "near-tie (bf16)" if engine.bf16 else "token-identical (float32)",
    }


def tokens_per_step(stats: SpecDecodingStats, positions: int) -> dict[str, float]:
    """Fraction of verification steps that produced 1, 2, ... tokens (1 + accepted drafts), from the
    per-position counters: steps accepting exactly k drafts = accepted_per_position[k-1] - [k]."""
    steps = stats.verification_steps
    if not steps:
        return {}
    counts = [steps, *stats.accepted_per_position] + [0] * max(0, positions - len(stats.accepted_per_position))
    return {str(k + 1): (counts[k] - (counts[k + 1] if k + 1 < len(counts) else 0)) / steps for k in range(len(counts))}


def summarize(found: Measured, plain: Measured, positions: int) -> dict:
    """The record of one candidate: acceptance from the run over every prompt, CPU speed from the batch-1
    probe (plain decoding's probe is the reference)."""
    stats, probe, base = found.acceptance.stats, found.probe, plain.probe
    step_cpu = probe.decode_cpu_s / max(probe.decode_steps, 1)
    plain_step = base.decode_cpu_s / max(base.decode_steps, 1)
    rate = probe.decode_tokens / max(probe.decode_cpu_s, 1e-12)
    plain_rate = base.decode_tokens / max(base.decode_cpu_s, 1e-12)
    run = found.acceptance
    return {
        "mean_acceptance_length": stats.mean_acceptance_length,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_per_position": stats.acceptance_per_position(positions),
        "tokens_per_step": tokens_per_step(stats, positions),
        "verification_steps": stats.verification_steps,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "rows_per_step": run.rows_fed / max(run.decode_steps, 1),
        "decode_steps": run.decode_steps,
        "decode_tokens": run.decode_tokens,
        "decode_cpu_s": run.decode_cpu_s,
        "cpu_probe": {  # the batch-1 timing run the CPU figures below come from
            "prompts": len(probe.outputs),
            "mean_acceptance_length": probe.stats.mean_acceptance_length,
            "rows_per_step": probe.rows_fed / max(probe.decode_steps, 1),
            "decode_steps": probe.decode_steps,
            "decode_tokens": probe.decode_tokens,
            "decode_cpu_s": probe.decode_cpu_s,
            "batch_invariant": probe.outputs == run.outputs[: len(probe.outputs)],
        },
        "cpu_step_ms": step_cpu * 1e3,
        "cpu_step_cost": step_cpu / plain_step if plain_step else float("nan"),  # in plain decoding steps
        "cpu_speedup": rate / plain_rate if plain_rate else float("nan"),
    }
