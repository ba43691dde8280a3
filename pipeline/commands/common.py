"""What several commands share: the spec argument, the output roots and loading a plan.

A SPEC argument is a path; when no file is there and it is a bare file name (``NAME.yaml``,
or ``NAME``), it names a spec of the project's ``specs/`` folder, so ``specdeploy engine
llama70b-eagle.yaml`` (and ``make engine SPEC=llama70b-eagle.yaml``) work from any folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import InputError
from pipeline.plan import OutputRoots, Plan
from pipeline.preflight import checked_plan
from pipeline.spec import load_spec

# The project's example specs, beside the pipeline package.
SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
DEFAULT_SPEC = Path("smollm2-lookahead.yaml")


SPEC_HELP = "a spec file, or the name of one in the project's specs/ folder"


def add_spec_argument(parser: argparse.ArgumentParser, *, required: bool = False, help: str | None = None) -> None:
    """The positional SPEC: optional (default: the SmolLM2 Lookahead spec) unless ``required``."""
    help = help or SPEC_HELP
    if required:
        parser.add_argument("spec", help=help)
    else:
        parser.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC), help=help)


def add_variant_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", action="append", help="only this variant (repeatable)")


def output_roots(args: argparse.Namespace) -> OutputRoots:
    """Where engines, Triton repositories and the embedded model go (global CLI options)."""
    return OutputRoots(Path(args.engines_dir), Path(args.triton_repo), Path(args.cache_dir))


def spec_path(value: str, specs_dir: Path = SPECS_DIR) -> Path:
    """``value`` if a file is there, else the project spec it names; InputError listing the
    known specs when a bare name matches none. Paths with a folder part are taken as given."""
    path = Path(value)
    if path.exists() or path.name != value or value in ("", ".", ".."):
        return path
    for candidate in (specs_dir / value, specs_dir / f"{value}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.name for p in specs_dir.glob("*.yaml")) if specs_dir.is_dir() else []
    listed = f"known specs in {specs_dir}: {', '.join(known)}" if known else f"{specs_dir} has no specs"
    raise InputError(
        f"{value}: spec file not found here or in the project's specs folder ({listed}); "
        "give a path or one of those names"
    )


def load_plan(args: argparse.Namespace, *, resolve: bool = False) -> Plan:
    """The plan of ``args.spec``, with everything ``validate`` checks in the input files short of the
    weights' values (:mod:`pipeline.preflight`); InputError (exit 2) listing every problem.
    ``resolve``: the spec file as an absolute path, so that its relative paths resolve absolute."""
    path = spec_path(args.spec)
    return checked_plan(load_spec(path.resolve() if resolve else path), output_roots(args))
