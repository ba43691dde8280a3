"""What several commands share: the spec argument, the output roots and loading a plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.plan import OutputRoots, Plan, make_plan
from pipeline.spec import load_spec

DEFAULT_SPEC = Path("specs/smollm2-lookahead.yaml")


def add_spec_argument(parser: argparse.ArgumentParser, *, required: bool = False, help: str | None = None) -> None:
    """The positional SPEC: optional (default: the SmolLM2 Lookahead spec) unless ``required``."""
    if required:
        parser.add_argument("spec", help=help)
    else:
        parser.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC), help=help)


def add_variant_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", action="append", help="only this variant (repeatable)")


def output_roots(args: argparse.Namespace) -> OutputRoots:
    """Where engines, Triton repositories and the embedded model go (global CLI options)."""
    return OutputRoots(Path(args.engines_dir), Path(args.triton_repo), Path(args.cache_dir))


def load_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``args.spec``; InputError (exit 2) listing every problem of a bad spec."""
    return make_plan(load_spec(Path(args.spec)), output_roots(args))
