"""Runs plan stages atomically, skips up-to-date ones, and keeps concurrent runs apart.

* Atomic: a stage writes into ``.<name>.tmp-<pid>`` beside its output folder and the
  folder is renamed into place only when the stage body returned; a failed or killed
  stage never leaves an output folder that looks complete.
* Fingerprints: each output folder records ``.specdeploy-stage.json`` with a hash of the
  stage's parameters (the spec fields it reads), the identity (path, size, mtime, inode,
  ctime; or, with ``SPECDEPLOY_FINGERPRINT=content``, a sha256) of every input file, and tool
  versions. A re-run with an equal fingerprint skips the stage.
* Locks: ``.<name>.lock`` (fcntl) beside the output; a second run on the same output waits,
  saying for whom, and fails clearly after ``lock_timeout`` seconds. Whoever holds the lock
  first removes the work folders of killed runs and says how much that freed.
* Host faults (read-only or full filesystem, permissions, a file or symlink where the output
  folder goes: never deleted, :func:`refuse_foreign_output`) become one-line errors with exit
  codes 4 and 5 (:func:`pipeline.errors.host_error`). Where the lock cannot be created (a
  read-only mount), an output that is complete and up to date is still reported as skipped.
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
from pipeline.errors import UNWRITABLE, HostFilesystemError, InputError, host_error
from pipeline.io.atomic import describe_freed, exclusive_lock, remove_dead_leftovers, replace_folder
from pipeline.io.hashing import HashCache
from pipeline.plan.types import StagePlan

FINGERPRINT_FILE = ".specdeploy-stage.json"
FINGERPRINT_ENV = "SPECDEPLOY_FINGERPRINT"
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


def fingerprint_mode() -> str:
    """``stat`` (default) or ``content`` (``SPECDEPLOY_FINGERPRINT=content``: hash every input byte)."""
    mode = os.environ.get(FINGERPRINT_ENV, "stat")
    if mode not in ("stat", "content"):
        raise InputError(
            f"{FINGERPRINT_ENV}={mode!r}: use 'stat' (size, mtime, inode, ctime) or 'content' "
            "(sha256 of every input file)"
        )
    return mode


def _file_identity(path: Path, *, ctime: bool) -> list[Any]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino] + ([stat.st_ctime_ns] if ctime else [])


def _identity(path: Path) -> Any:
    """Cheap identity of an input: size, mtime, inode and ctime, not contents (checkpoints are huge).

    An edit that restores size and mtime still changes the ctime (the kernel sets it on every
    write and on utime), and a file replaced by another has a new inode. Another stage's output
    (a folder with a fingerprint) is only ever replaced whole, so its files go without ctime: the
    reference build hard-links the checkpoint's files, which changes their ctime, not their content.
    """
    if path.is_file():
        return _file_identity(path, ctime=True)
    if path.is_dir():
        owned = (path / FINGERPRINT_FILE).is_file()
        return [
            [str(file.relative_to(path)), *_file_identity(file, ctime=not owned)]
            for file in sorted(p for p in path.rglob("*") if p.is_file() and _is_content(p))
        ]
    return None


def _is_content(path: Path) -> bool:
    # Lock files and temp markers change on every run without changing the content.
    return not path.name.startswith(".") or path.name == FINGERPRINT_FILE


def fingerprint(stage: StagePlan, hashes: HashCache | None = None) -> dict[str, Any]:
    """Inputs identified by size, mtime, inode and ctime; by content (sha256) with ``hashes``
    (``--hash-inputs``) or ``SPECDEPLOY_FINGERPRINT=content``."""
    if hashes is None and fingerprint_mode() == "content":
        hashes = HashCache(None)
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


def refuse_foreign_output(output: Path) -> None:
    """A stage's output is a folder this runner renamed into place; a regular file, a symlink (dangling or
    not) or anything else there was put by someone else, and is not ours to delete."""
    if not os.path.lexists(output):
        return
    if output.is_dir() and not output.is_symlink():
        if (output / FINGERPRINT_FILE).is_file() or not any(output.iterdir()):
            return  # this runner's earlier output (it always records its fingerprint), or empty
        raise HostFilesystemError(
            f"{output} holds files specdeploy did not write (it has no {FINGERPRINT_FILE}), where the stage's "
            "output folder goes; specdeploy deletes only what it wrote: move them away, or choose another "
            "--engines-dir/--triton-repo"
        )
    kind = f"a symlink to {os.readlink(output)}" if output.is_symlink() else "a regular file"
    if not output.is_symlink() and not output.is_file():
        kind = "not a folder"
    raise HostFilesystemError(
        f"{output} is {kind} where the stage's output folder goes; specdeploy deletes only what it wrote: "
        "move or remove it, or choose another --engines-dir/--triton-repo"
    )


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
    locked = False
    try:
        with output_lock(output, lock_timeout, on_wait):
            locked = True
            removed, freed = remove_dead_leftovers(output.parent, output.name)
            if removed:
                on_wait(f"{output}: {describe_freed(removed, freed)}")
            wanted = fingerprint(stage, hashes)
            recorded = recorded_fingerprint(output)
            if not force and recorded is not None and recorded.get("digest") == wanted["digest"]:
                return StageResult(stage.name, "skipped", output, time.monotonic() - start)
            refuse_foreign_output(output)
            tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
            tmp.mkdir()
            try:
                body(tmp)
                (tmp / FINGERPRINT_FILE).write_text(json.dumps(wanted, indent=2, sort_keys=True, default=str))
                replace_folder(tmp, output)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except OSError as exc:
        # The lock cannot even be created (a read-only mount, another user's folder): nobody writes here
        # through this mount, and an output that is already complete and up to date needs no lock.
        if not locked and not force and exc.errno in UNWRITABLE and _up_to_date(stage, hashes):
            on_wait(f"{output}: up to date; its folder is not writable here ({os.strerror(exc.errno)}), so not locked")
            return StageResult(stage.name, "skipped", output, time.monotonic() - start)
        raise host_error(exc, f"writing the {stage.name} stage's output {output}") from None
    return StageResult(stage.name, "ran", output, time.monotonic() - start)


def _up_to_date(stage: StagePlan, hashes: HashCache | None) -> bool:
    """Whether the output's recorded fingerprint is the one wanted now (read without the lock: the
    folder is only ever renamed into place complete, so what is read is one whole output)."""
    recorded = recorded_fingerprint(stage.output)
    return recorded is not None and recorded.get("digest") == fingerprint(stage, hashes)["digest"]
