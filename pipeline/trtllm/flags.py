"""The trtllm-build 1.2 flag table (``build_flags.json``) and checks against it.

The table is data so that the argv builder, the engine-config prediction and the contract
tests all read one source; a flag missing here cannot reach trtllm-build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE_FILE = Path(__file__).with_name("build_flags.json")
TYPES = ("int", "str", "choice", "store_true")


@dataclass(frozen=True)
class Flag:
    name: str  # with the leading "--"
    type: str
    default: Any
    choices: tuple[str, ...] | None
    notes: str = ""
    config: tuple[str, ...] = ()  # dotted paths in the engine config.json
    aliases: tuple[str, ...] = ()
    nargs: str | None = None
    owner: str | None = None  # "plan": only the plan sets it
    forbid: str | None = None  # why extra_flags may not pass it
    reject_values: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The name without dashes, as written under build.extra_flags."""
        return self.name.lstrip("-")

    def value_problem(self, value: Any) -> str | None:
        """None if ``value`` is legal for this flag in trtllm-build 1.2, else what is allowed."""
        if self.type == "store_true":
            return None if isinstance(value, bool) else "true or false (a switch)"
        if self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            return None if ok else "a non-negative integer"
        if self.type == "choice":
            assert self.choices is not None
            return None if isinstance(value, str) and value in self.choices else f"one of {', '.join(self.choices)}"
        return None if isinstance(value, str) and value and not value.startswith("-") else "a non-empty string"


@lru_cache(maxsize=1)
def load_flags() -> dict[str, Flag]:
    """Flags by name (``--max_seq_len``) and by alias (``--max_decoder_seq_len``)."""
    data = json.loads(TABLE_FILE.read_text())
    flags: dict[str, Flag] = {}
    for entry in data["flags"]:
        if entry["type"] not in TYPES:
            raise ValueError(f"{TABLE_FILE}: {entry['name']} has unknown type {entry['type']!r}")
        flag = Flag(
            name=entry["name"],
            type=entry["type"],
            default=entry["default"],
            choices=tuple(entry["choices"]) if entry.get("choices") else None,
            notes=entry.get("notes", ""),
            config=tuple(entry.get("config", ())),
            aliases=tuple(entry.get("aliases", ())),
            nargs=entry.get("nargs"),
            owner=entry.get("owner"),
            forbid=entry.get("forbid"),
            reject_values=dict(entry.get("reject_values") or {}),
        )
        for name in (flag.name, *flag.aliases):
            flags[name] = flag
    return flags


def table_version() -> str:
    return str(json.loads(TABLE_FILE.read_text())["version"])


def flag(name: str) -> Flag:
    """A flag by name with or without the leading dashes; KeyError if trtllm-build has none."""
    return load_flags()["--" + name.lstrip("-")]


def plan_owned() -> tuple[str, ...]:
    return tuple(sorted({f.name for f in load_flags().values() if f.owner == "plan"}))


def argv_problems(argv: list[str]) -> list[str]:
    """Every flag/value in a trtllm-build argv that the 1.2 table does not allow.

    ``argv[0]`` is the program. Used by the contract tests and, as a last guard, by the
    build stage before it spends GPU time.
    """
    problems: list[str] = []
    flags = load_flags()
    seen: set[str] = set()
    index = 1
    while index < len(argv):
        token = argv[index]
        entry = flags.get(token)
        if entry is None:
            problems.append(f"{token}: not a trtllm-build 1.2 flag")
            index += 1
            continue
        if entry.name in seen:
            problems.append(f"{token}: given twice")
        seen.add(entry.name)
        if entry.type == "store_true":
            index += 1
            continue
        if index + 1 >= len(argv):
            problems.append(f"{token}: missing its value")
            break
        end = index + 2
        if entry.nargs == "+":  # one or more values, up to the next flag
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
        for raw in argv[index + 1 : end]:
            value: Any = raw
            if entry.type == "int":
                value = int(raw) if raw.isdigit() else raw
            problem = entry.value_problem(value)
            if problem:
                problems.append(f"{token} {raw}: must be {problem}")
        index = end
    return problems
