"""`specdeploy engine [SPEC] [--variant V] [--force] [--ray [ADDRESS]] [--hash-inputs] [--junit-xml PATH] [--json]`:
run the stages quantize, convert, build, package, then write the release manifest (engines/<spec>/manifest.json) and,
when every variant is done, the Kubernetes manifests (engines/<spec>/deploy/, :mod:`pipeline.kubernetes`).
``--junit-xml``, ``--json`` and ``$GITHUB_STEP_SUMMARY``: the run for CI (:mod:`pipeline.ci`).

Without ``--ray`` the variants run one after another here. Exit 0 when every variant is done;
otherwise the largest exit code of the variants that stopped at a stage this host cannot run (3)
or at a failed release gate (6, one line each on stderr after every variant).
With ``--ray`` (no address: a local Ray cluster; ``auto``: the running one) each stage is a Ray
task (:mod:`pipeline.fleet.ray_runner`); the exit code is that of the failed stages (a failed
release gate: 6, with the same line on stderr), after all other variants finished.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import (
    add_ci_options,
    add_json_flag,
    add_spec_argument,
    add_variant_filter,
    check_ci_outputs,
    load_plan,
    output_roots,
    report_error,
    report_run,
)
from pipeline.errors import InputError, SpecdeployError

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.ci.records import VariantRecord
    from pipeline.hashing import HashCache


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    check_ci_outputs(args)  # before the try: a refused --junit-xml is not written with the error either
    try:
        return _engine(args, console)
    except SpecdeployError as exc:  # no result to report: CI still gets a failed check with the error
        report_error("engine", args, exc)
        raise


def _engine(args: argparse.Namespace, console: Console) -> int:
    from pipeline.ci.records import RunRecord
    from pipeline.hashing import HashCache
    from pipeline.manifest import write_manifest

    roots = output_roots(args)
    hashes = HashCache(roots.cache)
    if args.ray is not None:
        plan, states, code, records = _engine_on_ray(args, console, hashes if args.hash_inputs else None)
    else:
        plan, states, code, records = _engine_here(args, console, hashes if args.hash_inputs else None)
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
    """engines/<spec>/deploy/: the Kubernetes manifests of what the plan serves (pipeline/kubernetes.py)."""
    from pipeline.kubernetes import write_deploy
    from pipeline.triton.spec_repository import sharing_problem

    whole_spec = plan.repository is not None and sharing_problem(plan) is None
    folder, notes = write_deploy(plan, engines_root, whole_spec)
    for note in notes:
        console.print(f"deploy: {note}", highlight=False, markup=False)
    if folder is not None:
        console.print(f"deploy: {folder} (kubectl apply -k {folder})", highlight=False, markup=False)


def say_choices(plan, console: Console) -> None:
    """One line per variant whose method was chosen by measurement: what is built and why."""
    for variant in plan.variants:
        if variant.rehearsal is not None:
            console.print(
                f"[{variant.name}] method best: building {variant.method}: {variant.speculative.reason}",
                highlight=False,
                markup=False,
            )


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


def _engine_here(args: argparse.Namespace, console: Console, hashes: HashCache | None):
    from pipeline.evaluation.apply import split_at_evaluate
    from pipeline.report import print_lora_decisions
    from pipeline.stages.execute import VariantOutcome, execute_plan

    plan = load_plan(args)
    print_lora_decisions(plan, console)
    only = set(args.variant or ())
    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    # method: best: the stages up to evaluate first, then the plan again, so its choice is what is built.
    first, rest = split_at_evaluate(plan, only)
    early: dict[str, VariantOutcome] = {}
    if first is not None:
        early = {o.variant: o for o in execute_plan(first, force=args.force, hashes=hashes, say=say)}
        plan = load_plan(args)
        say_choices(plan, console)
    stopped = {name for name, o in early.items() if o.stopped_at}  # a gate failed, or evaluate could not run
    names = {v.name for v in plan.variants if (not only or v.name in only) and v.name not in stopped}
    later = execute_plan(rest(plan), only=names, force=args.force, hashes=hashes, say=say) if names else []
    by_name = {o.variant: early[o.variant].joined(o) if o.variant in early else o for o in later}
    by_name |= {name: early[name] for name in stopped}
    outcomes = [by_name[v.name] for v in plan.variants if v.name in by_name]
    from pipeline.evaluation.result import GATE_FAILED, RELEASE_EXIT_CODE

    for outcome in outcomes:  # after every variant, so a release pipeline sees every failed gate at once
        if outcome.exit_code == RELEASE_EXIT_CODE:
            print(f"error: {outcome.variant}: release gate failed: {outcome.reason}", file=sys.stderr)
    states = {  # a failed release gate stops after an evaluate stage that ran: the manifest says which gate
        o.variant: {r.name: r.status for r in o.results}
        | ({o.stopped_at: GATE_FAILED if o.exit_code == RELEASE_EXIT_CODE else "unavailable"} if o.stopped_at else {})
        for o in outcomes
    }
    unavailable = [o for o in outcomes if o.stopped_at and o.exit_code != RELEASE_EXIT_CODE]
    if unavailable:
        console.print(f"[yellow]{len(unavailable)} variant(s) stopped at a stage this host cannot run yet[/yellow]")
    records = [_outcome_record(plan, o) for o in outcomes]
    codes = [outcome.exit_code for outcome in outcomes if outcome.stopped_at]
    if codes:
        return plan, states, max(codes), records
    console.print(f"[green]done[/green]: {len(outcomes)} variant(s)")
    return plan, states, 0, records


def _outcome_record(plan, outcome) -> VariantRecord:
    """The CI record of a variant run here: its stages' results, and the stage that stopped it."""
    from pipeline.ci.records import UNAVAILABLE, StageRecord, variant_record
    from pipeline.evaluation.result import GATE_FAILED, RELEASE_EXIT_CODE

    done = [StageRecord(r.name, r.status, r.seconds) for r in outcome.results]
    stopped = None
    if outcome.stopped_at:
        state = GATE_FAILED if outcome.exit_code == RELEASE_EXIT_CODE else UNAVAILABLE
        stopped = StageRecord(outcome.stopped_at, state, None, outcome.reason or "")
    variant = next(v for v in plan.variants if v.name == outcome.variant)
    return variant_record(variant, done, stopped_by=stopped, exit_code=outcome.exit_code)


