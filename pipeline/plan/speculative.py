"""Resolved speculative-decoding settings and the numbers TensorRT-LLM 1.2 derives from them.

These dataclasses are what the plan carries to every later stage: the converter, the
trtllm-build argv, the engine config and the Triton parameters all read ``max_draft_len``
and friends from here, so build-time and serve-time values cannot drift apart.

Each method's config and its ``check()`` (the TensorRT-LLM 1.2 rules it must meet, reported at
spec key paths, as vLLM's ``SpeculativeConfig`` validates itself) live with its definition in
:mod:`pipeline.methods`; the planner only orchestrates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline import methods
from pipeline.methods.base import SPECULATIVE_DECODING_MODES
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle import EagleConfig
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.medusa import MedusaConfig
from pipeline.methods.ngram import NGramConfig

Method = str  # a method's name: one of pipeline.methods.names() (a method is its definition, not a name listed here)

# The Triton tensorrt_llm model's decoding_mode values (TensorRT-LLM executor's DecodingMode names):
# those plain decoding serves, and the speculative ones.
TRITON_PLAIN_DECODING_MODES = ("", "top_k", "top_p", "top_k_top_p", "auto")
TRITON_SPECULATIVE_DECODING_MODES = ("medusa", "eagle", "lookahead", "redrafter", "explicit_draft_tokens")


def engine_mode_method(mode: int | str | None) -> str:
    """The method an engine was built for, from its build_config.speculative_decoding_mode (the
    IntFlag's int, or a build-mode name): the one method of that mode not ``selected_by_settings``; a mode
    no method has comes back as its name."""
    if mode is None or isinstance(mode, str) and mode.strip().lower() in ("", "none"):
        return "none"
    if isinstance(mode, str):
        build_mode: str | None = mode.strip().lower()
    else:
        names = [name for name, value in SPECULATIVE_DECODING_MODES.items() if value == mode]
        if not names:
            return str(mode)
        build_mode = names[0]
    if build_mode is None:  # NONE: plain decoding (a method built by no engine flow has no mode either)
        return "none"
    named = (d.name for d in methods.definitions() if d.build_mode == build_mode and not d.selected_by_settings)
    return next(named, str(build_mode))


@dataclass(frozen=True)
class SpeculativeConfig:
    method: Method
    reason: str
    medusa: MedusaConfig | None = None
    eagle: EagleConfig | None = None
    lookahead: LookaheadConfig | None = None
    ngram: NGramConfig | None = None
    eagle3: Eagle3Config | None = None
    # The resolved config of a method that has no field above (a method added beside these: its
    # definition's ``resolve`` made it); the plan's JSON shows it under the method's name (:meth:`to_dict`).
    added: Any = None

    @classmethod
    def of(cls, method: str, reason: str, config: Any = None) -> SpeculativeConfig:
        """``method``'s config (None: it has none), in its field, or in ``added`` when it has no field."""
        if config is None:
            return cls(method, reason)
        if method in _METHOD_FIELDS:
            return cls(method, reason, **{method: config})
        return cls(method, reason, added=config)

    @property
    def config(self) -> Any:
        """The method's own resolved config (None for plain decoding): its ``describe()``, ``drafting()``,
        ``max_draft_len`` and whatever hooks the generic modules ask of it."""
        if self.method in _METHOD_FIELDS:
            return getattr(self, self.method)
        return self.added

    def to_dict(self) -> dict[str, Any]:
        """As the plan's JSON shows it: every method's field (null but the method's own), an added
        method's config under its name."""
        data = dataclasses.asdict(self)
        data.pop("added")
        if self.added is not None:
            added = self.added
            data[self.method] = (
                dataclasses.asdict(added) if dataclasses.is_dataclass(added) and not isinstance(added, type) else added
            )
        return data

    def configs(self) -> dict[str, Any]:
        """The plan's resolved configs by method name, in the fields' order: its method's own (none for plain
        decoding), for the generic modules that ask each method for its config."""
        names = [f.name for f in dataclasses.fields(self) if f.name in _METHOD_FIELDS]
        held = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.added is not None:
            held[self.method] = self.added
        return held

    @property
    def max_draft_len(self) -> int:
        return 0 if self.config is None else self.config.max_draft_len

    def drafting(self) -> Drafting:
        """What a step of this method costs beyond the verification pass (the cost model's input)."""
        return Drafting.plain() if self.config is None else self.config.drafting()

    @property
    def build_mode(self) -> str | None:
        return methods.definition(self.method).build_mode


# The methods with a field of their own in SpeculativeConfig.
_METHOD_FIELDS = frozenset(f.name for f in dataclasses.fields(SpeculativeConfig)) - {"method", "reason", "added"}
