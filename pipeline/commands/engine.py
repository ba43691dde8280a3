"""`specdeploy engine [SPEC] [--variant V] [--force]`: run the stages quantize, convert, build, package.

Exit 0 when every variant is done; otherwise the largest exit code of the variants that
stopped at a stage this host cannot run (3) or at a failed release gate (6, one line each on
stderr after every variant).
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from pipeline.commands.common import add_spec_argument, add_variant_filter, load_plan


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    from pipeline.stages.execute import execute_plan

    plan = load_plan(args)
    outcomes = execute_plan(plan, only=set(args.variant or ()), force=args.force,
                            say=lambda text: console.print(text, highlight=False, markup=False))
    from pipeline.evaluation.result import RELEASE_EXIT_CODE

    for outcome in outcomes:  # after every variant, so a release pipeline sees every failed gate at once
        if outcome.exit_code == RELEASE_EXIT_CODE:
            print(f"error: {outcome.variant}: release gate failed: {outcome.reason}", file=sys.stderr)
    stopped = [outcome for outcome in outcomes if outcome.stopped_at and outcome.exit_code != RELEASE_EXIT_CODE]
    if stopped:
        console.print(f"[yellow]{len(stopped)} variant(s) stopped at a stage this host cannot run yet[/yellow]")
    codes = [outcome.exit_code for outcome in outcomes if outcome.stopped_at]
    if codes:
        return max(codes)
    console.print(f"[green]done[/green]: {len(outcomes)} variant(s)")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    engine = commands.add_parser("engine", help="run the stages: quantize, convert, build, package")
    add_spec_argument(engine)
    add_variant_filter(engine)
    engine.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    engine.set_defaults(handler=cmd_engine)
