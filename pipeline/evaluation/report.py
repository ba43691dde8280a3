"""The evaluation report: report.json, report.md and two charts per variant, one table per spec.

* ``report.md``: a table of candidates (acceptance length, per-position acceptance, CPU step cost and
  measured CPU speedup, predicted GPU speedup at each batch size, losslessness) and the choice with its
  reason;
* ``acceptance.png``: per-position acceptance per candidate;
* ``speedup_vs_batch.png``: predicted GPU speedup against batch size per candidate, as a line in the
  band of its interval (its method's held-out error), with the 1.0 line, so the batch size where
  speculation stops paying, and how sure the model is of it, are visible.

Colours: one per candidate, in candidate order, the same in both charts (plain decoding is black).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import methods
from pipeline.evaluation.choose import interval_text

CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def colours(names: list[str]) -> dict[str, str]:
    speculative = [n for n in names if n != "plain"]
    return {"plain": "#000000", **{n: PALETTE[i % len(PALETTE)] for i, n in enumerate(speculative)}}


def identity_text(identity: dict) -> str:
    if identity["identical"] == identity["prompts"]:
        return "identical"
    verdict = "near-ties only" if identity["lossless"] else "NOT LOSSLESS"
    return f"{identity['identical']}/{identity['prompts']} identical, {verdict}"


def markdown(result: dict) -> str:
    batches = result["settings"]["batch_sizes"]
    gpu = result["gpu"]
    choice = result["choice"]
    lines = [
        f"# Evaluation of {result['variant']}",
        "",
        f"{result['prompts']['count']} prompts ({result['prompts']['source']}), "
        f"{result['settings']['max_new_tokens']} new tokens each, greedy, reference runtime on "
        f"{result['settings']['device']}. GPU predictions: {gpu['type']}"
        f"{' (assumed: the plan names no GPU)' if gpu['assumed'] else ''}, {gpu['dtype']}, "
        f"context {gpu['context_len']} tokens.",
        "",
        f"**Choice: {choice['candidate']}** ({choice['method']}): {choice['reason']}.",
        "",
        f"GPU speedups: point prediction (interval) of the {gpu.get('runtime', 'trtllm')} profile, the "
        "interval the 10th-90th percentile of its method's held-out error"
        + (f" ({gpu['calibration']})" if gpu.get("calibration") else "")
        + ". Release gates check "
        + ("the point prediction" if choice.get("speedup_bound") == "point" else "the interval's lower end")
        + " (release.speedup_bound).",
        "",
    ]
    if choice.get("failed"):
        lines += [f"**Release gate failed**: {choice['failed']}.", ""]
    lines += [
        "| candidate | AL | per-position acceptance | rows/step | CPU step cost | CPU speedup | "
        + " | ".join(f"GPU b{b}" for b in batches)
        + " | = plain |",
        "|---|---|---|---|---|---|" + "---|" * len(batches) + "---|",
    ]
    for c in result["candidates"]:
        per_pos = ", ".join(f"{a:.2f}" for a in c["acceptance_per_position"]) or "-"
        lines.append(
            f"| {c['name']} | {c['mean_acceptance_length']:.2f} | {per_pos} | {c['rows_per_step']:.1f} | "
            f"{c['cpu_step_cost']:.2f} | {c['cpu_speedup']:.2f}x | "
            + " | ".join(interval_text(c, b) for b in batches)
            + f" | {identity_text(c['identity'])} |"
        )
    timing = result["timing"]
    lines += [
        "",
        f"AL: mean acceptance length (1 + accepted drafts / verification steps). CPU step cost: a "
        "decode step's CPU time in plain decoding steps; CPU speedup: decode tokens per CPU-second over "
        "plain decoding's. Evaluation: "
        f"{timing['wall_s']:.0f} s wall; the shared prefill took {timing['prefill_cpu_s']:.1f} CPU-s and "
        f"saved {timing['prefill_saved_cpu_s']:.1f} CPU-s.",
        "",
    ]
    return "\n".join(lines)


def charts(result: dict, out: Path) -> list[str]:
    """The two PNGs; none when matplotlib is missing (it is a dependency, so only in odd installs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return []
    names = [c["name"] for c in result["candidates"]]
    colour = colours(names)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for c in result["candidates"]:
        if c["acceptance_per_position"]:
            ax.plot(
                range(1, len(c["acceptance_per_position"]) + 1),
                c["acceptance_per_position"],
                marker="o",
                color=colour[c["name"]],
                label=f"{c['name']} (AL {c['mean_acceptance_length']:.2f})",
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("acceptance per verification step")
    ax.set_title(f"{result['variant']}: per-position acceptance")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for c in result["candidates"]:
        curve = c["predicted_curve"]
        xs = [int(b) for b in curve]
        band = c.get("predicted_curve_interval") or {}
        if band and c["method"] != methods.PLAIN:
            low, high = [band[b]["low"] for b in curve], [band[b]["high"] for b in curve]
            ax.fill_between(xs, low, high, color=colour[c["name"]], alpha=0.18, linewidth=0)
        ax.plot(xs, list(curve.values()), marker=".", color=colour[c["name"]], label=c["name"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests in flight)")
    ax.set_ylabel(f"predicted speedup on {result['gpu']['type']}")
    ax.set_title(f"{result['variant']}: predicted GPU speedup vs batch size\n(bands: model error)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "speedup_vs_batch.png", dpi=100)
    plt.close(fig)
    return ["acceptance.png", "speedup_vs_batch.png"]


def write_report(result: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "report.md").write_text(markdown(result))
    result["charts"] = charts(result, out)


def spec_table(rows: list[tuple[str, dict | None]]) -> list[list[str]]:
    """One row per variant of a spec: (variant, its report.json or None when not evaluated)."""
    table = []
    for name, result in rows:
        if result is None:
            table.append([name, "not evaluated", "-", "-", "-", "-"])
            continue
        choice = result["choice"]
        chosen = next(c for c in result["candidates"] if c["name"] == choice["candidate"])
        batch = str(result["settings"]["batch_sizes"][0])
        table.append(
            [
                name,
                choice["candidate"],
                f"{chosen['mean_acceptance_length']:.2f}",
                f"{interval_text(chosen, int(batch))} (b{batch}, {result['gpu']['type']})",
                "FAILED: " + choice["failed"] if choice.get("failed") else "pass",
                choice["reason"],
            ]
        )
    return table
