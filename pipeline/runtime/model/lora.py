"""LoRA in the reference engine: adapters applied unmerged, several adapters (and the base) in one step.

TensorRT-LLM's LoRA plugin adds ``x @ A^T @ (scale B)^T`` to each target projection's output, the
adapter chosen per request by ``lora_task_id``. Here, as in Punica's BGMV/SGMV kernels (Chen et al.,
arXiv 2310.18547) and S-LoRA (Sheng et al., arXiv 2311.03285), one step batches requests of
different adapters: per module, each row's A and B are gathered from the step's adapters (rank
zero-padded to the step's largest; the base's rows gather zeros) and two batched matmuls give
every row its own update. Nothing is merged into the base weights, so the base and every adapter
share them.

:class:`LoraWeights` parses one adapter from the runtime's tensors (``lora_weights`` [1, rows,
width], ``lora_config`` [1, rows, 3], see :mod:`pipeline.lora.convert`) with TensorRT-LLM's request
checks and messages (loraUtils.cpp); :class:`LoraCache` keeps them by task id with the C++
runtime's semantics (peftCacheManager.cpp, loraCache.cpp); :class:`LoraStep` is one step's grouping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.lora.rules import (
    CACHE_FULL,
    CONFIG_ROW,
    FLOAT16_MAX,
    MODULE_IDS,
    MODULE_NAMES,
    PEFT_CACHE_FULL,
    PREFETCH_FILES,
    REQUEST_CHECKS,
    UNKNOWN_TASK,
    module_dims,
)


@dataclass(frozen=True)
class LoraSettings:
    """The engine's LoRA build settings (build_config.lora_config, plugin_config.lora_plugin)."""

    max_rank: int
    modules: tuple[str, ...]  # TensorRT-LLM module names enabled at build time

    @classmethod
    def from_build_config(cls, build_config: dict, where: str) -> LoraSettings | None:
        plugin = (build_config.get("plugin_config") or {}).get("lora_plugin")
        if plugin in (None, "disable", False):
            return None
        lora = build_config.get("lora_config") or {}
        modules = tuple(lora.get("lora_target_modules") or ())
        unknown = [m for m in modules if m not in MODULE_IDS]
        if unknown or not modules:
            raise InputError(
                f"{where}: lora_config.lora_target_modules {list(modules)}: give one or more of {', '.join(MODULE_IDS)}"
            )
        rank = int(lora.get("max_lora_rank", 64))
        if rank < 1:
            raise InputError(f"{where}: lora_config.max_lora_rank must be positive, got {rank}")
        return cls(rank, modules)


def _dims(model: ModelGeometry) -> dict[int, tuple[int, int]]:
    dims = module_dims(model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.intermediate_size)
    return {MODULE_IDS[name]: io for name, io in dims.items()}


@dataclass(frozen=True)
class LoraWeights:
    """One adapter, per (layer, module id): A [r, in] and scale-folded B [out, r], float32."""

    task_id: int
    modules: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]
    nbytes: int  # what it takes in the cache (its float32 values)

    @property
    def max_rank(self) -> int:
        return max(a.shape[0] for a, _ in self.modules.values())

    @cached_property
    def module_ids(self) -> frozenset[int]:
        """The module ids it adapts on any layer."""
        return frozenset(module_id for _, module_id in self.modules)

    @classmethod
    def parse(
        cls, task_id: int, weights: np.ndarray, config: np.ndarray, model: ModelGeometry, settings: LoraSettings
    ) -> LoraWeights:
        """TensorRT-LLM's checks of a request's LoRA tensors, then the per-module split."""
        if weights.ndim != 3 or config.ndim != 3:
            raise InputError(
                "Invalid shape for lora_weights tensor" if weights.ndim != 3 else "Invalid shape for lora_keys tensor"
            )
        if weights.shape[0] != 1 or config.shape[0] != 1:
            raise InputError("Expected batch dimension to be 1 for each lora request")
        if config.dtype != np.int32:
            raise InputError(f"Expected  lora keys to have TYPE_INT32 but was {config.dtype}")
        if config.shape[1] != weights.shape[1]:
            raise InputError("Expected dim1 lora_weights and lora_keys to have the same size")
        if config.shape[2] not in (CONFIG_ROW, CONFIG_ROW + 1):
            raise InputError(f"Expected dim2 of lora_keys to have a size in [{CONFIG_ROW}, {CONFIG_ROW + 1}]")
        dims = _dims(model)
        enabled = {MODULE_IDS[m] for m in settings.modules}
        values = torch.from_numpy(np.ascontiguousarray(weights[0], dtype=np.float32))
        modules: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for row, (module_id, layer, rank, *dora) in enumerate(config[0].tolist()):
            if not 0 <= layer < model.num_layers:
                raise InputError(REQUEST_CHECKS["layer"])
            if rank <= 0:
                raise InputError(REQUEST_CHECKS["size"])
            name = MODULE_NAMES.get(module_id, str(module_id))
            if module_id not in enabled:
                raise InputError(REQUEST_CHECKS["module"].format(module=name))
            if dora and dora[0]:
                raise InputError(f"lora module {name}: DoRA is not supported by the reference backend")
            n_in, n_out = dims[module_id]
            if rank * (n_in + n_out) > values.shape[1]:
                raise InputError(REQUEST_CHECKS["few_values"].format(module=name))
            if rank > settings.max_rank:
                raise InputError(REQUEST_CHECKS["rank"].format(rank=rank, max_rank=settings.max_rank))
            a = values[row, : rank * n_in].reshape(rank, n_in).clone()
            b = values[row, rank * n_in : rank * (n_in + n_out)].reshape(n_out, rank).clone()
            for part, tensor in (("lora_A", a), ("lora_B", b)):
                # Not TensorRT-LLM's check (it serves such weights, and answers come out empty): an overflowed
                # or corrupt adapter is refused, naming where, before it reaches every request of its task.
                if not bool(torch.isfinite(tensor).all()) or float(tensor.abs().max()) >= FLOAT16_MAX:
                    raise InputError(
                        f"lora_weights row {row} (layer {layer}, {name} {part}): NaN, Inf or a float16-overflowed "
                        f"value (|x| >= {FLOAT16_MAX:g}); the adapter is corrupt"
                    )
            modules[(layer, module_id)] = (a, b)
        nbytes = sum(4 * (a.numel() + b.numel()) for a, b in modules.values())
        return cls(task_id, modules, nbytes)


