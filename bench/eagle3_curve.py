"""Learning curve of the EAGLE-3 drafter beside EAGLE heads on the same data: AL against training tokens.

    .venv/bin/python bench/eagle3_curve.py [JSON ...] [--batch 1] [--out docs/img/eagle3_curve.png]

Reads bench/eagle3_vs_eagle2.py reports (default, all 25 prompts per set: bench/out/eagle3_vs_eagle2_25.json,
bench/out/eagle3_vs_eagle2_equal_25.json and bench/out/curve25_*.json) and takes, per prompt set, the mean
acceptance length of two rows at batch ``--batch``: ``eagle3`` (the EAGLE-3 drafter, ``--eagle3``, its
dynamic tree) and ``eagle2=`` (the EAGLE heads of ``--equal-budget-eagle``, EAGLE-2's dynamic tree),
each at its drafter's training tokens (the manifest's, from the report's budgets). The shipped EAGLE
heads' ``eagle2`` row (371k tokens of other data) is left out. Reports whose measuring settings (prompts,
new tokens, tree, dtype) differ from the first one's are refused. Prints a markdown table and draws
x = training tokens (log scale), y = AL, one line per drafter per set. Reads results only: no decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
DRAFTERS = {"eagle3": ("eagle3", "EAGLE-3"), "eagle2=": ("eagle=", "EAGLE")}  # row: (budget key, label)
SAME = ("prompts", "new_tokens", "eagle3_k", "eagle2_top_k", "dtype")  # settings every report must share


def default_reports() -> list[Path]:
    fixed = [OUT / "eagle3_vs_eagle2_25.json", OUT / "eagle3_vs_eagle2_equal_25.json"]
    return [p for p in fixed if p.is_file()] + sorted(OUT.glob("curve25_*.json"))


def collect(paths: list[Path], batch: int) -> dict[tuple[str, str], dict[int, float]]:
    """{(drafter label, set): {training tokens: AL}} from the reports' rows at ``batch``."""
    points: dict[tuple[str, str], dict[int, float]] = {}
    first = None
    for path in paths:
        report = json.loads(path.read_text())
        settings = {k: report["settings"][k] for k in SAME}
        first = first or (path, settings)
        if settings != first[1]:
            raise SystemExit(f"{path}: settings {settings} differ from {first[0]}'s {first[1]}")
        for row in report["runs"]:
            if row["batch"] != batch or row["method"] not in DRAFTERS:
                continue
            key, label = DRAFTERS[row["method"]]
            tokens = report["budgets"][key]["tokens"]
            points.setdefault((label, row["set"]), {})[tokens] = row["mean_acceptance_length"]
    return points


def table(points: dict[tuple[str, str], dict[int, float]]) -> str:
    budgets = sorted({t for by_tokens in points.values() for t in by_tokens})
    lines = ["| training tokens | EAGLE-3 code / chat | EAGLE code / chat |", "|---|---|---|"]
    for tokens in budgets:
        cells = [
            " / ".join(f"{points.get((label, s), {}).get(tokens, float('nan')):.2f}" for s in ("code", "chat"))
            for label in ("EAGLE-3", "EAGLE")
        ]
        lines.append(f"| {tokens:,} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def plot(points: dict[tuple[str, str], dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"code": "tab:orange", "chat": "tab:blue"}
    styles = {"EAGLE-3": "o-", "EAGLE": "s--"}
    for (label, kind), by_tokens in sorted(points.items()):
        xs = sorted(by_tokens)
        ax.plot(xs, [by_tokens[x] for x in xs], styles[label], color=colors[kind], label=f"{label}, {kind}")
    ax.set_xscale("log")
    budgets = sorted({t for by_tokens in points.values() for t in by_tokens})
    ax.set_xticks(budgets, [f"{t / 1000:.1f}k" for t in budgets])
    ax.minorticks_off()
    ax.set_xlabel("training tokens (the EAGLE-3 drafter's self-distilled data, log scale)")
    ax.set_ylabel("acceptance length (dynamic tree, batch 1)")
    ax.set_title("EAGLE-3 drafter vs EAGLE heads on the same data")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, help="bench/eagle3_vs_eagle2.py JSON reports")
    parser.add_argument("--batch", type=int, default=1, help="the batch size whose rows to plot")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "eagle3_curve.png")
    args = parser.parse_args()
    paths = args.reports or default_reports()
    points = collect(paths, args.batch)
    if not points:
        raise SystemExit(f"no eagle3 or eagle2= rows at batch {args.batch} in {[str(p) for p in paths]}")
    print(table(points))
    plot(points, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
