"""YAML loading that remembers where every value came from.

Spec errors must name ``file:line:col`` and the key path, so the loader keeps a map
from key path (a tuple such as ``("variants", 2, "parallel", "tp")``) to the source
position of the value at that path. Duplicate keys are an error: PyYAML silently keeps
the last one, which hides typos in a release pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    file: str
    line: int  # 1-based
    column: int  # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def format_key_path(path: KeyPath) -> str:
    """``("variants", 2, "parallel", "tp")`` -> ``variants[2].parallel.tp``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "<root>"


@dataclass
class YamlDocument:
    """Plain data (dicts, lists, scalars) plus the position of every key path."""

    file: str
    data: Any
    positions: dict[KeyPath, Position]

    def position(self, path: KeyPath) -> Position:
        """Position of ``path``, or of its nearest ancestor that exists in the file."""
        for end in range(len(path), -1, -1):
            found = self.positions.get(tuple(path[:end]))
            if found is not None:
                return found
        return Position(self.file, 1, 1)


_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that never constructs Python objects and keeps node marks."""


def load_yaml(path: Path, display_name: str | None = None) -> YamlDocument:
    name = display_name or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: spec file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: cannot read spec file ({exc})") from None
    try:
        root = yaml.compose(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        raise InputError(f"{where} invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: invalid YAML: {exc}") from None
    positions: dict[KeyPath, Position] = {}
    data = _to_data(root, (), name, positions) if root is not None else None
    return YamlDocument(name, data, positions)


def _to_data(node: yaml.Node, path: KeyPath, name: str, positions: dict[KeyPath, Position]) -> Any:
    positions[path] = Position(name, node.start_mark.line + 1, node.start_mark.column + 1)
    if not isinstance(node, yaml.ScalarNode) and node.tag not in (_MAP_TAG, _SEQ_TAG):
        raise InputError(f"{positions[path]} {format_key_path(path)}: YAML tag '{node.tag}' is not allowed in specs")
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            where = f"{name}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}"
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError(f"{where} YAML merge keys (<<) are not supported in specs; use variants")
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(f"{where} {format_key_path(path)}: keys must be plain strings")
            key = key_node.value
            if key in result:
                raise InputError(f"{where} {format_key_path(path + (key,))}: duplicate key '{key}'")
            result[key] = _to_data(value_node, path + (key,), name, positions)
            # Point errors at the key, where a reader's eye goes, rather than at the value.
            positions[path + (key,)] = Position(name, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_to_data(item, path + (i,), name, positions) for i, item in enumerate(node.value)]
    try:
        return _StrictLoader(" ").construct_object(node)
    except yaml.YAMLError as exc:
        raise InputError(f"{positions[path]} {format_key_path(path)}: {exc}") from None
