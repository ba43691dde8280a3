"""YAML loading that remembers where every value came from.

Spec errors must name ``file:line:col`` and the key path, so the loader keeps a map
from key path (a tuple such as ``("variants", 2, "parallel", "tp")``) to the source
position of the value at that path. Duplicate keys are an error: PyYAML silently keeps
the last one, which hides typos in a release pipeline.

A spec is untrusted input, so the loader is bounded before PyYAML sees it: only regular
files up to ``MAX_SPEC_BYTES`` are read (a FIFO would hang), nesting is limited to
``MAX_DEPTH`` (PyYAML's composer recurses), and alias expansion to ``MAX_NODES`` values with
self-references refused (a "billion laughs" document is a few lines that expand to 10^9
values). Every refusal names ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError
from pipeline.io.files import read_regular_file

KeyPath = tuple[str | int, ...]

MAX_SPEC_BYTES = 256 * 1024  # shipped specs are ~1 KB; PyYAML parses ~200 KB/s
MAX_DEPTH = 64  # mappings and lists inside each other
MAX_NODES = 100_000  # values after alias expansion


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
    """SafeLoader that never constructs Python objects, keeps node marks and bounds nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(
                    problem=f"nested deeper than {MAX_DEPTH} levels; a spec needs a few",
                    problem_mark=self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start].decode("utf-8")
        line, column = _line_col(before, len(before))
        raise InputError(
            f"{name}:{line}:{column} not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            "is this a binary file? save the spec as UTF-8"
        ) from None


def load_yaml(path: Path, display_name: str | None = None) -> YamlDocument:
    name = display_name or str(path)
    raw = read_regular_file(path, "spec file", max_bytes=MAX_SPEC_BYTES, name=name)
    text = _decode(raw, name)
    try:
        root = yaml.compose(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        raise InputError(f"{where} invalid YAML: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:
        line, column = _line_col(text, exc.position)
        raise InputError(
            f"{name}:{line}:{column} invalid YAML: character U+{exc.character:04X} is not "
            "allowed (a binary file, or a control character?)"
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: invalid YAML: {exc}") from None
    positions: dict[KeyPath, Position] = {}
    data = _Converter(name, positions).value(root, ()) if root is not None else None
    return YamlDocument(name, data, positions)


class _Converter:
    """Nodes -> plain data, counting values as aliases expand and refusing cycles."""

    def __init__(self, name: str, positions: dict[KeyPath, Position]) -> None:
        self.name, self.positions = name, positions
        self.count = 0
        self.constructor = _StrictLoader(" ")
        self.active: set[int] = set()  # nodes on the path from the root: an alias back to one is a cycle

    def value(self, node: yaml.Node, path: KeyPath) -> Any:
        here = self.positions[path] = Position(self.name, node.start_mark.line + 1, node.start_mark.column + 1)
        self.count += 1
        if self.count > MAX_NODES:
            raise InputError(
                f"{here} {format_key_path(path)}: the spec expands to more than {MAX_NODES} values "
                "(YAML aliases repeated inside each other?); write the values out"
            )
        if id(node) in self.active:
            raise InputError(
                f"{here} {format_key_path(path)}: a YAML alias refers to the value that contains "
                "it; remove the self-reference"
            )
        if not isinstance(node, yaml.ScalarNode) and node.tag not in (_MAP_TAG, _SEQ_TAG):
            raise InputError(f"{here} {format_key_path(path)}: YAML tag '{node.tag}' is not allowed in specs")
        if isinstance(node, yaml.ScalarNode):
            try:
                return self.constructor.construct_object(node)
            except yaml.MarkedYAMLError as exc:
                raise InputError(f"{here} {format_key_path(path)}: {exc.problem or exc.context}") from None
            except ValueError:  # Python refuses to parse ints of more than 4300 digits
                raise InputError(
                    f"{here} {format_key_path(path)}: a number of {len(node.value)} characters; "
                    "no setting needs one that long"
                ) from None
            except yaml.YAMLError as exc:
                raise InputError(f"{here} {format_key_path(path)}: {' '.join(str(exc).split())[:200]}") from None
        self.active.add(id(node))
        try:
            return (
                self._mapping(node, path)
                if isinstance(node, yaml.MappingNode)
                else [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
            )
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            where = f"{self.name}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}"
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError(f"{where} YAML merge keys (<<) are not supported in specs; use variants")
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(f"{where} {format_key_path(path)}: keys must be plain strings")
            key = key_node.value
            if key in result:
                raise InputError(f"{where} {format_key_path(path + (key,))}: duplicate key '{key}'")
            result[key] = self.value(value_node, path + (key,))
            # Point errors at the key, where a reader's eye goes, rather than at the value.
            self.positions[path + (key,)] = Position(
                self.name, key_node.start_mark.line + 1, key_node.start_mark.column + 1
            )
        return result
