"""The speculative plug-in point, exercised with an oracle drafter: tree feeding, acceptance, KV
compaction and draft metrics through the real scheduler; the output must equal plain decoding."""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.model.engine import StepRows
from pipeline.runtime.request import GenerationRequest, SamplingParams
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, Sequence
from pipeline.runtime.spec_decode.tree_verify import DraftTree, accept, commit, tree_input
from tests.runtime.drive import Collector
from tests.runtime.fixtures import PROMPTS


class OracleDrafts(DecodingMethod):
    """Proposes the known next two tokens as a chain, with a wrong sibling at each level; every
    third step proposes only wrong tokens (nothing accepted)."""

    name = "oracle"
    max_draft_len = 4

    def __init__(self, truth: dict[str, list[int]], vocab: int):
        self.truth, self.vocab = truth, vocab

    def generation_input(self, seq: Sequence):
        done = len(seq.generated)
        right = self.truth[seq.request.request_id][done : done + 2]
        if seq.metrics.forward_steps % 3 == 2:
            right = []
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for level in range(max(len(right), 1)):
            near = right[level] if right else seq.generated[-1]
            tokens.append((near + 1) % self.vocab)  # a wrong sibling at this level
            parents.append(parent)
            if level < len(right):
                tokens.append(right[level])
                parents.append(parent)
                parent = len(tokens) - 1
        tree = DraftTree(tuple(tokens), tuple(parents))
        seq.state.update(tree=tree, start=seq.cache.length)
        return tree_input(seq.cache, seq.generated[-1], tree)

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        if after_prefill:
            return Accepted([seq.sample(rows.logits[-1])])
        tree = seq.state["tree"]
        verdict = accept(tree, rows.logits, seq.sample)
        commit(seq.cache, seq.state["start"], verdict)
        return Accepted(verdict.tokens, len(tree), verdict.accepted_drafts)


def generate(engine, requests, method=None) -> tuple[Collector, int]:
    sched, got = Scheduler(engine, method), Collector()
    for r in requests:
        sched.submit(r, got.sink(r.request_id))
    return got, sched.run_until_idle()


def test_draft_tree_mask_and_depths():
    tree = DraftTree((10, 11, 12, 13), (-1, -1, 0, 2))  # root -> {10 -> 12 -> 13, 11}
    assert tree.depths() == [1, 1, 2, 3]
    assert tree.mask().int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    verdict = accept(tree, torch.eye(20)[[10, 12, 0, 13, 7]], lambda row: int(row.argmax()))
    assert verdict.path == [0, 2, 3] and verdict.tokens == [10, 12, 13, 7]
    with pytest.raises(ValueError):
        DraftTree((1, 2), (1, -1))


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=7)])
def test_speculative_output_equals_plain_decoding(engine, sampling):
    requests = [
        GenerationRequest(str(i), tuple(p), 12, sampling=sampling, exclude_input_in_output=True)
        for i, p in enumerate(PROMPTS)
    ]
    plain, plain_steps = generate(engine, requests)
    truth = {r.request_id: plain.final(r.request_id).tokens for r in requests}
    spec, spec_steps = generate(engine, requests, OracleDrafts(truth, engine.config.model.vocab_size))
    assert {rid: spec.final(rid).tokens for rid in truth} == truth
    assert spec_steps < plain_steps
    m = spec.final("0").metrics
    assert m.total_draft_tokens > m.total_accepted_draft_tokens > 0
    assert m.acceptance_rate == m.total_accepted_draft_tokens / m.total_draft_tokens
