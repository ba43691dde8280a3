"""pipeline/runtime/spec_decode/eagle3.py: the reference EAGLE-3 drafter against ModelOpt's own EAGLE-3
module, and EAGLE-3 decoding (its chain and its dynamic tree) against plain greedy decoding on the
embedded SmolLM2.

The drafter is exported by ModelOpt (tests/runtime/eagle3_fixtures.py): random, so it rarely guesses
right; oracle variants whose chains (trees) are partly the true continuation exercise accepted drafts
(KV-cache keep, the drafter catching up on several committed tokens) through the same code. The tree's
growth is checked on small literal cases with a stand-in drafter.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.errors import InputError
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.request import GenerationRequest
from pipeline.runtime.serving.metrics import SpecDecodingStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding, Sequence
from pipeline.runtime.spec_decode.eagle.drafter import DraftInput
from pipeline.runtime.spec_decode.eagle.trees import DynamicTree
from pipeline.runtime.spec_decode.eagle3 import Eagle3Decoding, draft_to_target, draft_trees
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.runtime.spec_decode.tree_verify import DraftTree, Proposal
from tests.runtime.eagle3_fixtures import ModelOptDrafter, make_modelopt_drafter
from tests.runtime.fixtures import write_engine

K = 3
NEW_TOKENS = 20
# Token ids of short SmolLM2 texts (any ids do: the comparison is token for token).
PROMPTS = [
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 25, 2, 198, 1, 4093, 198, 10576, 314],
    [504, 3458, 282, 4649, 314, 216, 28, 30, 29, 216, 33, 30, 29],
    [3153, 1464, 28, 2049, 1326, 5541, 30, 378, 2512, 9434, 28, 37, 30],
]


@pytest.fixture(scope="module")
def drafter(smollm2_dir, module_tmp) -> ModelOptDrafter:
    return make_modelopt_drafter(smollm2_dir, module_tmp("eagle3") / "drafter")


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_dir, module_tmp) -> Engine:
    return Engine.load(write_engine(smollm2_dir, module_tmp("eagle3-engine") / "engine"))


@pytest.fixture(scope="module")
def plain(smollm2_engine) -> list[list[int]]:
    """Plain greedy decoding's tokens for PROMPTS."""
    torch.set_num_threads(1)
    return decode(smollm2_engine, PlainDecoding(), PROMPTS, batch=3)[0]


TREE_TOP_K, TREE_NODES = 3, 7  # a dynamic tree K = 3 deep: 3 + 9 + 9 nodes grown, the best 7 verified


def tree_config(drafter: ModelOptDrafter) -> Eagle3Config:
    return Eagle3Config(K, drafter.capture_layers, True, TREE_TOP_K, TREE_NODES)


def eagle3(engine: Engine, drafter: ModelOptDrafter, k: int = K, config: Eagle3Config | None = None) -> Eagle3Decoding:
    config = config or Eagle3Config(k, drafter.capture_layers)
    settings = MethodSettings(eagle3=config, eagle3_drafter=drafter.folder)
    method, warnings = make_method(engine, settings)
    assert isinstance(method, Eagle3Decoding) and warnings == []
    return method


def decode(engine: Engine, method: DecodingMethod, prompts: list[list[int]], batch: int):
    limits = dataclasses.replace(engine.config.limits, max_batch_size=batch)
    sched, outputs = Scheduler(engine, method, limits=limits), {}
    for i, prompt in enumerate(prompts):
        sched.submit(
            GenerationRequest(str(i), tuple(prompt), NEW_TOKENS, end_id=-1, exclude_input_in_output=True),
            lambda o: outputs.__setitem__(o.request_id, o) if o.finished else None,
        )
    sched.run_until_idle()
    stats = SpecDecodingStats()
    for out in outputs.values():
        stats.merge(out.metrics.spec)
    return [outputs[str(i)].tokens for i in range(len(prompts))], stats


