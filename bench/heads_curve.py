"""Learning curve of the heads trainer: held-out acceptance against the number of training tokens.

    .venv/bin/python bench/heads_curve.py [--method eagle] [--budgets 7500 15000 30000 60000] [--epochs 6]
    .venv/bin/python bench/heads_curve.py --replot --plot docs/img/heads_curve.png

Why the shipped heads stop where they do. The target is the fleet's code fine-tune (specs/smollm2-fleet.yaml,
built through the pipeline; up-to-date stages skip); the data is the 120k self-distilled tokens with
top-10 labels that its refreshed heads (heads/smollm2-code-*) trained on, from the heads data cache
(generated once if missing: ~40 min on 2 threads). For each budget the heads train from a random start
on the first ``budget`` tokens of it (chat and code alternate), seed 0, the epoch with the best
validation score kept, and are scored offline (pipeline/heads/evaluate.py, greedy, full vocabulary) on
the fine-tune's own answers to the 25 + 25 held-out prompts. The base's heads (stale on this target) and
the shipped warm-started refresh are scored the same way for reference.

Then tokens/step = a + b * log2(tokens) is fitted per set and solved for the tokens a target needs:
an extrapolation, printed as one. Keeps each method's results in bench/heads_curve.json and writes
bench/out/heads_curve_<method>.{md,png} (or the figure to --plot); budgets measured by an earlier run with
the same method and epochs are kept, so budgets can run in separate processes. With ``--replot`` it measures
nothing and draws every method kept in bench/heads_curve.json, one panel each, in seconds.
Not a test: the figures depend on the data; the seconds on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.geometry import ModelGeometry
from pipeline.heads.data import DataSettings, SeqData, _records, build_split, load_base
from pipeline.heads.eagle import EagleTrainConfig, train_eagle
from pipeline.heads.evaluate import evaluate_eagle, evaluate_medusa
from pipeline.heads.expand import base_lm_head
from pipeline.heads.export import load_eagle_folder, load_medusa_folder
from pipeline.heads.medusa import MedusaTrainConfig, train_medusa
from pipeline.heads.refresh import RefreshSettings, data_key, fast_bf16, split_validation, training_data
from pipeline.heads.train import EAGLE_TREES, MEDUSA_TREES, base_embedding, validation_score
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan

SPEC = REPO / "specs" / "smollm2-fleet.yaml"
REPORT = REPO / "bench" / "heads_curve.json"  # {"methods": {method: result}}, kept in the repository
VARIANT = "code-stale-eagle"  # the code fine-tune, merged by the pipeline
DATA_TOKENS = 120_000  # the shipped refresh's data
TREE = "cpu_small_10_depth_3"
# The shipped SmolLM2 heads' targets (reference backend, trees of <= 16 nodes): {method: {set: tokens/step}}.
TARGETS = {"eagle": {"chat": 2.3, "code": 2.9}, "medusa": {"chat": 1.8, "code": 2.3}}
REFERENCES = {"eagle": ("heads/smollm2-eagle", "heads/smollm2-code-eagle"),
              "medusa": ("heads/smollm2-medusa", "heads/smollm2-code-medusa")}  # fmt: skip


def held_out(target: Path, cache: Path, say) -> SeqData:
    """The target's greedy answers to the held-out prompts with their features, cached beside the training data."""
    identity = data_key(target, RefreshSettings("eagle", None, tokens=0))  # the target's files, mostly
    key = hashlib.sha256(f"heldout|{identity}".encode())
    path = cache / f"heldout-{key.hexdigest()[:16]}.safetensors"
    if not path.is_file():
        model, tokenizer = load_base(target)
        data = build_split(model, tokenizer, _records("eval", DataSettings()), DataSettings(), say)
        cache.mkdir(parents=True, exist_ok=True)
        data.save(path.with_name(f".{path.name}.partial"))
        path.with_name(f".{path.name}.partial").replace(path)
    return SeqData.load(path)


def first_tokens(data: SeqData, budget: int) -> SeqData:
    """The leading sequences of ``data`` holding at most ``budget`` tokens."""
    ends = data.offsets[1:]
    return data.subset(list(range(int((ends <= budget).sum()))))


