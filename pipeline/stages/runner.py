"""Runs plan stages atomically, skips up-to-date ones, and keeps concurrent runs apart.

* Atomic: a stage writes into ``.<name>.tmp-<pid>`` beside its output folder and the
  folder is renamed into place only when the stage body returned; a failed or killed
  stage never leaves an output folder that looks complete.
* Fingerprints: each output folder records ``.specdeploy-stage.json`` with a hash of the
  stage's parameters (the spec fields it reads), the identity (path, size, mtime) of every
  input file, and tool versions. A re-run with an equal fingerprint skips the stage.
* Locks: ``.<name>.lock`` (fcntl) beside the output; a second run on the same output waits,
  saying for whom, and fails clearly after ``lock_timeout`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pipeline
from pipeline.atomic import exclusive_lock, replace_folder
from pipeline.hashing import HashCache
from pipeline.plan import StagePlan

FINGERPRINT_FILE = ".specdeploy-stage.json"
TOOLS = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tensorrt_llm")


@dataclass(frozen=True)
class StageResult:
    name: str
    status: str  # "ran" | "skipped"
    output: Path
    seconds: float


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"specdeploy": pipeline.__version__}
    for tool in TOOLS:
        try:
            versions[tool] = metadata.version(tool)
        except metadata.PackageNotFoundError:
            versions[tool] = None
    return versions


def _identity(path: Path) -> Any:
    """Cheap identity of an input: sizes and mtimes, not contents (checkpoints are huge)."""
    if path.is_file():
        stat = path.stat()
        return [stat.st_size, stat.st_mtime_ns]
    if path.is_dir():
        entries = []
        for file in sorted(p for p in path.rglob("*") if p.is_file() and _is_content(p)):
            stat = file.stat()
            entries.append([str(file.relative_to(path)), stat.st_size, stat.st_mtime_ns])
        return entries
    return None


def _is_content(path: Path) -> bool:
    # Lock files and temp markers change on every run without changing the content.
    return not path.name.startswith(".") or path.name == FINGERPRINT_FILE


def fingerprint(stage: StagePlan, hashes: HashCache | None = None) -> dict[str, Any]:
    """``hashes`` given (``--hash-inputs``): inputs are identified by content, not size and mtime."""
    identity = _identity if hashes is None else hashes.tree
    inputs = {name: {"path": str(path), "identity": identity(path)} for name, path in sorted(stage.inputs.items())}
    body = {"stage": stage.name, "params": stage.params, "inputs": inputs, "tools": tool_versions()}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return {"digest": digest, **body}


def recorded_fingerprint(output: Path) -> dict[str, Any] | None:
    try:
        return json.loads((output / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None


def output_lock(output: Path, timeout: float, on_wait: Callable[[str], None]):
    return exclusive_lock(output.parent / f".{output.name}.lock", timeout=timeout, what=str(output), on_wait=on_wait)


def _remove_leftovers(output: Path) -> None:
    """Temp/old folders of runs that died; safe because we hold the lock."""
    for stale in output.parent.glob(f".{output.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in output.parent.glob(f".{output.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)


def run_stage(
    stage: StagePlan,
    body: Callable[[Path], None],
    *,
    force: bool = False,
    lock_timeout: float = 3600.0,
    on_wait: Callable[[str], None] = print,
    hashes: HashCache | None = None,
) -> StageResult:
    """Run ``body(tmp_dir)`` unless the output is up to date, then rename tmp_dir into place."""
    start = time.monotonic()
    output = stage.output
    with output_lock(output, lock_timeout, on_wait):
        wanted = fingerprint(stage, hashes)
        recorded = recorded_fingerprint(output)
        if not force and recorded is not None and recorded.get("digest") == wanted["digest"]:
            return StageResult(stage.name, "skipped", output, time.monotonic() - start)
        _remove_leftovers(output)
        tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            body(tmp)
            (tmp / FINGERPRINT_FILE).write_text(json.dumps(wanted, indent=2, sort_keys=True, default=str))
            replace_folder(tmp, output)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return StageResult(stage.name, "ran", output, time.monotonic() - start)
