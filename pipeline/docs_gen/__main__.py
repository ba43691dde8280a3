"""``python -m pipeline.docs_gen [--out DIR] [--check]``: write the generated reference pages.

Without ``--out`` they go to the repository's ``docs/reference/``. ``--check`` writes nothing and
exits 1 naming each page that differs from what the code gives now (and the command to run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from pipeline.docs_gen import cli_reference, contract_reference, layers, spec_reference

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"
COMMAND = "python -m pipeline.docs_gen"

# page file name -> its renderer
PAGES: dict[str, Callable[[], str]] = {
    "spec.md": spec_reference.render,
    "cli.md": cli_reference.render,
    "triton-contract.md": contract_reference.render,
    "layers.md": layers.render,
}


def render_all() -> dict[str, str]:
    return {name: render() for name, render in PAGES.items()}


def write(folder: Path, pages: dict[str, str]) -> list[Path]:
    """Each page written beside its target and renamed into place (a reader never sees half a page)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages.items():
        target = folder / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        written.append(target)
    return written


def stale(folder: Path, pages: dict[str, str]) -> list[str]:
    """The pages whose file in ``folder`` is missing or differs."""
    out = []
    for name, text in pages.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="folder to write (default docs/reference)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    pages = render_all()
    if args.check:
        outdated = stale(args.out, pages)
        for name in outdated:
            print(f"error: {args.out / name} is out of date; run `{COMMAND}` and commit the result", file=sys.stderr)
        return 1 if outdated else 0
    for path in write(args.out, pages):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
