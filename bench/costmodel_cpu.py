"""The cost model against the reference backend's measured CPU decode speedups (validation, CPU side).

    .venv/bin/python bench/costmodel_cpu.py EVALUATION_JSON [EVALUATION_JSON ...] [--repeats 5]

For each evaluation (written by the evaluate stage, e.g. by bench/evaluate.py), takes this host's
GEMM cost by rows for the variant's shapes (pipeline/costmodel/cpu.py; the engine's own Gemm, one
thread) as the evaluate stage probed it right after timing the candidates (an evaluation without that
record is probed now, with the error of the host's drift in between), takes plain decoding's
measured step as the one fitted parameter (its non-GEMM time), and
takes the evaluation's timed engine passes by rows fed (cpu_forward_s) as the target pass, and
prints per candidate the predicted and the measured CPU decode speedup (and step cost) side by
side, with the relative error; the target is within 15% for every candidate. The measured figures,
acceptance length and rows fed per step are the batch-1 timing probe's (cpu_probe; Lookahead feeds
fewer than (W + G)(N - 1) when its pool has no n-gram).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import trees
from pipeline.costmodel.cpu import interpolate, predicted_cpu_speedup
from pipeline.costmodel.gemm_probe import CpuProfile, probe
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.spec import presets


def drafting_of(record: dict) -> Drafting:
    """The cost model's view of a candidate from its name (the evaluation's naming)."""
    name = record["name"]
    if name == "plain":
        return Drafting.plain()
    if name.startswith("lookahead("):
        return Drafting.lookahead(LookaheadConfig(*(int(v) for v in name[10:-1].split(","))))
    if name.startswith("eagle2("):
        top_k = int(name.split("top_k ")[1].rstrip(")"))
        depth = len(record["acceptance_per_position"])
        return Drafting.eagle_dynamic(top_k, depth, int(record["draft_tokens"] / max(record["verification_steps"], 1)))
    tree = trees.TREE_PRESETS[name.split("[")[1].rstrip("]")]
    if name.startswith("medusa["):
        return Drafting.medusa(tree, len(record["acceptance_per_position"]))
    return Drafting.eagle(tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evaluations", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    arch = presets.preset("smollm2-135m-instruct")  # the SmolLM2 specs' shape (its published config.json)
    worst = 0.0
    for path in args.evaluations:
        result = json.loads(path.read_text())
        bf16 = result.get("engine_dtype") == "bfloat16"
        recorded = result["timing"].get("cpu_gemm_probe")  # probed by the evaluate stage, in the same minutes
        profile = CpuProfile.from_dict(recorded) if recorded else probe(arch, bf16=bf16, repeats=args.repeats)
        plain = next(c for c in result["candidates"] if c["name"] == "plain")
        plain_step = plain["cpu_step_ms"] / 1e3
        forward = {int(r): s for r, s in (result["timing"].get("cpu_forward_s") or {}).items()}
        print(
            f"{result['variant']} ({path}): {result['prompts']['count']} prompts; plain step "
            f"{plain['cpu_step_ms']:.1f} ms"
            + (
                "; engine pass 1 / 8 / 16 rows "
                + " / ".join(f"{interpolate(forward, r) * 1e3:.1f}" for r in (1, 8, 16))
                + " ms"
                if forward
                else " (no timed engine passes in this evaluation: GEMM probe only)"
            )
        )
        print(
            f"  {'candidate':30s} {'AL':>5s} {'rows':>5s}  {'step cost pred/meas':>20s}  "
            f"{'speedup pred/meas':>18s}  error"
        )
        for c in result["candidates"]:
            if c["name"] == "plain":
                continue
            # The CPU figures come from the batch-1 timing probe: its own acceptance length and rows.
            timed = c.get("cpu_probe") or c
            al, rows = timed["mean_acceptance_length"], timed["rows_per_step"]
            speedup, cost = predicted_cpu_speedup(profile, arch, drafting_of(c), rows, al, plain_step, forward)
            error = (speedup - c["cpu_speedup"]) / c["cpu_speedup"]
            worst = max(worst, abs(error))
            print(
                f"  {c['name']:30s} {al:5.2f} {rows:5.1f}  "
                f"{cost:9.2f} / {c['cpu_step_cost']:8.2f}  {speedup:8.2f}x / {c['cpu_speedup']:6.2f}x  "
                f"{error:+.0%}"
            )
    print(f"largest error {worst:.0%} (target: within 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