@dataclass
class _Slot:
    weights: LoraWeights
    in_flight: int = 0  # requests using it now: never evicted while > 0
    pinned: bool = False  # a deployed fine-tune's adapter (prefetched): never evicted


@dataclass
class LoraCache:
    """Adapters by task id, within ``capacity_bytes``, with TensorRT-LLM's semantics:

    * a request with weights and config stores them under its task id (a task already cached keeps
      its first weights, as ``LoraCache::put`` does);
    * a request with the task id alone uses the cached adapter, or fails with
      "LoRA task <id> not found in cache. Please send LoRA weights with request";
    * when a new adapter does not fit, the least recently used adapters that no request is using
      are evicted; if that is not enough: "PEFT Cache is full. Could not store taskId=<id>".

    Unlike TensorRT-LLM's, the adapters prefetched at startup (the deployed fine-tunes) are pinned:
    no flood of client-sent adapters can push them out (which left every fine-tune failing "LoRA
    task N not found in cache" until a restart).

    >>> cache = LoraCache(capacity_bytes=0)
    >>> cache.acquire(7)
    Traceback (most recent call last):
    ...
    pipeline.errors.InputError: LoRA task 7 not found in cache. Please send LoRA weights with request
    """

    capacity_bytes: int
    client_adapters: bool = True  # False: a request may not bring an adapter the cache does not hold
    _slots: OrderedDict[int, _Slot] = field(default_factory=OrderedDict)  # least recently used first

    @property
    def used_bytes(self) -> int:
        return sum(slot.weights.nbytes for slot in self._slots.values())

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._slots

    def put(self, weights: LoraWeights, pinned: bool = False) -> None:
        """Store an adapter (``pinned``: prefetched at startup, never evicted; else sent with a request)."""
        if weights.task_id in self._slots:
            self._slots.move_to_end(weights.task_id)
            return
        need = weights.nbytes - (self.capacity_bytes - self.used_bytes)
        for task_id in [t for t, slot in self._slots.items() if slot.in_flight == 0 and not slot.pinned]:
            if need <= 0:
                break
            need -= self._slots.pop(task_id).weights.nbytes
        if need > 0:
            raise InputError(f"{PEFT_CACHE_FULL.format(task_id=weights.task_id)} ({CACHE_FULL})")
        self._slots[weights.task_id] = _Slot(weights, pinned=pinned)

    def acquire(self, task_id: int, weights: LoraWeights | None = None) -> LoraWeights:
        """The adapter for a new request (storing ``weights`` first when it brought them); the caller
        calls :meth:`release` when the request ends."""
        if weights is not None and task_id not in self._slots and not self.client_adapters:
            raise InputError(
                f"LoRA task {task_id} is not one of this server's fine-tunes, and it takes no adapters from "
                "clients (serving.lora_client_adapters: false)"
            )
        if weights is not None:
            self.put(weights)
        slot = self._slots.get(task_id)
        if slot is None:
            known = ", ".join(str(t) for t, held in self._slots.items() if held.pinned) or "none"
            hint = "" if self.client_adapters else f" (this server takes none from clients; its fine-tunes: {known})"
            raise InputError(UNKNOWN_TASK.format(task_id=task_id) + hint)
        slot.in_flight += 1
        self._slots.move_to_end(task_id)
        return slot.weights

    def release(self, task_id: int) -> None:
        slot = self._slots.get(task_id)
        if slot is not None and slot.in_flight > 0:
            slot.in_flight -= 1


