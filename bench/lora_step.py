"""Decode cost of the shared LoRA engine against the base, side by side in one run, on SmolLM2.

    .venv/bin/python bench/lora_step.py [--batch 8] [--new-tokens 48] [--rounds 5]

Builds specs/smollm2-lora.yaml's group engine (the base with the LoRA plugin; under
bench/out/lora-step, up-to-date stages are skipped) and runs the reference engine's scheduler on
``--batch`` requests decoding ``--new-tokens`` tokens each (EOS ignored), three ways, interleaved
over ``--rounds`` rounds:

* ``base``: no request names an adapter (the LoRA engine's plain path);
* ``one adapter``: every request through the shipped code adapter;
* ``N adapters``: every request a task id of its own (the two shipped adapters' weights under
  ``--batch`` distinct task ids: a group per request, the most mixed step there is).

It prints the median wall time of each and its ratio to ``base``: what a LoRA fine-tune costs on the
shared engine, and what mixing adapters in one step adds. Not a test: the machine's load moves
absolute times; the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from pipeline.lora.convert import convert_adapter
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest, LoraRequest
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan

OUT = REPO / "bench" / "out" / "lora-step"
PROMPT = tuple(range(100, 116))  # 16 tokens


def build_engine(cache: Path) -> Path:
    plan = make_plan(load_spec(REPO / "specs" / "smollm2-lora.yaml"), OutputRoots(OUT / "engines", OUT / "repo", cache))
    base = next(v for v in plan.variants if v.name == "base")
    execute_plan(plan, only={"base"}, say=lambda text: print(f"  {text}", flush=True))
    return base.stage("build").output


def decode(engine: Engine, loras: list[LoraRequest | None], new_tokens: int) -> float:
    scheduler = Scheduler(engine)
    for i, lora in enumerate(loras):
        request = GenerationRequest(f"r{i}", PROMPT, new_tokens, end_id=-1, lora=lora)
        scheduler.submit(request, lambda output, rid=i: None)
    start = time.perf_counter()
    scheduler.run_until_idle()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine.load(build_engine(args.cache_dir))
    code = convert_adapter(REPO / "adapters" / "smollm2-code")
    json_ = convert_adapter(REPO / "adapters" / "smollm2-json")

    def first(task_id: int, adapter) -> LoraRequest:  # the first request of a task id brings its weights
        return LoraRequest(task_id, adapter.weights, adapter.config)

    ways = {
        "base": [None] * args.batch,
        "one adapter": [first(1, code)] + [LoraRequest(1)] * (args.batch - 1),
        f"{args.batch} adapters": [first(10 + i, (code, json_)[i % 2]) for i in range(args.batch)],
    }
    decode(engine, ways["base"], 4)  # warm up
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, loras in ways.items():
            times[name].append(decode(engine, loras, args.new_tokens))
    base = statistics.median(times["base"])
    print(f"SmolLM2-135M float32, batch {args.batch}, {args.new_tokens} new tokens, {args.rounds} rounds, 1 thread")
    print(f"{'':<14} {'median s':>9} {'x base':>7}")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name:<14} {median:>9.3f} {median / base:>7.2f}")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
