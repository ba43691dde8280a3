"""Stale vs refreshed heads: the base's heads on the base, on the code fine-tune, and the fine-tune's refreshed heads.

    .venv/bin/python bench/stale_heads.py [--prompts 25] [--new-tokens 48] [--sets code chat] [--variants ...]

Builds the fleet through the pipeline (up-to-date stages skip), then decodes the same eval prompts
greedily with plain decoding and with each variant's method through the scheduler of
specs/smollm2-fleet.yaml: EAGLE on ``base``, ``code-stale-eagle`` (the base's drafter on the code
fine-tune) and ``code-refreshed-eagle`` (heads/smollm2-code-eagle); Medusa on ``base-medusa``,
``code-stale-medusa`` and ``code-refreshed-medusa`` (heads/smollm2-code-medusa). Reports the mean
acceptance length of each and whether the output equals the same engine's plain decoding (it must:
stale heads cost speed, never correctness). Writes bench/out/stale_heads.json (results of variants
not measured in this run are kept from the previous file). All 25 held-out prompts per set by default:
on 8 the figures moved by up to 0.2 from the full sets'. Not a test: acceptance depends on the prompts;
CPU time depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.speculative import Tally, load_prompts, run
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan

SPEC = REPO / "specs" / "smollm2-fleet.yaml"
VARIANTS = (
    "base",
    "code-stale-eagle",
    "code-refreshed-eagle",
    "base-medusa",
    "code-stale-medusa",
    "code-refreshed-medusa",
)
END_ID = 2  # SmolLM2's <|im_end|>, as bench/speculative.py


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=25, help="eval prompts per set (25: all of them)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--sets", nargs="+", default=["code", "chat"], choices=["code", "chat"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan = make_plan(load_spec(SPEC), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache"))
    execute_plan(plan, only=set(args.variants), say=lambda text: print(f"  {text}", flush=True))
    out = REPO / "bench" / "out" / "stale_heads.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    same_setup = (previous.get("prompts"), previous.get("new_tokens")) == (args.prompts, args.new_tokens)
    results: dict[str, dict] = dict(previous.get("results", {})) if same_setup else {}
    for name in args.variants:
        variant = next(v for v in plan.variants if v.name == name)
        engine = Engine.load(variant.stage("build").output)
        config = getattr(variant.speculative, variant.method)
        trees = {"eagle_choices": config.tree} if variant.method == "eagle" else {"medusa_choices": config.tree}
        method, _ = make_method(engine, MethodSettings(variant.method, **trees))
        for kind in args.sets:
            prompts, _ = load_prompts(kind, args.prompts, variant.model_dir)
            plain, spec = Tally(), Tally()
            run(engine, PlainDecoding(), prompts, args.new_tokens, END_ID, plain)
            run(engine, method, prompts, args.new_tokens, END_ID, spec)
            row = {
                "method": variant.method,
                "mean_acceptance_length": round(spec.stats.mean_acceptance_length, 3),
                "same_as_plain": spec.outputs == plain.outputs,
                "tokens": spec.tokens,
            }
            results.setdefault(name, {})[kind] = row
            print(
                f"{name:22s} {kind:5s} {variant.method} mean acceptance length {row['mean_acceptance_length']:.2f} "
                f"(output {'=' if row['same_as_plain'] else '!='} plain decoding)",
                flush=True,
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"prompts": args.prompts, "new_tokens": args.new_tokens, "results": results}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
