"""The build stage: TensorRT-LLM checkpoint -> engine folder.

* target ``tensorrt``: runs ``trtllm-build`` (argv from the plan) in the output folder,
  keeps its full log beside the engine folder (it survives a failure), then checks the
  engine config.json it wrote against the plan.
* target ``reference``: writes the engine config.json trtllm-build would write (the same
  prediction the GPU path is checked against) and places the checkpoint's rank files beside
  it as ``rank{r}.safetensors``, so the CPU runtime serves the numbers the GPU build will.

The runner gives ``out`` as a temp folder and renames it only on success, so a failed
build never leaves an engine folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pipeline import targets
from pipeline.errors import StageError, StageUnavailable
from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.trtllm import container_hint, host
from pipeline.trtllm.build_command import display, trtllm_build_argv
from pipeline.trtllm.engine_config import check_checkpoint_config, check_engine_config, predict_engine_config
from pipeline.trtllm.flags import argv_problems

LOG_NAME = "build.log"
REFERENCE_RANK_FILE = "rank{rank}.safetensors"


def run(variant: VariantPlan, stage: StagePlan, out: Path) -> None:
    checkpoint = variant.stage("convert").output
    # Validates build.extra_flags too: a bad flag fails on the CPU path before any GPU build.
    shown_argv = trtllm_build_argv(variant, checkpoint, stage.output, visible_gpus=None)
    on_gpus = targets.on_gpus(variant.target)
    if on_gpus:
        missing = host.engine_flow_missing()
        if missing:  # checked first: "not here" is the answer even before a checkpoint exists
            raise StageUnavailable(
                f"{'; '.join(missing)}, so the TensorRT engine cannot be built here; "
                f"{container_hint()} and run there: {display(shown_argv)}"
            )
    config = read_checkpoint(variant, checkpoint)
    if on_gpus:
        _build_tensorrt(variant, out, checkpoint)
    else:
        _build_reference(variant, stage, out, checkpoint, config)


def read_checkpoint(variant: VariantPlan, checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"{path}: no checkpoint; run the convert stage first (specdeploy engine SPEC)") from None
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable checkpoint config ({exc}); re-run the convert stage") from None
    problems = check_checkpoint_config(config, variant)
    missing = [
        f"rank{r}.safetensors" for r in range(variant.world_size) if not (checkpoint / f"rank{r}.safetensors").is_file()
    ]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        raise StageError(
            f"{checkpoint} does not match the plan of variant {variant.name}: {'; '.join(problems)}; "
            "re-run the convert stage (specdeploy engine SPEC --force)"
        )
    return config


def _build_reference(
    variant: VariantPlan, stage: StagePlan, out: Path, checkpoint: Path, checkpoint_config: dict[str, Any]
) -> None:
    config = predict_engine_config(variant, checkpoint_config, output_dir=stage.output)
    for rank in range(variant.world_size):
        name = REFERENCE_RANK_FILE.format(rank=rank)
        _place(checkpoint / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    problems = check_engine_config(config, variant, engine_dir=out, rank_file=REFERENCE_RANK_FILE)
    if problems:  # the prediction disagreeing with its own plan is a specdeploy bug
        raise StageError(f"reference engine for {variant.name} disagrees with the plan: {'; '.join(problems)}")


def _place(source: Path, target: Path) -> None:
    """Hard link (no copy of multi-GB weights) when on one filesystem, else copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _build_tensorrt(variant: VariantPlan, out: Path, checkpoint: Path) -> None:
    argv = trtllm_build_argv(variant, checkpoint, out, visible_gpus=host.visible_gpu_count())
    problems = argv_problems(argv)
    if problems:  # a guard: the argv builder only emits table flags
        raise StageError(f"refusing to run an argv outside the trtllm-build table: {'; '.join(problems)}")
    log = out.parent / LOG_NAME
    code, last_line = run_logged(argv, cwd=out, log=log)
    if code != 0:
        raise StageError(
            f"trtllm-build failed for {variant.name} (exit {code}): {last_line or 'no output'}; full log: {log}"
        )
    config_path = out / "config.json"
    try:
        actual = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise StageError(f"trtllm-build exited 0 but {config_path} is unreadable ({exc}); full log: {log}") from None
    problems = check_engine_config(actual, variant, engine_dir=out)
    if problems:
        raise StageError(
            f"the engine trtllm-build wrote for {variant.name} disagrees with the plan: "
            f"{'; '.join(problems)}; full log: {log}"
        )


def run_logged(argv: list[str], *, cwd: Path, log: Path) -> tuple[int, str]:
    """Run argv, every output line to ``log``, the latest one on a spinner; (exit code, last line)."""
    last = ""
    console = Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with log.open("w", encoding="utf-8") as handle, Progress(*columns, console=console, transient=True) as progress:
        handle.write(f"$ (cd {cwd} && {display(argv)})\n")
        handle.flush()
        task = progress.add_task(f"{argv[0]}: starting", total=None)
        process = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:
                handle.write(line)
                if line.strip():
                    last = line.strip()
                    progress.update(task, description=f"{argv[0]}: {last[:100]}")
            code = process.wait()
        except BaseException:  # Ctrl-C or a failing write: never leave the build running
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    return code, last
