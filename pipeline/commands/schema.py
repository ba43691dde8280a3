"""`specdeploy schema`: print the JSON schema of spec files (for editors that validate YAML)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    from pipeline import methods
    from pipeline.spec.json_schema import spec_json_schema

    print(json.dumps(spec_json_schema(methods.names()), indent=2))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    schema = commands.add_parser("schema", help="print the JSON schema of spec files (for editors)")
    schema.set_defaults(handler=cmd_schema)
