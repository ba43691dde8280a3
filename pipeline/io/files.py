"""Reading user-given files without hanging on the ones that are not files.

Opening a FIFO blocks until someone writes to it and a character device (``/dev/zero``)
never ends, so every input a user names (spec, config.json, safetensors, head files,
tokenizer) is checked with ``stat`` first: only regular files (symlinks to them included)
are read, and size-bounded reads stop at their limit instead of filling memory.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(path: Path) -> str:
    """What ``path`` is, in words: "a regular file", "a folder", "a FIFO (named pipe)", ..."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((label for test, label in _KINDS if test(mode)), "not a regular file")


def require_regular_file(path: Path, what: str, *, name: str | None = None) -> os.stat_result:
    """``stat`` of ``path`` if it is a regular file (following symlinks), else InputError naming it."""
    shown = name or str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(
                f"{shown}: {what} is a dangling symlink (to {os.readlink(path)}); fix the link or give the file itself"
            ) from None
        raise InputError(f"{shown}: {what} not found") from None
    except OSError as exc:
        raise InputError(f"{shown}: cannot read {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((label for test, label in _KINDS if test(info.st_mode)), "not a regular file")
        raise InputError(f"{shown}: {what} is {kind}, not a regular file; give the file itself")
    return info


def read_regular_file(path: Path, what: str, *, max_bytes: int, name: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, or InputError naming it."""
    shown = name or str(path)
    info = require_regular_file(path, what, name=name)
    if info.st_size > max_bytes:
        raise InputError(
            f"{shown}: {what} is {info.st_size} bytes, more than the {max_bytes} allowed; is this the right file?"
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{shown}: cannot read {what} ({exc.strerror or exc})") from None
    if len(data) > max_bytes:  # grew since stat
        raise InputError(f"{shown}: {what} is more than the {max_bytes} bytes allowed; is this the right file?")
    return data


MAX_JSON_BYTES = 64 * 1024 * 1024  # a model's config.json is ~1 KB, a tokenizer.json ~20 MB


def read_json(path: Path, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parsed JSON of a regular file, or a one-line InputError naming the file, line and column."""
    raw = read_regular_file(path, what, max_bytes=max_bytes)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {what} is not UTF-8 text (byte {exc.start}); re-download or re-export it") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno} {what} is not valid JSON ({exc.msg}); re-download or re-export it"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: {what} nests too deeply to be a real config; re-download it") from None
    except ValueError as exc:  # an integer longer than Python's int_max_str_digits (4300 digits)
        raise InputError(
            f"{path}: {what} holds a number too long to be real ({exc}); re-download or re-export it"
        ) from None


def hf_offline() -> None:
    """Never let transformers/huggingface_hub reach a model hub.

    Set before transformers is imported where possible; loads here always pass local paths and
    ``local_files_only=True`` too, so this is a second line of defence, not the only one.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
