"""`specdeploy engine [SPEC] [--variant V] [--force]`: run the stages quantize, convert, build, package.

Exit 0 when every variant is done; otherwise the largest exit code of the variants that
stopped at a stage this host cannot run (3).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from pipeline.commands.common import add_spec_argument, add_variant_filter, load_plan


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    from pipeline.stages.execute import execute_plan

    plan = load_plan(args)
    outcomes = execute_plan(plan, only=set(args.variant or ()), force=args.force,
                            say=lambda text: console.print(text, highlight=False, markup=False))
    stopped = [outcome for outcome in outcomes if outcome.stopped_at]
    if stopped:
        console.print(f"[yellow]{len(stopped)} variant(s) stopped at a stage this host cannot run yet[/yellow]")
        return max(outcome.exit_code for outcome in stopped)
    console.print(f"[green]done[/green]: {len(outcomes)} variant(s)")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    engine = commands.add_parser("engine", help="run the stages: quantize, convert, build, package")
    add_spec_argument(engine)
    add_variant_filter(engine)
    engine.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    engine.set_defaults(handler=cmd_engine)
