"""Which GPUs each engine of one server runs on: the one rule the fleet placement and the LoRA decision use.

The spec's ``serving.gpu_device_ids`` first (they are not ours to move), then the largest engines
first, each on its ``ranks`` least loaded GPUs (ties: the lower index). Plain data in, plain data out,
so that the planner's LoRA decision can place engines before the plan exists.

>>> gpus, load = assign_gpus([Engine("a", 1, 30.0), Engine("b", 1, 20.0), Engine("c", 1, 5.0, (0,))], 2)
>>> gpus
{'c': (0,), 'a': (1,), 'b': (0,)}
>>> load
[25.0, 30.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str
    ranks: int  # tp x pp: one GPU each
    gib: float  # memory per GPU
    device_ids: tuple[int, ...] | None = None  # the spec's serving.gpu_device_ids


def assign_gpus(engines: Sequence[Engine], count: int) -> tuple[dict[str, tuple[int, ...]], list[float]]:
    """(engine name -> its GPUs, GiB placed on each of the ``count`` GPUs). Device ids outside 0..count-1
    and engines with more ranks than GPUs are the caller's to refuse; here they take what there is."""
    gpus_of: dict[str, tuple[int, ...]] = {}
    load = [0.0] * count
    for engine in engines:
        if engine.device_ids is not None:
            gpus_of[engine.name] = engine.device_ids
            for index in engine.device_ids:
                if 0 <= index < count:
                    load[index] += engine.gib
    for engine in sorted((e for e in engines if e.device_ids is None), key=lambda e: -e.gib):
        chosen = tuple(sorted(sorted(range(count), key=lambda i: (load[i], i))[: engine.ranks]))
        gpus_of[engine.name] = chosen
        for index in chosen:
            load[index] += engine.gib
    return gpus_of, load
