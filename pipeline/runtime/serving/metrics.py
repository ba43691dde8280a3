"""Metrics of the reference backend: speculative-decoding counters (vLLM style) and their Prometheus export.

Speculative decoding, per request and per server (:class:`SpecDecodingStats`). Definitions, as
vLLM v1 (``vllm/v1/spec_decode/metrics.py``) computes them, with "draft" = one verification step:

* ``verification_steps``: generation steps after the prompt (one forward pass each, whether or
  not the method found anything to draft that step); a request's ``forward_steps``
  (RequestMetrics) count one more, the step that ended its prefill and chose its first token;
* ``draft_tokens``: draft tokens verified (tree nodes for Medusa / EAGLE, verification-branch
  n-gram nodes for Lookahead; the Lookahead window itself is not a draft);
* ``accepted_tokens``: draft tokens accepted (the bonus token the target model adds each step
  is not counted);
* ``accepted_per_position[k]``: steps that accepted a draft at depth k + 1 (an accepted path is
  always a prefix, so this is the number of steps that accepted more than k drafts);
* mean acceptance length = 1 + accepted_tokens / verification_steps (tokens per forward pass);
* acceptance rate = accepted_tokens / draft_tokens (TensorRT-LLM's ``acceptance_rate`` output);
* acceptance at position k = accepted_per_position[k] / verification_steps.

Prometheus (through Triton's custom-metrics API, served on the metrics port next to Triton's own
``nv_*`` metrics). The counters are cumulative, so rates come out of PromQL:

* mean acceptance length = 1 + rate(specdeploy_reference_spec_decode_num_accepted_tokens_total[1m])
  / rate(specdeploy_reference_spec_decode_num_drafts_total[1m])
* acceptance rate = rate(..._num_accepted_tokens_total[1m]) / rate(..._num_draft_tokens_total[1m])
* acceptance at position k = rate(..._num_accepted_tokens_per_pos_total{position="k"}[1m])
  / rate(..._num_drafts_total[1m])

and one gauge, ``specdeploy_reference_requests_in_flight``: the sequences queued or generating,
updated on every submit and at the end of every step (a request whose client went away leaves it
at the step that drops it, within ``cancellation_check_period_ms``).

The MetricFamily objects are kept on this object for the model's lifetime: once one is garbage
collected every later ``increment`` raises "the corresponding 'MetricFamily' has been deleted"
(seen with tritonserver 2.51 from nvidia-pytriton 0.7). Outside Triton (tests, benchmarks)
``pb_utils`` is None and the export is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.runtime.request import RequestMetrics


@dataclass
class SpecDecodingStats:
    """Speculative-decoding counters; see the module docstring for the definitions."""

    verification_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def observe(self, draft_tokens: int, accepted_tokens: int) -> None:
        """One verification step that proposed ``draft_tokens`` and accepted a path of ``accepted_tokens``."""
        self.verification_steps += 1
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted_tokens
        if len(self.accepted_per_position) < accepted_tokens:
            self.accepted_per_position += [0] * (accepted_tokens - len(self.accepted_per_position))
        for k in range(accepted_tokens):
            self.accepted_per_position[k] += 1

    def merge(self, other: SpecDecodingStats) -> None:
        self.verification_steps += other.verification_steps
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        for k, count in enumerate(other.accepted_per_position):
            if k == len(self.accepted_per_position):
                self.accepted_per_position.append(0)
            self.accepted_per_position[k] += count

    @property
    def mean_acceptance_length(self) -> float:
        steps = self.verification_steps
        return 1.0 + self.accepted_tokens / steps if steps else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def acceptance_per_position(self, positions: int | None = None) -> list[float]:
        n = len(self.accepted_per_position) if positions is None else positions
        counts = self.accepted_per_position + [0] * max(0, n - len(self.accepted_per_position))
        return [c / self.verification_steps if self.verification_steps else 0.0 for c in counts[:n]]

    def summary(self) -> str:
        """One log line, as vLLM's SpecDecodingLogging prints it."""
        per_pos = ", ".join(f"{r:.3f}" for r in self.acceptance_per_position())
        return (
            f"mean acceptance length {self.mean_acceptance_length:.2f}, acceptance rate "
            f"{self.acceptance_rate:.3f} ({self.accepted_tokens}/{self.draft_tokens} draft tokens, "
            f"{self.verification_steps} steps), per-position acceptance [{per_pos}]"
        )