def score(method: str, heads, embed, lm_head, data: SeqData) -> dict[str, float]:
    """{set: offline tokens/step on ``TREE``} of ``heads`` on ``data``."""
    if method == "eagle":
        report = evaluate_eagle(heads, embed, lm_head, data, EAGLE_TREES)
    else:
        report = evaluate_medusa(heads, lm_head, data, MEDUSA_TREES)
    return {kind: report[kind]["tokens_per_step"][TREE] for kind in ("chat", "code")}


def train(method: str, fit: SeqData, valid: SeqData, target: Path, embed, lm_head, epochs: int, say):
    """Heads from a random start, as ``specdeploy train-heads --data self-distill`` trains them without ``--init``."""
    if method == "eagle":
        geometry = ModelGeometry.from_hf(json.loads((target / "config.json").read_text()), "config.json")
        cfg = EagleTrainConfig(epochs=epochs, seed=0, bf16=fast_bf16())
        check = lambda m: validation_score(evaluate_eagle(m, embed, lm_head, valid, EAGLE_TREES))  # noqa: E731
        return train_eagle(fit, embed, lm_head, geometry, cfg, say, validate=check)[0]
    medusa_cfg = MedusaTrainConfig(epochs=epochs, seed=0, bf16=fast_bf16())
    check_medusa = lambda m: validation_score(evaluate_medusa(m, lm_head, valid, MEDUSA_TREES))  # noqa: E731
    return train_medusa(fit, lm_head, medusa_cfg, say, validate=check_medusa)[0]


