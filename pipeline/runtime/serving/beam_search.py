"""Beam search for one request over the reference engine, with TensorRT-LLM's semantics.

TensorRT-LLM's beam search (``cpp/tensorrt_llm/kernels/beamSearchKernels``, which follows Hugging Face's
``BeamSearchScorer``) keeps ``beam_width`` alive beams and a candidate-beam array of at most
``beam_width`` finished hypotheses. Each step:

* every alive beam's next-token log-probabilities (log-softmax of the logits after the request's
  penalties, bans and temperature) give it its 2 x beam_width best tokens; a candidate's value is the
  beam's cumulative log-probability plus the token's plus ``beam_search_diversity_rate`` x the beam's
  index (``addCumLogProbs``: the diversity term stays in the cumulative value; the per-token log-probs
  are the model's); the first step has one beam, the prompt's;
* the 2 x beam_width best candidates are visited in order: one ending with the end id and ranked in the
  top beam_width becomes a finished hypothesis scored ``cum_log_prob / length ** length_penalty``
  (length: its generated tokens, the end id included; no division for length_penalty 0 or length 1),
  replacing the worst one when the array is full and it beats it; the others become the next alive beams
  until there are beam_width of them;
* the request is done when the array is full and early_stopping is 1, or (early_stopping 0, Hugging
  Face's heuristic) when the best candidate cannot beat the worst hypothesis any more; with any other
  early_stopping ("never") and length_penalty > 0 the best candidate's score is taken at the longest
  length the engine allows (max_seq_len - prompt). Two details are TensorRT-LLM's, not Hugging Face's:
  that best candidate may be one ending with the end id (HF takes the best alive beam), and "never"
  uses the engine's max_seq_len (HF the request's max_length).

When the request ends by length, the alive beams join the hypotheses (scored at their length) as in
TensorRT-LLM's ``insertUnfinishedPath``; the result is the best beam_width hypotheses, best first, each
with its tokens (the end id not returned), per-token log-probabilities and raw cumulative log-probability.

Stop words: a beam whose history (prompt + its tokens) ends with a stop word is marked finished
(``stopWordsCriterion`` in cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu, which walks the beam's parent
ids). A finished beam stays in the batch and at the next step offers one candidate only, the end id at
log-probability 0 (cumulative value unchanged, no diversity term): TensorRT-LLM's beam search masks a
finished beam's row to the end id (``beamStage1Kernel`` / ``addCumLogProbs`` in
cpp/tensorrt_llm/kernels/beamSearchKernels*, ``addBiasSoftMax`` before them; the V1 stage-1 kernel writes
the largest float there instead of a log-probability, which would rank such a beam first with a saturated
score: the reference keeps the log-softmax value, 0). From there the end-id rule
above applies: ranked in the top beam_width it becomes a hypothesis, its length counting the end id; its
tokens keep the stop word (the end id is not returned), as TensorRT-LLM keeps stop words in the output.

Generation logits (return_generation_logits): each beam carries the raw logits row behind each of its
tokens, continued from its parent's, so a returned beam's logits follow its own history (the reordering
TensorRT-LLM does in ``trtGptModelInflightBatching.cpp``, NVIDIA/TensorRT-LLM pull request 12268).

The KV cache is real: every alive beam has its own cache; a beam continues its parent's cache, and a
parent with several children is forked (copied) for all but the first. The block accounting counts the
prompt's full blocks once (shared by all beams, as TensorRT-LLM's paged cache shares them) and every
other block per beam.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.runtime.model.engine import Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.request import BeamOutput, GenerationRequest, ends_with_stop_word
from pipeline.runtime.sampling import adjust_logits


@dataclass
class _Beam:
    tokens: list[int]  # generated so far
    log_probs: list[float]
    cum_log_prob: float
    cache: KVCache
    logits: list[torch.Tensor] = field(default_factory=list)  # return_generation_logits: a row per token
    finished: bool = False  # ends with a stop word: its next candidate is the end id only


@dataclass(frozen=True)
class _Hypothesis:
    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]
    cum_log_prob: float
    score: float  # the length-penalised score hypotheses are ranked by
    logits: tuple[torch.Tensor, ...] = ()


def _output(tokens, log_probs, cum_log_prob: float, logits) -> BeamOutput:
    rows = tuple(row.float().numpy() for row in logits)
    return BeamOutput(tuple(tokens), tuple(log_probs), cum_log_prob, rows)


def length_penalised(cum_log_prob: float, length: int, length_penalty: float) -> float:
    """TensorRT-LLM's ``applyLengthPenalty``: log(prob) / length ** length_penalty."""
    if length_penalty == 0.0 or length == 1:
        return cum_log_prob
    return cum_log_prob / float(length) ** length_penalty


