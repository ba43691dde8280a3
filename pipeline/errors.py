"""Errors that reach the user as one line, never as a traceback.

Every module raises one of these for bad input or an environment problem; the CLI
prints ``error: <message>`` and exits with ``exit_code``:

0 done, 1 a stage failed (StageError), 2 bad input (InputError), 3 a stage cannot run on this
host (StageUnavailable), 4 the filesystem refused (HostFilesystemError), 5 the disk is full
(DiskFullError).
"""

import errno
import os


class SpecdeployError(Exception):
    """A problem the user can fix; the message names the file/tensor/field and what to do."""

    exit_code = 2


class InputError(SpecdeployError):
    """Bad input: a spec, a checkpoint, a head file, a request. Exit code 2."""

    exit_code = 2


class StageError(SpecdeployError):
    """A stage failed while running (tool failure, missing dependency on this host). Exit code 1."""

    exit_code = 1


class StageUnavailable(StageError):
    """The stage cannot run on this host (e.g. trtllm-build without TensorRT-LLM).

    ``exit_code`` 3 says "not done here"; 0 marks a stage this version does not have yet.
    """

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class HostFilesystemError(SpecdeployError):
    """The host's filesystem refused an operation: read-only, no permission, a path of the wrong kind
    (a regular file where a folder must be, a dangling symlink). Exit code 4."""

    exit_code = 4


class DiskFullError(HostFilesystemError):
    """No space (or quota) left on the device being written. Exit code 5: free space and re-run."""

    exit_code = 5


_ADVICE = {
    errno.EROFS: (
        "is on a read-only filesystem",
        "choose a writable location (--engines-dir, --triton-repo, --cache-dir) or remount it read-write",
    ),
    errno.EACCES: (
        "is not writable by this user (permission denied)",
        "fix its permissions or choose another location",
    ),
    errno.EPERM: ("cannot be changed (operation not permitted)", "fix its permissions or choose another location"),
    errno.ENOTDIR: (
        "has a regular file where a folder must be",
        "remove or rename that file, or choose another location",
    ),
    errno.EEXIST: ("already exists as a file, not a folder", "remove or rename it, or choose another location"),
    errno.ELOOP: ("is a symlink loop", "fix the symlink"),
    errno.ENOSPC: ("is on a full disk (no space left on device)", "free space and re-run; completed stages are kept"),
    errno.EDQUOT: ("is over its disk quota", "free space and re-run; completed stages are kept"),
}


# The filesystem will not let this process write there (a read-only mount, another user's folder).
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)

# Errors of the side that writes: for a two-path call (a copy, a link, a rename) the path they concern
# is the destination, ``filename2``; a copy onto a full disk names its source as ``filename``.
_WRITE_SIDE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EEXIST, errno.EXDEV)


def _written_path(exc: OSError) -> str:
    if exc.filename2 is not None and exc.errno in _WRITE_SIDE:
        return str(exc.filename2)
    return str(exc.filename) if exc.filename is not None else "a path"


def host_error(exc: OSError, doing: str) -> HostFilesystemError:
    """One-line error for an OSError of the host, naming the path, what was being done and what to do.

    ``doing`` completes "while ..." (e.g. ``"writing the convert stage's output"``).
    """
    path = _written_path(exc)
    what, fix = _ADVICE.get(exc.errno or 0, (f"failed: {exc.strerror or exc}", "check the path and re-run"))
    if exc.errno == errno.ENOENT and exc.filename is not None and os.path.islink(exc.filename):
        what, fix = f"is a dangling symlink (to {os.readlink(exc.filename)})", "fix or remove the link"
    kind = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else HostFilesystemError
    return kind(f"{path} {what} while {doing}; {fix}")
