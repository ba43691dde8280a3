"""Iteration-level (in-flight) batching over the reference engine.

Requests join and leave between steps. Each step packs, within ``max_num_tokens``:
1. one generation input for every running request past its prompt (1 token, or 1 + drafts; a
   speculative method with ``propose`` first drafts for all of them in one batch);
2. prompt chunks of requests still in prefill, oldest first (a prompt longer than the budget
   left is split across steps: chunked context);
and runs them as ONE engine forward. A beam-search request (beam_width > 1, beam_search.py) feeds one
generation input per alive beam, each over the beam's own KV cache. At most ``max_batch_size``
requests are admitted at a time; the rest wait in arrival order. A request that breaks a limit is
answered with an error at once and never touches the batch, so one bad request cannot stop the server.

Threading: ``submit``/``cancel`` may be called from any thread; ``step`` runs on one thread
only (the background loop from ``start``, or a test calling it directly).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from pipeline import methods
from pipeline.errors import InputError
from pipeline.lora.rules import HOST_CACHE_DEFAULT_BYTES, REQUEST_CHECKS, speculative_refusal
from pipeline.runtime.model.config import Limits
from pipeline.runtime.model.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.model.lora import LoraCache, LoraWeights
from pipeline.runtime.request import FinishReason, GenerationRequest, LoraRequest, StepOutput, ends_with_stop_word
from pipeline.runtime.serving.beam_search import BeamSearch
from pipeline.runtime.serving.metrics import SpecDecodingStats, SpecRequestMetrics, StepStats
from pipeline.runtime.serving.request_limits import request_problem
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, PlainDecoding, Sequence

log = logging.getLogger(__name__)

Sink = Callable[[StepOutput], None]  # receives every response of one request, the last one finished
IsCancelled = Callable[[], bool]  # the client went away (Triton: response_sender.is_cancelled)


@dataclass
class _Entry:
    seq: Sequence
    sink: Sink
    is_cancelled: IsCancelled | None
    cancelled: bool = False  # by cancel() or a failed delivery
    finished: bool = False  # the final response was sent
    checked_ns: int = 0  # last is_cancelled() poll (it is an IPC round trip under Triton)
    beams: BeamSearch | None = None  # beam_width > 1
    context_logits: list[torch.Tensor] = field(default_factory=list)  # return_context_logits: per prompt chunk
    lora: LoraWeights | None = None  # the request's adapter, held in the LoRA cache until it ends


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        method: DecodingMethod | None = None,
        limits: Limits | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        cancel_check_period_s: float = 0.1,
        on_active: Callable[[int], None] | None = None,
        lora_cache: LoraCache | None = None,
        target: str = "reference",
    ):
        self.engine = engine
        # The target whose rules the runtime serves: which methods it runs on a LoRA engine (the engine
        # flow none; the PyTorch backend applies each request's adapter to the target while it speculates).
        self.target = target
        # TensorRT-LLM's PEFT cache: adapters by lora_task_id (only for engines with the LoRA plugin).
        self.lora_cache = lora_cache or (LoraCache(HOST_CACHE_DEFAULT_BYTES) if engine.lora is not None else None)
        # How often is_cancelled callbacks are polled (TensorRT-LLM's cancellation_check_period_ms).
        self.cancel_check_period_s = cancel_check_period_s
        self.method = method or PlainDecoding()
        self.limits = limits or engine.config.limits
        self.on_step = on_step
        # Told the number of requests queued or running whenever a request joins or a step ends
        # (the in-flight gauge: it drops as soon as a cancelled request is dropped).
        self.on_active = on_active
        self._keys = itertools.count()
        self._lock = threading.Condition()
        self._waiting: deque[_Entry] = deque()
        self._running: list[_Entry] = []
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- client side (any thread) -----------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: Sink, is_cancelled: IsCancelled | None = None) -> None:
        """Queue a request; a request that breaks a limit gets its error through ``sink`` right away."""
        problem = self._problem(request)
        lora = None
        if problem is None and request.lora is not None:
            try:
                lora = self._acquire_lora(request.lora)
            except InputError as exc:
                problem = str(exc)
        if problem is not None:
            _deliver(sink, StepOutput(request.request_id, [], True, FinishReason.ERROR, problem))
            return
        limit = len(request.input_ids) + request.max_new_tokens + self.method.max_draft_len
        seq = Sequence.create(
            next(self._keys), request, self.engine.new_cache(limit), SpecRequestMetrics(arrival_time_ns=time.time_ns())
        )
        entry = _Entry(seq, sink, is_cancelled, lora=lora)
        if request.sampling.beam_width > 1:
            prompt_blocks = len(request.input_ids) // self.engine.config.limits.tokens_per_block
            entry.beams = BeamSearch(request, self.limits.max_seq_len, prompt_blocks)
        with self._lock:
            self._waiting.append(entry)
            self._lock.notify()
        self._report_active()

    def submit_prefilled(self, request: GenerationRequest, sink: Sink, cache: KVCache, rows: StepRows) -> None:
        """Queue a request whose prompt is already in ``cache``: ``rows`` are that prefill's output (the
        last row's logits; every prompt row's hidden state when the method has ``prompt_hidden``). Its
        first token is chosen here, as the step that ended its prefill would have chosen it. The
        evaluation stage prefills each prompt once and decodes it with every method this way."""
        problem = self._problem(request)
        need = len(request.input_ids) + request.max_new_tokens + self.method.max_draft_len
        if problem is None and cache.length != len(request.input_ids):
            problem = f"the cache holds {cache.length} tokens, the prompt has {len(request.input_ids)}"
        if problem is None and cache.limit < need:
            problem = f"the cache holds at most {cache.limit} tokens; this request needs {need}"
        if problem is not None:
            _deliver(sink, StepOutput(request.request_id, [], True, FinishReason.ERROR, problem))
            return
        seq = Sequence.create(next(self._keys), request, cache, SpecRequestMetrics(arrival_time_ns=time.time_ns()))
        seq.prefilled = len(request.input_ids)
        entry = _Entry(seq, sink, None)
        self._emit(entry, self.method.accept(seq, rows, after_prefill=True))
        if not entry.finished:
            with self._lock:
                self._waiting.append(entry)
                self._lock.notify()

    def cancel(self, request_id: str) -> bool:
        """Cancel every queued or running request with this id (Triton's ``stop`` input)."""
        with self._lock:
            found = [e for e in (*self._waiting, *self._running) if e.seq.request.request_id == request_id]
            for entry in found:
                entry.cancelled = True
            self._lock.notify()
        return bool(found)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._running)

    # -- the loop (one thread) --------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration; False when there was nothing to do."""
        started = time.perf_counter()
        self._admit()
        self._drop_cancelled()
        batch = self._pack()
        if not batch:
            self._report_active()
            return False
        flat = self.engine.forward([item for _, items, _ in batch for item in items])
        generated = 0
        spec = SpecDecodingStats()
        start = 0
        for entry, items, prefill_chunk in batch:
            seq, all_rows = entry.seq, flat[start : start + len(items)]
            start += len(items)
            item, rows = items[0], all_rows[0]
            if prefill_chunk:
                seq.prefilled += len(item.token_ids)
                if seq.request.return_context_logits:
                    entry.context_logits.append(rows.logits)
                if seq.in_prefill:  # more prompt chunks to go: no token yet
                    if self.method.prompt_hidden:
                        self.method.prompt_chunk(seq, rows)
                    continue
            if entry.beams is not None:
                generated += self._beam_step(entry, all_rows, prefill_chunk)
                continue
            accepted = self.method.accept(seq, rows, after_prefill=prefill_chunk)
            if not prefill_chunk:  # a verification step (metrics.py has the definitions)
                for stats in (cast(SpecRequestMetrics, seq.metrics).spec, spec):
                    stats.observe(accepted.draft_tokens, accepted.accepted_draft_tokens)
            generated += self._emit(entry, accepted)
        self._running = [e for e in self._running if not e.finished]
        self._report_active()
        if self.on_step is not None:
            fed = sum(len(item.token_ids) for _, items, _ in batch for item in items)
            prefill = sum(len(items[0].token_ids) for _, items, chunk in batch if chunk)
            self.on_step(StepStats(len(batch), fed, prefill, generated, time.perf_counter() - started, spec))
        return True

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until no request is left (tests and benchmarks); returns the number of steps."""
        steps = 0
        while steps < max_steps and self.step():
            steps += 1
        return steps

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="reference-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        for entry in [*self._waiting, *self._running]:
            _deliver(
                entry.sink,
                StepOutput(
                    entry.seq.request.request_id,
                    [],
                    True,
                    FinishReason.ERROR,
                    "the server is shutting down",
                    entry.seq.metrics,
                ),
            )
        self._waiting.clear()
        self._running.clear()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._waiting and not self._running:
                    self._lock.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as exc:  # an engine bug must not kill the server: fail the batch, go on
                log.exception("reference engine step failed")
                self._fail_running(f"reference engine step failed: {type(exc).__name__}: {exc}")

    # -- internals --------------------------------------------------------------------------------

    def _report_active(self) -> None:
        if self.on_active is not None:
            self.on_active(self.active)

    def _acquire_lora(self, lora: LoraRequest) -> LoraWeights:
        """The request's adapter from the LoRA cache, stored first when the request brought it."""
        if self.lora_cache is None or self.engine.lora is None:
            raise InputError("lora_task_id was given, but the engine was built without the LoRA plugin (--lora_plugin)")
        weights = None
        if (lora.weights is None) != (lora.config is None):
            raise InputError(REQUEST_CHECKS["pair"])
        if lora.weights is not None and lora.config is not None:
            weights = LoraWeights.parse(
                lora.task_id, lora.weights, lora.config, self.engine.config.model, self.engine.lora
            )
        with self._lock:
            return self.lora_cache.acquire(lora.task_id, weights)

    def _release_lora(self, entry: _Entry) -> None:
        if entry.lora is not None and self.lora_cache is not None:
            with self._lock:
                self.lora_cache.release(entry.lora.task_id)
            entry.lora = None

    def _problem(self, request: GenerationRequest) -> str | None:
        limits, n = self.limits, len(request.input_ids)
        vocab = self.engine.config.model.vocab_size
        if n == 0:
            return "input_ids is empty; send at least one token"
        if n > limits.max_input_len:
            return f"the prompt has {n} tokens, more than the engine's max_input_len {limits.max_input_len}"
        if request.max_new_tokens < 1:
            return f"request_output_len must be at least 1, got {request.max_new_tokens}"
        if n + request.max_new_tokens > limits.max_seq_len:
            return (
                f"prompt {n} + request_output_len {request.max_new_tokens} tokens exceed the engine's "
                f"max_seq_len {limits.max_seq_len}; ask for at most {max(limits.max_seq_len - n, 0)} tokens"
            )
        bad = next((t for t in request.input_ids if not 0 <= t < vocab), None)
        if bad is not None:
            return f"input token id {bad} is outside the vocabulary [0, {vocab})"
        if request.return_context_logits and not self.engine.config.limits.gather_context_logits:
            return (
                "return_context_logits needs an engine built with gather_context_logits (trtllm-build "
                "--gather_context_logits; build.extra_flags.gather_context_logits: true; not possible with "
                "speculative decoding)"
            )
        beam = self._beam_problem(request)
        if beam is not None:
            return beam
        speculating = request.lora is not None and self.method.name != PlainDecoding.name
        refusal = speculative_refusal(self.method.name, self.target) if speculating else None
        if refusal is not None:
            return f"lora_task_id: LoRA with {refusal}"
        if len(request.sampling.embedding_bias) > vocab:
            return f"embedding_bias has {len(request.sampling.embedding_bias)} values, the vocabulary {vocab}"
        return request_problem(request, vocab, limits.max_seq_len) or self.method.problem(request)

    def _beam_problem(self, request: GenerationRequest) -> str | None:
        """beam_width > 1: TensorRT-LLM's refusals (the decoding layer's for speculative methods, the
        executor's beyond max_beam_width or num_return_sequences > beam_width)."""
        width = request.sampling.beam_width
        if width == 1:
            return None
        if self.method.name != PlainDecoding.name:
            mode = methods.definition(self.method.name).title
            return f"Decoding mode is {mode}, but beamWidth != 1 ({width} != 1)"
        if width > self.limits.max_beam_width:
            return f"Requested beam width {width} is larger than configured max beam width {self.limits.max_beam_width}"
        count = request.num_return_beams
        if count is not None and not 1 <= count <= width:  # executor SamplingConfig::checkNumReturnSequences
            return f"num_return_sequences {count} must be between 1 and beam_width {width} with beam search"
        return None

    def _admit(self) -> None:
        with self._lock:
            while self._waiting and len(self._running) < self.limits.max_batch_size:
                entry = self._waiting.popleft()
                entry.seq.metrics.first_scheduled_time_ns = time.time_ns()
                self._running.append(entry)

    def _drop_cancelled(self) -> None:
        period = int(self.cancel_check_period_s * 1e9)
        with self._lock:
            queued = [e for e in self._waiting if _cancelled(e, period)]
            for entry in queued:
                self._waiting.remove(entry)
        for entry in [*queued, *(e for e in self._running if _cancelled(e, period))]:
            self._finish(entry, FinishReason.CANCELLED, [])
        self._running = [e for e in self._running if not e.finished]

    def _pack(self) -> list[tuple[_Entry, list[StepInput], bool]]:
        """(entry, inputs, is_prefill_chunk) for this step within the token budget: one input, or one
        per alive beam of a beam-search request."""
        budget = self.limits.max_num_tokens
        batch: list[tuple[_Entry, list[StepInput], bool]] = []
        # Draft for every generating request in one batch.
        self.method.propose([e.seq for e in self._running if not e.seq.in_prefill and e.beams is None])
        for entry in self._running:  # generation first: running requests never starve
            if not entry.seq.in_prefill:
                items = entry.beams.inputs() if entry.beams is not None else [self.method.generation_input(entry.seq)]
                need = sum(len(item.token_ids) for item in items)
                for item in items:
                    item.lora = entry.lora
                if need <= budget:
                    batch.append((entry, items, False))
                    budget -= need
        for entry in self._running:
            seq = entry.seq
            if seq.in_prefill and budget > 0:
                chunk = list(seq.request.input_ids[seq.prefilled : seq.prefilled + budget])
                last = seq.prefilled + len(chunk) == len(seq.request.input_ids)
                rows = Logits.ALL if seq.request.return_context_logits else Logits.LAST if last else Logits.NONE
                item = StepInput(
                    seq.cache,
                    chunk,
                    rows,
                    all_hidden=self.method.prompt_hidden,
                    lora=entry.lora,
                    capture_layers=self.method.capture_layers,
                )
                batch.append((entry, [item], True))
                budget -= len(chunk)
        return batch

    def _emit(self, entry: _Entry, accepted: Accepted) -> int:
        """Append the step's tokens, apply the stop rules, answer the client; returns tokens kept."""
        seq, request = entry.seq, entry.seq.request
        m = seq.metrics
        m.forward_steps += 1
        m.total_draft_tokens += accepted.draft_tokens
        m.total_accepted_draft_tokens += accepted.accepted_draft_tokens
        log_probs, logits = seq.chosen_log_probs, seq.chosen_logits
        seq.chosen, seq.chosen_log_probs, seq.chosen_logits = [], [], []  # now generated tokens (below)
        kept: list[int] = []
        reason = None
        for index, token in enumerate(accepted.tokens):
            if request.end_id is not None and token == request.end_id:
                reason = FinishReason.END_ID  # the end token itself is not returned (as TensorRT-LLM)
                break
            seq.generated.append(token)
            kept.append(token)
            if request.return_log_probs:
                seq.log_probs.append(log_probs[index])
            if request.return_generation_logits:
                seq.generation_logits.append(logits[index])
            if request.stop_words and _ends_with_stop_word(seq, request.stop_words):
                reason = FinishReason.STOP_WORDS  # the stop word stays in the output (as TensorRT-LLM)
                break
            if len(seq.generated) >= request.max_new_tokens:
                reason = FinishReason.LENGTH
                break
        m.kv_cache_alloc_new_blocks = seq.cache.blocks
        now = time.time_ns()
        if kept:
            m.first_token_time_ns = m.first_token_time_ns or now
            m.last_token_time_ns = now
        if reason is not None:
            self._finish(entry, reason, kept)
        elif request.streaming:
            out = StepOutput(request.request_id, kept, False, None, None, m, *_log_probs(seq, len(kept)))
            out.context_logits = _context_logits(entry)
            _deliver(entry.sink, out, entry)
        return len(kept)

    def _beam_step(self, entry: _Entry, rows: list[StepRows], after_prefill: bool) -> int:
        """Advance a beam-search request by one step and answer it; returns the tokens added."""
        beams, seq = entry.beams, entry.seq
        assert beams is not None
        if after_prefill:
            beams.start(seq.cache, rows[0].logits[-1])
        else:
            beams.advance(rows)
        m = seq.metrics
        m.forward_steps += 1
        m.kv_cache_alloc_new_blocks = beams.blocks
        now = time.time_ns()
        m.first_token_time_ns = m.first_token_time_ns or now
        m.last_token_time_ns = now
        if beams.done:
            self._finish(entry, FinishReason.LENGTH, [])
        elif seq.request.streaming:
            out = _beam_output(entry, finished=False)
            out.context_logits = _context_logits(entry)
            _deliver(entry.sink, out, entry)
        return len(beams.beams)

    def _finish(self, entry: _Entry, reason: FinishReason, last_tokens: list[int]) -> None:
        self._release_lora(entry)
        seq, request = entry.seq, entry.seq.request
        if entry.beams is not None:
            entry.finished = True
            out = _beam_output(entry, finished=True, reason=reason)
            out.context_logits = _context_logits(entry)
            _deliver(entry.sink, out)
            return
        if request.streaming:
            tokens, generated = last_tokens, len(last_tokens)
        else:
            tokens = seq.generated if request.exclude_input_in_output else seq.tokens
            generated = len(seq.generated)
        entry.finished = True
        out = StepOutput(request.request_id, list(tokens), True, reason, None, seq.metrics, *_log_probs(seq, generated))
        out.context_logits = _context_logits(entry)
        _deliver(entry.sink, out)

    def _fail_running(self, message: str) -> None:
        for entry in self._running:
            self._release_lora(entry)
            if not entry.finished:
                entry.finished = True
                _deliver(
                    entry.sink,
                    StepOutput(entry.seq.request.request_id, [], True, FinishReason.ERROR, message, entry.seq.metrics),
                )
        self._running = []


