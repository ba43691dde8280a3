"""The LoRA step price on this host's CPU, from a probe of the reference engine's LoRA work by rows.

As the CPU model of the base passes does (it takes the engine's own passes, timed by rows fed), the
LoRA price on CPU is no roofline: :func:`probe` runs the reference engine's own decoding passes
with random adapters and times its LoRA code where it runs (``LoraStep.add``: per adapter, its rows'
two thin GEMMs added in place to each target projection's output; one thread), per target module,
at each probed row count, three ways:

* ``whole``: one adapter on every row of the step (its rows one run: a slice);
* ``first``: one adapter on every other row, the others the base's (its rows gathered by index);
* ``next``: what each further adapter adds, from passes that interleave four adapters' rows:
  (four groups - ``first``) / 3 (an average over three groups, where the difference of a pair and
  ``first`` would carry both timings' noise into every group of a many-adapter step);

and :meth:`LoraCpuProfile.step_s` predicts a step as

    one adapter:  layers x sum over modules of whole(module, rows)
    N adapters:   layers x sum over modules of first(module, rows_1) + sum over groups 2..N of
                  next(module, rows_g)

with the rows split as evenly as the requests allow (:func:`group_sizes`), interpolated between
probed row counts. Probe the row counts a price needs rather than interpolate: the thin GEMMs'
cost is a sawtooth in the rows as the weights' GEMMs are (pipeline/costmodel/gemm_probe.py; rank 64
on SmolLM2's q projection, one thread: 17.5 us at 3 rows, 16.0 at 4, 26.8 at 7, 23.7 at 8), so a
3-row group priced between 2 and 4 rows comes out ~20% cheap. bench/costmodel_lora.py measures
decode steps of more requests, mixing more adapters than the probe's passes, and prints the
predicted against the measured LoRA time of each step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pipeline.costmodel.cpu import interpolate
from pipeline.costmodel.lora import LoraLoad, module_features
from pipeline.geometry import ModelGeometry
from pipeline.lora.rules import HF_TO_TRTLLM, MODULE_IDS
from pipeline.runtime.model.engine import Engine, StepInput
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.model.lora import LoraStep, LoraWeights


@dataclass(frozen=True)
class LoraCpuProfile:
    """Seconds of one module's LoRA work in a layer, by rows, as the engine's passes spend it: whole
    (one adapter over every row), the first gathered group, and each further group (module docstring)."""

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
        sizes = group_sizes(rows, load.adapters)
        if len(sizes) == 1:
            return arch.num_layers * sum(interpolate(self.whole[m], rows) for m in load.modules)
        per_layer = sum(
            interpolate(self.first[m], sizes[0]) + sum(interpolate(self.next[m], n) for n in sizes[1:])
            for m in load.modules
        )
        return arch.num_layers * per_layer


def group_sizes(rows: int, adapters: int) -> list[int]:
    """The rows of each adapter's group in a step of ``rows`` rows mixing ``adapters`` adapters, split as
    evenly as the rows allow: 6 rows, 4 adapters -> [2, 2, 1, 1]."""
    groups = max(1, min(adapters, rows))
    return [rows // groups + (1 if g < rows % groups else 0) for g in range(groups)]


CONTEXT = 16  # tokens in each probed request's cache before its timed passes
DECODED = 2  # the token each decode pass feeds (any id of the vocabulary)


def random_adapters(
    arch: ModelGeometry, rank: int, modules: tuple[str, ...], n: int, gen: torch.Generator
) -> list[LoraWeights]:
    """n adapters (task ids 1..n) of ``rank`` on ``modules`` of every layer, as the engine's LoRA cache
    holds them: per (layer, module id) A [r, in] and B [out, r], scale folded in."""
    adapters = []
    for task in range(1, n + 1):
        weights = {}
        for layer in range(arch.num_layers):
            for m in modules:
                n_in, n_out = module_features(arch, m)
                a = torch.randn(rank, n_in, generator=gen) * 0.02
                weights[layer, MODULE_IDS[HF_TO_TRTLLM[m]]] = (a, torch.randn(n_out, rank, generator=gen) * 0.02)
        adapters.append(LoraWeights(task, weights, sum(4 * (a.numel() + b.numel()) for a, b in weights.values())))
    return adapters


def clock_pair_s() -> float:
    """What one ``time.thread_time()`` pair costs, to take out of every timed call."""
    n = 20000
    start = time.thread_time()
    for _ in range(n):
        time.thread_time()
    return (time.thread_time() - start) / n


@contextmanager
def lora_timed(engine: Engine) -> Iterator[dict[int, float]]:
    """The engine's LoRA code timed where it runs, while in the block: every ``add`` that has work (a
    module some adapter of the step adapts) adds its CPU seconds to the yielded ``spent[module id]``
    (clear it between steps); the others return at once, untimed (a clock around them would cost
    more than they do)."""
    spent: dict[int, float] = {}
    clock = clock_pair_s()

    class Timed(LoraStep):
        def add(self, y: torch.Tensor, layer: int, module_id: int, x: torch.Tensor) -> torch.Tensor:
            if module_id not in self.module_ids:
                return y
            start = time.thread_time()
            super().add(y, layer, module_id, x)
            spent[module_id] = spent.get(module_id, 0.0) + time.thread_time() - start - clock
            return y

    before, engine.lora_step = engine.lora_step, Timed
    try:
        yield spent
    finally:
        engine.lora_step = before


def prefilled(engine: Engine, requests: int, steps: int) -> list[KVCache]:
    """Caches of ``requests`` requests with their ``CONTEXT``-token prompts in, room for ``steps``
    more tokens. The prompts are all the same, so one is prefilled and copied (a copy is a memcpy;
    prefilling every request was most of a probe's time)."""
    first = engine.new_cache(CONTEXT + steps)
    engine.forward([StepInput(first, list(range(1, 1 + CONTEXT)))])
    return [first, *(first.fork() for _ in range(requests - 1))]


def decode_passes(engine: Engine, loras: list[LoraWeights | None], passes: int) -> list[dict[int, float]]:
    """``passes`` decode steps of ``len(loras)`` requests (one row each, ``CONTEXT`` tokens cached), the
    i-th with adapter ``loras[i]`` (None: the base): per step, the engine's LoRA seconds per module id."""
    caches = prefilled(engine, len(loras), passes)
    found = []
    with lora_timed(engine) as spent:
        for _ in range(passes):
            spent.clear()
            engine.forward([StepInput(c, [DECODED], lora=lora) for c, lora in zip(caches, loras)])
            found.append(dict(spent))
    return found


def probe(engine: Engine, load: LoraLoad, rows: tuple[int, ...], repeats: int = 3) -> LoraCpuProfile:
    """Time the engine's LoRA code per target module in its own decoding passes (module docstring)
    at each of ``rows`` (the row counts a price will need: every batch and adapter group size,
    :func:`group_sizes`): ``repeats`` passes each way, the median. One thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        arch = engine.config.model
        four = random_adapters(arch, load.rank, load.modules, 4, torch.Generator().manual_seed(0))
        # per way, the requests' adapters of one pass, repeated m times
        ways: dict[str, list[LoraWeights | None]] = {"whole": [four[0]], "first": [four[0], None], "four": [*four]}
        med: dict[tuple[str, str, int], float] = {}
        for m in rows:
            for kind, pattern in ways.items():
                steps = decode_passes(engine, pattern * m, repeats)
                for module in load.modules:
                    module_id = MODULE_IDS[HF_TO_TRTLLM[module]]
                    med[kind, module, m] = statistics.median(s[module_id] for s in steps) / arch.num_layers

        def table(of: Callable[[str, int], float]) -> dict[str, dict[int, float]]:
            return {module: {m: of(module, m) for m in rows} for module in load.modules}

        return LoraCpuProfile(
            load.rank,
            whole=table(lambda module, m: med["whole", module, m]),
            first=table(lambda module, m: med["first", module, m]),
            next=table(lambda module, m: max(med["four", module, m] - med["first", module, m], 0.0) / 3),
        )
    finally:
        torch.set_num_threads(before)
