"""Safe writes of shared output folders: an exclusive lock and an all-or-nothing folder swap.

Stage outputs and the embedded-model cache are shared by concurrent runs (two CI jobs, a
user and a test). fcntl locks vanish with the process that held them, so a killed run never
leaves a stale lock behind; a folder is written beside its target and swapped in complete.

A killed run does leave its work folders (``.<name>.tmp-<pid>``, ``.<name>.old-<pid>``) and
its pid in the lock file. Whoever holds the lock next removes the folders whose owner is gone
(:func:`remove_dead_leftovers`, reporting what it freed), and the waiting message says when the
recorded holder is no longer running.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.errors import HostFilesystemError, StageError, host_error

_OWNER = re.compile(r"\.(?:tmp|old)-(\d+)")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (in this PID namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(text: str) -> str:
    match = re.fullmatch(r"pid (\d+)", text.strip())
    if not match:
        return text.strip() or "unknown"
    pid = int(match.group(1))
    if pid_alive(pid):
        return f"pid {pid}"
    return (
        f"pid {pid} recorded, which is not running here: the lock is held from another host or container, "
        "or by a child process of that run"
    )


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
                    on_wait(f"waiting for another specdeploy run on {what} ({_holder(handle.read())})")
                    told = True
                if time.monotonic() > deadline:
                    raise StageError(
                        f"{what}: still locked by another run after {timeout:.0f} s; wait for it, "
                        f"or remove {lock_path} if no run is alive"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        previous = re.fullmatch(r"pid (\d+)", handle.read().strip())
        if previous and int(previous.group(1)) != os.getpid():
            on_wait(
                f"{what}: the previous run (pid {previous.group(1)}) was killed while holding the lock; "
                "taking over and removing its leftovers"
            )
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


def remove_path(path: Path) -> None:
    """Remove a folder tree, a file or a symlink (never what a symlink points to)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size if path.is_symlink() or path.exists() else 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                pass
    return total


def remove_dead_leftovers(parent: Path, name: str) -> tuple[list[Path], int]:
    """Remove ``.<name>.tmp-<pid>*`` / ``.<name>.old-<pid>*`` of owners that are gone (or are us);
    returns (removed paths, bytes freed). Call it while holding the lock of ``name``."""
    removed: list[Path] = []
    freed = 0
    if not parent.is_dir():
        return removed, freed
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for stale in sorted(parent.glob(pattern)):
            match = _OWNER.search(stale.name[len(name) + 1 :])
            pid = int(match.group(1)) if match else -1
            if pid != os.getpid() and pid_alive(pid):
                continue  # a live owner (another PID namespace sharing this folder): not ours to take
            size = _size(stale)
            try:
                remove_path(stale)
            except OSError:
                continue
            removed.append(stale)
            freed += size
    return removed, freed


def describe_freed(removed: list[Path], freed: int) -> str:
    return (
        f"removed {len(removed)} leftover(s) of killed runs, {freed / 2**20:.1f} MiB freed: "
        f"{', '.join(p.name for p in removed)}"
    )


def replace_folder(tmp: Path, target: Path) -> None:
    """Move the complete ``tmp`` folder to ``target``; an existing target (a folder, a file, a symlink,
    dangling or not) is moved aside first (a directory cannot be renamed over a non-empty one or over
    a file) and deleted after the swap."""
    if os.path.lexists(target):
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if os.path.lexists(old):
            remove_path(old)
        os.replace(target, old)
        os.replace(tmp, target)
        try:
            remove_path(old)
        except OSError:
            pass  # the next run holding the lock removes it (our pid is then gone)
    else:
        os.replace(tmp, target)


def check_replaceable(path: Path, option: str, ours: Callable[[Path], bool], *, folder: bool = True) -> None:
    """A user-named output (``option``: ``--out``, ``--junit-xml``, ...; ``folder``: a folder, else a
    file) may be replaced only when it is absent, an empty folder (for a folder), or what ``ours``
    recognizes as specdeploy's own earlier output; anything else is the user's: HostFilesystemError
    (exit 4) naming it, and it is left as it is."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    empty_folder = path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    if empty_folder and folder:
        return
    if path.is_dir() and not folder:
        raise HostFilesystemError(f"{option} {path}: a folder where the file to write goes; give a file's path")
    if not path.is_symlink() and ours(path):
        return
    kind = "a symlink" if path.is_symlink() else "a folder" if path.is_dir() else "a file"
    raise HostFilesystemError(
        f"{option} {path}: {kind} specdeploy did not write; it would be replaced whole: give a new or empty "
        "path (or move it away first)"
    )


def check_writable_beside(path: Path, doing: str) -> None:
    """``path``'s folder made if absent and shown to take a new entry, as the atomic write of ``path`` will
    need: found out before the work that produces it, not after; else host_error, "while ``doing``"."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(prefix=f".{path.name}.tmp-", dir=path.parent).cleanup()
    except OSError as exc:
        raise host_error(exc, doing) from None


def json_of(path: Path) -> Any:
    """The JSON in a regular file, or None (an ownership test that must not fail on foreign content)."""
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
