"""The run of ``specdeploy engine``, written once for both ways of running its stages.

:func:`run_engine` is the flow: plan, print the LoRA decisions, run the stages up to evaluate of the
``method: best`` variants first and plan again (so that the measured choice is what is built), run the
rest for the variants not stopped, join each variant's two runs, then one stderr line per failed
release gate (after every variant), the exit code, the manifest's stage states and the CI records.

A :class:`StageRunner` runs "these stages of this plan for these variants" and answers one
:class:`VariantRun` per variant: :class:`HereStages` one variant after another on this host
(:func:`pipeline.stages.execute.execute_plan`), :class:`RayStages` each stage a Ray task
(:func:`pipeline.fleet.ray_runner.run_fleet`), with its setup (Ray installed, absolute paths for the
workers, the output folders claimed before any task, the roots every node must see, retries).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipeline.commands.common import load_plan, output_roots
from pipeline.errors import InputError
from pipeline.evaluation.result import GATE_FAILED
from pipeline.release.ci.records import FAILED, UNAVAILABLE, StageRecord

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.io.hashing import HashCache
    from pipeline.plan.types import Plan
    from pipeline.release.ci.records import VariantRecord


@dataclass(frozen=True)
class Stop:
    """The stage that stopped a variant: ``state`` gate failed (a release gate, exit 6), failed (a
    stage's error) or unavailable (it cannot run there: exit 3, or 0 for a stage not in this version)."""

    state: str
    exit_code: int
    reason: str


@dataclass(frozen=True)
class VariantRun:
    """What one run of some of a variant's stages did."""

    states: dict[str, str]  # stage -> its state, for the manifest
    stages: tuple[StageRecord, ...]  # for CI, in the order they ran
    complete: bool  # every stage of the run ran or was up to date
    stop: Stop | None = None  # what stopped the variant, where it counts for the exit code
    stopped_by: StageRecord | None = None  # for CI: the stopping stage's record over the one that ran
    exit_code: int = 0  # the variant's code in the CI record

    def then(self, later: VariantRun) -> VariantRun:
        """This run's stages followed by a later run's (the rest of the variant's stages)."""
        return VariantRun(
            self.states | later.states,
            self.stages + later.stages,
            later.complete,
            later.stop,
            later.stopped_by,
            max(self.exit_code, later.exit_code),
        )


@dataclass(frozen=True)
class EngineRun:
    plan: Plan  # the plan that was built (made again after a measured choice)
    states: dict[str, dict[str, str]]  # variant -> stage -> state, for the manifest
    exit_code: int
    records: list[VariantRecord]


class StageRunner(Protocol):
    """One way of running the stages of ``specdeploy engine``."""

    def load_plan(self) -> Plan:
        """The spec's plan (again after the evaluate-first stages: the measured choice is in it)."""
        ...

    def prepare(self, plan: Plan, only: set[str]) -> None:
        """Before any stage of ``plan`` runs (``only``: the variants asked for, empty: all)."""
        ...

    def run(self, plan: Plan, names: set[str]) -> dict[str, VariantRun]:
        """Every stage of ``plan`` for the variants ``names`` (empty: all of the plan's), by variant."""
        ...

    def say_done(self, runs: list[VariantRun], exit_code: int) -> None:
        """The closing line(s) on the console, once every variant's runs are joined."""
        ...


def run_engine(args: argparse.Namespace, console: Console, runner: StageRunner) -> EngineRun:
    from pipeline.evaluation.apply import split_at_evaluate
    from pipeline.release.ci.records import variant_record
    from pipeline.release.report import print_lora_decisions

    plan = runner.load_plan()
    print_lora_decisions(plan, console)
    only = set(args.variant or ())
    runner.prepare(plan, only)
    # method: best: the stages up to evaluate first, then the plan again, so its choice is what is built.
    first, rest = split_at_evaluate(plan, only)
    early: dict[str, VariantRun] = {}
    if first is not None:
        early = runner.run(first, set())
        plan = runner.load_plan()
        say_choices(plan, console)
    stopped = {name for name, run in early.items() if not run.complete}  # a gate failed, or evaluate could not run
    names = {v.name for v in plan.variants if (not only or v.name in only) and v.name not in stopped}
    later = runner.run(rest(plan), names) if names else {}
    runs: dict[str, VariantRun] = {}
    for variant in plan.variants:
        parts = [part[variant.name] for part in (early, later) if variant.name in part]
        if parts:
            runs[variant.name] = parts[0].then(parts[1]) if len(parts) == 2 else parts[0]
    for name, run in runs.items():  # after every variant, so a release pipeline sees every failed gate at once
        if run.stop is not None and run.stop.state == GATE_FAILED:
            print(f"error: {name}: release gate failed: {run.stop.reason}", file=sys.stderr)
    code = exit_code_of([run.stop for run in runs.values() if run.stop is not None])
    records = [
        variant_record(v, runs[v.name].stages, stopped_by=runs[v.name].stopped_by, exit_code=runs[v.name].exit_code)
        for v in plan.variants
        if v.name in runs
    ]
    runner.say_done(list(runs.values()), code)
    return EngineRun(plan, {name: run.states for name, run in runs.items()}, code, records)


def exit_code_of(stops: list[Stop]) -> int:
    """The failed stages' code (the largest; a failed release gate is one), else that of the stages
    that could not run, else 0."""
    failed = [s.exit_code for s in stops if s.state in (FAILED, GATE_FAILED)]
    if failed:
        return max(failed)
    return max((s.exit_code for s in stops), default=0)


def say_choices(plan: Plan, console: Console) -> None:
    """One line per variant whose method was chosen by measurement: what is built and why."""
    for variant in plan.variants:
        if variant.rehearsal is not None:
            console.print(
                f"[{variant.name}] method best: building {variant.method}: {variant.speculative.reason}",
                highlight=False,
                markup=False,
            )


class HereStages:
    """The stages here, one variant after another; a variant stops at a stage this host cannot run
    (StageUnavailable) or at a failed release gate, any other error ends the command."""

    def __init__(self, args: argparse.Namespace, console: Console, hashes: HashCache | None) -> None:
        self.args, self.console, self.hashes = args, console, hashes

    def load_plan(self) -> Plan:
        return load_plan(self.args)

    def prepare(self, plan: Plan, only: set[str]) -> None:
        """Nothing: execute_plan claims the output folders of what it runs."""

    def run(self, plan: Plan, names: set[str]) -> dict[str, VariantRun]:
        from pipeline.evaluation.result import RELEASE_EXIT_CODE
        from pipeline.stages.execute import execute_plan

        say = lambda text: self.console.print(text, highlight=False, markup=False)  # noqa: E731
        runs = {}
        for o in execute_plan(plan, only=names or None, force=self.args.force, hashes=self.hashes, say=say):
            stop = stopped_by = None
            states = {r.name: r.status for r in o.results}
            if o.stopped_at:  # a failed release gate stops after an evaluate stage that ran: the manifest says so
                state = GATE_FAILED if o.exit_code == RELEASE_EXIT_CODE else UNAVAILABLE
                states[o.stopped_at] = state
                stop = Stop(state, o.exit_code, o.reason or "")
                stopped_by = StageRecord(o.stopped_at, state, None, o.reason or "")
            stages = tuple(StageRecord(r.name, r.status, r.seconds) for r in o.results)
            runs[o.variant] = VariantRun(states, stages, not o.stopped_at, stop, stopped_by, o.exit_code)
        return runs

    def say_done(self, runs: list[VariantRun], exit_code: int) -> None:
        stops = [run.stop for run in runs if run.stop is not None]
        unavailable = [stop for stop in stops if stop.state == UNAVAILABLE]
        if unavailable:
            self.console.print(
                f"[yellow]{len(unavailable)} variant(s) stopped at a stage this host cannot run yet[/yellow]"
            )
        if not stops:
            self.console.print(f"[green]done[/green]: {len(runs)} variant(s)")


class RayStages:
    """Each stage a Ray task (``--ray [ADDRESS]``: none starts a local cluster, ``auto`` joins the
    running one); every variant that can go on runs to its end before the run's result is given."""

    def __init__(self, args: argparse.Namespace, console: Console, hashes: HashCache | None) -> None:
        from pipeline.fleet.ray_runner import require_ray

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
        self.args, self.console, self.hashes = args, console, hashes
        self.roots: tuple[Path, ...] = ()

    def load_plan(self) -> Plan:
        return load_plan(self.args, resolve=True)

    def prepare(self, plan: Plan, only: set[str]) -> None:
        from pipeline.fleet.graph import build_graph
        from pipeline.stages.owners import claim_outputs

        claim_outputs(plan, only)  # another spec's folders are refused before any task runs
        build_graph(plan, only=only)  # and two variants writing one folder with different settings
        roots = output_roots(self.args)
        needs_cache = any(variant.builtin for variant in plan.variants)
        self.roots = (roots.engines, roots.triton_repo) + ((roots.cache,) if needs_cache else ())

    def run(self, plan: Plan, names: set[str]) -> dict[str, VariantRun]:
        from pipeline.fleet.graph import build_graph
        from pipeline.fleet.ray_runner import run_fleet
        from pipeline.fleet.task import BLOCKED, GATED

        result = run_fleet(
            build_graph(plan, only=names),
            address=None if self.args.ray == "local" else self.args.ray,
            force=self.args.force,
            hashes=self.hashes,
            max_retries=self.args.ray_retries,
            console=self.console,
            roots=self.roots,
        )
        graph, runs = result.graph, {}
        for name in graph.variants:
            first = result.stopped(name)  # the first task that did not complete
            stop = None
            if first is not None and first.state != BLOCKED:
                stop = Stop(GATE_FAILED if first.state == GATED else first.state, first.exit_code, first.message)
            stages, code = [], 0
            for column in graph.columns:
                key = graph.cells.get((name, column))
                if key is None or key not in result.reports:
                    continue
                report = result.reports[key]
                stages.append(StageRecord(column, _record_state(report.state), report.seconds or None, report.message))
                code = max(code, report.exit_code if not report.ok and report.state != BLOCKED else 0)
            runs[name] = VariantRun(result.stage_states(name), tuple(stages), first is None, stop, None, code)
        return runs

    def say_done(self, runs: list[VariantRun], exit_code: int) -> None:
        done = sum(run.complete for run in runs)
        self.console.print(
            f"{'[green]done[/green]' if exit_code == 0 else '[yellow]stopped[/yellow]'}: {done} of "
            f"{len(runs)} variant(s) complete"
        )


def _record_state(state: str) -> str:
    """A Ray task's state as the CI records say it (a task after one that stopped: not run)."""
    from pipeline.fleet.task import BLOCKED
    from pipeline.release.ci.records import NOT_RUN

    return NOT_RUN if state == BLOCKED else state
