"""Which LoRA fine-tunes share the base's LoRA engine and which get a merged engine of their own.

A fine-tune of a base can be served two ways:

* **shared**: its adapter is loaded into the one engine built with the LoRA plugin for the base (one
  engine for every shared fine-tune; the adapter costs ``adapter_gib`` on each GPU of that engine).
  Its steps pay the LoRA GEMMs and the adapter mixing (pipeline/costmodel/lora.py). On the engine
  flow it decodes plainly (TensorRT-LLM 1.2.1 does not combine LoRA with Medusa, EAGLE or Lookahead),
  so its speedup is at most 1.0x; on the PyTorch backend it runs ``SharedEngine.method`` (NGram, or
  EAGLE-3 with the base's drafter) with the adapters on the target, and the caller weighs one fleet
  per such method (:func:`pipeline.lora.auto.best_shared_engine`);
* **merged**: the adapter is merged into a full copy of the weights, built as an engine of its own
  with its own method and KV cache: ``per_gpu_gib`` on each of ``world_size`` GPUs, at the method's
  predicted speedup.

Speedups are over plain decoding of the base (no LoRA, no speculation) at the fleet's concurrency.

**The objective.** Variant ``i`` receives the share ``w_i`` of the fleet's generated tokens
(``traffic.share``, normalized to sum to 1; default equal) and produces them at ``s_i`` times plain
decoding's rate under its choice. The engines time-share the GPUs, so one token of the mix takes
``sum_i w_i / s_i`` plain-token times, and the fleet's predicted speedup is

    S(x) = 1 / sum_i (w_i / s_i(x_i))

over x_i in {shared} and {merged on g} for every set g of world_size GPUs. S is maximized, i.e.
``sum_i w_i / s_i(x_i)`` minimized (linear in the choices), subject to, on every GPU j:

    [some fine-tune shared or the base served] x shared_gib_j + min(sum_{i shared} adapter_gib_i, cap)
        + sum_{i merged on a set holding j} per_gpu_gib_i  <=  free_gib_j

(the shared engine, base weights + KV cache + the LoRA cache's workspace, is paid once when anything
uses it; its LoRA cache holds each shared adapter, but never more than ``cache_cap_gib``: one batch's
worth of adapters is all a step needs on the GPU, the rest wait in the host cache; "<=" holds to
1e-9 GiB: the memory rows go to the solver in KiB, below its own tolerance).
Among equal objectives the choice with the least merged memory wins, then the one with the fewest
merged engines.

**The method.** A 0/1 integer program (a multiple-choice, multi-dimensional knapsack: one choice per
fine-tune, one memory constraint per GPU; the LoRA cache's cap adds one binary and one continuous
variable) solved by HiGHS through ``scipy.optimize.milp``. HiGHS's
branch and cut proves optimality (status 0 with the relative gap set to zero), the program is exact
in the GiB figures (no memory quantization, which a DP over memory units would need, and no
hand-written bound whose proof would be ours to keep), and 64 fine-tunes on 8 GPUs is ~600
binaries, which it solves in well under a second. A brute force over every choice agrees on small instances
(tests/fleet/test_lora_decision.py).

    >>> d = decide(LoraFleet(
    ...     [FineTune("sql", 0.3, 0.95, MergedOption("eagle", 1.9, 16.1)),
    ...      FineTune("chat", 0.3, 0.95, MergedOption("eagle", 1.3, 16.1))],
    ...     SharedEngine((0,), 20.0, required=True), free_gib=(40.0,), concurrency=8))
    >>> [c.choice for c in d.choices]
    ['merged', 'shared']
    >>> d.choices[0].reason
    'merged: eagle 1.90x vs 0.95x shared, +16.1 GiB on GPU 0 fits'
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pipeline import methods

if TYPE_CHECKING:  # numpy and scipy are imported where a fleet is decided, not by every plan
    import numpy as np

Choice = Literal["shared", "merged"]
Allowed = Literal["shared", "merged", "auto"]  # serving.lora per variant
_TOLERANCE = 1e-9  # GiB (and objective units): what "fits" and "equal" allow
# HiGHS accepts a constraint violated by up to 1e-6 of its units (its MIP feasibility tolerance), so
# the memory rows are written in KiB and the objective bound scaled alike: 1e-6 KiB is ~1e-12 GiB.
_ROW_SCALE = float(2**20)


class LoraDecisionError(ValueError):
    """The fleet's fine-tunes cannot be placed, or its inputs are inconsistent (one line each)."""


