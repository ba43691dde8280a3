"""The decoding method an engine serves, chosen as TensorRT-LLM's executor chooses it.

The engine's build mode decides; the ``tensorrt_llm`` model's parameters (``decoding_mode``, the
trees, Lookahead's (W, N, G)) shape it. :func:`make_method` is the one place that maps an engine
and its parameters to a :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`: it asks the
method's definition (:mod:`pipeline.methods`) and the loop its module registered
(:mod:`pipeline.runtime.spec_decode.registry`), never a method's name.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

from pipeline import methods
from pipeline.errors import InputError
from pipeline.plan.speculative import TRITON_PLAIN_DECODING_MODES, TRITON_SPECULATIVE_DECODING_MODES, engine_mode_method
from pipeline.runtime import spec_decode
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode import registry
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding
from pipeline.runtime.spec_decode.registry import MethodSettings

__all__ = ["MethodSettings", "load_runtimes", "make_method", "served_method"]

NO_SETTINGS = MethodSettings()  # no tensorrt_llm parameters set


@functools.cache
def load_runtimes() -> None:
    """Import every module of pipeline/runtime/spec_decode/, so each method's loop is registered."""
    for module in pkgutil.walk_packages(spec_decode.__path__, f"{spec_decode.__name__}."):
        importlib.import_module(module.name)


def served_method(mode: int | str | None, settings: MethodSettings, where: Path) -> str:
    """The method an engine built with speculative_decoding_mode ``mode`` serves under these parameters.

    An engine records its build mode, not its method. A method whose engine is built with another's mode
    (``selected_by_settings``: EAGLE-3's none, plain decoding's) is served where the parameters select it:
    its runtime's ``claims`` hook, or its own settings present (MethodSettings.own); else the mode's own
    method. The definitions' order never decides. InputError, naming ``where`` (the file the parameters or
    the engine come from), when the parameters select two methods or one the engine was not built for."""
    load_runtimes()
    flagged = _selected_by_settings()
    selected = [
        r.method
        for r in registry.RUNTIMES.values()
        if (r.claims(settings) if r.claims is not None else r.method in flagged and settings.of(r.method) is not None)
    ]
    if len(selected) > 1:
        both = " and ".join(selected)
        raise InputError(f"{where}: the tensorrt_llm parameters select {both} at once; set one method's")
    if not selected:
        return engine_mode_method(mode)
    _check_built_for(selected[0], engine_mode_method(mode), where)
    return selected[0]


def make_method(
    engine: Engine, settings: MethodSettings = NO_SETTINGS, method: str | None = None
) -> tuple[DecodingMethod, list[str]]:
    """The method for this engine and these parameters, and warnings to log.

    As TensorRT-LLM's executor: the engine's build mode decides (a different ``decoding_mode`` is
    overridden with a warning); an unknown or unsupported plain mode falls back to the default with
    a warning. What would fail on a GPU (a speculative mode on a plain engine, Lookahead without
    (W, N, G), a tree larger than the engine's max_draft_len) raises InputError at load. ``method``:
    the method the caller knows the engine serves (a rehearsal candidate's, the stand-in's plan's); None:
    :func:`served_method` decides.
    """
    load_runtimes()
    mode = (settings.decoding_mode or "").strip().lower()
    built = engine_mode_method(engine.config.limits.speculative_decoding_mode)
    where = engine.config.folder / "config.json"
    chosen = method or served_method(engine.config.limits.speculative_decoding_mode, settings, where)
    if chosen != built:  # selected by its settings (or the caller), not named by the build mode
        if chosen not in registry.RUNTIMES:
            title = methods.definition(chosen).title
            raise InputError(f"{where}: {title} is not supported by the reference backend ({_served()})")
        _check_built_for(chosen, built, where)
        return registry.RUNTIMES[chosen].build(engine, settings, []), []
    if built == methods.PLAIN:
        if mode in {d.triton_decoding_mode for d in methods.definitions() if d.speculative} - set(
            TRITON_PLAIN_DECODING_MODES
        ):
            raise InputError(
                f"decoding_mode {mode}, but {where} has no speculative_decoding_mode: the engine was "
                f"built without {mode}; rebuild it from a {mode} plan or set decoding_mode top_k_top_p"
            )
        if mode in TRITON_PLAIN_DECODING_MODES:
            return PlainDecoding(), []
        if mode in TRITON_SPECULATIVE_DECODING_MODES:
            return PlainDecoding(), [
                f"decoding_mode {mode} is not served by the reference backend; serving plain "
                "decoding (same greedy output, no draft tokens)"
            ]
        if mode == "beam_search":  # beam_width > 1 requests get beam search (serving/beam_search.py)
            return PlainDecoding(), []
        return PlainDecoding(), [f"decoding_mode {settings.decoding_mode!r} is not valid; using top_k_top_p"]
    runtime = registry.RUNTIMES.get(built)
    if runtime is None:
        raise InputError(
            f"{where}: speculative_decoding_mode {built} is not supported by the reference backend ({_served()})"
        )
    warnings = []
    # A method without a decoding_mode of its own (NGram: external draft tokens) is configured with the
    # plain one; only another mode is overwritten with a warning.
    own = next((d.triton_decoding_mode for d in methods.definitions() if d.name == built), built)
    if mode not in ("", "auto", built, own):
        warnings.append(
            f"the engine is built for {built} but decoding_mode is {mode!r}; "
            f"overwriting decoding_mode to {built} (as TensorRT-LLM does)"
        )
    return runtime.build(engine, settings, warnings), warnings


def _check_built_for(method: str, built: str, where: Path) -> None:
    """InputError unless an engine built for ``built`` (the method its mode names) can serve ``method``."""
    definition = methods.definition(method)
    if engine_mode_method(definition.engine_mode) != built:
        needs = f"for {definition.build_mode}" if definition.build_mode else "without a speculative mode"
        raise InputError(
            f"{where}: the engine is built for {built}; {definition.title} runs on an engine built {needs}"
            + ("" if definition.build_mode else " (the PyTorch backend builds none)")
        )


def _served() -> str:
    """The methods the reference backend serves by an engine's build mode (not selected by settings), for errors."""
    flagged = _selected_by_settings()
    return ", ".join(r.method for r in registry.RUNTIMES.values() if r.claims is None and r.method not in flagged)


def _selected_by_settings() -> set[str]:
    """The methods an engine's mode never names: served only where their settings select them."""
    return {d.name for d in methods.definitions() if d.selected_by_settings}
