"""The reference runtime's loop of each method, by method name: where a runtime class registers itself.

Each method's module here (``medusa.py``, ``eagle/decoding.py``, ``eagle3.py``, ``lookahead.py``,
``ngram.py``) registers the function that builds its :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`
from an engine and the ``tensorrt_llm`` model's parameters, the settings rehearsal measures it at
(its :class:`Candidate` list; without one, the plan's config is the one candidate) and how it reads its
own parameters (the :class:`MethodSettings` fields they set, or its own settings under its name)::

    @register("ngram", candidates=_rehearsed, parameters=_parameters)
    def _from_settings(engine, settings, warnings): ...

:func:`pipeline.runtime.spec_decode.factory.make_method` imports every module of this package and
looks the engine's method up in :data:`RUNTIMES`; a new method is its definition
(:mod:`pipeline.methods`) and one module here, and no other module names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import trees
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.runtime.spec_decode.parameters import TritonParameters

if TYPE_CHECKING:
    from pipeline.runtime.model.engine import Engine
    from pipeline.runtime.spec_decode.base import DecodingMethod


@dataclass(frozen=True)
class MethodSettings:
    """What selects and shapes the method: the tensorrt_llm model's parameters (each method's runtime reads
    its own: ``@register(name, parameters=...)``; pipeline/runtime/triton/io.py makes the whole).

    ``eagle_dynamic_tree`` / ``eagle_dynamic_tree_max_top_k`` come from the reference-only
    parameters ``reference_eagle_use_dynamic_tree`` / ``reference_eagle_dynamic_tree_max_top_k``
    (the C++ backend exposes only eagle_choices and ignores keys it does not know).
    """

    decoding_mode: str | None = None
    medusa_choices: trees.Tree | None = None
    eagle_choices: trees.Tree | None = None
    lookahead: LookaheadConfig | None = None  # the server's (W, N, G)
    eagle_dynamic_tree: bool = False
    eagle_dynamic_tree_max_top_k: int | None = None
    ngram: NGramConfig | None = None  # the pool's settings (reference_ngram_* parameters)
    # EAGLE-3 (the PyTorch backend's; its engine is built without a speculative mode): K and the
    # capture layers, and the drafter folder (Hugging Face format, as ModelOpt exports it).
    eagle3: Eagle3Config | None = None
    eagle3_drafter: Path | None = None
    # By method name: the settings of a method without a field above (a new method's parameters hook
    # returns ``{its name: its settings}``); read with :meth:`of`.
    own: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def of(self, method: str) -> Any:
        """``method``'s own settings (``own``), None when its parameters set none."""
        return self.own.get(method)


@dataclass(frozen=True)
class Candidate:
    """One setting of a method that rehearsal measures on an engine's weights, as a server would run it."""

    name: str  # e.g. "plain", "lookahead(4,3,4)", "medusa[smollm2_medusa_10]", "eagle2(top_k 4)"
    method: str  # a method's name (pipeline.methods): what a build of it would be
    settings: MethodSettings  # the tensorrt_llm model's parameters that select and shape it
    drafting: Drafting  # what the cost model charges for it
    lookahead: LookaheadConfig | None = None  # per-request (w, n, g) on the server's (W, N, G)
    describe: str = ""
    max_draft_len: int = 0  # the build's max_draft_len for this candidate


@dataclass(frozen=True)
class Measuring:
    """What rehearsal lists an engine's candidates from, beside the engine itself."""

    configs: Mapping[str, Any]  # by method name: the resolved config to measure it at (absent: none)
    eagle_top_k: int  # EAGLE-2's expansion top_k (the spec's speculative.eagle.dynamic_tree_max_top_k)
    heads: Path | None = None  # the variant's heads folder, for a drafter loaded at run time (EAGLE-3)


# ``build(engine, settings, warnings)``: the method's loop for this engine and these parameters; it
# appends what to log to ``warnings`` and raises InputError for what would fail on a GPU.
Build = Callable[["Engine", MethodSettings, list[str]], "DecodingMethod"]
# ``claims(settings)``: these parameters select the method whatever the engine's build mode (EAGLE-3:
# the PyTorch backend builds its engine without one).
Claims = Callable[[MethodSettings], bool]
# ``candidates(engine, config, measuring)``: the settings rehearsal measures the method at on this engine's
# weights (``config``: its entry in ``measuring.configs``, None when absent); [] when it cannot run there.
ListCandidates = Callable[["Engine", Any, Measuring], list[Candidate]]
# ``parameters(read)``: the MethodSettings fields the method's own tensorrt_llm parameters set, or
# ``{its name: its settings}`` for a method without a field there (MethodSettings.own); InputError for what
# TensorRT-LLM refuses at load.
ReadParameters = Callable[[TritonParameters], dict[str, Any]]


@dataclass(frozen=True)
class Runtime:
    """One method's loop in the reference runtime."""

    method: str  # the method's name (pipeline.methods)
    build: Build
    claims: Claims | None = None
    candidates: ListCandidates | None = None  # None: the config given is the one candidate
    parameters: ReadParameters | None = None  # None: no tensorrt_llm parameters of its own


RUNTIMES: dict[str, Runtime] = {}  # by method name, in registration order


def register(
    method: str,
    claims: Claims | None = None,
    candidates: ListCandidates | None = None,
    parameters: ReadParameters | None = None,
) -> Callable[[Build], Build]:
    """Register ``build`` as method ``method``'s loop (a decorator), with what rehearsal measures of it and
    how its server's parameters are read."""

    def decorate(build: Build) -> Build:
        RUNTIMES[method] = Runtime(method, build, claims, candidates, parameters)
        return build

    return decorate
