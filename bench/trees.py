"""Draft trees fitted to the shipped SmolLM2 heads: which n-node tree accepts the most tokens.

    .venv/bin/python bench/trees.py [--sizes 6 10 15 20 25 63] [--methods medusa eagle] [--plot PNG [--replot]]

For every decoding position of self-distilled text, the heads' ranks of the true next tokens
along the true path (pipeline/heads/evaluate.py) form a rank path; trees.most_frequent_paths
turns their counts into the best tree of each size. Trees are fitted on the validation sequences
of the training data (every 40th, which the heads never trained on: on their own training text
the heads rank the true tokens far better than on new text, and trees fitted there lean on deep
paths that do not pay off) and scored on the held-out eval sequences (offline tokens per step,
the walk of evaluate.simulate), next to the presets, per prompt kind. Writes bench/trees.json
(kept in the repository, like bench/heads.json: the presets in pipeline/trees.py come from it).
Needs the self-distillation cache that ``specdeploy train-heads`` fills (.cache/heads-data;
generated if missing, ~1 h). ``--plot`` draws the report's tokens per step by tree size, fitted trees
against the presets (docs/img/trees.png); with ``--replot`` it only draws bench/trees.json, in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import trees
from pipeline.embedded import prepare_embedded_model
from pipeline.heads.data import KINDS, SeqData, prepare_data
from pipeline.heads.evaluate import MISS, eagle_ranks, medusa_ranks, simulate
from pipeline.heads.expand import base_lm_head
from pipeline.heads.export import load_eagle_folder, load_medusa_folder
from pipeline.heads.train import base_embedding, split_validation

REPORT = REPO / "bench" / "trees.json"
EAGLE_DEPTH = 5  # ranks measured this deep; trees are limited by --eagle-depth
CAP = 8  # ranks beyond the top 8 never make a useful tree node


def rank_function(method: str, base_dir: Path):
    lm_head = base_lm_head(base_dir).float()
    if method == "medusa":
        blocks = load_medusa_folder(REPO / "heads" / "smollm2-medusa")
        return lambda tokens, hidden: medusa_ranks(blocks, lm_head, tokens, hidden, CAP)
    drafter = load_eagle_folder(REPO / "heads" / "smollm2-eagle")
    embed = base_embedding(base_dir).float()
    return lambda tokens, hidden: eagle_ranks(drafter, embed, lm_head, tokens, hidden, EAGLE_DEPTH, CAP)


def rank_tables(rank_fn, data: SeqData) -> list[tuple[torch.Tensor, int]]:
    """(ranks [T, D], answer start) per sequence."""
    out = []
    for s in range(len(data)):
        tokens, hidden, start = data.seq(s)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # fast on AMX; ranks, not logits, are kept
            out.append((rank_fn(tokens, hidden).cpu(), start))
    return out


def rank_paths(tables: list[tuple[torch.Tensor, int]]) -> Counter:
    """Counts of rank paths at every answer position (a path ends at the first MISS or the text's end)."""
    paths: Counter = Counter()
    for ranks, start in tables:
        T, depth = ranks.shape
        for t in range(start - 1, T - 1):
            path = []
            for d in range(min(depth, T - 2 - t)):
                if int(ranks[t, d]) == MISS:
                    break
                path.append(int(ranks[t, d]))
            paths[tuple(path)] += 1
    return paths


def tokens_per_step(tables: list[tuple[torch.Tensor, int]], tree: trees.Tree) -> float:
    produced = steps = 0
    for ranks, start in tables:
        a, b = simulate(ranks, start, tree)
        produced, steps = produced + a, steps + b
    return round(produced / max(steps, 1), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[6, 10, 15, 20, 25, 63])
    parser.add_argument(
        "--eagle-depth",
        type=int,
        default=3,
        help="deepest EAGLE tree: each level costs a drafter pass and an lm_head pass on a CPU",
    )
    parser.add_argument("--methods", nargs="+", default=["medusa", "eagle"], choices=["medusa", "eagle"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw tokens/step by tree size to PNG")
    parser.add_argument("--replot", action="store_true", help=f"measure nothing: only draw {REPORT.name} (--plot)")
    args = parser.parse_args()
    if args.replot:
        if not args.plot:
            parser.error("--replot draws the kept report: name the PNG with --plot")
        plot(json.loads(REPORT.read_text()), args.plot)
        print(f"wrote {args.plot}")
        return 0
    torch.set_num_threads(args.threads)
    base_dir = prepare_embedded_model(REPO / ".cache")
    train, held_out, _ = prepare_data(base_dir, REPO / ".cache", say=lambda text: print(f"  {text}", flush=True))
    _, fit = split_validation(train)
    report: dict = {"methods": {}}
    for method, max_depth in (("medusa", None), ("eagle", args.eagle_depth)):
        if method not in args.methods:
            continue
        rank_fn = rank_function(method, base_dir)
        counts = rank_paths(rank_tables(rank_fn, fit))
        fitted = {f"fitted_{n}": trees.most_frequent_paths(counts, n, max_depth) for n in args.sizes}
        candidates = {
            **{name: tree for name, tree in trees.TREE_PRESETS.items() if max_depth or trees.tree_depth(tree) <= 3},
            **fitted,
        }
        section = {
            "settings": {**vars(args), "fit_sequences": len(fit)},
            "trees": {name: [list(p) for p in tree] for name, tree in fitted.items()},
            "tokens_per_step": {},
        }
        for kind in KINDS:
            tables = rank_tables(rank_fn, held_out.select(kind))
            section["tokens_per_step"][kind] = {
                name: tokens_per_step(tables, tree) for name, tree in candidates.items()
            }
            print(
                f"{method} {kind}: "
                + ", ".join(
                    f"{name} ({len(tree)}) {section['tokens_per_step'][kind][name]}"
                    for name, tree in candidates.items()
                ),
                flush=True,
            )
        report["methods"][method] = section
    if REPORT.exists():  # keep the other method's section when only one was run
        report["methods"] = {**json.loads(REPORT.read_text()).get("methods", {}), **report["methods"]}
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {REPORT}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def plot(report: dict, path: Path) -> None:
    """Held-out tokens per step by tree size, a panel per prompt kind: each method's fitted trees as a
    line, the presets (scored with the same heads) as open markers at their node counts, a shape each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    sections = report["methods"]
    kinds = list(next(iter(sections.values()))["tokens_per_step"])
    shape = {name: "v^sDPXh*dp<>"[i % 12] for i, name in enumerate(trees.TREE_PRESETS)}
    colour = {method: f"C{i}" for i, method in enumerate(sections)}
    fig, axes = plt.subplots(1, len(kinds), figsize=(12, 4.6), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for method, section in sections.items():
            scores = section["tokens_per_step"][kind]
            fitted = sorted(
                (int(name.removeprefix("fitted_")), v) for name, v in scores.items() if name.startswith("fitted_")
            )
            ax.plot(*zip(*fitted), "o-", ms=4, color=colour[method], zorder=2)
            for name, tree in trees.TREE_PRESETS.items():
                if name in scores:
                    ax.scatter(len(tree), scores[name], marker=shape[name], s=70, facecolors="none",
                               edgecolors=colour[method], linewidths=1.1, zorder=3)  # fmt: skip
        sizes = sorted(
            {len(trees.TREE_PRESETS[n]) for n in shape} | {n for s in sections.values() for n in s["settings"]["sizes"]}
        )
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("tree nodes (draft tokens verified per step)")
        ax.set_title(f"{kind}: held-out prompts")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tokens per step (offline, greedy)")
    handles = [Line2D([], [], marker="o", ms=4, color=c, label=f"{m} heads: fitted trees") for m, c in colour.items()]
    handles += [
        Line2D([], [], ls="", marker=shape[name], ms=8, mfc="none", mec="0.3", label=f"preset {name} ({len(tree)})")
        for name, tree in trees.TREE_PRESETS.items()
    ]
    axes[0][-1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
