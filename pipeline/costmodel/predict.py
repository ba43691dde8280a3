"""Predicted speedup of a method over plain decoding at each batch size.

``speedup(b) = acceptance_length x t_plain(b) / t_method(b)``: a step of the method produces
``acceptance_length`` tokens per request (1 + accepted draft tokens, the mean acceptance length
``return_perf_metrics`` reports) at the price of one method step, where plain decoding produces one
token per plain step. Times come from :mod:`pipeline.costmodel.pricing`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.costmodel.lora import LoraLoad, add_lora
from pipeline.costmodel.pricing import method_step, target_step
from pipeline.costmodel.step import Deployment
from pipeline.methods.drafting import Drafting


@dataclass(frozen=True, kw_only=True)
class BatchPrediction:
    batch: int
    plain_s: float
    method_s: float
    speedup: float
    parts: dict[str, float]  # the method step's parts, seconds

    def to_dict(self) -> dict:
        return {
            "plain_ms": self.plain_s * 1e3,
            "method_ms": self.method_s * 1e3,
            "parts_ms": {k: v * 1e3 for k, v in self.parts.items()},
        }


def predict(
    deployment: Deployment,
    drafting: Drafting,
    acceptance_length: float,
    batches: Iterable[int],
    lora: LoraLoad | None = None,
) -> list[BatchPrediction]:
    """One prediction per batch size. ValueError for an acceptance length outside [1, rows].

    With ``lora``, the method's step carries the LoRA parts (pipeline/costmodel/lora.py) and the
    speedup stays over plain decoding without LoRA."""
    if not 1.0 <= acceptance_length <= drafting.rows:
        raise ValueError(
            f"acceptance length {acceptance_length} must be between 1 and the rows a step feeds ({drafting.rows})"
        )
    out = []
    for batch in batches:
        if batch < 1:
            raise ValueError(f"batch size {batch} must be >= 1")
        plain = target_step(deployment, batch, 1, logit_rows=1).total_s
        step = method_step(deployment, drafting, batch)
        if lora is not None:
            add_lora(step, deployment, lora, batch * drafting.rows)
        out.append(
            BatchPrediction(
                batch=batch,
                plain_s=plain,
                method_s=step.total_s,
                speedup=acceptance_length * plain / step.total_s,
                parts=dict(step.parts),
            )
        )
    return out


def break_even_batch(
    deployment: Deployment, drafting: Drafting, acceptance_length: float, limit: int = 1024
) -> int | None:
    """The smallest batch size (powers of two up to ``limit``) where the method no longer beats plain
    decoding, or None if it pays up to ``limit``."""
    batch = 1
    while batch <= limit:
        (p,) = predict(deployment, drafting, acceptance_length, [batch])
        if p.speedup < 1.0:
            return batch
        batch *= 2
    return None
