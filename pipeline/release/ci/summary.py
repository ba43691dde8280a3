"""The Markdown summary ``engine`` and ``evaluate`` append to ``$GITHUB_STEP_SUMMARY`` when it is set.

GitHub Actions shows that file on the run's page. The summary has one table of the variants (method,
result, each stage's state), then per evaluated variant the chosen candidate and why, the candidates'
figures, the release gates with measured values and thresholds, and links to its report files
(report.md, acceptance.png, speedup_vs_batch.png; relative to the workspace, the paths under which a
workflow uploads them as an artifact).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pipeline.errors import host_error
from pipeline.evaluation.choose import Gates, gate_checks
from pipeline.release.ci.records import RunRecord, VariantRecord, shown_path

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
EXIT_MEANING = {
    0: "passed",
    1: "a stage failed",
    2: "bad input",
    3: "a stage cannot run on this host",
    4: "the filesystem refused",
    5: "the disk is full",
    6: "a release gate failed",
}


def cell(text: object) -> str:
    """Text for a Markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def step_summary(run: RunRecord, base: Path | None = None) -> str:
    """The Markdown of ``run``; report paths relative to ``base`` (default: the current folder)."""
    verdict = EXIT_MEANING.get(run.exit_code, f"exit {run.exit_code}")
    lines = [
        f"## specdeploy {run.command} `{run.spec}`: {verdict}" + (f" (exit {run.exit_code})" if run.exit_code else ""),
        "",
        "| variant | method | result | stages |",
        "|---|---|---|---|",
    ]
    for variant in run.variants:
        stopped = variant.stopped()
        result = "ok" if stopped is None else f"stopped at {stopped.stage} ({stopped.state}): {stopped.message}"
        stages = ", ".join(
            f"{s.stage} {s.state}" + (f" {s.seconds:.1f} s" if s.seconds else "") for s in variant.stages
        )
        lines.append(f"| {cell(variant.name)} | {cell(variant.method)} | {cell(result)} | {cell(stages)} |")
    for variant in run.variants:
        lines += _evaluation_section(variant, base)
    if run.manifest is not None:
        lines += ["", f"Release manifest: `{shown_path(run.manifest, base)}`"]
    return "\n".join(lines) + "\n"


def _evaluation_section(variant: VariantRecord, base: Path | None) -> list[str]:
    evaluation = variant.evaluation()
    if evaluation is None:
        return []
    choice = evaluation["choice"]
    batches = evaluation["settings"]["batch_sizes"]
    gpu = evaluation["gpu"]
    lines = [
        "",
        f"### {variant.name}: chose {choice['candidate']} ({choice['method']})",
        "",
        f"{choice['reason']}. Predicted on {gpu['type']}{' (assumed)' if gpu['assumed'] else ''}, "
        f"{evaluation['prompts']['count']} prompts.",
        "",
        "| candidate | AL | CPU speedup | " + " | ".join(f"GPU b{b}" for b in batches) + " | gate |",
        "|---|---|---|" + "---|" * len(batches) + "---|",
    ]
    misses = choice.get("misses") or {}
    for c in evaluation["candidates"]:
        name = f"**{c['name']}**" if c["name"] == choice["candidate"] else c["name"]
        lines.append(
            f"| {cell(name)} | {c['mean_acceptance_length']:.2f} | {c['cpu_speedup']:.2f}x | "
            + " | ".join(f"{c['predicted_speedup'][str(b)]:.2f}x" for b in batches)
            + f" | {cell(misses.get(c['name'], 'pass'))} |"
        )
    chosen = next(c for c in evaluation["candidates"] if c["name"] == choice["candidate"])
    lines += ["", f"Release gates on {choice['candidate']}:", ""]
    for check in gate_checks(chosen, Gates.from_dict(evaluation.get("release")), batches[0]):
        mark = "pass" if check.passed else "**FAILED**"
        lines.append(f"- {check.gate}: {mark}, measured {check.measured}, threshold {check.threshold}")
    reports = variant.report_files()
    if reports:
        links = ", ".join(f"[{p.name}]({shown_path(p, base)})" for p in reports)
        lines += ["", f"Reports: {links}"]
    return lines


def append_step_summary(run: RunRecord, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append ``run``'s summary to the file ``$GITHUB_STEP_SUMMARY`` names; None when it is not set."""
    environ = os.environ if environ is None else environ
    target = environ.get(SUMMARY_ENV)
    if not target:
        return None
    path = Path(target)
    base = Path(environ["GITHUB_WORKSPACE"]) if environ.get("GITHUB_WORKSPACE") else None
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(step_summary(run, base) + "\n")
    except OSError as exc:
        raise host_error(exc, f"appending the step summary to {SUMMARY_ENV}") from None
    return path
