"""A plan as a task graph: one task per distinct stage output, with the machine it needs.

Pure data, no Ray: ``pipeline.fleet.ray_runner`` submits these tasks. Stages of one variant
depend on the previous one (their order in the plan); stages of different variants are
independent unless they produce the same output folder, which is then one shared task that
every owner waits for (a base model merged once for several adapters). Variants on the
embedded model share one task that prepares it.

What a task asks of a node comes from the plan (``StagePlan.resources``, see
:mod:`pipeline.plan.resources`): ``num_gpus`` = the GPUs the stage needs (the build's world size,
or ``build.workers``), ``memory`` = its host RAM, one CPU; a GPU stage runs inside a
STRICT_PACK placement group holding exactly that request, so that every rank of one engine
builds on one node (a bundle never spans nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError
from pipeline.plan.types import Plan, StagePlan, VariantPlan

GIB = 1024**3
PREPARE = "prepare"  # the task that prepares an embedded model
PREPARE_MEMORY_GIB = 2.0  # reading the GGUF file and writing safetensors, a tensor at a time
DEFAULT_MEMORY_GIB = 1.0  # a stage the plan has no estimate for


@dataclass(frozen=True)
class TaskRequest:
    """What one task asks of a node: Ray's num_cpus, num_gpus and memory (bytes)."""

    num_cpus: float
    num_gpus: int
    memory_bytes: int

    @property
    def placement_strategy(self) -> str | None:
        """STRICT_PACK for GPU stages (all their GPUs on one node), none for CPU stages."""
        return "STRICT_PACK" if self.num_gpus else None

    def bundle(self) -> dict[str, float]:
        """The one placement-group bundle that holds this request."""
        bundle = {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus)}
        if self.memory_bytes:
            bundle["memory"] = float(self.memory_bytes)
        return bundle

    def describe(self) -> str:
        return f"{self.num_cpus:g} CPU, {self.num_gpus} GPU, {self.memory_bytes / GIB:.1f} GiB RAM"


@dataclass(frozen=True)
class FleetTask:
    key: str  # the output folder (unique), or "prepare:<cache folder>/<model>"
    kind: str  # a stage name, or PREPARE
    variant: VariantPlan  # the first variant that needs it (its body reads this plan)
    owners: tuple[str, ...]  # every variant whose progress waits for it
    stage: StagePlan | None  # None for PREPARE
    deps: tuple[str, ...]
    request: TaskRequest


@dataclass(frozen=True)
class FleetGraph:
    tasks: dict[str, FleetTask]  # in submission order (dependencies first)
    columns: tuple[str, ...]  # stage names in plan order, for the progress view
    cells: dict[tuple[str, str], str]  # (variant, column) -> task key
    variants: tuple[str, ...]

    def chain(self, variant: str) -> list[FleetTask]:
        """The tasks of one variant, in order."""
        return [self.tasks[self.cells[(variant, column)]] for column in self.columns if (variant, column) in self.cells]


def stage_request(stage: StagePlan) -> TaskRequest:
    res = stage.resources
    if res is None:
        return TaskRequest(1, 0, int(DEFAULT_MEMORY_GIB * GIB))
    return TaskRequest(1, res.gpus, int(res.host_memory_gib * GIB))


def build_graph(plan: Plan, *, only: set[str] | None = None) -> FleetGraph:
    """The tasks of ``plan`` (the variants in ``only``, when given); InputError when two
    variants would write one output folder with different settings, or a path is relative
    (workers run in another folder)."""
    tasks: dict[str, FleetTask] = {}
    cells: dict[tuple[str, str], str] = {}
    columns: list[str] = []
    variants = [v for v in plan.variants if not only or v.name in only]
    for variant in variants:
        previous: tuple[str, ...] = ()
        column: str | None = None
        if variant.builtin and variant.model_dir is not None:
            key = f"{PREPARE}:{variant.model_dir}"
            _add(
                tasks,
                FleetTask(
                    key, PREPARE, variant, (variant.name,), None, (), TaskRequest(1, 0, int(PREPARE_MEMORY_GIB * GIB))
                ),
            )
            cells[(variant.name, PREPARE)] = key
            _column(columns, PREPARE)
            previous, column = (key,), PREPARE
        for stage in variant.stages:
            _check_absolute(variant, stage)
            key = str(stage.output)
            existing = tasks.get(key)
            if (
                existing is not None
                and existing.stage is not None
                and (existing.stage.params != stage.params or existing.stage.inputs != stage.inputs)
            ):
                raise InputError(
                    f"variants {existing.variant.name} and {variant.name} both write {stage.output} "
                    f"({stage.name}) with different settings; give them different names"
                )
            _add(tasks, FleetTask(key, stage.name, variant, (variant.name,), stage, previous, stage_request(stage)))
            cells[(variant.name, stage.name)] = key
            _column(columns, stage.name, after=column)
            previous, column = (key,), stage.name
    return FleetGraph(tasks, tuple(columns), cells, tuple(v.name for v in variants))


def _add(tasks: dict[str, FleetTask], new: FleetTask) -> None:
    """Add ``new``, or make its variant one more owner of the task already writing that output."""
    task = tasks.get(new.key)
    if task is None:
        tasks[new.key] = new
        return
    owners = tuple(dict.fromkeys((*task.owners, *new.owners)))
    deps = tuple(dict.fromkeys((*task.deps, *new.deps)))
    tasks[new.key] = FleetTask(task.key, task.kind, task.variant, owners, task.stage, deps, task.request)


def _column(columns: list[str], name: str, after: str | None = None) -> None:
    """Add a stage's column after the column of the stage before it, so every variant's chain is in
    plan order (a variant with an evaluate stage after one without: convert, evaluate, build, ...)."""
    if name not in columns:
        columns.insert(columns.index(after) + 1 if after in columns else len(columns), name)


def _check_absolute(variant: VariantPlan, stage: StagePlan) -> None:
    for path in (stage.output, *stage.inputs.values()):
        if not Path(path).is_absolute() and not str(path).startswith("<"):
            raise InputError(
                f"{path} ({variant.name} {stage.name}) is relative; Ray workers run in another "
                "folder, so plan with absolute output roots and spec paths"
            )