class Oracle(Eagle3Decoding):
    """The real drafter runs; then :meth:`rewrite` puts part of the true continuation into each draft
    tree, so drafts are accepted and rejected through the same accept path."""

    def __init__(self, *args, truth: dict[tuple[int, ...], list[int]]):
        super().__init__(*args)
        self.truth, self.turn = truth, 0

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        super().propose(todo)
        for seq in todo:
            state = self._state(seq)
            assert state.proposal is not None
            future = self.truth[seq.request.input_ids][len(seq.generated) :]
            self.turn += 1
            tree = self.rewrite(state.proposal.tree, future)
            state.proposal = Proposal.of_tree(seq.cache, seq.generated[-1], tree)
            state.proposal.input.capture_layers = self.capture_layers

    def rewrite(self, tree: DraftTree, future: list[int]) -> DraftTree:
        raise NotImplementedError


class OracleChains(Oracle):
    """Each chain becomes the true continuation's first j tokens (j cycling 0..K) and a wrong token."""

    def rewrite(self, tree: DraftTree, future: list[int]) -> DraftTree:
        length = len(tree)
        j = min(self.turn % (K + 1), length, len(future))
        return DraftTree.chain(future[:j] + [0] * (length - j))


class OracleTrees(Oracle):
    """One node's path (the node cycling through the grown dynamic tree) becomes the true continuation,
    so drafts deep in the tree, off its first branch, are accepted."""

    def rewrite(self, tree: DraftTree, future: list[int]) -> DraftTree:
        tokens = list(tree.tokens)
        if tokens:
            node, path = self.turn % len(tokens), []
            while node >= 0:
                path.insert(0, node)
                node = tree.parents[node]
            for depth, node in enumerate(path[: len(future)]):
                tokens[node] = future[depth]
        return DraftTree(tuple(tokens), tree.parents)


# --- served by Eagle3Decoding: plain greedy decoding's tokens ------------------------------------


@pytest.mark.slow
@pytest.mark.smollm2
def test_eagle3_is_lossless(smollm2_engine, drafter, plain):
    torch.set_num_threads(1)
    alone, stats = decode(smollm2_engine, eagle3(smollm2_engine, drafter), PROMPTS[:1], batch=1)
    assert alone == plain[:1]
    assert stats.draft_tokens > 0
    together, _ = decode(smollm2_engine, eagle3(smollm2_engine, drafter), PROMPTS, batch=3)
    assert together == plain
    truth = {tuple(p): out for p, out in zip(PROMPTS, plain)}
    settings = (smollm2_engine, Eagle3Config(K, drafter.capture_layers), drafter.folder)
    oracle, stats = decode(smollm2_engine, OracleChains(*settings, truth=truth), PROMPTS, batch=3)
    assert oracle == plain
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert len(stats.accepted_per_position) == K  # whole chains were accepted too


@pytest.mark.slow
@pytest.mark.smollm2
def test_eagle3_dynamic_tree_is_lossless(smollm2_engine, drafter, plain):
    torch.set_num_threads(1)
    method = eagle3(smollm2_engine, drafter, config=tree_config(drafter))
    assert (method.max_draft_len, method.draft_positions) == (TREE_NODES, K)
    alone, stats = decode(smollm2_engine, method, PROMPTS[:1], batch=1)
    assert alone == plain[:1]
    steps = NEW_TOKENS - 1  # generation steps at most (the first token comes with the prompt)
    assert stats.draft_tokens > steps  # a tree, not a chain: more than one draft a step
    together, stats = decode(smollm2_engine, eagle3(smollm2_engine, drafter, config=tree_config(drafter)), PROMPTS, 3)
    assert together == plain
    truth = {tuple(p): out for p, out in zip(PROMPTS, plain)}
    settings = (smollm2_engine, tree_config(drafter), drafter.folder)
    oracle, stats = decode(smollm2_engine, OracleTrees(*settings, truth=truth), PROMPTS, batch=3)
    assert oracle == plain
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert len(stats.accepted_per_position) >= 2  # paths below the first level were accepted too


# --- the drafter against ModelOpt's EAGLE-3 module ------------------------------------------------