@dataclass(frozen=True)
class MergedOption:
    """A fine-tune's engine of its own: its method, predicted speedup and memory per GPU."""

    method: str  # e.g. "eagle", "medusa", "lookahead", "none"
    speedup: float  # over plain decoding of the base at the fleet's concurrency
    per_gpu_gib: float  # weights / tp + KV cache + activations, on each of its GPUs
    world_size: int = 1  # tp x pp GPUs


@dataclass(frozen=True)
class FineTune:
    """One LoRA fine-tune and its two options."""

    name: str
    adapter_gib: float  # extra memory on each GPU of the shared engine
    shared_speedup: float  # on the shared engine (<= 1: LoRA GEMMs and adapter mixing, no heads)
    merged: MergedOption | None  # None: no merged engine is possible (serving.lora: shared)
    share: float | None = None  # traffic share; None: equal with the others that give none
    allowed: Allowed = "auto"


@dataclass(frozen=True)
class SharedEngine:
    """The base's engine built with the LoRA plugin."""

    gpus: tuple[int, ...]  # the GPUs its ranks run on
    per_gpu_gib: float  # base weights / tp + KV cache + LoRA workspace, on each of those GPUs
    required: bool = False  # True when the base itself is served from it
    cache_cap_gib: float = math.inf  # the most its LoRA cache takes per GPU, however many adapters share
    method: str = methods.PLAIN  # what it runs beside the adapters: none on the engine flow, e.g. ngram on PyTorch

    @property
    def label(self) -> str:
        """How the reasons name this option: ``shared``, or ``shared ngram`` where the engine speculates."""
        return "shared" if self.method == methods.PLAIN else f"shared {self.method}"


@dataclass(frozen=True)
class LoraFleet:
    fine_tunes: Sequence[FineTune]
    shared: SharedEngine
    free_gib: tuple[float, ...]  # per GPU: memory left for these engines
    concurrency: int  # requests in flight (evaluation.batch_sizes[0]); the speedups are at it


@dataclass(frozen=True)
class VariantChoice:
    name: str
    choice: Choice
    method: str  # "lora" on the shared engine, else the merged engine's method
    gpus: tuple[int, ...]
    memory_gib: dict[int, float]  # what this choice adds per GPU
    speedup: float
    share: float
    reason: str

    def to_dict(self) -> dict:
        return {
            "choice": self.choice,
            "method": self.method,
            "gpus": list(self.gpus),
            "memory_gib": {str(g): round(v, 3) for g, v in sorted(self.memory_gib.items())},
            "predicted_speedup": _rounded(self.speedup),
            "traffic_share": _rounded(self.share),
            "reason": self.reason,
        }


def _rounded(value: float) -> float | None:
    """JSON has no NaN: a figure that was not weighed (no GPU) is null."""
    return None if math.isnan(value) else round(value, 4)


@dataclass(frozen=True)
class LoraDecision:
    choices: tuple[VariantChoice, ...]
    shared_engine_used: bool
    used_gib: tuple[float, ...]  # per GPU, with the choices above
    free_gib: tuple[float, ...]
    fleet_speedup: float  # 1 / sum(w_i / s_i)
    all_shared_speedup: float  # the same objective with every fine-tune shared
    concurrency: int
    solver: str = field(default="HiGHS (scipy.optimize.milp)")

    def to_dict(self) -> dict:
        return {
            "objective": "maximize 1 / sum_i(share_i / speedup_i) subject to every GPU's memory",
            "solver": self.solver,
            "concurrency": self.concurrency,
            "fleet_speedup": round(self.fleet_speedup, 4),
            "all_shared_speedup": round(self.all_shared_speedup, 4),
            "shared_engine_used": self.shared_engine_used,
            "used_gib": [round(v, 3) for v in self.used_gib],
            "free_gib": [round(v, 3) for v in self.free_gib],
            "variants": {c.name: c.to_dict() for c in self.choices},
        }


def shares(fine_tunes: Sequence[FineTune]) -> list[float]:
    """Traffic shares normalized to 1; fine-tunes without one split what the others leave equally
    (all equal when none gives one).

    >>> shares([FineTune("a", 0, 1, None, 3.0), FineTune("b", 0, 1, None, 1.0)])
    [0.75, 0.25]
    """
    given = [f.share for f in fine_tunes]
    for f in fine_tunes:
        if f.share is not None and not (math.isfinite(f.share) and f.share >= 0):
            raise LoraDecisionError(f"variant {f.name}: traffic.share must be a finite number >= 0, got {f.share}")
    if all(s is None for s in given):
        return [1.0 / len(fine_tunes)] * len(fine_tunes)
    if any(s is None for s in given):
        named = sum(s for s in given if s is not None)
        if named > 1.0 + _TOLERANCE:
            raise LoraDecisionError(
                f"traffic shares given sum to {named:g} > 1 while {sum(s is None for s in given)} fine-tune(s) "
                "give none: give every fine-tune a share, or shares summing to at most 1"
            )
        rest = (1.0 - named) / sum(s is None for s in given)
        given = [rest if s is None else s for s in given]
    total = sum(s for s in given if s is not None)
    if total <= 0:
        raise LoraDecisionError("traffic shares sum to 0: give at least one fine-tune a share > 0")
    return [s / total for s in given if s is not None]


