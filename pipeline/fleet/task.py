"""What one Ray task runs on its worker: one stage through the local runner, or the embedded model.

The same stage bodies, temp folders, fingerprints and locks as ``specdeploy engine`` without
``--ray`` (:func:`pipeline.stages.runner.run_stage`): a task retried after its worker died
finds the dead attempt's temp folder, removes it under the lock, and runs again, or skips when
the output is already complete. Errors come back as a report (state and exit code), never
raised: Ray retries a task only when its worker is lost, not when a stage rejects its input.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import SpecdeployError, StageUnavailable
from pipeline.evaluation.result import RELEASE_EXIT_CODE, release_failure
from pipeline.fleet.graph import PREPARE, FleetTask
from pipeline.io.hashing import HashCache

RAN, SKIPPED, FAILED, UNAVAILABLE, BLOCKED = "ran", "skipped", "failed", "unavailable", "blocked"
GATED = "gate failed"  # an evaluate stage that ran and whose choice failed a release gate (evaluation/result.py)
OK_STATES = (RAN, SKIPPED)


@dataclass(frozen=True)
class TaskReport:
    key: str
    state: str  # RAN | SKIPPED | FAILED | UNAVAILABLE | BLOCKED
    exit_code: int = 0
    message: str = ""
    seconds: float = 0.0
    node: str = ""  # the worker's host name and IP
    gpu_ids: tuple[str, ...] = ()  # what Ray gave the task (CUDA_VISIBLE_DEVICES)
    placement_group: str | None = None  # the placement group the task ran in
    attempt_pid: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state in OK_STATES


def node_name() -> str:
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # outside Ray (unit tests call run_task directly)
        ip = "local"
    return f"{socket.gethostname()} {ip}"


def run_task(
    task: FleetTask,
    produced: tuple[str, ...],
    *,
    bodies: dict | None,
    force: bool,
    hashes: HashCache | None,
    board=None,
) -> TaskReport:
    """Run ``task`` here; ``produced`` are the outputs its dependencies wrote."""
    from pipeline.stages.execute import STAGE_BODIES, require_inputs
    from pipeline.stages.runner import run_stage

    start, node = time.monotonic(), node_name()
    if board is not None:
        board.started.remote(task.key, node)
    gpu_ids, group = _ray_context()
    base: dict[str, Any] = dict(
        key=task.key, node=node, gpu_ids=gpu_ids, placement_group=group, attempt_pid=os.getpid()
    )
    try:
        if task.kind == PREPARE:
            from pipeline.embedded import prepare_embedded_model

            assert task.variant.model_dir is not None and task.variant.builtin is not None
            ready = (task.variant.model_dir / "config.json").is_file()  # prepared folders appear whole
            prepare_embedded_model(task.variant.model_dir.parent, name=task.variant.builtin)
            state = SKIPPED if ready else RAN
        else:
            variant, stage = task.variant, task.stage
            assert stage is not None
            body = (bodies or STAGE_BODIES)[stage.name]
            require_inputs(variant, stage, {Path(p) for p in produced})
            print(f"[{variant.name}] {stage.name} -> {stage.output} on {node}", flush=True)
            result = run_stage(
                stage,
                lambda out: body(variant, stage, out),
                force=force,
                hashes=hashes,
                on_wait=lambda text: print(f"[{variant.name}] {stage.name}: {text}", flush=True),
            )
            state = result.status
            failed = release_gate(stage.name, result.output)
            if failed:  # the variant stops here, as without Ray; its later tasks are blocked
                return TaskReport(
                    state=GATED,
                    exit_code=RELEASE_EXIT_CODE,
                    message=failed,
                    seconds=time.monotonic() - start,
                    **base,
                )
    except StageUnavailable as exc:
        return TaskReport(
            state=UNAVAILABLE, exit_code=exc.exit_code, message=str(exc), seconds=time.monotonic() - start, **base
        )
    except SpecdeployError as exc:
        return TaskReport(
            state=FAILED, exit_code=exc.exit_code, message=str(exc), seconds=time.monotonic() - start, **base
        )
    except Exception as exc:  # a bug: the traceback goes to the worker's log, one line to the user
        traceback.print_exc()
        return TaskReport(
            state=FAILED,
            exit_code=1,
            message=f"{type(exc).__name__}: {exc} (traceback in the Ray worker log)",
            seconds=time.monotonic() - start,
            **base,
        )
    return TaskReport(state=state, seconds=time.monotonic() - start, **base)


def release_gate(stage: str, output: Path) -> str | None:
    """The release gate an evaluate stage's choice failed (release.on_fail: fail), else None."""
    return release_failure(output) if stage == "evaluate" else None


def _ray_context() -> tuple[tuple[str, ...], str | None]:
    try:
        import ray

        if not ray.is_initialized():
            return (), None
        context = ray.get_runtime_context()
        return tuple(str(i) for i in ray.get_gpu_ids()), context.get_placement_group_id()
    except ImportError:
        return (), None
