"""The cost model with CPU parameters measured on this host: what a decode step of the reference
backend costs, from a GEMM-by-rows probe (as bench/gemm_rows.py measures it).

A CPU is not a roofline machine for these shapes (float32 GEMMs turn compute-bound within a few rows,
oneDNN's bf16 ones step up at 16/32 rows), so instead of bandwidth and peak the CPU model uses the
measured time of each of the engine's weight GEMMs at each row count (gemm_probe.probe, the engine's
own ``Gemm`` class, one thread, row counts interleaved), linearly interpolated between the probed counts:

    t_step(rows, logit_rows) = layers x sum over (qkv, dense, fc, gate, proj) of gemm(shape, rows)
                               + gemm(lm_head, logit_rows) + other

``other`` (norms, rope, attention, sampling, scheduling) is plain decoding's measured step minus its
GEMMs. That GEMM-only view misses what a real pass pays at few rows: the probe calls each GEMM on one
weight again and again, so the weight sits in cache, while a decode pass streams every layer's
weights from memory (SmolLM2 float32 here: a 1-row engine pass measured ~46 ms against ~16 ms of
probed GEMMs), and the per-row work outside the GEMMs. So when the evaluate stage's timed engine
passes by rows fed are at hand (``forward_s``, measure.forward_probe), the target pass is that
measurement (interpolated at the rows fed) and ``other`` is plain's step minus its 1-row pass:

    t_step(rows) = forward(rows) + the method's own GEMMs (probe) + (plain step - forward(1))

Methods add their own GEMMs as on the GPU: Medusa's ResBlocks and one lm_head pass over K rows (the
heads share the base lm_head in specdeploy's heads), EAGLE's fc + drafter layer + lm_head per tree
level (level 0's lm_head over its last row only). An EAGLE level is a one-layer pass, so with
``forward_s`` it also pays one target layer's measured work outside its GEMMs (weight streaming,
norms, rope, attention): ``(forward(1) - the 1-row pass's probed GEMMs) / layers``.
"""

from __future__ import annotations

from bisect import bisect_left

from pipeline.costmodel.gemm_probe import CpuProfile, eagle_level_gemms, medusa_gemms, target_gemms
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting


def target_gemms_s(profile: CpuProfile, arch: ModelGeometry, rows: float, logit_rows: float) -> float:
    return profile.total_s(target_gemms(arch.num_layers, rows, logit_rows))


def drafting_gemms_s(profile: CpuProfile, drafting: Drafting) -> float:
    """A method's own GEMM seconds beyond the target pass: Medusa's heads, EAGLE's drafter levels."""
    if drafting.medusa_heads:
        return profile.total_s(medusa_gemms(drafting.medusa_heads, 1))
    if drafting.eagle_level_rows:
        return sum(profile.total_s(eagle_level_gemms(rows, logits)) for rows, logits in drafting.eagle_levels())
    return 0.0


def method_gemms_s(profile: CpuProfile, arch: ModelGeometry, drafting: Drafting, rows: float) -> float:
    """One step's GEMM seconds of a method feeding ``rows`` rows (plain decoding: 1 row, 1 logit row)."""
    if drafting.is_plain:
        return target_gemms_s(profile, arch, 1, 1)
    return target_gemms_s(profile, arch, rows, rows) + drafting_gemms_s(profile, drafting)


def interpolate(points: dict[int, float], x: float) -> float:
    """Linear between measured points, and beyond them from the nearest two."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def predicted_cpu_speedup(
    profile: CpuProfile,
    arch: ModelGeometry,
    drafting: Drafting,
    rows: float,
    acceptance_length: float,
    plain_step_s: float,
    forward_s: dict[int, float] | None = None,
) -> tuple[float, float]:
    """(speedup, step cost in plain steps). With ``forward_s`` (measured engine passes by rows fed): the
    target pass is that measurement at ``rows``, plus the method's own GEMMs from the probe, plus
    ``other`` = plain's measured step - its 1-row pass, plus a target layer's non-GEMM work per EAGLE
    level. Without: GEMMs from the probe only, ``other`` = plain's measured step - its probed GEMMs."""
    fed = 1.0 if drafting.is_plain else rows
    if forward_s:
        other = max(plain_step_s - interpolate(forward_s, 1), 0.0)
        layer = max(interpolate(forward_s, 1) - target_gemms_s(profile, arch, 1, 1), 0.0) / arch.num_layers
        drafter_layers = layer * len(drafting.eagle_level_rows)
        step = interpolate(forward_s, fed) + drafting_gemms_s(profile, drafting) + drafter_layers + other
    else:
        other = max(plain_step_s - method_gemms_s(profile, arch, Drafting.plain(), 1), 0.0)
        step = method_gemms_s(profile, arch, drafting, rows) + other
    return acceptance_length * plain_step_s / step, step / plain_step_s