@dataclass(frozen=True)
class StepStats:
    """What one scheduler step did, for metrics."""

    batch_size: int  # requests in the forward pass
    input_tokens: int  # tokens fed to the forward pass (<= max_num_tokens)
    prefill_tokens: int
    generated_tokens: int  # tokens handed to clients this step
    seconds: float
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)  # this step's verification steps


class BackendMetrics:
    def __init__(self, pb_utils: Any | None, labels: dict[str, str], draft_positions: int = 0):
        """``draft_positions``: the method's deepest draft (per-position series 0..draft_positions-1)."""
        self._families: list[Any] = []
        # Triton metrics (pb_utils.Metric); None outside Triton, where every update is a no-op.
        self.tokens: Any = None
        self.steps: Any = None
        self.requests: Any = None
        self.batch: Any = None
        self.step_ms: Any = None
        self.in_flight: Any = None
        self.drafts: Any = None
        self.draft_tokens: Any = None
        self.accepted_tokens: Any = None
        self.per_position: list[Any] = []
        if pb_utils is None or not hasattr(pb_utils, "MetricFamily"):
            return
        family = pb_utils.MetricFamily

        def make_family(name: str, description: str, kind: Any) -> Any:
            fam = family(name=name, description=description, kind=kind)
            self._families.append(fam)
            return fam

        def make(name: str, description: str, kind: Any) -> Any:
            return make_family(name, description, kind).Metric(labels=labels)

        self.tokens = make("specdeploy_reference_generated_tokens_total", "Tokens returned to clients", family.COUNTER)
        self.steps = make(
            "specdeploy_reference_steps_total", "Engine forward steps (in-flight batches)", family.COUNTER
        )
        self.requests = make("specdeploy_reference_requests_total", "Requests finished (any reason)", family.COUNTER)
        self.batch = make("specdeploy_reference_batch_size", "Requests in the last forward step", family.GAUGE)
        self.step_ms = make("specdeploy_reference_step_milliseconds", "Duration of the last forward step", family.GAUGE)
        self.in_flight = make(
            "specdeploy_reference_requests_in_flight",
            "Sequences queued or generating (a cancelled or abandoned one leaves at the next step)",
            family.GAUGE,
        )
        prefix = "specdeploy_reference_spec_decode"
        self.drafts = make(
            f"{prefix}_num_drafts_total",
            "Speculative verification steps (generation steps after the prompt)",
            family.COUNTER,
        )
        self.draft_tokens = make(f"{prefix}_num_draft_tokens_total", "Draft tokens verified", family.COUNTER)
        self.accepted_tokens = make(f"{prefix}_num_accepted_tokens_total", "Draft tokens accepted", family.COUNTER)
        per_pos = make_family(
            f"{prefix}_num_accepted_tokens_per_pos_total",
            "Verification steps that accepted a draft at this position (0 = depth 1)",
            family.COUNTER,
        )
        self.per_position = [per_pos.Metric(labels={**labels, "position": str(k)}) for k in range(draft_positions)]

    def on_step(self, stats: StepStats) -> None:
        if self.steps is None:
            return
        self.steps.increment(1)
        if stats.generated_tokens:
            self.tokens.increment(stats.generated_tokens)
        self.batch.set(stats.batch_size)
        self.step_ms.set(stats.seconds * 1000.0)
        spec = stats.spec
        if spec.verification_steps:
            self.drafts.increment(spec.verification_steps)
            if spec.draft_tokens:
                self.draft_tokens.increment(spec.draft_tokens)
            if spec.accepted_tokens:
                self.accepted_tokens.increment(spec.accepted_tokens)
            for metric, count in zip(self.per_position, spec.accepted_per_position):
                if count:
                    metric.increment(count)

    def on_active(self, count: int) -> None:
        if self.in_flight is not None:
            self.in_flight.set(count)

    def on_finished(self) -> None:
        if self.requests is not None:
            self.requests.increment(1)


@dataclass
class SpecRequestMetrics(RequestMetrics):
    """A request's metrics plus its speculative-decoding counters (``StepOutput.metrics.spec``).

    RequestMetrics already carries total_draft_tokens / total_accepted_draft_tokens (what Triton
    returns); ``spec`` adds verification steps and per-position acceptance for the same request.
    """

    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
