"""The LoRA step price on this host's CPU, from a probe of one module's LoRA work by rows.

As :mod:`pipeline.costmodel.cpu` does for the base GEMMs, the CPU model does not use a roofline: it
times the real unmerged LoRA computation of each target module (:func:`lora_update`, float32 torch,
one thread) at each probed row count, in its place after the module's base projection (a probe of a
few layers: see :func:`probe`), as one group over every row (a step of one adapter: ``whole``) and
as gathered groups (a step mixing adapters: each group's rows gathered, the two thin GEMMs, the
result scattered back; the ``first`` group after the base projection, and each ``next`` one), and
predicts a step as

    one adapter:  layers x sum over modules of whole(module, rows)
    N adapters:   layers x sum over modules of first(module, rows_1) + sum over groups 2..N of
                  next(module, rows_g)

with the rows split as evenly as the requests allow (interpolated between probed row counts).
bench/costmodel_lora.py measures the same computation over a whole step (every layer's own weights,
the base projections around it) and prints predicted against measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from pipeline.costmodel.cpu import interpolate
from pipeline.costmodel.lora import LORA_MODULES, LoraLoad, module_features
from pipeline.geometry import ModelGeometry

PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Group:
    """The rows of one adapter in a step."""

    adapter: int
    rows: torch.Tensor  # [n] int64 row indices, None-free; every row when the step has one adapter


def groups_of(adapter_per_row: torch.Tensor) -> list[Group]:
    """One group per distinct adapter, rows in order (what S-LoRA / Punica batch together).

    >>> [(g.adapter, g.rows.tolist()) for g in groups_of(torch.tensor([2, 0, 2, 1]))]
    [(0, [1]), (1, [3]), (2, [0, 2])]
    """
    order = torch.argsort(adapter_per_row, stable=True)
    ids, counts = torch.unique_consecutive(adapter_per_row[order], return_counts=True)
    return [Group(int(a), rows) for a, rows in zip(ids.tolist(), order.split(counts.tolist()))]


def lora_update(
    y: torch.Tensor,  # [rows, out] the base projection's output, updated in place
    x: torch.Tensor,  # [rows, in]
    a: list[torch.Tensor],  # per adapter [r, in]
    b: list[torch.Tensor],  # per adapter [out, r], the scaling alpha / r folded in
    groups: list[Group],
) -> torch.Tensor:
    """``y[rows_g] += x[rows_g] @ A_g^T @ B_g^T`` for every group g; one group over every row skips the
    gather and scatter."""
    if len(groups) == 1 and groups[0].rows.numel() == x.shape[0]:
        g = groups[0].adapter
        return y.addmm_(x @ a[g].T, b[g].T)
    for group in groups:
        shrunk = x.index_select(0, group.rows) @ a[group.adapter].T
        y.index_add_(0, group.rows, shrunk @ b[group.adapter].T)
    return y


@dataclass(frozen=True)
class LoraCpuProfile:
    """Seconds of one module's LoRA work by rows, right after the module's base projection: whole (one
    adapter over every row), the first gathered group, and each further group."""

    rank: int
    whole: dict[str, dict[int, float]]  # by module, by rows
    first: dict[str, dict[int, float]]
    next: dict[str, dict[int, float]]

    @classmethod
    def median(cls, profiles: list[LoraCpuProfile]) -> LoraCpuProfile:
        """Entry by entry, the median of probes taken at different moments (this host's speed drifts)."""

        def med(kind: str) -> dict[str, dict[int, float]]:
            first = getattr(profiles[0], kind)
            return {
                m: {r: statistics.median(getattr(p, kind)[m][r] for p in profiles) for r in first[m]} for m in first
            }

        return cls(profiles[0].rank, med("whole"), med("first"), med("next"))

    def step_s(self, arch: ModelGeometry, load: LoraLoad, rows: int) -> float:
        """Predicted LoRA seconds of a step of ``rows`` rows mixing ``load.adapters`` adapters."""
        if load.rank != self.rank:
            raise ValueError(f"probed at rank {self.rank}, asked for rank {load.rank}")
        groups = min(load.adapters, rows)
        if groups == 1:
            return arch.num_layers * sum(interpolate(self.whole[m], rows) for m in load.modules)
        sizes = [rows // groups + (1 if g < rows % groups else 0) for g in range(groups)]
        per_layer = sum(
            interpolate(self.first[m], sizes[0]) + sum(interpolate(self.next[m], n) for n in sizes[1:])
            for m in load.modules
        )
        return arch.num_layers * per_layer


LAYERS = 4  # decoder layers the probe walks, each with its own base and adapter weights


def probe(arch: ModelGeometry, load: LoraLoad, repeats: int = 5, rows: tuple[int, ...] = PROBE_ROWS) -> LoraCpuProfile:
    """Time :func:`lora_update` of each target module at each row count in its place in a pass: a walk
    over ``LAYERS`` layers of every module's base projection (the engine's float32 Gemm) with the
    target modules' LoRA updates after theirs, so each update finds the caches a pass leaves it (the
    base GEMMs stream megabytes of weights between updates). One thread; the median of every call."""
    from pipeline.runtime.model.gemm import Gemm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        layers = []
        for _ in range(LAYERS):
            base, adapters = {}, {}
            for module in LORA_MODULES:
                n_in, n_out = module_features(arch, module)
                base[module] = Gemm(torch.randn(n_out, n_in, generator=gen) * 0.02)
                adapters[module] = (
                    [torch.randn(load.rank, n_in, generator=gen) * 0.02 for _ in range(2)],
                    [torch.randn(n_out, load.rank, generator=gen) * 0.02 for _ in range(2)],
                )
            layers.append((base, adapters))
        widths = {module_features(arch, m)[0] for m in LORA_MODULES}
        xs = {m: {n: torch.randn(2 * m, n, generator=gen) for n in widths} for m in rows}
        times: dict[tuple[str, str, int], list[float]] = {
            (kind, module, m): [] for kind in ("whole", "first", "next") for module in load.modules for m in rows
        }
        for _ in range(repeats):
            for m in rows:
                whole = [Group(0, torch.arange(m))]
                mixed = [Group(0, torch.arange(0, 2 * m, 2)), Group(1, torch.arange(1, 2 * m, 2))]
                for base, adapters in layers:  # one adapter over m rows
                    for module in LORA_MODULES:
                        x = xs[m][module_features(arch, module)[0]][:m]
                        y = base[module](x)
                        if module in load.modules:
                            a, b = adapters[module]
                            start = time.thread_time()
                            lora_update(y, x, a, b, whole)
                            times["whole", module, m].append(time.thread_time() - start)
                for base, adapters in layers:  # two adapters of m rows each, interleaved
                    for module in LORA_MODULES:
                        x = xs[m][module_features(arch, module)[0]]
                        y = base[module](x)
                        if module in load.modules:
                            a, b = adapters[module]
                            t0 = time.thread_time()
                            lora_update(y, x, a, b, mixed[:1])
                            t1 = time.thread_time()
                            lora_update(y, x, a, b, mixed[1:])
                            t2 = time.thread_time()
                            times["first", module, m].append(t1 - t0)
                            times["next", module, m].append(t2 - t1)
        out: dict[str, dict[str, dict[int, float]]] = {
            kind: {module: {m: statistics.median(times[kind, module, m]) for m in rows} for module in load.modules}
            for kind in ("whole", "first", "next")
        }
        return LoraCpuProfile(load.rank, out["whole"], out["first"], out["next"])
    finally:
        torch.set_num_threads(before)
