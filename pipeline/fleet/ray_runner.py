"""``specdeploy engine SPEC --ray [ADDRESS]``: every variant's stages as Ray tasks.

* Connect: no address starts a local Ray cluster, ``auto`` joins the running one, anything
  else is given to ``ray.init(address=...)``. The project folder travels to the workers as
  Ray's ``runtime_env`` working directory when specdeploy runs from a source checkout (an
  installed specdeploy, as in a TensorRT-LLM container, is imported as installed).
* Before any stage: every task's request (:mod:`pipeline.fleet.graph`) is checked against the
  nodes; a task no node can hold stops its variant there with exit 3, saying what it needs and
  what the nodes have, instead of waiting forever. Every node must see the output folders and
  the inputs (:mod:`pipeline.fleet.storage`).
* Scheduling is Ray's: the driver submits a task once the tasks it depends on are done (so a GPU
  build's placement group is reserved only when its checkpoint exists), variants side by side.
  ``max_retries`` re-runs a task whose worker died; the runner's fingerprints and atomic renames
  make the retry skip or redo the stage cleanly. Worker output goes to Ray's logs (and, by
  Ray's default, to this terminal).
* The result: a variants x stages table, live and again at the end; the exit code is that of
  the failed stages (the largest; a release gate failed by an evaluated choice, ``release.on_fail:
  fail``, counts as a failed stage with exit code 6 and stops only its variant), else 3 when a
  stage could not run on the cluster, else 0, given once every variant that could go on has finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

import pipeline
from pipeline.console import make_console
from pipeline.errors import InputError, StageError
from pipeline.fleet import storage
from pipeline.fleet.graph import GIB, FleetGraph, FleetTask, TaskRequest
from pipeline.fleet.task import BLOCKED, FAILED, GATED, UNAVAILABLE, TaskReport, run_task
from pipeline.fleet.view import WAITING, Board
from pipeline.io.hashing import HashCache

DEFAULT_RETRIES = 3
POLL_SECONDS = 0.25
RAY_LOGS = "/tmp/ray/session_latest/logs"  # Ray's default temp dir (ray start --temp-dir moves it)
# Not shipped to the workers with the project folder: outputs, caches, environments, weights.
WORKING_DIR_EXCLUDES = [
    ".git",
    ".venv",
    ".cache",
    "engines",
    "triton_repo",
    "tests",
    "heads",
    "bench",
    "*.safetensors",
    "*.gguf",
    "*.bin",
    "*.pt",
    "__pycache__",
]


@dataclass(frozen=True)
class FleetResult:
    graph: FleetGraph
    reports: dict[str, TaskReport]

    def stopped(self, variant: str) -> TaskReport | None:
        """The first task of ``variant`` that did not complete (None: the variant is done)."""
        return next((self.reports[t.key] for t in self.graph.chain(variant) if not self.reports[t.key].ok), None)

    def stage_states(self, variant: str) -> dict[str, str]:
        return {
            column: self.reports[self.graph.cells[(variant, column)]].state
            for column in self.graph.columns
            if (variant, column) in self.graph.cells
        }

    def release_failures(self) -> dict[str, str]:
        """{variant: the release gate its evaluated choice failed} (release.on_fail: fail)."""
        return {v: s.message for v in self.graph.variants if (s := self.stopped(v)) is not None and s.state == GATED}

    @property
    def stops(self) -> list[TaskReport]:
        return [s for s in (self.stopped(v) for v in self.graph.variants) if s is not None and s.state != BLOCKED]

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.stops)


def exit_code_of(stops: list[TaskReport]) -> int:
    """The failed stages' code (the largest), else that of stages that could not run, else 0."""
    failed = [s.exit_code for s in stops if s.state in (FAILED, GATED)]
    if failed:
        return max(failed)
    return max((s.exit_code for s in stops), default=0)


def require_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'specdeploy[ray]' (or pip install 'ray==2.60.0')") from None
    return ray


def project_runtime_env() -> dict[str, Any]:
    """Ray's runtime_env that ships this source checkout to the workers ({} when installed)."""
    root = Path(pipeline.__file__).resolve().parents[1]
    if not ((root / "pyproject.toml").is_file() and (root / "pipeline" / "__init__.py").is_file()):
        return {}
    return {"working_dir": str(root), "excludes": list(WORKING_DIR_EXCLUDES)}


