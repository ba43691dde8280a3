"""`specdeploy validate [SPEC]`: check a spec and print every problem at once."""

from __future__ import annotations

import argparse

from rich.console import Console

from pipeline.commands.common import add_spec_argument, load_plan


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    plan = load_plan(args)
    for variant in plan.variants:
        console.print(f"[green]ok[/green] {variant.name}: {variant.method} ({variant.speculative.reason})")
        for note in variant.notes:
            console.print(f"   note: {note}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    validate = commands.add_parser("validate", help="check a spec and print every problem at once")
    add_spec_argument(validate)
    validate.set_defaults(handler=cmd_validate)