@dataclass(frozen=True)
class _Option:
    variant: int
    choice: Choice
    gpus: tuple[int, ...]
    cost: float  # w_i / s_i
    memory: dict[int, float]


def _options(fleet: LoraFleet, weights: list[float]) -> list[list[_Option]]:
    gpus = len(fleet.free_gib)
    out: list[list[_Option]] = []
    for i, (f, w) in enumerate(zip(fleet.fine_tunes, weights)):
        options: list[_Option] = []
        if f.allowed in ("shared", "auto"):
            _check_speedup(f.name, "shared", f.shared_speedup)
            memory = {g: f.adapter_gib for g in fleet.shared.gpus}
            options.append(_Option(i, "shared", fleet.shared.gpus, w / f.shared_speedup, memory))
        if f.allowed in ("merged", "auto") and f.merged is not None:
            m = f.merged
            _check_speedup(f.name, "merged", m.speedup)
            if not 1 <= m.world_size <= gpus:
                raise LoraDecisionError(
                    f"variant {f.name}: a merged engine of {m.world_size} ranks needs that many of the {gpus} GPUs"
                )
            for chosen in itertools.combinations(range(gpus), m.world_size):
                options.append(_Option(i, "merged", chosen, w / m.speedup, {g: m.per_gpu_gib for g in chosen}))
        if not options:
            raise LoraDecisionError(
                f"variant {f.name}: serving.lora is {f.allowed} but it has no "
                f"{'merged engine' if f.allowed == 'merged' else 'option'}; give it a method or allow shared"
            )
        out.append(options)
    return out


