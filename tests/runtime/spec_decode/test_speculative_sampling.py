"""Speculative sampling keeps the target distribution (vocab-16 model, fixed seeds, exact reference).

The reference is exact, not another sample: the probability of every (t1, t2) and of t3 after the
prompt is computed from the engine's own logits with the request's sampling rule (temperature,
top-k). 1200 seeded requests per method are compared with it by a chi-square test (cells with an
expected count below 5 pooled); a correct rule passes with p far above the 1e-3 bound, and a rule
that skips verification (negative control) fails it by many orders of magnitude.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.request import GenerationRequest, SamplingParams
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import Accepted, PlainDecoding
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.runtime.spec_decode.medusa import MedusaDecoding
from pipeline.runtime.spec_decode.tree_verify import Verdict, commit
from tests.runtime.fixtures import LOOKAHEAD, TREE

VOCAB, SAMPLES = 16, 1200
SAMPLING = dict(temperature=0.8, top_k=10)  # top-k 10 of 16: the filtering is part of the target
SETTINGS = {
    "medusa": MethodSettings("medusa", medusa_choices=TREE),
    "eagle": MethodSettings("eagle", eagle_choices=TREE),
    "eagle2": MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=3),
    "lookahead": MethodSettings("lookahead", lookahead=LOOKAHEAD),
}


def target_probs(logits: torch.Tensor) -> torch.Tensor:
    """What sampling.sample_one draws from: softmax(logits / T), top-k kept, renormalized."""
    probs = torch.softmax(logits / SAMPLING["temperature"], dim=-1)
    kept = torch.zeros_like(probs).scatter(-1, probs.topk(SAMPLING["top_k"], dim=-1).indices, 1.0)
    probs = probs * kept
    return probs / probs.sum(-1, keepdim=True)


def exact(engine: Engine, prompt: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t1, t2) [V, V] and P(t3) [V] after the prompt, from every continuation's logits."""
    prefixes = (
        [prompt] + [prompt + (a,) for a in range(VOCAB)] + [prompt + (a, b) for a in range(VOCAB) for b in range(VOCAB)]
    )
    rows = engine.forward([StepInput(engine.new_cache(len(p)), list(p), Logits.LAST) for p in prefixes])
    p = target_probs(torch.stack([r.logits[-1] for r in rows]).double())
    p1, p2, p3 = p[0], p[1 : 1 + VOCAB], p[1 + VOCAB :].view(VOCAB, VOCAB, VOCAB)
    joint = p1[:, None] * p2
    return joint, (joint[..., None] * p3).sum((0, 1))


def sample(engine: Engine, method, prompt: tuple[int, ...]) -> tuple[torch.Tensor, int, int]:
    """First three tokens of SAMPLES requests seeded 0..SAMPLES-1; (tokens [N, 3], draft, accepted)."""
    sched, out = Scheduler(engine, method), {}
    for seed in range(SAMPLES):
        request = GenerationRequest(
            str(seed), prompt, 3, sampling=SamplingParams(**SAMPLING, seed=seed), exclude_input_in_output=True
        )
        sched.submit(request, lambda o: out.__setitem__(int(o.request_id), o) if o.finished else None)
    sched.run_until_idle()
    tokens = torch.tensor([out[s].tokens for s in range(SAMPLES)])
    metrics = [out[s].metrics for s in range(SAMPLES)]
    return tokens, sum(m.total_draft_tokens for m in metrics), sum(m.total_accepted_draft_tokens for m in metrics)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value; cells expected below 5 are pooled into one."""
    expected = probs.flatten() * counts.sum()
    counts = counts.flatten().double()
    small = expected < 5
    obs = torch.cat((counts[~small], counts[small].sum()[None]))
    exp = torch.cat((expected[~small], expected[small].sum()[None]))
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.double), stat / 2))


def p_values(engine: Engine, prompt: tuple[int, ...], tokens: torch.Tensor) -> tuple[float, float]:
    joint, third = exact(engine, prompt)
    pairs = torch.zeros(VOCAB * VOCAB, dtype=torch.double).index_add_(
        0, tokens[:, 0] * VOCAB + tokens[:, 1], torch.ones(len(tokens), dtype=torch.double)
    )
    return chi_square_p(pairs, joint), chi_square_p(torch.bincount(tokens[:, 2], minlength=VOCAB), third)


@pytest.fixture(scope="module")
def prompt(small_vocab_engines) -> tuple[int, ...]:
    """A start and the model's own greedy continuation of it: likely continuations then also occur
    in the prompt, so Lookahead's pool (seeded with the prompt's n-grams) has something to propose."""
    start = [1, 5, 9, 2]
    sched, out = Scheduler(small_vocab_engines(None)), []
    sched.submit(
        GenerationRequest("g", tuple(start), 12, exclude_input_in_output=True),
        lambda o: out.append(o.tokens) if o.finished else None,
    )
    sched.run_until_idle()
    return tuple(start + out[0])


@pytest.fixture(scope="module")
def plain_samples(small_vocab_engines, prompt):
    return {
        kind: sample(small_vocab_engines(kind), PlainDecoding(), prompt)[0] for kind in ("medusa", "eagle", "lookahead")
    }


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampling_distribution_equals_the_target(small_vocab_engines, plain_samples, prompt, name):
    settings = SETTINGS[name]
    engine = small_vocab_engines(settings.decoding_mode)
    method, _ = make_method(engine, settings)
    tokens, drafted, accepted = sample(engine, method, prompt)
    assert drafted > accepted > SAMPLES // 10, "speculation must actually accept drafts for this to test anything"
    joint_p, third_p = p_values(engine, prompt, tokens)
    assert joint_p > 1e-3 and third_p > 1e-3, (joint_p, third_p)
    # Seeded and reproducible: one sample per emitted token from the request's generator, as plain
    # decoding draws them, so each seed gives plain sampling's tokens (float round-off aside).
    same = (tokens == plain_samples[settings.decoding_mode]).all(-1).float().mean()
    assert same > 0.99


def test_plain_sampling_passes_and_skipping_verification_fails(small_vocab_engines, plain_samples, prompt):
    """The test's own calibration: plain sampling passes; accepting drafts unchecked fails."""
    engine = small_vocab_engines("medusa")
    assert min(p_values(engine, prompt, plain_samples["medusa"])) > 1e-3

    class Unverified(MedusaDecoding):
        """Takes the tree's first root-to-leaf path as if verified, then samples the bonus token."""

        def accept(self, seq, rows, after_prefill):
            if after_prefill:
                return super().accept(seq, rows, after_prefill)
            state = seq.state[self.name]
            proposal, state.proposal = state.proposal, None
            path = [0]
            while kids := [i for i, parent in enumerate(proposal.tree.parents) if parent == path[-1]]:
                path.append(kids[0])
            bonus = seq.sample(rows.logits[path[-1] + 1])
            verdict = Verdict(path, [proposal.tree.tokens[i] for i in path] + [bonus])
            commit(seq.cache, proposal.start, verdict)
            state.hidden = rows.hidden[verdict.rows()[-1]]
            return Accepted(verdict.tokens, len(proposal.tree), len(path))

    tokens, _, _ = sample(engine, Unverified(engine, TREE), prompt)
    assert max(p_values(engine, prompt, tokens)) < 1e-6
