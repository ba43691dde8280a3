"""`specdeploy report SPEC`: one table over every variant of a spec from its evaluations.

Each variant's own report (report.md, report.json, acceptance.png, speedup_vs_batch.png) is in
``engines/<variant>/evaluation/``; this prints the choice per variant, its acceptance length,
predicted speedup at the expected concurrency, the release verdict and the reason.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def register(commands: argparse._SubParsersAction) -> None:
    from pipeline.commands.common import add_json_flag, add_spec_argument

    parser = commands.add_parser("report", help="one table of the evaluated choice of every variant of a spec")
    add_spec_argument(parser, required=True)
    add_json_flag(
        parser,
        '{"spec", "variants": [{"name", "evaluated", "choice", "method", "mean_acceptance_length", '
        '"predicted_speedup", "batch", "gpu", "release", "failed", "reason", "reports"}]}',
    )
    parser.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from pipeline.commands.common import output_roots, print_json, spec_path
    from pipeline.commands.evaluate import with_default_evaluation
    from pipeline.console import Table
    from pipeline.evaluation.report import spec_table
    from pipeline.evaluation.result import read_result
    from pipeline.plan.planner import make_plan
    from pipeline.spec.document import load_spec

    plan = make_plan(with_default_evaluation(load_spec(spec_path(args.spec))), output_roots(args))
    rows = [(v.name, read_result(v.stage("evaluate").output)) for v in plan.variants]
    if args.json:
        print_json(
            {"spec": plan.spec_name, "variants": [_variant_json(v, r) for v, (_, r) in zip(plan.variants, rows)]}
        )
        return 0
    table = Table(title=f"{plan.spec_name}: evaluated choices", title_justify="left")
    for column in ("variant", "choice", "AL", "predicted speedup", "release", "why"):
        table.add_column(column, overflow="fold")
    for row in spec_table(rows):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    missing = [name for name, result in rows if result is None]
    if missing:
        console.print(f"not evaluated yet: {', '.join(missing)} (specdeploy evaluate {args.spec})")
    return 0


def _variant_json(variant, result: dict | None) -> dict:
    """A variant's row of ``report --json``: the same facts as the table's, as numbers."""
    from pipeline.release.ci.records import CHARTS

    if result is None:
        return {"name": variant.name, "evaluated": False}
    choice = result["choice"]
    chosen = next(c for c in result["candidates"] if c["name"] == choice["candidate"])
    batch = result["settings"]["batch_sizes"][0]
    folder = variant.stage("evaluate").output
    return {
        "name": variant.name,
        "evaluated": True,
        "choice": choice["candidate"],
        "method": choice["method"],
        "mean_acceptance_length": chosen["mean_acceptance_length"],
        "predicted_speedup": chosen["predicted_speedup"][str(batch)],
        "batch": batch,
        "gpu": result["gpu"]["type"],
        "release": "failed" if choice.get("failed") else "pass",
        "failed": choice.get("failed"),
        "reason": choice["reason"],
        "reports": [str(folder / n) for n in ("report.md", *CHARTS) if (folder / n).is_file()],
    }
