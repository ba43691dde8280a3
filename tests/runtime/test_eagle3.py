"""pipeline/runtime/spec_decode/eagle3.py: the reference EAGLE-3 drafter against ModelOpt's own EAGLE-3
module, and EAGLE-3 decoding against plain greedy decoding on the embedded SmolLM2.

The drafter is exported by ModelOpt (tests/runtime/eagle3_fixtures.py): random, so it rarely guesses
right; an oracle variant whose chains are partly the true continuation exercises accepted drafts
(KV-cache keep, the drafter catching up on several committed tokens) through the same code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.errors import InputError
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.request import GenerationRequest
from pipeline.runtime.serving.metrics import SpecDecodingStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding, Sequence
from pipeline.runtime.spec_decode.eagle.drafter import DraftInput
from pipeline.runtime.spec_decode.eagle3 import Eagle3Decoding, draft_to_target
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


def eagle3(engine: Engine, drafter: ModelOptDrafter, k: int = K) -> Eagle3Decoding:
    settings = MethodSettings(eagle3=Eagle3Config(k, drafter.capture_layers), eagle3_drafter=drafter.folder)
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


class OracleChains(Eagle3Decoding):
    """The real drafter runs; then each chain becomes the true continuation's first j tokens (j cycling
    0..K) and a wrong token, so drafts are accepted and rejected through the same accept path."""

    def __init__(self, *args, truth: dict[tuple[int, ...], list[int]]):
        super().__init__(*args)
        self.truth, self.turn = truth, 0

    def propose(self, seqs: list[Sequence]) -> None:
        todo = [seq for seq in seqs if self._state(seq).proposal is None]
        super().propose(todo)
        for seq in todo:
            state = self._state(seq)
            assert state.proposal is not None
            length = len(state.proposal.tree)
            future = self.truth[seq.request.input_ids][len(seq.generated) :]
            self.turn += 1
            j = min(self.turn % (K + 1), length, len(future))
            chain = future[:j] + [0] * (length - j)
            state.proposal = Proposal.of_tree(seq.cache, seq.generated[-1], DraftTree.chain(chain))
            state.proposal.input.capture_layers = self.capture_layers


# --- served by Eagle3Decoding: plain greedy decoding's tokens ------------------------------------


@pytest.mark.slow
@pytest.mark.smollm2
def test_eagle3_is_lossless(smollm2_engine, drafter):
    torch.set_num_threads(1)
    plain, _ = decode(smollm2_engine, PlainDecoding(), PROMPTS, batch=3)
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


def test_needs_both_settings(engine):
    with pytest.raises(InputError, match="both"):
        make_method(engine, MethodSettings(eagle3=Eagle3Config(3, (0, 1))))
    with pytest.raises(InputError, match="both"):
        make_method(engine, MethodSettings(eagle3_drafter=Path("drafter")))