def connect(address: str | None) -> bool:
    """Start or join a cluster; False when Ray was already initialised by the caller."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address or "local", runtime_env=project_runtime_env(), logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = "a local Ray cluster" if not address else f"the Ray cluster at {address}"
        raise StageError(
            f"cannot start or join {where}: {exc}; start one with `ray start --head` and pass "
            "--ray auto, or give its address"
        ) from None
    return True


def run_fleet(
    graph: FleetGraph,
    *,
    address: str | None = None,
    force: bool = False,
    hashes: HashCache | None = None,
    bodies: dict[str, Callable] | None = None,
    max_retries: int = DEFAULT_RETRIES,
    roots: tuple[Path, ...] = (),
    console: Console | None = None,
) -> FleetResult:
    """Run every task of ``graph`` on Ray; ``roots`` are the output folders every node must see."""
    ray = require_ray()
    console = console or make_console(stderr=True)
    owned = connect(address)
    try:
        check_storage(ray, graph, roots)
        return _Driver(
            ray, graph, force=force, hashes=hashes, bodies=bodies, max_retries=max_retries, console=console
        ).run()
    finally:
        if owned:
            ray.shutdown()


def alive_nodes(ray) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def fits(request: TaskRequest, resources: dict[str, float]) -> bool:
    return (
        resources.get("CPU", 0) >= request.num_cpus
        and resources.get("GPU", 0) >= request.num_gpus
        and resources.get("memory", 0) >= request.memory_bytes
    )


def infeasible_message(task: FleetTask, nodes: list[dict[str, Any]]) -> str:
    have = (
        "; ".join(
            f"{n.get('NodeManagerAddress', '?')}: {n['Resources'].get('CPU', 0):g} CPU, "
            f"{n['Resources'].get('GPU', 0):g} GPU, {n['Resources'].get('memory', 0) / GIB:.1f} GiB RAM"
            for n in nodes
        )
        or "none alive"
    )
    detail = f" ({task.stage.resources.detail})" if task.stage is not None and task.stage.resources else ""
    return (
        f"no node of the Ray cluster can run it: it needs {task.request.describe()} on one node{detail}; "
        f"the nodes have {have}; add a node that large (GPU workers in the TensorRT-LLM container), or "
        "lower parallel.tp or build.workers"
    )


def check_storage(ray, graph: FleetGraph, roots: tuple[Path, ...]) -> None:
    """InputError naming each node that cannot see an output root or an input."""
    inputs = sorted(
        {
            str(path)
            for task in graph.tasks.values()
            if task.stage is not None
            for path in task.stage.inputs.values()
            if Path(path).exists()
        }
        - {str(task.stage.output) for task in graph.tasks.values() if task.stage is not None}
    )
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    tokens = storage.write_tokens(roots)
    try:
        remote = ray.remote(storage.probe)
        nodes = alive_nodes(ray)
        refs = {
            node.get("NodeManagerAddress", node["NodeID"]): remote.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(tokens, inputs)
            for node in nodes
        }
        problems = dict(zip(refs, ray.get(list(refs.values()))))
    finally:
        storage.remove_tokens(tokens)
    error = storage.storage_error(problems)
    if error is not None:
        raise error


class _Driver:
    """Submits ready tasks, follows them, keeps the board; one per run."""

    def __init__(
        self,
        ray,
        graph: FleetGraph,
        *,
        force: bool,
        hashes: HashCache | None,
        bodies: dict[str, Callable] | None,
        max_retries: int,
        console: Console,
    ) -> None:
        self.ray, self.graph, self.console = ray, graph, console
        self.force, self.hashes, self.bodies, self.max_retries = force, hashes, bodies, max_retries
        self.board = Board(graph)
        self.reports: dict[str, TaskReport] = {}
        self.pending: dict[Any, str] = {}  # ObjectRef -> task key
        self.groups: dict[str, Any] = {}  # task key -> placement group
        self.placements: dict[str, dict[str, Any]] = {}  # task key -> the placement asked for
        self.remote = ray.remote(run_task)
        self.started = _started_board(ray)

    def run(self) -> FleetResult:
        nodes = alive_nodes(self.ray)
        for task in self.graph.tasks.values():
            if not any(fits(task.request, node["Resources"]) for node in nodes):
                self._finish(TaskReport(task.key, UNAVAILABLE, 3, infeasible_message(task, nodes)))
        try:
            with Live(
                self.board.table("specdeploy engine --ray"), console=self.console, transient=True, auto_refresh=False
            ) as live:
                while len(self.reports) < len(self.graph.tasks):
                    self._submit_ready()
                    self._collect()
                    self._follow_starts()
                    live.update(self.board.table("specdeploy engine --ray"), refresh=True)
        except BaseException:
            for ref in self.pending:
                self.ray.cancel(ref, force=True)
            raise
        finally:
            for key in list(self.groups):
                self._release(key)
        self._summary()
        for key, placement in self.placements.items():
            self.reports[key].extra.update(placement)
        return FleetResult(self.graph, dict(self.reports))

    def _submit_ready(self) -> None:
        for key, task in self.graph.tasks.items():
            if key in self.reports or self.board.cells[key].state != WAITING:
                continue
            deps = [self.reports.get(dep) for dep in task.deps]
            if any(dep is not None and not dep.ok for dep in deps):
                self._finish(TaskReport(key, BLOCKED, 0, "an earlier stage did not complete"))
            elif all(dep is not None for dep in deps):
                self._submit(task)

    def _submit(self, task: FleetTask) -> None:
        request = task.request
        options: dict[str, Any] = dict(
            num_cpus=request.num_cpus,
            num_gpus=request.num_gpus,
            memory=request.memory_bytes or None,
            max_retries=self.max_retries,
            name=f"{task.kind}:{task.variant.name}",
        )
        if request.placement_strategy:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group = placement_group(
                [request.bundle()],
                strategy=request.placement_strategy,
                name=f"specdeploy-{task.kind}-{task.variant.name}",
            )
            self.groups[task.key] = group
            self.placements[task.key] = {
                "placement_group": group.id.hex(),
                "strategy": request.placement_strategy,
                "bundle": repr(request.bundle()),
            }
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        produced = tuple(self.graph.tasks[dep].key for dep in task.deps)
        ref = self.remote.options(**options).remote(
            task, produced, bodies=self.bodies, force=self.force, hashes=self.hashes, board=self.started
        )
        self.pending[ref] = task.key
        self.board.queued(task.key)

    def _collect(self) -> None:
        if not self.pending:
            return
        done, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=POLL_SECONDS)
        for ref in done:
            key = self.pending.pop(ref)
            try:
                report = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                report = TaskReport(
                    key,
                    FAILED,
                    1,
                    f"the Ray worker was lost {self.max_retries + 1} time(s) "
                    f"running it ({first}); see the worker logs "
                    f"({RAY_LOGS} on its node)",
                )
            self._release(key)
            self._finish(report)

    def _follow_starts(self) -> None:
        wall, mono = time.time(), time.monotonic()
        for key, (node, started) in self.ray.get(self.started.snapshot.remote()).items():
            self.board.running(key, node, mono - (wall - started))

    def _finish(self, report: TaskReport) -> None:
        self.reports[report.key] = report
        self.board.finished(report)

    def _release(self, key: str) -> None:
        group = self.groups.pop(key, None)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)

    def _summary(self) -> None:
        self.console.print(self.board.table("specdeploy engine --ray: summary"))
        for variant in self.graph.variants:
            for task in self.graph.chain(variant):
                report = self.reports[task.key]
                if report.state in (FAILED, UNAVAILABLE, GATED):
                    self.console.print(
                        f"[{variant}] {task.kind}: {report.state}: {report.message}", markup=False, highlight=False
                    )
                    break


def _started_board(ray):
    """A small actor the tasks tell when (and where) they start, for the live view."""

    @ray.remote(num_cpus=0)
    class StartedBoard:
        def __init__(self) -> None:
            self.seen: dict[str, tuple[str, float]] = {}

        def started(self, key: str, node: str) -> None:
            self.seen[key] = (node, time.time())

        def snapshot(self) -> dict[str, tuple[str, float]]:
            return dict(self.seen)

    return StartedBoard.remote()
