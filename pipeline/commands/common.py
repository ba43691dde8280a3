"""What several commands share: the spec argument, the output roots, loading a plan, and the outputs
for CI (``--json``, ``--junit-xml``, GitHub's step summary).

A SPEC argument is a path; when no file is there and it is a bare file name (``NAME.yaml``,
or ``NAME``), it names a spec of the project's ``specs/`` folder, so ``specdeploy engine
llama70b-eagle.yaml`` (and ``make engine SPEC=llama70b-eagle.yaml``) work from any folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError, SpecdeployError

if TYPE_CHECKING:  # the planner imports much of the package: only the commands that plan pay for it
    from pipeline.plan.types import OutputRoots, Plan

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
    from pipeline.plan.types import OutputRoots

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
    weights' values (:mod:`pipeline.plan.preflight`); InputError (exit 2) listing every problem.
    ``resolve``: the spec file as an absolute path, so that its relative paths resolve absolute."""
    path = spec_path(args.spec)
    from pipeline.plan.preflight import checked_plan
    from pipeline.spec.document import load_spec

    return checked_plan(load_spec(path.resolve() if resolve else path), output_roots(args))


def add_json_flag(parser: argparse.ArgumentParser, shape: str) -> None:
    """``--json``: the command's result as one JSON document on stdout (``shape`` says what it holds);
    progress lines and tables go to stderr then, so stdout parses as it is."""
    parser.add_argument("--json", action="store_true", help=f"print the result as JSON on stdout: {shape}")


def print_json(data: object) -> None:
    """The one way a command prints its ``--json`` result."""
    print(json.dumps(data, indent=2))


def add_ci_options(parser: argparse.ArgumentParser) -> None:
    """``--junit-xml PATH`` (engine, evaluate); the step summary needs no option ($GITHUB_STEP_SUMMARY)."""
    parser.add_argument(
        "--junit-xml",
        metavar="PATH",
        type=Path,
        help="also write the run as JUnit XML: each variant's stages and release gates as test cases "
        "(a failed gate is a failure with the measured value and threshold; a stage this host cannot run "
        "is skipped with the reason), for GitHub, GitLab and Jenkins to show as checks",
    )


def check_ci_outputs(args: argparse.Namespace) -> None:
    """``--junit-xml`` may replace only a JUnit file specdeploy wrote, and its folder must take a file:
    both checked before the run starts, not found out after it."""
    if getattr(args, "junit_xml", None) is None:
        return
    import re

    from pipeline.io.atomic import check_replaceable, check_writable_beside

    def ours(path: Path) -> bool:
        """specdeploy's JUnit files are named by it: <testsuites name="specdeploy COMMAND SPEC" ...>."""
        try:
            head = path.read_bytes()[:1024] if path.is_file() else b""
        except OSError:
            return False
        return re.search(rb'<testsuites\b[^>]*\bname="specdeploy ', head) is not None

    path = Path(args.junit_xml)
    check_replaceable(path, "--junit-xml", ours, folder=False)
    check_writable_beside(path, f"--junit-xml {path}: its folder cannot take the report")


def report_run(run, args: argparse.Namespace) -> None:
    """The CI outputs of a finished run: the JUnit file (--junit-xml), GitHub's step summary (when
    $GITHUB_STEP_SUMMARY is set) and the JSON document (--json)."""
    from pipeline.release.ci.summary import append_step_summary

    if args.junit_xml is not None:  # junitparser only then: containers that install specdeploy --no-deps work
        junit_module().write_junit(run, args.junit_xml)
    append_step_summary(run)
    if args.json:
        print_json(run.to_json())


def report_error(command: str, args: argparse.Namespace, error: Exception) -> None:
    """For a run that stopped with ``error`` before it had a result: the one-case JUnit file (--junit-xml),
    so CI still shows a failed check. A JUnit file that cannot be written is said on stderr; the run's own
    error stays the one the CLI reports (and exits with)."""
    if getattr(args, "junit_xml", None) is None:
        return
    try:
        junit_module().write_error_junit(command, args.spec, str(error), args.junit_xml)
    except SpecdeployError as exc:
        print(f"error: {exc}", file=sys.stderr)


def run_reporting_errors(command: str, args: argparse.Namespace, run: Callable[[], int]) -> int:
    """``run()`` (a command's work, its exit code) with its CI outputs checked first, so a refused
    --junit-xml is not written with the error either; a SpecdeployError that stops it before it has a
    result is reported (:func:`report_error`: CI still gets a failed check) and raised on to the CLI."""
    check_ci_outputs(args)
    try:
        return run()
    except SpecdeployError as exc:
        report_error(command, args, exc)
        raise


def junit_module():
    """pipeline.release.ci.junit; InputError (exit 2) saying what to install when junitparser is missing."""
    try:
        from pipeline.release.ci import junit
    except ImportError:
        raise InputError("--junit-xml needs junitparser: pip install 'junitparser==5.0.3'") from None
    return junit