def _fleet_records(plan, graph, results) -> list[VariantRecord]:
    """The CI records of the variants a Ray run handled: each stage task's state, seconds and message."""
    from pipeline.ci.records import NOT_RUN, StageRecord, variant_record
    from pipeline.fleet.task import BLOCKED

    records = []
    for name in graph.variants:
        done, code = [], 0
        for r in results:
            for column in r.graph.columns:
                key = r.graph.cells.get((name, column))
                if key is None or key not in r.reports:
                    continue
                report = r.reports[key]
                state = NOT_RUN if report.state == BLOCKED else report.state
                done.append(StageRecord(column, state, report.seconds or None, report.message))
                code = max(code, report.exit_code if not report.ok and report.state != BLOCKED else 0)
        variant = next(v for v in plan.variants if v.name == name)
        records.append(variant_record(variant, done, exit_code=code))
    return records


def _engine_on_ray(args: argparse.Namespace, console: Console, hashes: HashCache | None):
    from pipeline.fleet.graph import build_graph
    from pipeline.fleet.ray_runner import require_ray, run_fleet

    require_ray()  # before planning: a clear line when the extra is not installed
    if args.ray.endswith((".yaml", ".yml")):  # `engine --ray SPEC`: argparse gave SPEC to --ray
        raise InputError(
            f"--ray took {args.ray} as the Ray cluster's address; write the spec first "
            f"(specdeploy engine {args.ray} --ray) or give an address (--ray auto)"
        )
    # Workers run in another folder: every path absolute (the spec's relative paths too).
    args.engines_dir, args.triton_repo, args.cache_dir = (
        str(Path(p).resolve()) for p in (args.engines_dir, args.triton_repo, args.cache_dir)
    )
    from pipeline.evaluation.apply import split_at_evaluate
    from pipeline.fleet.ray_runner import exit_code_of
    from pipeline.report import print_lora_decisions
    from pipeline.stages.owners import claim_outputs

    plan = load_plan(args, resolve=True)
    print_lora_decisions(plan, console)
    only = set(args.variant or ())
    claim_outputs(plan, only)  # another spec's folders are refused before any task runs
    roots = output_roots(args)
    needs_cache = any(variant.builtin for variant in plan.variants)

    def run(todo, names):
        return run_fleet(
            build_graph(todo, only=names),
            address=None if args.ray == "local" else args.ray,
            force=args.force,
            hashes=hashes,
            max_retries=args.ray_retries,
            console=console,
            roots=(roots.engines, roots.triton_repo) + ((roots.cache,) if needs_cache else ()),
        )

    # method: best: the stages up to evaluate first, then the plan again, so its choice is what is built.
    first, rest = split_at_evaluate(plan, only)
    early = run(first, set()) if first is not None else None
    stopped = {v for v in early.graph.variants if early.stopped(v) is not None} if early is not None else set()
    if early is not None:
        plan = load_plan(args, resolve=True)
        say_choices(plan, console)
    names = {v.name for v in plan.variants if (not only or v.name in only) and v.name not in stopped}
    result = run(rest(plan), names) if names else None
    results = [r for r in (early, result) if r is not None]
    graph = build_graph(plan, only=only)
    states: dict[str, dict[str, str]] = {variant: {} for variant in graph.variants}
    for r in results:
        for variant in r.graph.variants:
            states[variant] |= r.stage_states(variant)
    failures = {variant: failed for r in results for variant, failed in r.release_failures().items()}
    for variant, failed in failures.items():  # as without --ray: one line each, at the end
        print(f"error: {variant}: release gate failed: {failed}", file=sys.stderr)
    code = exit_code_of([stop for r in results for stop in r.stops])
    done = sum(
        variant not in stopped and (result is None or result.stopped(variant) is None) for variant in graph.variants
    )
    console.print(
        f"{'[green]done[/green]' if code == 0 else '[yellow]stopped[/yellow]'}: {done} of "
        f"{len(graph.variants)} variant(s) complete"
    )
    return plan, states, code, _fleet_records(plan, graph, results)


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
