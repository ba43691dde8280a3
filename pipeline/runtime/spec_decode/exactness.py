"""How far a speculative output may be from plain decoding on a bfloat16 engine, and why.

On float32 engines every method's greedy output equals plain greedy decoding token for token.
On bfloat16 engines (gemm.py) a GEMM row does not depend on the other rows of the call, but
attention sums in a different order in a tree pass than in single-token steps; rounding the
next GEMM's input to bf16 can turn that 1e-7 difference into a few bf16 steps of a logit. So
greedy outputs are identical except where plain decoding itself was at a near-tie: the first
token that differs must be one whose logit is within a few bf16 steps of plain decoding's
choice. :func:`divergence` measures that gap; tests and bench/speculative.py report it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.runtime.model.engine import Engine, Logits, StepInput

# A divergence within this many bf16 steps (of the larger logit) is round-off, not a wrong draft.
NEAR_TIE_BF16_STEPS = 8


@dataclass(frozen=True)
class Divergence:
    position: int  # index of the first differing generated token
    plain_token: int
    other_token: int
    gap_bf16_steps: float  # plain decoding's logit(plain_token) - logit(other_token), in bf16 steps


def bf16_step(value: float) -> float:
    """The spacing of bfloat16 numbers (8 significant bits) around ``value``."""
    return 2.0 ** (math.floor(math.log2(max(abs(value), 1e-30))) - 7)


def divergence(engine: Engine, prompt: list[int], plain: list[int], other: list[int]) -> Divergence | None:
    """None if ``other`` equals ``plain`` (or is a prefix-equal early stop); else where and by how much
    it leaves plain decoding, judged by plain decoding's own logits at that position."""
    at = next((i for i, (p, o) in enumerate(zip(plain, other)) if p != o), None)
    if at is None:
        return None
    context = prompt + plain[:at]
    (rows,) = engine.forward([StepInput(engine.new_cache(len(context)), context, Logits.LAST)])
    logits = rows.logits[-1]
    a, b = float(logits[plain[at]]), float(logits[other[at]])
    return Divergence(at, plain[at], other[at], (a - b) / bf16_step(max(abs(a), abs(b))))