class BeamSearch:
    """The beams of one request: fed by :meth:`inputs`, judged by :meth:`start` / :meth:`advance`."""

    def __init__(self, request: GenerationRequest, max_seq_len: int, prompt_blocks: int):
        self.request = request
        self.width = request.sampling.beam_width
        self.max_new_tokens = request.max_new_tokens
        self.longest = max_seq_len - len(request.input_ids)  # the engine's room: "never"'s best length
        self.beams: list[_Beam] = []
        self.hypotheses: list[_Hypothesis] = []
        self.done = False
        self.steps = 0
        self._shared_blocks = prompt_blocks  # full prompt blocks, shared by every beam
        self.blocks = 0

    # -- the scheduler's side ---------------------------------------------------------------------

    def inputs(self) -> list[StepInput]:
        """One generation input per alive beam."""
        return [StepInput(beam.cache, [beam.tokens[-1]], Logits.LAST) for beam in self.beams]

    def start(self, cache: KVCache, logits: torch.Tensor) -> None:
        """The step after prefill: one beam (the prompt, in ``cache``) and its last logits row [vocab]."""
        self._step([_Beam([], [], 0.0, cache)], logits[None])

    def advance(self, rows: list[StepRows]) -> None:
        """A generation step's rows, one per alive beam in :meth:`inputs`' order."""
        self._step(self.beams, torch.stack([r.logits[-1] for r in rows]))

    @property
    def _end_token(self) -> int:
        """The id a finished beam's only candidate carries (any id when the request has no end id:
        a finished beam's candidate is recognised by its parent, not by the id)."""
        return self.request.end_id if self.request.end_id is not None else 0

    def results(self) -> list[BeamOutput]:
        """The beams as they stand, best first: the final hypotheses once done, else the alive beams."""
        if self.done:
            ranked = sorted(self.hypotheses, key=lambda h: h.score, reverse=True)[: self.width]
            return [_output(h.tokens, h.log_probs, h.cum_log_prob, h.logits) for h in ranked]
        return [_output(b.tokens, b.log_probs, b.cum_log_prob, b.logits) for b in self.beams]

    # -- one step ---------------------------------------------------------------------------------

    def _log_probs(self, parents: list[_Beam], logits: torch.Tensor) -> torch.Tensor:
        request, params = self.request, self.request.sampling
        rows = []
        for row, beam in zip(logits, parents):
            if beam.finished:  # a stop word ended it: the end id only, at log-probability 0
                only_end = torch.full_like(row, float("-inf"), dtype=torch.float32)
                only_end[self._end_token] = 0.0
                rows.append(only_end)
                continue
            context = [*request.input_ids, *beam.tokens]
            row = adjust_logits(row.float(), params, context, len(beam.tokens), request.end_id)
            if params.temperature > 0.0 and params.temperature != 1.0:
                row = row / params.temperature
            rows.append(torch.log_softmax(row, dim=-1))
        return torch.stack(rows)

    def _step(self, parents: list[_Beam], logits: torch.Tensor) -> None:
        params, width, end_id = self.request.sampling, self.width, self.request.end_id
        self.steps += 1
        log_probs = self._log_probs(parents, logits)  # [P, vocab]
        per_beam = min(2 * width, log_probs.shape[1])
        top = torch.topk(log_probs, per_beam, dim=-1)  # each beam's best tokens
        cum = torch.tensor([b.cum_log_prob for b in parents], dtype=torch.float64)
        # [P, per_beam] candidate cumulative log-probs, diversity_rate x beam index added (addCumLogProbs;
        # not to a finished beam's end id)
        index = torch.tensor([0.0 if b.finished else k for k, b in enumerate(parents)], dtype=torch.float64)
        diversity = params.beam_search_diversity_rate * index[:, None]
        values = cum[:, None] + top.values.double() + diversity
        order = torch.argsort(values.flatten(), descending=True, stable=True)[: 2 * width].tolist()
        chosen: list[tuple[int, int, float, float]] = []  # (parent, token, log_prob, cum)
        for i, flat in enumerate(order):
            parent, j = divmod(flat, per_beam)
            token, value = int(top.indices[parent, j]), float(values[parent, j])
            step_log_prob = float(top.values[parent, j])
            if value == float("-inf"):  # a finished beam's masked row: no candidate at all
                continue
            beam = parents[parent]
            if beam.finished or (end_id is not None and token == end_id):
                if i >= width:
                    continue
                score = length_penalised(value, len(beam.tokens) + 1, params.length_penalty)
                hypothesis = _Hypothesis(tuple(beam.tokens), tuple(beam.log_probs), value, score, tuple(beam.logits))
                if not self._add(hypothesis):
                    if params.early_stopping:
                        break
                    continue
            else:
                chosen.append((parent, token, step_log_prob, value))
            if len(chosen) >= width:
                break
        best = float(values.flatten()[order[0]])
        self.done = self._is_done(best, len(parents[0].tokens) + 1)
        self.beams = self._children(parents, chosen, logits)
        if not self.done and (not self.beams or len(self.beams[0].tokens) >= self.max_new_tokens):
            for beam in self.beams:  # out of length: the alive beams become hypotheses
                score = length_penalised(beam.cum_log_prob, len(beam.tokens), params.length_penalty)
                self._add(
                    _Hypothesis(tuple(beam.tokens), tuple(beam.log_probs), beam.cum_log_prob, score, tuple(beam.logits))
                )
            self.done = True
        shared = self._shared_blocks
        self.blocks = max(self.blocks, shared + sum(max(b.cache.blocks - shared, 0) for b in self.beams))

    def _add(self, hypothesis: _Hypothesis) -> bool:
        """Into the candidate-beam array; False when it is full and this one is worse than its worst."""
        if len(self.hypotheses) < self.width:
            self.hypotheses.append(hypothesis)
            return True
        worst = min(range(len(self.hypotheses)), key=lambda k: self.hypotheses[k].score)
        if hypothesis.score < self.hypotheses[worst].score:
            return False
        self.hypotheses[worst] = hypothesis
        return True

    def _is_done(self, best_value: float, length: int) -> bool:
        params = self.request.sampling
        if len(self.hypotheses) < self.width:
            return False
        if params.early_stopping == 1:
            return True
        if params.early_stopping != 0 and params.length_penalty > 0.0:
            length = self.longest  # "never": the longest it could get
        worst = min(h.score for h in self.hypotheses)
        return worst >= length_penalised(best_value, length, params.length_penalty)

    def _children(
        self, parents: list[_Beam], chosen: list[tuple[int, int, float, float]], logits: torch.Tensor
    ) -> list[_Beam]:
        """The next alive beams; each continues its parent's cache (forked when the parent has several),
        its logits rows (return_generation_logits) and is finished when it now ends with a stop word."""
        request = self.request
        taken: set[int] = set()
        beams = []
        for parent, token, log_prob, value in chosen:
            beam = parents[parent]
            cache = beam.cache.fork() if parent in taken else beam.cache
            taken.add(parent)
            rows = [*beam.logits, logits[parent].detach().float().clone()] if request.return_generation_logits else []
            tokens = [*beam.tokens, token]
            finished = ends_with_stop_word(request.input_ids, tokens, request.stop_words)
            beams.append(_Beam(tokens, [*beam.log_probs, log_prob], value, cache, rows, finished))
        return beams
