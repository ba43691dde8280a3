"""The methods a variant can serve, each as the reference runtime would serve it.

From one engine (the variant's checkpoint with its build config): plain decoding; Lookahead at the
spec's (W, N, G) plus a smaller (w, n, g) as a per-request setting on that server;
Medusa with the spec's tree plus the project's fitted trees of a similar size, when the checkpoint
has Medusa heads; EAGLE-1 with the spec's static tree and EAGLE-2 with a dynamic tree, when it has
a drafter. Each candidate gets its method from ``make_method`` on an engine *view*: the same loaded
weights with the build config a build of that method would have (speculative_decoding_mode,
max_draft_len), so nothing is loaded twice.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import methods, trees
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.lookahead import LookaheadConfig, lookahead_problem
from pipeline.methods.ngram import NGramConfig
from pipeline.plan.speculative import Method, engine_mode_method
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import DecodingMethod
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method

SIMILAR_SIZE = 0.5  # fitted trees within +-50% of the spec tree's node count


@dataclass(frozen=True)
class Candidate:
    name: str  # e.g. "plain", "lookahead(4,3,4)", "medusa[smollm2_medusa_10]", "eagle2(top_k 4)"
    method: Method  # a method's name (pipeline.methods): what a build of it would be
    settings: MethodSettings
    drafting: Drafting  # what the cost model charges for it
    lookahead: LookaheadConfig | None = None  # per-request (w, n, g) on the server's (W, N, G)
    describe: str = ""
    max_draft_len: int = 0  # the build's max_draft_len for this candidate


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


def tree_name(tree: trees.Tree) -> str:
    return next((name for name, preset in trees.TREE_PRESETS.items() if preset == tree), f"{len(tree)}-node tree")


def lookahead_sweep(spec: LookaheadConfig) -> list[LookaheadConfig]:
    """The spec's (W, N, G) and a smaller setting: half the window and verification set (legal ones only,
    at most the spec's: per-request limits). One smaller point, not more: on SmolLM2 the half-size
    setting and the one n-gram shorter (W, N - 1, G) measured the same acceptance (1.36 / 1.35) and step
    cost (2.47 / 2.45 plain steps) while each costs a sixth of the evaluation's time."""
    w, n, g = spec
    options = [spec, LookaheadConfig(max(1, w // 2), n, g // 2)]
    out: list[LookaheadConfig] = []
    for option in options:
        if option not in out and option.ngram >= 2 and lookahead_problem(*option) is None:
            out.append(option)
    return out


def similar_trees(tree: trees.Tree, max_depth: int, max_nodes: int) -> list[trees.Tree]:
    """The project's tree presets of a similar size to ``tree`` (it first) that fit the heads and the build."""
    low, high = len(tree) * (1 - SIMILAR_SIZE), len(tree) * (1 + SIMILAR_SIZE)
    others = [
        t
        for t in trees.TREE_PRESETS.values()
        if t != tree and low <= len(t) <= high and trees.tree_depth(t) <= max_depth and len(t) <= max_nodes
    ]
    return [tree, *sorted(others, key=len)]


def candidates(
    engine: Engine,
    lookahead: LookaheadConfig,
    medusa_tree: trees.Tree | None,
    eagle_tree: trees.Tree | None,
    eagle_top_k: int,
    ngram: NGramConfig | None = None,
    eagle3: tuple[Eagle3Config, Path] | None = None,
    added: tuple[str, Any] | None = None,
) -> list[Candidate]:
    """Every candidate this engine's weights can serve (see the module docstring); ``ngram``: the plan's
    NGram pool, a candidate when the plan decodes with it; ``eagle3``: an EAGLE-3 drafter (its config and
    folder), drafting its chain of max_draft_len, or its dynamic tree; ``added``: the plan's method and
    config when it is one added beside these (SpeculativeConfig.added), one candidate as its config says:
    its drafting and max_draft_len, its runtime class built from the engine (its registered loop)."""
    built = engine_mode_method(engine.config.limits.speculative_decoding_mode)
    out = [Candidate("plain", "none", MethodSettings(), Drafting.plain(), describe="plain decoding")]
    for config in lookahead_sweep(lookahead):
        w, n, g = config
        out.append(
            Candidate(
                f"lookahead({w},{n},{g})",
                "lookahead",
                MethodSettings("lookahead", lookahead=lookahead),
                Drafting.lookahead(config),
                config if config != lookahead else None,
                f"(w, n, g) = ({w}, {n}, {g}) on a ({lookahead.window}, {lookahead.ngram}, "
                f"{lookahead.verification_set}) server",
                lookahead.max_draft_len,
            )
        )
    if ngram is not None:
        out.append(
            Candidate(
                f"ngram(k {ngram.max_draft_len}, m {ngram.max_matching_ngram_size})",
                "ngram",
                MethodSettings(ngram=ngram),
                ngram.drafting(),
                describe=f"NGram, {ngram.max_draft_len} drafts from tails of up to {ngram.max_matching_ngram_size}",
                max_draft_len=ngram.max_draft_len,
            )
        )
    if eagle3 is not None:
        chain, folder = eagle3
        name, describe = f"eagle3(k {chain.max_draft_len})", f"EAGLE-3, a chain of {chain.max_draft_len} drafts"
        if chain.use_dynamic_tree:
            k, nodes = chain.dynamic_tree_max_top_k, chain.total_draft_tokens
            name = f"eagle3(k {chain.max_draft_len}, top {k}, {nodes} nodes)"
            describe = f"EAGLE-3, a dynamic tree {chain.max_draft_len} deep (top-{k}) of {nodes} nodes"
        out.append(
            Candidate(
                name,
                "eagle3",
                MethodSettings(eagle3=chain, eagle3_drafter=folder),
                chain.drafting(),
                describe=describe,
                max_draft_len=chain.max_draft_len,
            )
        )
    if added is not None:
        method, config = added
        describe = config.describe() if hasattr(config, "describe") else methods.definition(method).title
        out.append(
            Candidate(
                f"{method}(k {config.max_draft_len})",
                method,
                MethodSettings(),
                config.drafting(),
                describe=describe,
                max_draft_len=config.max_draft_len,
            )
        )
    stage = engine.stage(engine.pp - 1)[0]
    limit = engine.config.limits.max_draft_len
    if built == "medusa" and stage.medusa:
        heads = len(stage.medusa)
        for tree in similar_trees(medusa_tree or trees.MC_SIM_7B_63, heads, limit):
            out.append(
                Candidate(
                    f"medusa[{tree_name(tree)}]",
                    "medusa",
                    MethodSettings("medusa", medusa_choices=tree),
                    Drafting.medusa(tree, heads),
                    describe=f"medusa_choices {tree_name(tree)}, {len(tree)} nodes",
                    max_draft_len=limit,
                )
            )
    if built == "eagle":
        layers = int(engine.config.raw["pretrained_config"].get("num_eagle_layers") or 0)
        tree = eagle_tree or trees.MC_SIM_7B_63
        out.append(
            Candidate(
                f"eagle[{tree_name(tree)}]",
                "eagle",
                MethodSettings("eagle", eagle_choices=tree),
                Drafting.eagle(tree),
                describe=f"EAGLE-1, eagle_choices {tree_name(tree)}",
                max_draft_len=limit,
            )
        )
        out.append(
            Candidate(
                f"eagle2(top_k {eagle_top_k})",
                "eagle",
                MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=eagle_top_k),
                Drafting.eagle_dynamic(eagle_top_k, layers, limit),
                describe=f"EAGLE-2 dynamic tree, top_k {eagle_top_k}, at most {limit} nodes",
                max_draft_len=limit,
            )
        )
    return out


def load(engine: Engine, candidate: Candidate) -> Loaded:
    """The candidate's engine view and its method, from make_method (warnings are not expected here)."""
    view = engine_as(engine, candidate.method, candidate.max_draft_len)
    method, _ = make_method(view, candidate.settings)
    return Loaded(candidate, view, method)
