"""`specdeploy report SPEC`: one table over every variant of a spec from its evaluations.

Each variant's own report (report.md, report.json, acceptance.png, speedup_vs_batch.png) is in
``engines/<variant>/evaluation/``; this prints the choice per variant, its acceptance length,
predicted speedup at the expected concurrency, the release verdict and the reason.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from pipeline.console import Table


def register(commands: argparse._SubParsersAction) -> None:
    from pipeline.commands.common import add_spec_argument

    parser = commands.add_parser("report", help="one table of the evaluated choice of every variant of a spec")
    add_spec_argument(parser, required=True)
    parser.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from pipeline.commands.common import output_roots, spec_path
    from pipeline.commands.evaluate import with_default_evaluation
    from pipeline.evaluation.report import spec_table
    from pipeline.evaluation.result import read_result
    from pipeline.plan import make_plan
    from pipeline.spec import load_spec

    plan = make_plan(with_default_evaluation(load_spec(spec_path(args.spec))), output_roots(args))
    rows = [(v.name, read_result(v.stage("evaluate").output)) for v in plan.variants]
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