@pytest.mark.slow
@pytest.mark.smollm2
def test_draft_logits_match_modelopt(smollm2_engine, drafter):
    """Captured layers, fc, norms, the draft chain's feed-back and d2t against ModelOpt's
    ``pseudo_speculative_generate`` (no KV cache: it reruns the whole sequence every step)."""
    torch.set_num_threads(1)
    model, prompt, steps = drafter.model, PROMPTS[0], 3
    aux, logits = [], []
    gather, forward = model.pop_and_gather_aux_hiddens, model._eagle_forward

    def gather_and_keep():
        aux.append(gather())
        return aux[-1]

    def forward_and_keep(*args, **kwargs):
        out = forward(*args, **kwargs)
        logits.append(out[2][0, -1])  # the draft logits at the last entry
        return out

    model.pop_and_gather_aux_hiddens, model._eagle_forward = gather_and_keep, forward_and_keep
    try:
        with torch.no_grad():
            base_token, drafts = model.pseudo_speculative_generate(torch.tensor([prompt]), steps=steps)
    finally:
        del model.pop_and_gather_aux_hiddens, model._eagle_forward

    method = eagle3(smollm2_engine, drafter)
    rows = smollm2_engine.forward(
        [
            StepInput(
                smollm2_engine.new_cache(64),
                prompt,
                Logits.LAST,
                all_hidden=True,
                capture_layers=method.capture_layers,
            )
        ]
    )[0]
    assert rows.captured is not None and rows.captured.shape == (len(prompt), 3 * 576)
    torch.testing.assert_close(rows.captured, aux[0][0], atol=1e-4, rtol=1e-4)  # layer l = its output
    first = int(rows.logits[-1].argmax())
    assert first == int(base_token)

    d = method.drafter
    cache = d.new_cache(64)
    out = d.forward([DraftInput(cache, [*prompt[1:], first], d.fuse(rows.captured), list(range(len(prompt))))])[0]
    last = out[-1:]
    for step in range(steps):
        torch.testing.assert_close(d.logits(last)[0], logits[step], atol=1e-4, rtol=1e-4)
        token = d.draft(last)[0]
        assert token == int(drafts[0, step])  # a target id (d2t applied)
        last = d.forward([DraftInput(cache, [token], last, [cache.length])])[0]
    assert drafter.model.eagle_module.d2t.abs().sum() > 0  # the mapping was not the identity


# --- small cases ---------------------------------------------------------------------------------


class LiteralDrafter:
    """A stand-in drafter: an entry's output is its own token (a [1] row), and an output's candidates are
    the table's for that token; every entry fed is recorded with its position and what it sees."""

    def __init__(self, table: dict[int, list[tuple[int, float]]]):
        self.table = table
        self.fed: list[tuple[list[int], list[int], torch.Tensor | None]] = []

    def forward(self, items: list[DraftInput]) -> list[torch.Tensor]:
        outs = []
        for item in items:
            item.cache.reserve(len(item.tokens))
            self.fed.append((item.tokens, item.positions, item.visible))
            item.cache.advance(len(item.tokens))
            outs.append(torch.tensor(item.tokens, dtype=torch.float32)[:, None])  # [n, 1]
        return outs

    def candidates(self, outputs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.table[int(o)][:k] for o in outputs[:, 0]]
        return torch.tensor([[t for t, _ in r] for r in rows]), torch.tensor([[p for _, p in r] for r in rows])


# The docstring's worked example of draft_trees (root token 100; a, b, c, d, e, f = 1 .. 6), one level
# more: c's children g = 7, h = 8 and e's children i = 9, j = 10.
TABLE = {
    100: [(1, -0.1), (2, -0.5)],
    1: [(3, -0.2), (4, -1.0)],
    2: [(5, -0.1), (6, -2.0)],
    3: [(7, -0.05), (8, -3.0)],
    5: [(9, -0.1), (10, -3.0)],
}


