"""`specdeploy validate [SPEC]`: check a spec and print every problem at once."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, add_spec_argument, load_plan, print_json

if TYPE_CHECKING:
    from rich.console import Console


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    plan = load_plan(args)
    if args.json:
        variants = [
            {"name": v.name, "method": v.method, "reason": v.speculative.reason, "notes": list(v.notes)}
            for v in plan.variants
        ]
        print_json({"spec": plan.spec_name, "spec_file": str(plan.spec_file), "ok": True, "variants": variants})
        return 0
    for variant in plan.variants:
        console.print(f"[green]ok[/green] {variant.name}: {variant.method} ({variant.speculative.reason})")
        for note in variant.notes:
            console.print(f"   note: {note}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    validate = commands.add_parser("validate", help="check a spec and print every problem at once")
    add_spec_argument(validate)
    add_json_flag(
        validate,
        '{"spec", "spec_file", "ok", "variants": [{"name", "method", "reason", "notes"}]}; errors '
        "stay one line each on stderr, exit 2",
    )
    validate.set_defaults(handler=cmd_validate)
