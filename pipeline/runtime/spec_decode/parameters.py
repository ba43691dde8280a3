"""The ``tensorrt_llm`` model's parameters as the reference backend reads them.

A parameter whose value is empty or a leftover ``${...}`` template is unset (as the C++ backend treats
them); a value that does not parse falls back to the default with a warning. Each method's runtime
module reads its own keys through this (``@register(name, parameters=...)``,
:mod:`pipeline.runtime.spec_decode.registry`); ``pipeline/runtime/triton/io.py`` reads the rest.

>>> read = TritonParameters({"decoding_mode": "medusa", "max_beam_width": "two"})
>>> read.integer("max_beam_width", 1), read.warnings
(1, ["parameter max_beam_width='two' is not an integer; using 1"])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline import trees
from pipeline.errors import InputError

_TRUE, _FALSE = ("true", "True", "TRUE", "1"), ("false", "False", "FALSE", "0")


@dataclass
class TritonParameters:
    """The set values (stripped) by key, and what reading them warned about."""

    values: Mapping[str, str]
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, model_config: Mapping[str, object]) -> TritonParameters:
        """From a parsed config.pbtxt: ``parameters { key: ... value: { string_value: ... } }``."""
        raw = model_config.get("parameters") or {}
        assert isinstance(raw, Mapping)
        values = {k: ((v or {}).get("string_value") or "").strip() for k, v in raw.items()}
        return cls({k: v for k, v in values.items() if v and not v.startswith("${")})

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def has_any(self, keys: tuple[str, ...]) -> bool:
        return any(key in self.values for key in keys)

    def integer(self, key: str, default: int | None) -> int | None:
        if key not in self.values:
            return default
        try:
            return int(self.values[key])
        except ValueError:
            self.warnings.append(f"parameter {key}={self.values[key]!r} is not an integer; using {default}")
            return default

    def boolean(self, key: str, default: bool) -> bool:
        value = self.values.get(key)
        if value is None:
            return default
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        self.warnings.append(f"parameter {key}={value!r} is not a boolean; using {default}")
        return default

    def tree(self, key: str) -> trees.Tree | None:
        """A tree in Triton's compact form (``{0, 0}, {1}``); InputError when it does not parse."""
        if key not in self.values:
            return None
        try:
            return trees.parse_triton_choices(self.values[key])
        except ValueError as exc:
            raise InputError(f"parameter {key}: {exc}") from None
