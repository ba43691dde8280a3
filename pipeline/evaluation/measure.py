"""Every candidate decoded on every prompt through the reference runtime, from one shared prefill.

Each prompt is prefilled once (one engine pass, every prompt row's hidden state kept for EAGLE's
drafter); each candidate then starts from a copy of that KV cache (``Scheduler.submit_prefilled``)
and decodes greedily through the scheduler, one request in flight, so its acceptance counters are
the ones ``return_perf_metrics`` reports (serving/metrics.py) and its decode-step CPU time is the
time one step of that method costs here. Candidates are interleaved per prompt: this host's speed
drifts during a run, and interleaving spreads the drift over all of them alike.

The saving of the shared prefill is measured, not estimated: the prefill's CPU time is timed once
per prompt, and every candidate after the first would have spent it again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.evaluation.candidates import Loaded
from pipeline.runtime.model.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.request import FinishReason, GenerationRequest, StepOutput
from pipeline.runtime.serving.metrics import SpecDecodingStats, SpecRequestMetrics, StepStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.exactness import NEAR_TIE_BF16_STEPS, divergence


@dataclass
class Prefill:
    cache: KVCache
    rows: StepRows
    cpu_s: float


@dataclass
class Tally:
    """One candidate's totals over the prompts."""

    stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_cpu_s: float = 0.0
    rows_fed: int = 0  # rows fed to the target in decode steps
    outputs: list[list[int]] = field(default_factory=list)


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
    """This thread's CPU time on a CPU engine (other processes' load does not count); wall time on a GPU,
    where the step is the GPU's work."""
    return time.thread_time if engine.device.type == "cpu" else time.perf_counter


def prefill(engine: Engine, prompt: list[int]) -> Prefill:
    clock = step_clock(engine)
    start = clock()
    cache = engine.new_cache(len(prompt))
    (rows,) = engine.forward([StepInput(cache, list(prompt), Logits.LAST, all_hidden=True)])
    return Prefill(cache, rows, clock() - start)


def decode(
    loaded: Loaded, prompt: list[int], shared: Prefill, max_new_tokens: int, end_id: int | None, tally: Tally
) -> None:
    """One request from the shared prefill to its end; adds to ``tally``."""
    candidate, method = loaded.candidate, loaded.method
    request = GenerationRequest(
        "0", tuple(prompt), max_new_tokens, end_id=end_id, exclude_input_in_output=True, lookahead=candidate.lookahead
    )
    limits = dataclasses.replace(loaded.engine.config.limits, max_batch_size=1)
    now_s = step_clock(loaded.engine)
    clock = [0.0]

    def count(step: StepStats) -> None:
        now = now_s()
        tally.decode_steps += 1
        tally.decode_tokens += step.generated_tokens
        tally.decode_cpu_s += now - clock[0]
        tally.rows_fed += step.input_tokens
        clock[0] = now

    done: list[StepOutput] = []
    sched = Scheduler(loaded.engine, method, limits=limits, on_step=count)
    cache = clone_cache(shared.cache, len(prompt) + max_new_tokens + method.max_draft_len)
    sched.submit_prefilled(request, lambda out: done.append(out) if out.finished else None, cache, shared.rows)
    clock[0] = now_s()
    sched.run_until_idle()
    (out,) = done
    if out.reason == FinishReason.ERROR:
        raise RuntimeError(f"{candidate.name}: {out.error}")
    assert isinstance(out.metrics, SpecRequestMetrics)  # what the scheduler gives every request
    tally.stats.merge(out.metrics.spec)
    tally.outputs.append(list(out.tokens))


def measure(
    loaded: list[Loaded],
    prompts: list[list[int]],
    max_new_tokens: int,
    end_id: int | None,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[dict[str, Tally], float]:
    """Tallies by candidate name, and the shared prefills' total CPU seconds."""
    tallies = {item.candidate.name: Tally() for item in loaded}
    base = loaded[0].engine
    prefill_cpu = 0.0
    for i, prompt in enumerate(prompts):
        shared = prefill(base, prompt)
        prefill_cpu += shared.cpu_s
        for item in loaded:
            decode(item, prompt, shared, max_new_tokens, end_id, tallies[item.candidate.name])
        if (i + 1) % 8 == 0 or i + 1 == len(prompts):
            say(f"evaluated {i + 1}/{len(prompts)} prompts x {len(loaded)} candidates")
    return tallies, prefill_cpu


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


def summarize(tally: Tally, plain: Tally, positions: int) -> dict:
    """The record of one candidate (plain decoding's tally is the reference for CPU speed)."""
    stats = tally.stats
    step_cpu = tally.decode_cpu_s / max(tally.decode_steps, 1)
    plain_step = plain.decode_cpu_s / max(plain.decode_steps, 1)
    rate = tally.decode_tokens / max(tally.decode_cpu_s, 1e-12)
    plain_rate = plain.decode_tokens / max(plain.decode_cpu_s, 1e-12)
    return {
        "mean_acceptance_length": stats.mean_acceptance_length,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_per_position": stats.acceptance_per_position(positions),
        "tokens_per_step": tokens_per_step(stats, positions),
        "verification_steps": stats.verification_steps,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "rows_per_step": tally.rows_fed / max(tally.decode_steps, 1),
        "decode_steps": tally.decode_steps,
        "decode_tokens": tally.decode_tokens,
        "decode_cpu_s": tally.decode_cpu_s,
        "cpu_step_ms": step_cpu * 1e3,
        "cpu_step_cost": step_cpu / plain_step if plain_step else float("nan"),  # in plain decoding steps
        "cpu_speedup": rate / plain_rate if plain_rate else float("nan"),
    }
