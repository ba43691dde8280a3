"""`specdeploy verify MANIFEST`: re-hash every output a release manifest lists.

Exit 0 when every file is there with its recorded sha256; else 1, one line per changed or
missing file (CI-friendly: nothing else on stderr). Outputs are found relative to the manifest's
own folder (the engines root) and ``--triton-repo``, so a moved release verifies where it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag

if TYPE_CHECKING:
    from rich.console import Console


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from pipeline.release.manifest import verify

    checked, problems = verify(Path(args.manifest), triton_repo=Path(args.triton_repo))
    if args.json:
        from pipeline.commands.common import print_json

        print_json({"manifest": args.manifest, "checked": checked, "ok": not problems, "problems": problems})
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        console.print(f"{len(problems)} of {checked} file(s) changed or missing", highlight=False)
        return 1
    console.print(f"[green]ok[/green]: {checked} file(s) match {args.manifest}", highlight=False)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    verify = commands.add_parser("verify", help="re-hash the outputs a release manifest lists")
    verify.add_argument("manifest", help="engines/<spec>/manifest.json")
    add_json_flag(verify, '{"manifest", "checked", "ok", "problems": ["<file>: changed|missing (...)"]}')
    verify.set_defaults(handler=cmd_verify)
