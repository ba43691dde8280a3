"""Safe writes of shared output folders: an exclusive lock and an all-or-nothing folder swap.

Stage outputs and the embedded-model cache are shared by concurrent runs (two CI jobs, a
user and a test). fcntl locks vanish with the process that held them, so a killed run never
leaves a stale lock behind; a folder is written beside its target and swapped in complete.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import StageError


@contextmanager
def exclusive_lock(lock_path: Path, *, timeout: float, what: str, on_wait: Callable[[str], None]) -> Iterator[None]:
    """Hold ``lock_path``; ``what`` names the guarded thing in the waiting and timeout messages."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    on_wait(f"waiting for another specdeploy run on {what} ({holder})")
                    told = True
                if time.monotonic() > deadline:
                    raise StageError(f"{what}: still locked by another run after {timeout:.0f} s; wait for it, "
                                     f"or remove {lock_path} if no run is alive") from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def replace_folder(tmp: Path, target: Path) -> None:
    """Move the complete ``tmp`` folder to ``target``; an existing target is moved aside first
    (a directory cannot be renamed over a non-empty one) and deleted after the swap."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
