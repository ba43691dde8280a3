"""The reference runtime's loop of each method, by method name: where a runtime class registers itself.

Each method's module here (``medusa.py``, ``eagle/decoding.py``, ``eagle3.py``, ``lookahead.py``,
``ngram.py``) registers the function that builds its :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`
from an engine and the ``tensorrt_llm`` model's parameters::

    @register("ngram")
    def _from_settings(engine, settings, warnings): ...

:func:`pipeline.runtime.spec_decode.factory.make_method` imports every module of this package and
looks the engine's method up in :data:`RUNTIMES`; a new method is its definition
(:mod:`pipeline.methods`) and one module here, and no other module names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import trees
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig

if TYPE_CHECKING:
    from pipeline.runtime.model.engine import Engine
    from pipeline.runtime.spec_decode.base import DecodingMethod


@dataclass(frozen=True)
class MethodSettings:
    """What selects and shapes the method: the tensorrt_llm model's parameters (parsed in triton/io.py).

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


# ``build(engine, settings, warnings)``: the method's loop for this engine and these parameters; it
# appends what to log to ``warnings`` and raises InputError for what would fail on a GPU.
Build = Callable[["Engine", MethodSettings, list[str]], "DecodingMethod"]
# ``claims(settings)``: these parameters select the method whatever the engine's build mode (EAGLE-3:
# the PyTorch backend builds its engine without one).
Claims = Callable[[MethodSettings], bool]


@dataclass(frozen=True)
class Runtime:
    """One method's loop in the reference runtime."""

    method: str  # the method's name (pipeline.methods)
    build: Build
    claims: Claims | None = None


RUNTIMES: dict[str, Runtime] = {}  # by method name, in registration order


def register(method: str, claims: Claims | None = None) -> Callable[[Build], Build]:
    """Register ``build`` as method ``method``'s loop (a decorator)."""

    def decorate(build: Build) -> Build:
        RUNTIMES[method] = Runtime(method, build, claims)
        return build

    return decorate