def fit_log2(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of the least-squares line y = a + b * log2(x)."""
    xs = [math.log2(x) for x, _ in points]
    ys = [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def needed_tokens(a: float, b: float, goal: float) -> float | None:
    """Tokens at which the fitted line reaches ``goal``; None when it does not rise."""
    return 2 ** ((goal - a) / b) if b > 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["eagle", "medusa"], default="eagle")
    parser.add_argument("--budgets", type=int, nargs="+", default=[7500, 15000, 30000, 60000])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, help="the figure's path (default bench/out/heads_curve_<method>.png)")
    parser.add_argument("--replot", action="store_true", help=f"measure nothing: only draw {REPORT.name} (--plot)")
    args = parser.parse_args()
    if args.replot:
        if args.plot is None:
            parser.error("--replot draws the kept report: name the PNG with --plot")
        plot(json.loads(REPORT.read_text())["methods"], args.plot)
        return 0
    torch.set_num_threads(args.threads)
    say = lambda text: print(f"  {text}", flush=True)  # noqa: E731
    plan = make_plan(load_spec(SPEC), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache"))
    execute_plan(plan, only={VARIANT}, say=say)
    target = next(v for v in plan.variants if v.name == VARIANT).stage("merge").output
    cache = REPO / ".cache" / "heads-data"
    data, _ = training_data(target, RefreshSettings(args.method, None, tokens=DATA_TOKENS), say, cache)
    heldout = held_out(target, cache, say)
    lm_head = base_lm_head(target).float()
    embed = base_embedding(target).float() if args.method == "eagle" else None
    load = load_eagle_folder if args.method == "eagle" else load_medusa_folder
    stale, refreshed = (score(args.method, load(REPO / f), embed, lm_head, heldout) for f in REFERENCES[args.method])

    for budget in args.budgets:
        fit, valid = split_validation(first_tokens(data, budget))
        start = time.monotonic()
        heads = train(args.method, fit, valid, target, embed, lm_head, args.epochs, say)
        row = {"tokens": int(fit.tokens.numel()), "seconds": round(time.monotonic() - start, 1)}
        row |= score(args.method, heads, embed, lm_head, heldout)
        print(
            f"{args.method} {budget:>7} tokens: chat {row['chat']:.3f}, code {row['code']:.3f} ({row['seconds']:.0f} s)"
        )
        write(args, budget, row, stale, refreshed)
    return 0


def write(args, budget: int, row: dict, stale: dict, refreshed: dict) -> None:
    """Merges ``row`` into this method's results in bench/heads_curve.json (same epochs) and redraws its
    table (bench/out/heads_curve_<method>.md) and plot."""
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {"methods": {}}
    previous = report["methods"].get(args.method, {})
    setup = {"method": args.method, "epochs": args.epochs, "tree": TREE}
    rows = previous.get("rows", {}) if previous.get("setup") == setup else {}
    rows[str(budget)] = row
    points = sorted(rows.values(), key=lambda r: r["tokens"])
    result: dict = {"setup": setup, "rows": rows, "stale": stale, "refreshed_warm_120k": refreshed, "fit": {}}
    lines = [
        f"| {args.method}, random start, {args.epochs} epochs | tokens | chat | code | seconds |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| | {r['tokens']} | {r['chat']:.3f} | {r['code']:.3f} | {r['seconds']:.0f} |" for r in points]
    lines.append(f"| base heads (stale) | | {stale['chat']:.3f} | {stale['code']:.3f} | |")
    lines.append(f"| shipped refresh (warm, 120k) | | {refreshed['chat']:.3f} | {refreshed['code']:.3f} | |")
    if len(points) >= 2:
        for kind in ("chat", "code"):
            a, b = fit_log2([(r["tokens"], r[kind]) for r in points])
            need = needed_tokens(a, b, TARGETS[args.method][kind])
            result["fit"][kind] = {"a": round(a, 4), "per_doubling": round(b, 4), "target": TARGETS[args.method][kind],
                                   "tokens_for_target": None if need is None else round(need)}  # fmt: skip
            lines.append(
                f"\n{kind}: +{b:.3f} tokens/step per doubling of the data; the fit reaches "
                f"{TARGETS[args.method][kind]} at ~{need:,.0f} tokens (extrapolated)"
                if need
                else f"\n{kind}: no rise"
            )
    report["methods"][args.method] = result
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    out = REPO / "bench" / "out" / f"heads_curve_{args.method}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    plot({args.method: result}, args.plot or out.with_suffix(".png"))
    print("\n".join(lines))


def plot(results: dict[str, dict], path: Path) -> None:
    """One panel per method of ``results`` ({method: result}), EAGLE first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted(results, key=lambda m: m != "eagle")
    fig, axes = plt.subplots(1, len(methods), figsize=(7 * len(methods), 4.8), squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods):
        panel(ax, method, results[method])
    handles, labels = axes[0][0].get_legend_handles_labels()  # the panels draw the same lines
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7)  # under the panels: it hides no point
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def panel(ax, method: str, result: dict) -> None:
    points = sorted(result["rows"].values(), key=lambda r: r["tokens"])
    for kind, color in (("chat", "tab:blue"), ("code", "tab:orange")):
        xs = [r["tokens"] for r in points]
        ax.plot(xs, [r[kind] for r in points], "o-", color=color, label=f"{kind}: random start")
        ax.axhline(result["stale"][kind], color=color, ls=":", lw=1, label=f"{kind}: base heads (stale)")
        ax.plot([120_000], [result["refreshed_warm_120k"][kind]], "*", ms=11, color=color,
                label=f"{kind}: shipped refresh (warm start)")  # fmt: skip
        ax.axhline(TARGETS[method][kind], color=color, ls="--", lw=1, label=f"{kind}: target")
        fit = result["fit"].get(kind)
        if fit and fit["tokens_for_target"]:  # the fitted line, out to where it meets the target
            ends = [xs[0], max(xs[-1], min(fit["tokens_for_target"], 2**25))]
            ax.plot(ends, [fit["a"] + fit["per_doubling"] * math.log2(x) for x in ends], "-", color=color, lw=0.6,
                    alpha=0.6, label=f"{kind}: fit, a + b log2(tokens)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training tokens (self-distilled, code fine-tune)")
    ax.set_ylabel(f"held-out tokens/step ({TREE}, offline)")
    slopes = " / ".join(f"{result['fit'][k]['per_doubling']:+.2f}" for k in ("chat", "code") if k in result["fit"])
    ax.set_title(f"{method}: acceptance against training data" + (f" (b = {slopes}, chat / code)" if slopes else ""))


if __name__ == "__main__":
    sys.exit(main())
