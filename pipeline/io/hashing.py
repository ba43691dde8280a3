"""Content hashes of files and folders: sha256, streamed, cached by file identity.

A 140 GB checkpoint is read once: the cache (an SQLite file in the cache folder) maps a file's
identity (device, inode, size, mtime and ctime in ns) to its sha256, so the next run, the manifest
and ``--hash-inputs`` fingerprints reuse it until the file changes. Any write changes the ctime
(the kernel sets it, also when a restore sets the mtime back), so a same-size edit is re-hashed;
a file restored with a new mtime is re-hashed once and, its content being the same, changes no
fingerprint. Hard links share an inode and are hashed once.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

CHUNK_BYTES = 8 * 1024 * 1024
CACHE_FILE = "sha256-cache-v2.sqlite"  # v2: the key has the ctime; a new name, not a migration


def sha256_file(path: Path) -> str:
    """The sha256 of ``path``, read in chunks (never whole in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def content_files(folder: Path) -> Iterator[Path]:
    """Files under ``folder`` in a stable order, without dot files (locks, temp markers,
    fingerprints: bookkeeping that changes without the content changing) and Python's bytecode
    caches (written whenever a source is imported)."""
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in parts):
            yield path


class HashCache:
    """sha256 by file identity, kept in ``folder/CACHE_FILE`` (None: no cache)."""

    def __init__(self, folder: Path | None) -> None:
        self.path = Path(folder) / CACHE_FILE if folder is not None else None

    def sha256(self, path: Path) -> str:
        stat = os.stat(path)
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if self.path is None:
            return sha256_file(path)
        try:
            with closing(self._connect()) as db:
                row = db.execute(
                    "SELECT sha256 FROM files WHERE dev=? AND ino=? AND size=? AND mtime_ns=? AND ctime_ns=?", key
                ).fetchone()
        except (OSError, sqlite3.Error):  # a cache that cannot be opened (read-only): hash without it
            row = None
        if row is not None:
            return row[0]
        digest = sha256_file(path)
        try:
            with closing(self._connect()) as db, db:
                db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)", (*key, digest))
        except (OSError, sqlite3.Error):  # a read-only cache keeps what it has; the digest is still right
            pass
        return digest

    def tree(self, path: Path) -> dict[str, str] | str | None:
        """A file's sha256, a folder's {relative path: sha256}, None when absent."""
        path = Path(path)
        if path.is_file():
            return self.sha256(path)
        if path.is_dir():
            return {str(file.relative_to(path)): self.sha256(file) for file in content_files(path)}
        return None

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=60)
        db.execute(
            "CREATE TABLE IF NOT EXISTS files (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
            "ctime_ns INTEGER, sha256 TEXT, PRIMARY KEY (dev, ino, size, mtime_ns, ctime_ns))"
        )
        return db


def content_identity(path: Path, cache: HashCache | None = None) -> object:
    """What ``--hash-inputs`` fingerprints instead of sizes and mtimes: the content hashes."""
    return (cache or HashCache(None)).tree(path)