def prefetch(
    cache: LoraCache, folder: Path, model: ModelGeometry, settings: LoraSettings
) -> tuple[list[int], list[str]]:
    """Load ``<folder>/<task id>/model.lora_{weights,config}.npy`` into the cache, as TensorRT-LLM's
    ``lora_prefetch_dir`` does (``PeftCacheManager::prefetchLoraWeights``): folders whose names are
    not all digits are skipped with a warning; a missing folder is no error. Returns (task ids, warnings).
    Files are read with ``allow_pickle=False``."""
    loaded: list[int] = []
    warnings: list[str] = []
    if not folder.is_dir():
        return loaded, [f"lora_prefetch_dir {folder} not found; no LoRA weights prefetched"]
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            continue
        if not entry.name.isdigit():
            warnings.append(f"lora task name {entry.name} is invalid, skipping to load lora weight from this folder.")
            continue
        try:
            weights = np.load(entry / PREFETCH_FILES[0], allow_pickle=False)
            config = np.load(entry / PREFETCH_FILES[1], allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"{entry}: cannot read the LoRA weights ({exc}); convert the adapter again") from None
        try:
            cache.put(LoraWeights.parse(int(entry.name), weights, config, model, settings), pinned=True)
        except InputError as exc:
            raise InputError(f"{entry}: {exc}") from None
        loaded.append(int(entry.name))
    return loaded, warnings


class LoraStep:
    """One step's LoRA updates, grouped by adapter: ``add(y, layer, module, x)`` adds every row's update.

    ``adapters[i]`` is item i's adapter (None: the base), ``spans[i]`` its rows [a, b). The rows are
    grouped once per step by adapter, as Punica's SGMV kernel segments them (Chen et al., arXiv
    2310.18547, section 4): per module, each distinct adapter's rows go through its own two thin GEMMs
    ``(x_rows @ A^T) @ B^T``, added in place to those rows of the projection's output; the base's rows
    are not touched. Nothing is copied per row (a per-row gather of A and B, BGMV's shape, costs an
    [rows, out, r] copy per module and made a batch-8 step with one adapter 1.34x the base step), and
    nothing per step beyond the adapters' rows (no zero-filled update over every row).
    """

    def __init__(self, adapters: Sequence[LoraWeights | None], spans: Sequence[tuple[int, int]]):
        rows_of: dict[int, list[tuple[int, int]]] = {}
        distinct: dict[int, LoraWeights] = {}
        for adapter, span in zip(adapters, spans):
            if adapter is not None:
                distinct.setdefault(adapter.task_id, adapter)
                rows_of.setdefault(adapter.task_id, []).append(span)
        self.adapters = list(distinct.values())
        self.module_ids = frozenset().union(*(a.module_ids for a in self.adapters))  # what any adapter adapts
        # per distinct adapter: its rows, a slice when they are one run (the usual case) else an index
        self.rows: list[slice | torch.Tensor] = [_rows(rows_of[a.task_id]) for a in self.adapters]

    def add(self, y: torch.Tensor, layer: int, module_id: int, x: torch.Tensor) -> torch.Tensor:
        """Adds each adapter's update of this (layer, module) to its rows of ``y`` [T, out] (a
        projection's output, or a column slice of the fused qkv's), in place, and returns ``y``.
        ``x`` [T, in] is the projection's input."""
        if module_id not in self.module_ids:  # no adapter of the step adapts it (k, o... when only q and v are)
            return y
        for rows, adapter in zip(self.rows, self.adapters):
            pair = adapter.modules.get((layer, module_id))
            if pair is None:
                continue
            a, b = pair  # A [r, in], B [out, r] (scale folded in)
            update = (x[rows] @ a.T) @ b.T  # [t, in] -> [t, r] -> [t, out]
            if isinstance(rows, slice):
                y[rows] += update
            else:
                y.index_add_(0, rows, update)
        return y


def _rows(spans: list[tuple[int, int]]) -> slice | torch.Tensor:
    """One adapter's rows: a slice when its spans are one contiguous run, else their indices."""
    spans = sorted(spans)
    if all(b == c for (_, b), (c, _) in zip(spans, spans[1:])):
        return slice(spans[0][0], spans[-1][1])
    return torch.cat([torch.arange(a, b) for a, b in spans])
