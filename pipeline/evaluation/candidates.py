"""The methods a variant can serve, each as the reference runtime would serve it.

From one engine (the variant's checkpoint with its build config): plain decoding, then every method
whose runtime (:mod:`pipeline.runtime.spec_decode.registry`) lists settings it can run at on these
weights: Lookahead at the spec's (W, N, G) plus a smaller (w, n, g) per request on that server; Medusa
with the spec's tree plus the project's presets of a similar size, when the checkpoint has Medusa
heads; EAGLE-1 with the spec's static tree and EAGLE-2 with a dynamic tree, when it has a drafter;
NGram at the plan's pool (the evaluate stage gives the ``pytorch`` target TensorRT-LLM's default one);
EAGLE-3 at the plan's chain or tree; a method without a list of its own at the plan's config.
Each candidate gets its method from ``make_method`` on an engine *view*: the same loaded weights with
the build config a build of that method would have (speculative_decoding_mode, max_draft_len), so
nothing is loaded twice.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline import methods
from pipeline.methods.drafting import Drafting
from pipeline.plan.speculative import Method
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode import registry
from pipeline.runtime.spec_decode.base import DecodingMethod
from pipeline.runtime.spec_decode.factory import MethodSettings, load_runtimes, make_method
from pipeline.runtime.spec_decode.registry import Candidate, Measuring

__all__ = ["Candidate", "Loaded", "Measuring", "candidates", "engine_as", "load"]

PLAIN = Candidate("plain", methods.PLAIN, MethodSettings(), Drafting.plain(), describe="plain decoding")


@dataclass
class Loaded:
    candidate: Candidate
    engine: Engine
    method: DecodingMethod


def engine_as(engine: Engine, method: Method, max_draft_len: int) -> Engine:
    """The same weights with the build config of a ``method`` engine (shallow: nothing is copied)."""
    limits = dataclasses.replace(
        engine.config.limits,
        speculative_decoding_mode=methods.definition(method).engine_mode,
        max_draft_len=max_draft_len,
    )
    view = copy.copy(engine)
    view.config = dataclasses.replace(engine.config, limits=limits)
    return view


def candidates(engine: Engine, measuring: Measuring) -> list[Candidate]:
    """Plain decoding, then every candidate each method's runtime lists for these weights (see the module
    docstring), the methods from the least to the most to maintain."""
    load_runtimes()
    listed = [PLAIN]
    for definition in sorted(methods.definitions(), key=lambda d: d.maintenance):
        runtime = registry.RUNTIMES.get(definition.name)
        config = measuring.configs.get(definition.name)
        if runtime is not None and runtime.candidates is not None:
            listed += runtime.candidates(engine, config, measuring)
        elif config is not None:  # without a runtime, loading it says the reference backend has none
            listed.append(_as_planned(definition.name, config))
    return listed


def _as_planned(method: str, config: Any) -> Candidate:
    """A method without a list of its own, at the plan's config: its drafting and max_draft_len."""
    describe = config.describe() if hasattr(config, "describe") else methods.definition(method).title
    return Candidate(
        f"{method}(k {config.max_draft_len})",
        method,
        MethodSettings(),
        config.drafting(),
        describe=describe,
        max_draft_len=config.max_draft_len,
    )


def load(engine: Engine, candidate: Candidate) -> Loaded:
    """The candidate's engine view and its method, from make_method (warnings are not expected here): the
    candidate's, also where another method shares its build mode."""
    view = engine_as(engine, candidate.method, candidate.max_draft_len)
    method, _ = make_method(view, candidate.settings, candidate.method)
    return Loaded(candidate, view, method)
