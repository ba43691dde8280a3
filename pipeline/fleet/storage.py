"""Before a distributed run: can every node see the output folders and the inputs?

The driver writes a token file (a random name and content) into each output root; a probe task
pinned to each alive node reads it back. A node that misses a token, reads another content
(a folder of the same name that is not the same storage), or lacks an input file the driver
has, is named with what is wrong and what to do, before any stage starts.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from pipeline.errors import InputError

TOKEN_PREFIX = ".specdeploy-visible-"


def write_tokens(roots: Iterable[Path]) -> dict[str, str]:
    """One token per root: {token file path: content}."""
    tokens = {}
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
        content = uuid.uuid4().hex
        path = root / f"{TOKEN_PREFIX}{content[:12]}"
        path.write_text(content)
        tokens[str(path)] = content
    return tokens


def remove_tokens(tokens: dict[str, str]) -> None:
    for path in tokens:
        try:
            os.unlink(path)
        except OSError:
            pass


def probe(tokens: dict[str, str], inputs: list[str]) -> list[str]:
    """Runs on a node: what this node cannot see (empty when it sees everything)."""
    problems = []
    for path, content in tokens.items():
        try:
            seen = Path(path).read_text()
        except OSError:
            problems.append(f"cannot see {Path(path).parent} (the file the driver wrote there is missing)")
            continue
        if seen != content:
            problems.append(f"sees another {Path(path).parent} than the driver (different content)")
        elif not os.access(Path(path).parent, os.W_OK):
            problems.append(f"cannot write to {Path(path).parent}")
    problems += [f"has no {path} (an input the driver has)" for path in inputs if not os.path.exists(path)]
    return problems


def storage_error(problems_by_node: dict[str, list[str]]) -> InputError | None:
    """One error naming every node and what it cannot see (None when all is well)."""
    lines = [f"node {node} {problem}" for node, problems in sorted(problems_by_node.items()) for problem in problems]
    if not lines:
        return None
    lines.append(
        "every Ray node must see the engines, Triton repository and cache folders, and the models, at the "
        "same paths: put them on shared storage (NFS, a shared volume) mounted at one path on every node, "
        "and pass that path with --engines-dir, --triton-repo and --cache-dir"
    )
    return InputError("\n".join(lines))