def _check_speedup(name: str, choice: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise LoraDecisionError(f"variant {name}: the {choice} predicted speedup must be > 0, got {value}")


def _validate(fleet: LoraFleet) -> None:
    if not fleet.fine_tunes:
        raise LoraDecisionError("no LoRA fine-tunes to decide for")
    names = [f.name for f in fleet.fine_tunes]
    if len(set(names)) != len(names):
        raise LoraDecisionError(f"fine-tune names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    if fleet.concurrency < 1:
        raise LoraDecisionError(f"concurrency must be >= 1, got {fleet.concurrency}")
    gpus = len(fleet.free_gib)
    if gpus < 1 or not fleet.shared.gpus or any(not 0 <= g < gpus for g in fleet.shared.gpus):
        raise LoraDecisionError(f"the shared engine's GPUs {list(fleet.shared.gpus)} must be among 0..{gpus - 1}")
    values = [fleet.shared.per_gpu_gib, *fleet.free_gib]
    if not (fleet.shared.cache_cap_gib >= 0):
        raise LoraDecisionError("memory figures must be finite and >= 0 GiB")
    for f in fleet.fine_tunes:
        values += [f.adapter_gib] + ([f.merged.per_gpu_gib] if f.merged else [])
    if any(not (math.isfinite(v) and v >= 0) for v in values):
        raise LoraDecisionError("memory figures must be finite and >= 0 GiB")


def decide(fleet: LoraFleet) -> LoraDecision:
    """The optimal choice per fine-tune (see the module docstring); LoraDecisionError when no choice
    fits, naming per GPU what the leanest choice still needs."""
    import numpy as np

    _validate(fleet)
    weights = shares(fleet.fine_tunes)
    options = _options(fleet, weights)
    flat = [o for per in options for o in per]
    program = _Program(fleet, options, flat)
    cost = np.array([o.cost for o in flat])
    first = program.solve(cost)
    if first is None:
        raise LoraDecisionError(_infeasible(fleet, options))
    best = float(cost @ first)
    # among the optimal choices: the least merged memory, then the fewest merged engines
    merged = np.array([sum(o.memory.values()) + 1e-6 if o.choice == "merged" else 0.0 for o in flat])
    second = program.solve(merged, extra=(cost * _ROW_SCALE, (best + _TOLERANCE) * _ROW_SCALE))
    chosen = first if second is None else second  # second is never None: the first optimum is feasible
    picked = [flat[k] for k in range(len(flat)) if chosen[k] > 0.5]
    return _decision(fleet, weights, options, picked)


class _Program:
    """The program over (one binary per option, y: the shared engine is used, c: the LoRA cache's KiB per
    GPU, z: the cache is at its cap). c >= sum of the shared adapters' GiB unless z, c >= cap if z: the
    solver takes the smaller, min(sum, cap), whenever memory binds."""

    def __init__(self, fleet: LoraFleet, options: list[list[_Option]], flat: list[_Option]):
        import numpy as np

        n = len(flat) + 3
        self.y, self.c, self.z = len(flat), len(flat) + 1, len(flat) + 2
        rows: list[np.ndarray] = []
        low: list[float] = []
        high: list[float] = []

        def add(row: np.ndarray, lo: float, hi: float) -> None:
            rows.append(row)
            low.append(lo)
            high.append(hi)

        start = 0
        for per in options:  # exactly one option per fine-tune
            row = np.zeros(n)
            row[start : start + len(per)] = 1.0
            add(row, 1.0, 1.0)
            start += len(per)
        for k, o in enumerate(flat):  # a shared choice needs the shared engine: x_k - y <= 0
            if o.choice == "shared":
                row = np.zeros(n)
                row[k], row[self.y] = 1.0, -1.0
                add(row, -np.inf, 0.0)
        # c is in KiB, as the rows are (its coefficient 1 beside GiB x _ROW_SCALE): scaled like the
        # others, it would sit 2**20 over a small adapter's in one row, which HiGHS does not solve reliably
        kib = 1.0 / _ROW_SCALE
        adapters = np.array([fleet.fine_tunes[o.variant].adapter_gib if o.choice == "shared" else 0.0 for o in flat])
        cap = min(fleet.shared.cache_cap_gib, float(adapters.sum()))
        row = np.r_[-adapters, 0.0, kib, float(adapters.sum())]  # c - sum_shared a_k x_k + (sum a) z >= 0
        add(row * _ROW_SCALE, 0.0, np.inf)
        row = np.zeros(n)
        row[self.c], row[self.z] = kib, -cap  # c - cap z >= 0
        add(row * _ROW_SCALE, 0.0, np.inf)
        for g, free in enumerate(fleet.free_gib):  # every GPU's memory
            row = np.array([o.memory.get(g, 0.0) if o.choice == "merged" else 0.0 for o in flat] + [0.0] * 3)
            if g in fleet.shared.gpus:
                row[self.y], row[self.c] = fleet.shared.per_gpu_gib, kib
            add(row * _ROW_SCALE, -np.inf, (free + _TOLERANCE) * _ROW_SCALE)
        self.a, self.low, self.high = np.array(rows), np.array(low), np.array(high)
        low_bounds, high_bounds = np.zeros(n), np.ones(n)
        low_bounds[self.y] = 1.0 if fleet.shared.required else 0.0
        high_bounds[self.c] = np.inf
        self.bounds = (low_bounds, high_bounds)
        self.integrality = np.ones(n)
        self.integrality[self.c] = 0

    def solve(self, objective: np.ndarray, extra: tuple[np.ndarray, float] | None = None) -> np.ndarray | None:
        """The options' minimizing 0/1 vector, or None when none is feasible; ``objective`` and ``extra``
        (row, upper bound) over the options."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        a, low, high = self.a, self.low, self.high
        if extra is not None:
            a, low, high = np.vstack([a, np.r_[extra[0], 0.0, 0.0, 0.0]]), np.r_[low, -np.inf], np.r_[high, extra[1]]
        result = milp(
            np.r_[objective, 0.0, 0.0, 0.0],
            integrality=self.integrality,
            bounds=Bounds(*self.bounds),
            constraints=LinearConstraint(a, low, high),
            options={"mip_rel_gap": 0.0},
        )
        if result.status != 0:  # 0: optimal (HiGHS proved it); 2: infeasible
            return None
        return np.round(result.x[: self.y])


def _used(fleet: LoraFleet, picked: Sequence[_Option]) -> list[float]:
    used = [0.0] * len(fleet.free_gib)
    if fleet.shared.required or any(o.choice == "shared" for o in picked):
        cache = sum(fleet.fine_tunes[o.variant].adapter_gib for o in picked if o.choice == "shared")
        for g in fleet.shared.gpus:
            used[g] += fleet.shared.per_gpu_gib + min(cache, fleet.shared.cache_cap_gib)
    for o in picked:
        if o.choice == "merged":
            for g, gib in o.memory.items():
                used[g] += gib
    return used


def _fleet_speedup(picked: Sequence[_Option]) -> float:
    """The fleet's predicted speedup 1 / sum(w_i / s_i) of one choice per fine-tune."""
    total = sum(o.cost for o in picked)
    return 1.0 / total if total > 0 else math.inf


def _decision(
    fleet: LoraFleet, weights: list[float], options: list[list[_Option]], picked: list[_Option]
) -> LoraDecision:
    picked.sort(key=lambda o: o.variant)
    used = _used(fleet, picked)
    shared_used = fleet.shared.required or any(o.choice == "shared" for o in picked)
    choices = []
    for o in picked:
        f = fleet.fine_tunes[o.variant]
        speedup = f.shared_speedup if o.choice == "shared" else f.merged.speedup  # type: ignore[union-attr]
        method = "lora" if o.choice == "shared" else f.merged.method  # type: ignore[union-attr]
        reason = _reason(fleet, f, o, options[o.variant], picked, used)
        choices.append(VariantChoice(f.name, o.choice, method, o.gpus, o.memory, speedup, weights[o.variant], reason))
    all_shared = [p for per in options for p in per if p.choice == "shared"]
    baseline = 1.0 / sum(p.cost for p in all_shared) if len(all_shared) == len(options) else math.nan
    return LoraDecision(
        tuple(choices),
        shared_used,
        tuple(used),
        tuple(fleet.free_gib),
        _fleet_speedup(picked),
        baseline,
        fleet.concurrency,
    )


def _gpu_text(memory: dict[int, float]) -> str:
    gib = next(iter(memory.values()))
    return f"+{gib:.1f} GiB on GPU{'s' if len(memory) > 1 else ''} {', '.join(str(g) for g in sorted(memory))}"


def _reason(
    fleet: LoraFleet,
    f: FineTune,
    o: _Option,
    mine: list[_Option],
    picked: list[_Option],
    used: list[float],
) -> str:
    shared = fleet.shared.label
    if o.choice == "merged":
        m = f.merged
        assert m is not None
        if f.allowed == "merged":
            return f"merged (serving.lora: merged): {m.method} {m.speedup:.2f}x, {_gpu_text(o.memory)} fits"
        return f"merged: {m.method} {m.speedup:.2f}x vs {f.shared_speedup:.2f}x {shared}, {_gpu_text(o.memory)} fits"
    if f.allowed == "shared" or f.merged is None:
        return f"{shared} (serving.lora: shared): {f.shared_speedup:.2f}x"
    m = f.merged
    if m.speedup <= f.shared_speedup:
        return f"{shared}: {f.shared_speedup:.2f}x >= merged {m.method} {m.speedup:.2f}x"
    # would merging this one alone (the others kept) fit anywhere?
    others = [p for p in picked if p.variant != o.variant]
    without = _used(fleet, others)  # its cache slot freed, if the cache is under its cap
    for alt in (a for a in mine if a.choice == "merged"):
        after = _used(fleet, [*others, alt])
        if all(after[g] <= fleet.free_gib[g] + _TOLERANCE for g in range(len(after))):
            # optimal and still shared: merging it would not lower the objective (no traffic, or a tie)
            return (
                f"{shared}: merged {m.method} {m.speedup:.2f}x would fit ({_gpu_text(alt.memory)}) but gains "
                "nothing at traffic share 0"
                if o.cost == 0
                else f"{shared}: merged {m.method} {m.speedup:.2f}x would fit ({_gpu_text(alt.memory)}) and "
                "gain no more than its memory costs (a tie; the leaner choice wins)"
            )
    room = ", ".join(f"GPU {g} {fleet.free_gib[g] - without[g]:.1f} GiB free" for g in range(len(used)))
    return (
        f"{shared}: merged {m.method} {m.speedup:.2f}x needs +{m.per_gpu_gib:.1f} GiB on {m.world_size} GPU(s) "
        f"beside the engines chosen ({room})"
    )


def _infeasible(fleet: LoraFleet, options: list[list[_Option]]) -> str:
    """Why nothing fits: per GPU, what the leanest choice per fine-tune needs against what is free."""
    lean = [min(per, key=lambda o: sum(o.memory.values())) for per in options]
    need = _used(fleet, lean)
    over = [
        f"GPU {g} needs {need[g]:.1f} of {fleet.free_gib[g]:.1f} GiB free"
        for g in range(len(need))
        if need[g] > fleet.free_gib[g] + _TOLERANCE
    ]
    where = "; ".join(over) if over else "the GPUs cannot hold every fine-tune's engine at once"
    return (
        f"the {len(options)} LoRA fine-tunes do not fit even with each on its leanest option ({where}): "
        "add GPUs, lower max_batch_size or max_seq_len of the shared engine, use FP8, or serve fewer fine-tunes"
    )
