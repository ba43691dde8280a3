"""The cost model against published GPU speedups, at their published acceptance lengths.

    .venv/bin/python bench/costmodel_published.py [--markdown]

Each row: a published (model, GPU, method, settings, mean accepted tokens per step, speedup over
plain decoding at batch 1), the model's prediction for the same shape, GPU, method and acceptance
length, and the relative error. Sources:

* Spec-Bench leaderboard, A100 80 GB, greedy, FP16, batch 1 (hemingkx/Spec-Bench, Leaderboard.md;
  Xia et al., "Unlocking Efficiency in Large Language Model Inference", arXiv 2401.07851): the
  "#Mean Accepted Tokens" and "Overall" columns. Their settings: EAGLE-1 with its own default tree
  (SafeAILab/EAGLE eagle/model/choices.py, 25 nodes, depth 5), Medusa-1 (FasterDecoding's
  medusa-vicuna heads: 5 heads, mc_sim_7b_63), Lookahead with level 5, window 7, guess 7
  (Spec-Bench eval.sh: N=5, W=7, G=7).

The Vicuna-13B and -33B shapes are their published config.json values (LLaMA-13B / LLaMA-30B).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import presets, trees
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.step import Deployment, Drafting
from pipeline.speculative import LookaheadConfig

VICUNA_7B = presets.preset("vicuna-7b-v1.3")
VICUNA_13B = dataclasses.replace(
    VICUNA_7B,
    name="vicuna-13b-v1.3",
    hidden_size=5120,
    num_layers=40,
    num_heads=40,
    num_kv_heads=40,
    intermediate_size=13824,
)
VICUNA_33B = dataclasses.replace(
    VICUNA_7B,
    name="vicuna-33b-v1.3",
    hidden_size=6656,
    num_layers=60,
    num_heads=52,
    num_kv_heads=52,
    intermediate_size=17920,
)
EAGLE1_TREE: trees.Tree = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (2, 1),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (0, 2, 0),
    (0, 2, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 0, 2),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)
SPEC_BENCH = "Spec-Bench A100 leaderboard"
METHODS = {
    "eagle": ("EAGLE-1, 25-node tree", Drafting.eagle(EAGLE1_TREE)),
    "medusa": ("Medusa-1, 5 heads, mc_sim_7b_63", Drafting.medusa(trees.MC_SIM_7B_63, 5)),
    "lookahead": ("Lookahead W7 N5 G7", Drafting.lookahead(LookaheadConfig(7, 5, 7))),
}
# (source, model shape, gpu, method, published mean accepted tokens, published speedup)
PUBLISHED = [
    (SPEC_BENCH, VICUNA_7B, "a100-80gb", "eagle", 3.61, 2.29),
    (SPEC_BENCH, VICUNA_7B, "a100-80gb", "medusa", 2.32, 1.78),
    (SPEC_BENCH, VICUNA_7B, "a100-80gb", "lookahead", 1.66, 1.27),
    (SPEC_BENCH, VICUNA_13B, "a100-80gb", "eagle", 3.64, 2.34),
    (SPEC_BENCH, VICUNA_13B, "a100-80gb", "medusa", 2.39, 1.75),
    (SPEC_BENCH, VICUNA_13B, "a100-80gb", "lookahead", 1.63, 1.22),
    (SPEC_BENCH, VICUNA_33B, "a100-80gb", "eagle", 3.39, 2.47),
    (SPEC_BENCH, VICUNA_33B, "a100-80gb", "medusa", 2.33, 1.79),
    (SPEC_BENCH, VICUNA_33B, "a100-80gb", "lookahead", 1.61, 1.24),
]


def rows(context_len: int) -> list[dict]:
    out = []
    for source, arch, gpu, method, accepted, published in PUBLISHED:
        label, drafting = METHODS[method]
        deployment = Deployment(arch, gpu_perf(gpu), context_len=context_len)
        (p,) = predict(deployment, drafting, accepted, [1])
        out.append(
            {
                "source": source,
                "model": arch.name,
                "gpu": gpu,
                "method": label,
                "al": accepted,
                "published": published,
                "predicted": p.speedup,
                "error": (p.speedup - published) / published,
                "step_ratio": p.method_s / p.plain_s,
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--context-len",
        type=int,
        default=512,
        help="cached tokens per request (Spec-Bench: prompts of a few hundred tokens plus up to 1024 generated)",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    table = rows(args.context_len)
    if args.markdown:
        print("| source | model | GPU | method | published AL | published speedup | predicted | error |")
        print("|---|---|---|---|---|---|---|---|")
        for r in table:
            print(
                f"| {r['source']} | {r['model']} | {r['gpu']} | {r['method']} | {r['al']:.2f} | "
                f"{r['published']:.2f}x | {r['predicted']:.2f}x | {r['error']:+.0%} |"
            )
    else:
        for r in table:
            print(
                f"{r['model']:16s} {r['gpu']:10s} {r['method']:32s} AL {r['al']:.2f}  published "
                f"{r['published']:.2f}x  predicted {r['predicted']:.2f}x (step {r['step_ratio']:.2f} plain steps)"
                f"  error {r['error']:+.0%}"
            )
    mean = sum(abs(r["error"]) for r in table) / len(table)
    print(f"mean absolute error {mean:.0%} over {len(table)} published results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