def _context_logits(entry: _Entry) -> np.ndarray | None:
    """The prompt's logits [prompt_len, vocab] (return_context_logits), None otherwise. Every response
    carries them, streaming ones too, as TensorRT-LLM's ``LlmRequest::createResult``
    (cpp/tensorrt_llm/batch_manager/llmRequest.cpp) puts them in every result."""
    if not entry.seq.request.return_context_logits or not entry.context_logits:
        return None
    if len(entry.context_logits) > 1:  # the chunks of a chunked prefill, joined once
        entry.context_logits[:] = [torch.cat(entry.context_logits)]
    return entry.context_logits[0].float().cpu().numpy()


def _beam_output(entry: _Entry, finished: bool, reason: FinishReason | None = None) -> StepOutput:
    """A beam-search response: the best num_return_beams beams as they stand (whole beams, streaming or
    not; the prompt before each unless excluded or streaming)."""
    seq, request, beams = entry.seq, entry.seq.request, entry.beams
    assert beams is not None
    results = beams.results()[: request.num_return_beams or beams.width]
    prompt = [] if request.streaming or request.exclude_input_in_output else list(request.input_ids)
    tokens = [*prompt, *results[0].tokens] if results else prompt
    cum = results[0].cum_log_prob if results and request.return_log_probs else 0.0
    return StepOutput(request.request_id, tokens, finished, reason, None, seq.metrics, cum_log_prob=cum, beams=results)


