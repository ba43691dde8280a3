"""`specdeploy engine [SPEC] [--variant V] [--force] [--ray [ADDRESS]] [--hash-inputs] [--junit-xml PATH] [--json]`:
run the stages quantize, convert, build, package, then write the release manifest (engines/<spec>/manifest.json) and,
when every variant is done, the Kubernetes manifests (engines/<spec>/deploy/, :mod:`pipeline.release.kubernetes`).
``--junit-xml``, ``--json`` and ``$GITHUB_STEP_SUMMARY``: the run for CI (:mod:`pipeline.release.ci`).

Without ``--ray`` the variants run one after another here. Exit 0 when every variant is done;
otherwise the largest exit code of the variants that stopped at a stage this host cannot run (3)
or at a failed release gate (6, one line each on stderr after every variant).
With ``--ray`` (no address: a local Ray cluster; ``auto``: the running one) each stage is a Ray
task (:mod:`pipeline.fleet.ray_runner`); the exit code is that of the failed stages (a failed
release gate: 6, with the same line on stderr), after all other variants finished.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import (
    add_ci_options,
    add_json_flag,
    add_spec_argument,
    add_variant_filter,
    output_roots,
    report_run,
    run_reporting_errors,
)

if TYPE_CHECKING:
    from rich.console import Console


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    return run_reporting_errors("engine", args, lambda: _engine(args, console))


def _engine(args: argparse.Namespace, console: Console) -> int:
    from pipeline.commands.engine_run import HereStages, RayStages, run_engine
    from pipeline.io.hashing import HashCache
    from pipeline.release.ci.records import RunRecord
    from pipeline.release.manifest import write_manifest

    roots = output_roots(args)  # as given (RayStages makes them absolute for the workers)
    hashes = HashCache(roots.cache)
    stages = RayStages if args.ray is not None else HereStages
    result = run_engine(args, console, stages(args, console, hashes if args.hash_inputs else None))
    plan, states, code, records = result.plan, result.states, result.exit_code, result.records
    repository = (
        _spec_repository(plan, states, args, console, hashes if args.hash_inputs else None) if code == 0 else None
    )
    manifest = write_manifest(plan, roots.engines, states, hashes, repository, cache=roots.cache)
    console.print(f"manifest: {manifest}", highlight=False, markup=False)
    if code == 0:
        _write_deploy(plan, roots.engines, console)
    run = RunRecord("engine", plan.spec_name, str(plan.spec_file), tuple(records), code, manifest, repository)
    report_run(run, args)
    return code


def _write_deploy(plan, engines_root: Path, console: Console) -> None:
    """engines/<spec>/deploy/: the Kubernetes manifests of what the plan serves (pipeline/release/kubernetes.py)."""
    from pipeline.fleet.placement import sharing_problem
    from pipeline.release.kubernetes import write_deploy

    whole_spec = plan.repository is not None and sharing_problem(plan) is None
    folder, notes = write_deploy(plan, engines_root, whole_spec)
    for note in notes:
        console.print(f"deploy: {note}", highlight=False, markup=False)
    if folder is not None:
        console.print(f"deploy: {folder} (kubectl apply -k {folder})", highlight=False, markup=False)


def _spec_repository(
    plan, states: dict[str, dict[str, str]], args: argparse.Namespace, console: Console, hashes
) -> Path | None:
    """triton_repo/<spec>/ for one server of all variants, after every variant is packaged; its path
    when it is up to date now."""
    from pipeline.stages.execute import execute_spec_repository

    packaged = {name for name, stages in states.items() if stages.get("package") in ("ran", "skipped")}
    result = execute_spec_repository(
        plan,
        packaged,
        force=args.force,
        hashes=hashes,
        say=lambda text: console.print(text, highlight=False, markup=False),
    )
    return None if result is None else result.output


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    engine = commands.add_parser(
        "engine",
        help="run each variant's stages (merge, train-heads, quantize, convert, evaluate, build, lora, package, "
        "as its plan has them) and write the release manifest",
        epilog="exit 6: a release gate failed (release.on_fail: fail), one line per variant after every variant "
        "was processed; 4/5: the filesystem refused / the disk is full; all codes: specdeploy --help",
    )
    add_spec_argument(engine)
    add_variant_filter(engine)
    engine.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    engine.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run the stages as Ray tasks: no address starts a local cluster, 'auto' joins the "
        "running one (pip install 'specdeploy[ray]')",
    )
    engine.add_argument(
        "--ray-retries",
        type=int,
        default=3,
        metavar="N",
        help="Ray re-runs a task whose worker died up to N times (default 3)",
    )
    engine.add_argument(
        "--hash-inputs",
        action="store_true",
        help="fingerprint stage inputs by content (sha256, cached) instead of size and mtime",
    )
    add_ci_options(engine)
    add_json_flag(
        engine,
        '{"command", "spec", "spec_file", "exit_code", "manifest", "repository", "variants": [{"name", "method", '
        '"exit_code", "stopped_at", "stages": [{"stage", "state", "seconds", "message"}], "evaluation"}]}',
    )
    engine.set_defaults(handler=cmd_engine)
