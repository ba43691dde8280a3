"""`specdeploy doctor [SPEC]`: what this host has for the TensorRT-LLM 1.2 engine flow, and
whether it can build each variant of SPEC. Exit 0 when it can build them all (or no spec
is given), 3 when some variant cannot be built here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, print_json

if TYPE_CHECKING:
    from rich.console import Console

STATUS_STYLE = {
    "ok": "[green]ok[/green]",
    "missing": "[red]missing[/red]",
    "warn": "[yellow]warn[/yellow]",
    "info": "[cyan]info[/cyan]",
}


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    parser = commands.add_parser("doctor", help="check this host for building and serving the engines")
    parser.add_argument("spec", nargs="?", help="also say whether each variant of this spec can build here")
    add_json_flag(parser, '{"host": {...}, "checks": [{"name", "status", "detail"}], "variants": [...], "ok"}')
    parser.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from pipeline.commands.common import load_plan
    from pipeline.console import Table
    from pipeline.doctor import assess_variant, host_checks, probe_host, to_json

    plan = load_plan(args) if args.spec else None  # bad specs fail first, with exit 2
    report = probe_host(Path(args.engines_dir))
    checks = host_checks(report)
    verdicts = [assess_variant(variant, report) for variant in plan.variants] if plan else []
    result = to_json(report, checks, verdicts)
    if args.json:
        print_json(result)
    else:
        table = Table(title="host", title_justify="left")
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        for check in checks:
            table.add_row(check.name, STATUS_STYLE[check.status], escape(check.detail))
        console.print(table)
        if plan is not None and verdicts:
            table = Table(title=f"spec {plan.spec_name}", title_justify="left")
            for column in ("variant", "target", "method", "world", "builds here"):
                table.add_column(column)
            table.add_column("why / notes", overflow="fold")
            for verdict in verdicts:
                why = "; ".join(verdict.reasons + verdict.notes)
                mark = "[green]yes[/green]" if verdict.can_build else "[red]no[/red]"
                table.add_row(
                    escape(verdict.variant), verdict.target, verdict.method, str(verdict.world_size), mark, escape(why)
                )
            console.print(table)
            for verdict in verdicts:
                _print_stages(verdict, console)
    return 0 if result["ok"] else 3


def _print_stages(verdict, console: Console) -> None:
    """Each stage's needs (pipeline.plan.resources) against this host."""
    from rich.markup import escape

    from pipeline.console import Table

    table = Table(title=f"{verdict.variant}: what each stage needs", title_justify="left")
    for column in ("stage", "GPUs", "GiB per GPU", "host RAM GiB", "disk GiB", "here"):
        table.add_column(column, justify="right" if "GiB" in column or column == "GPUs" else "left")
    for fit in verdict.stages:
        here = "[green]ok[/green]" if fit.fits else f"[red]no[/red]: {escape(fit.why)}"
        table.add_row(
            fit.stage,
            str(fit.gpus),
            f"{fit.gpu_memory_gib_per_gpu:.1f}" if fit.gpus else "-",
            f"{fit.host_memory_gib:.1f}",
            f"{fit.disk_gib:.1f}",
            here,
        )
    console.print(table)
