"""The decoding method an engine serves, chosen as TensorRT-LLM's executor chooses it.

The engine's build mode decides; the ``tensorrt_llm`` model's parameters (``decoding_mode``, the
trees, Lookahead's (W, N, G)) shape it. :func:`make_method` is the one place that maps an engine
and its parameters to a :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline import methods, trees
from pipeline.errors import InputError
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.plan.speculative import TRITON_PLAIN_DECODING_MODES, TRITON_SPECULATIVE_DECODING_MODES, engine_mode_method
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding
from pipeline.runtime.spec_decode.eagle.decoding import EagleDecoding
from pipeline.runtime.spec_decode.eagle3 import Eagle3Decoding
from pipeline.runtime.spec_decode.lookahead import LookaheadDecoding
from pipeline.runtime.spec_decode.medusa import MedusaDecoding
from pipeline.runtime.spec_decode.ngram import NGramDecoding

DEFAULT_DYNAMIC_TREE_TOP_K = 10  # the spec's default for speculative.eagle.dynamic_tree_max_top_k


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


def make_method(engine: Engine, settings: MethodSettings = MethodSettings()) -> tuple[DecodingMethod, list[str]]:
    """The method for this engine and these parameters, and warnings to log.

    As TensorRT-LLM's executor: the engine's build mode decides (a different ``decoding_mode`` is
    overridden with a warning); an unknown or unsupported plain mode falls back to the default with
    a warning. What would fail on a GPU (a speculative mode on a plain engine, Lookahead without
    (W, N, G), a tree larger than the engine's max_draft_len) raises InputError at load.
    """
    mode = (settings.decoding_mode or "").strip().lower()
    built = engine_mode_method(engine.config.limits.speculative_decoding_mode)
    where = engine.config.folder / "config.json"
    if settings.eagle3 is not None or settings.eagle3_drafter is not None:
        if settings.eagle3 is None or settings.eagle3_drafter is None:
            raise InputError("EAGLE-3 needs both its settings (max_draft_len, capture layers) and the drafter folder")
        if built != "none":
            raise InputError(
                f"{where} is built for {built}; EAGLE-3 runs on an engine built without a speculative mode "
                "(the PyTorch backend builds none)"
            )
        return Eagle3Decoding(engine, settings.eagle3, settings.eagle3_drafter), []
    if built == "none":
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
    warnings = []
    # A method without a decoding_mode of its own (NGram: external draft tokens) is configured with the
    # plain one; only another mode is overwritten with a warning.
    own = next((d.triton_decoding_mode for d in methods.definitions() if d.name == built), built)
    if mode not in ("", "auto", built, own):
        warnings.append(
            f"the engine is built for {built} but decoding_mode is {mode!r}; "
            f"overwriting decoding_mode to {built} (as TensorRT-LLM does)"
        )
    if built == "medusa":
        choices = settings.medusa_choices
        if choices is None:
            warnings.append(
                "medusa_choices parameter is not specified; using the default mc_sim_7b_63 (as TensorRT-LLM does)"
            )
        return MedusaDecoding(engine, choices or trees.MC_SIM_7B_63), warnings
    if built == "eagle":
        if settings.eagle_dynamic_tree and settings.eagle_choices is not None:
            raise InputError(
                "eagle_choices and reference_eagle_use_dynamic_tree are mutually exclusive "
                "(EAGLE-2 builds its own tree); drop one of them"
            )
        if settings.eagle_dynamic_tree:
            top_k = settings.eagle_dynamic_tree_max_top_k or DEFAULT_DYNAMIC_TREE_TOP_K
            return EagleDecoding(engine, dynamic_top_k=top_k), warnings
        if settings.eagle_choices is None:
            warnings.append(
                "eagle_choices parameter is not specified; using the default mc_sim_7b_63 (as TensorRT-LLM does)"
            )
        return EagleDecoding(engine, tree=settings.eagle_choices or trees.MC_SIM_7B_63), warnings
    if built == "ngram":  # K is the engine's; the pool's settings the server's, else TensorRT-LLM's defaults
        pool = settings.ngram or NGramConfig(0)
        k = pool.max_draft_len or engine.config.limits.max_draft_len
        return NGramDecoding(engine, dataclasses.replace(pool, max_draft_len=k)), warnings
    if built == "lookahead":
        if settings.lookahead is None:
            raise InputError(
                f"{where} is a Lookahead engine but lookahead_window_size, lookahead_ngram_size and "
                "lookahead_verification_set_size are not set (decoding_mode lookahead needs all three)"
            )
        return LookaheadDecoding(engine, settings.lookahead), warnings
    raise InputError(
        f"{where}: speculative_decoding_mode {built} is not supported by the reference backend "
        "(medusa, eagle, lookahead)"
    )
