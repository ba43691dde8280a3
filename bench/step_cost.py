"""Where a speculative decoding step's CPU time goes, in plain decoding steps, per method.

    .venv/bin/python bench/step_cost.py [--dtype bfloat16] [--medusa-tree PRESET] [--eagle-tree PRESET]
        [--lookahead W,N,G] [--set code] [--prompts 10] [--new-tokens 64]

Builds (or reuses) the same engines as bench/speculative.py for the same options, decodes the
prompts one at a time with plain decoding and each method (interleaved per prompt: this host's
speed drifts), and splits every decode-phase step's CPU time (steps without prompt tokens) into:

* verification: the target model's forward pass over root + draft tree (Engine.forward);
* medusa heads: the heads' ResBlocks and their batched lm_head pass (MedusaHeads.logits);
* drafter layers / drafter lm_head: the EAGLE drafter's decoder layer passes (Drafter.forward) and
  its top-k over the vocabulary, one lm_head pass per tree level (Drafter.candidates);
* other: the rest (tree building, acceptance, KV compaction, scheduling).

All in units of one plain decoding step (plain decoding's decode CPU time per token), so
speedup = mean acceptance length / step cost. Not a test; the timers wrap the methods in place.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import speculative as bench  # noqa: E402  (bench/speculative.py: engines, prompts)

from pipeline import trees
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.serving.metrics import StepStats
from pipeline.runtime.spec_decode.base import DecodingMethod
from pipeline.runtime.spec_decode.eagle.drafter import Drafter
from pipeline.runtime.spec_decode.medusa import MedusaHeads

PARTS = {
    "verification": (Engine, "forward"),
    "medusa heads": (MedusaHeads, "logits"),
    "drafter layers": (Drafter, "forward"),
    "drafter lm_head": (Drafter, "candidates"),
}


@contextlib.contextmanager
def timed_parts(spent: collections.Counter) -> Iterator[None]:
    """Add each part's CPU time to ``spent`` while inside."""
    originals = {part: getattr(cls, name) for part, (cls, name) in PARTS.items()}

    def timer(part: str, fn):
        def wrapped(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += time.thread_time() - start

        return wrapped

    for part, (cls, name) in PARTS.items():
        setattr(cls, name, timer(part, originals[part]))
    try:
        yield
    finally:
        for part, (cls, name) in PARTS.items():
            setattr(cls, name, originals[part])


@dataclasses.dataclass
class Totals:
    tally: bench.Tally = dataclasses.field(default_factory=bench.Tally)  # decode-phase tokens and CPU time
    steps: int = 0  # decode-phase steps
    parts: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def decode(engine: Engine, method: DecodingMethod, prompt: list[int], new_tokens: int, totals: Totals) -> None:
    """One request through bench/speculative.py's run; the parts' times count in decode-phase steps only."""
    spent: collections.Counter = collections.Counter()

    def on_step(step: StepStats) -> None:
        if step.prefill_tokens == 0:
            totals.steps += 1
            totals.parts.update(spent)
        spent.clear()

    with timed_parts(spent):
        bench.run(engine, method, [prompt], new_tokens, 2, totals.tally, on_step=on_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--medusa-tree", choices=sorted(trees.TREE_PRESETS))
    parser.add_argument("--eagle-tree", choices=sorted(trees.TREE_PRESETS))
    parser.add_argument("--lookahead", metavar="W,N,G", help="the Lookahead engine's (W, N, G)")
    parser.add_argument("--set", default="code", choices=["code", "chat"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--eagle2-top-k", type=int, default=4, help="EAGLE-2 expansion top_k")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = bench.Overrides.from_args(args)
    built = {kind: bench.build(kind, overrides) for kind in ("medusa", "eagle", "lookahead")}
    methods = bench.load_methods(built, args.eagle2_top_k)
    prompts, source = bench.load_prompts(args.set, args.prompts, built["lookahead"].variant.model_dir)
    totals = {name: Totals() for name in methods}
    for engine, method in methods.values():  # warm-up
        decode(engine, method, [1, 2, 3, 4], 4, Totals())
    for prompt in prompts:
        for name, (engine, method) in methods.items():
            decode(engine, method, prompt, args.new_tokens, totals[name])
    plain = totals["plain"].tally.decode_cpu_s / totals["plain"].tally.decode_tokens  # CPU s per plain step
    print(f"{args.set} prompts ({source}), {args.dtype}, batch 1; in plain decoding steps per step:")
    for name, t in totals.items():
        step = t.tally.decode_cpu_s / t.steps / plain
        accepted = t.tally.decode_tokens / t.steps
        parts = {part: t.parts[part] / t.steps / plain for part in PARTS if t.parts[part]}
        parts["other"] = step - sum(parts.values())
        shown = ", ".join(f"{part} {value:.2f}" for part, value in parts.items())
        print(f"  {name:9s} AL {accepted:.2f}  step {step:.2f}  speedup {accepted / step:.2f}x  = {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
