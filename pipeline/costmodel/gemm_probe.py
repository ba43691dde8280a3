"""What each weight GEMM of a model costs on this CPU by row count: the reference backend's device,
measured, because a CPU is no roofline machine for these shapes (float32 GEMMs turn compute-bound
within a few rows, oneDNN's bf16 ones step up at 16/32 rows).

:func:`probe` times the reference engine's own ``Gemm`` class (pipeline/runtime/model/gemm.py) on
each shape of one decoder layer, the lm_head and the drafters' own weights, one thread (as the
reference backend runs on a small host), row counts interleaved within every repeat (the host's speed
drifts); :class:`CpuProfile` holds the figures and interpolates between the probed row counts. The
probe calls one weight again and again, so a weight that fits the host's last-level cache sits in it:
the time to stream a pass's weights from memory is not in those figures (the CPU step models price
that on their own). A weight larger than that cache (the lm_head at any real vocabulary: SmolLM2's
is 113 MB in float32) is read from memory on every call, so its probed time already holds its
streaming; the profile names those shapes (``out_of_cache``) so a step does not charge them twice.

Every row count up to 64 is probed, not a few between which to interpolate: the host's GEMM kernels
work through the rows in blocks, so the cost is a sawtooth, not a curve. On SmolLM2's qkv (float32,
one thread) 11 rows took 188 us and 12 rows 167 us, 7 rows 150 us and 8 rows 127 us; interpolated
between 8 and 12, an 11-row Medusa or EAGLE verification pass (1 + a 10-node tree) was priced 20%
cheap on its GEMMs, and every held-out tree method with it.
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.geometry import ModelGeometry

PROBE_ROWS = (*range(1, 65), 80, 96, 128)  # every row count to 64 (see the module docstring)
LAYER_GEMMS = ("qkv", "dense", "fc", "gate", "proj")  # one decoder layer's weight GEMMs
Gemms = tuple[tuple[str, int, float], ...]  # the weight GEMMs of one pass: (shape, calls, rows a call)


def target_gemms(layers: int, rows: float, logit_rows: float) -> Gemms:
    """The target pass: every decoder layer's GEMMs over ``rows``, the lm_head over ``logit_rows``."""
    return (*((name, layers, rows) for name in LAYER_GEMMS), ("lm_head", 1, logit_rows))


def medusa_gemms(heads: int, batch: int) -> Gemms:
    """Medusa's heads pass: each head's ResBlock over one row a request, then one lm_head call over
    every head's rows (specdeploy's heads share the base lm_head)."""
    return (("medusa_resblock", heads, batch), ("lm_head", 1, batch * heads))


def eagle_level_gemms(rows: float, logit_rows: float) -> Gemms:
    """One EAGLE drafter level over ``rows``: its fc and one decoder layer, the lm_head over
    ``logit_rows``."""
    return (("eagle_fc", 1, rows), *((name, 1, rows) for name in LAYER_GEMMS), ("lm_head", 1, logit_rows))


def gemm_shapes(arch: ModelGeometry) -> dict[str, tuple[int, int]]:
    """(out, in) of each weight GEMM of one decoder layer, the lm_head and the EAGLE fc."""
    h, d = arch.hidden_size, arch.head_dim
    return {
        "qkv": ((arch.num_heads + 2 * arch.num_kv_heads) * d, h),
        "dense": (h, arch.num_heads * d),
        "fc": (arch.intermediate_size, h),
        "gate": (arch.intermediate_size, h),
        "proj": (h, arch.intermediate_size),
        "lm_head": (arch.vocab_size, h),
        "eagle_fc": (h, 2 * h),
        "medusa_resblock": (h, h),
    }


@dataclass(frozen=True)
class CpuProfile:
    """Measured seconds of each GEMM shape at the probed row counts."""

    rows: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]  # by shape name, one per probed row count
    out_of_cache: frozenset[str] = frozenset()  # shapes whose weight outgrew the last-level cache

    def to_dict(self) -> dict:
        return {
            "rows": list(self.rows),
            "seconds": {name: list(s) for name, s in self.seconds.items()},
            "out_of_cache": sorted(self.out_of_cache),
        }

    @classmethod
    def from_dict(cls, data: dict) -> CpuProfile:
        seconds = {name: tuple(s) for name, s in data["seconds"].items()}
        return cls(tuple(data["rows"]), seconds, frozenset(data.get("out_of_cache", ())))

    @classmethod
    def fastest(cls, profiles: list[CpuProfile]) -> CpuProfile:
        """Entry by entry, the fastest of probes of the same shapes and rows taken at different moments
        (on a shared host noise only adds time); a shape is out of cache if it was in every probe."""
        first = profiles[0]
        if any(p.rows != first.rows or p.seconds.keys() != first.seconds.keys() for p in profiles):
            raise ValueError("the probes differ in their shapes or row counts")
        seconds = {n: tuple(map(min, zip(*(p.seconds[n] for p in profiles)))) for n in first.seconds}
        return cls(first.rows, seconds, frozenset.intersection(*(p.out_of_cache for p in profiles)))

    def total_s(self, gemms: Gemms) -> float:
        return sum(calls * self.gemm_s(name, rows) for name, calls, rows in gemms)

    def gemm_s(self, name: str, rows: float) -> float:
        if rows <= 0:
            return 0.0
        xs, ys = self.rows, self.seconds[name]
        if rows >= xs[-1]:  # beyond the probe: linear in the rows from the last two points
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (rows - xs[-1])
        i = max(bisect_left(xs, rows), 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


def probe(
    arch: ModelGeometry,
    bf16: bool,
    repeats: int = 5,
    rows: tuple[int, ...] = PROBE_ROWS,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> CpuProfile:
    """Time the engine's Gemm for every shape and row count, one thread, row counts interleaved; each
    figure is ``statistic`` of its ``repeats`` timings."""
    import torch

    from pipeline.runtime.model.gemm import Gemm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        out: dict[str, tuple[float, ...]] = {}
        for name, (n_out, n_in) in gemm_shapes(arch).items():
            gemm = Gemm(torch.randn(n_out, n_in, generator=gen) * 0.02, bf16=bf16)
            inputs = {m: torch.randn(m, n_in, generator=gen) for m in rows}
            # ~1 ms or more per timing: 20M multiply-adds, the calls fewer as the rows grow
            calls = {m: max(1, min(1000, 20_000_000 // (n_out * n_in * m))) for m in rows}
            times: dict[int, list[float]] = {m: [] for m in rows}
            for _ in range(repeats):
                for m in rows:
                    start = time.thread_time()
                    for _ in range(calls[m]):
                        gemm(inputs[m])
                    times[m].append((time.thread_time() - start) / calls[m])
            out[name] = tuple(statistic(times[m]) for m in rows)
        cache = last_level_cache_bytes()
        weight_bytes = 2 if bf16 else 4
        too_big = frozenset(
            name for name, (n_out, n_in) in gemm_shapes(arch).items() if cache and n_out * n_in * weight_bytes > cache
        )
        return CpuProfile(tuple(rows), out, too_big)
    finally:
        torch.set_num_threads(before)


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of this host's highest cache level (Linux sysfs), or None where it cannot be read."""
    levels: dict[int, int] = {}
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in sorted(cpu.glob("index*")):
        try:
            level, size = (index / "level").read_text().strip(), (index / "size").read_text().strip()
        except OSError:
            continue
        if level.isdigit() and size[:-1].isdigit() and size[-1] in units:
            levels[int(level)] = max(levels.get(int(level), 0), int(size[:-1]) * units[size[-1]])
    return levels[max(levels)] if levels else None