def _log_probs(seq: Sequence, last: int) -> tuple[list[float], float, list]:
    """(log-probs of the last ``last`` generated tokens, their sum over all generated tokens,
    the logits rows of those tokens): the StepOutput fields after ``metrics``."""
    logits = seq.generation_logits[len(seq.generation_logits) - last :] if seq.request.return_generation_logits else []
    if not seq.request.return_log_probs:
        return [], 0.0, logits
    return seq.log_probs[len(seq.log_probs) - last :], float(sum(seq.log_probs)), logits


def _cancelled(entry: _Entry, period_ns: int) -> bool:
    if entry.cancelled:
        return True
    now = time.monotonic_ns()
    if entry.is_cancelled is None or now - entry.checked_ns < period_ns:
        return False
    entry.checked_ns = now
    try:
        gone = bool(entry.is_cancelled())
    except Exception:  # a broken connection check means the client is gone
        gone = True
    if gone:  # only ever set: a stop that cancel() set during the check (an IPC round trip) must stay set
        entry.cancelled = True
    return entry.cancelled


def _deliver(sink: Sink, output: StepOutput, entry: _Entry | None = None) -> None:
    """Hand a response to the client; if that fails the client is gone, so stop serving it."""
    try:
        sink(output)
    except Exception:
        log.exception("delivering a response for request %r failed; cancelling it", output.request_id)
        if entry is not None:
            entry.cancelled = True


def _ends_with_stop_word(seq: Sequence, stop_words: tuple[tuple[int, ...], ...]) -> bool:
    return ends_with_stop_word(seq.request.input_ids, seq.generated, stop_words)