def grow(k: int, depth: int, nodes: int, depths: list[int] | None = None):
    drafter, cache = LiteralDrafter(TABLE), KVCache([1], 1, 1, torch.float32, 64)
    rule = DynamicTree(k, depth, nodes)
    (draft,) = draft_trees(drafter, rule, [DraftInput(cache, [50, 100], torch.zeros(2, 1), [0, 1])], depths or [depth])
    return rule.final(draft), drafter.fed, draft


def test_the_dynamic_tree_keeps_the_best_paths():
    tree, fed, draft = grow(k=2, depth=2, nodes=3)  # the docstring's example
    assert (tree.tokens, tree.parents) == ((1, 2, 3), (-1, -1, 0))  # a, b, c: paths -0.1, -0.5, -0.3
    assert [tokens for tokens, _, _ in fed] == [[50, 100], [1, 2]]  # catch-up, then both level-1 nodes
    positions, visible = fed[1][1], fed[1][2]
    assert positions == [2, 2]  # the root's children sit at n = 2
    assert visible is not None and visible.tolist() == [[True, True, True, False], [True, True, False, True]]
    assert draft.committed == 2  # the caller truncates the drafter cache back to here


def test_the_dynamic_tree_expands_the_top_k_of_each_level():
    tree, fed, _ = grow(k=2, depth=3, nodes=4)
    # level 2 is c (-0.3), d (-1.1), e (-0.6), f (-2.5): c and e are expanded, not d
    assert fed[2][0] == [3, 5] and fed[2][1] == [3, 3]
    assert fed[2][2] is not None and fed[2][2][0].tolist() == [True, True, True, False, True, False]  # c sees a
    # the best 4 paths: a (-0.1), c (-0.3), g (-0.35), b (-0.5)
    assert (tree.tokens, tree.parents) == ((1, 2, 3, 7), (-1, -1, 0, 2))
    everything, _, _ = grow(k=2, depth=3, nodes=6)  # k x K: all nodes up to the cap, by score
    assert everything.tokens == (1, 2, 3, 5, 7, 9)


def test_a_top_1_tree_is_the_chain_and_depth_is_cut_per_request():
    chain, fed, _ = grow(k=1, depth=3, nodes=3)
    assert (chain.tokens, chain.parents) == ((1, 3, 7), (-1, 0, 1))
    assert [tokens for tokens, _, _ in fed] == [[50, 100], [1], [3]]
    short, fed, _ = grow(k=2, depth=3, nodes=6, depths=[1])  # one token left to emit: one level
    assert short.tokens == (1, 2) and len(fed) == 1


def test_d2t_maps_draft_ids_to_target_ids():
    d2t = torch.tensor([0, 4, 4, 10])  # draft vocabulary {0, 5, 6, 13}
    assert draft_to_target(torch.tensor([3, 0, 1, 2]), d2t).tolist() == [13, 0, 5, 6]
    assert draft_to_target(torch.tensor([3, 1]), None).tolist() == [3, 1]


@pytest.mark.slow
def test_refused_for_tp2(hf_model, tmp_path):
    engine = Engine.load(write_engine(hf_model, tmp_path / "tp2", tp=2))
    with pytest.raises(InputError, match=r"needs tp=1 and pp=1.*tp 2, pp 1") as err:
        make_method(engine, MethodSettings(eagle3=Eagle3Config(3, (0, 1)), eagle3_drafter=tmp_path / "none"))
    assert "\n" not in str(err.value)


def test_an_illegal_dynamic_tree_is_refused(engine, tmp_path):
    config = Eagle3Config(3, (0, 1), True, 2, 7)  # more than 2 x 3 nodes
    with pytest.raises(InputError, match=r"max_total_draft_tokens 7 is more than .* = 6") as err:
        make_method(engine, MethodSettings(eagle3=config, eagle3_drafter=tmp_path / "none"))
    assert "\n" not in str(err.value)


def test_needs_both_settings(engine):
    with pytest.raises(InputError, match="both"):
        make_method(engine, MethodSettings(eagle3=Eagle3Config(3, (0, 1))))
    with pytest.raises(InputError, match="both"):
        make_method(engine, MethodSettings(eagle3_drafter=Path("drafter")))
