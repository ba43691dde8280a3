"""A runtime's constants for the cost model, and the error its predictions carry.

The roofline in :mod:`pipeline.costmodel.step_gpu` is the same for every runtime; what a runtime adds on
top of it are the constants of a :class:`RuntimeProfile`:

* ``bandwidth_efficiency`` / ``compute_efficiency``: the attainable fractions of the datasheet peaks;
* ``row_compute``: how many times the draft rows' GEMM time at the tensor-core peak (their FLOPs /
  peak, for the rows a verification pass feeds beyond the first) adds to the step. The roofline's
  max(memory, compute) lets the extra rows ride free on the weight read until the step turns
  compute-bound; eager fp16 GEMMs of 2-64 rows do not (their tiles suit one row or many), which the
  published Spec-Bench results show as a step ratio that stays the same for 7B, 13B and 33B targets;
* ``host_step_s``: host work per step (scheduling, sampling, the decode loop itself);
* ``host_layer_s``: launch-bound work per decoder layer per pass, the cost of a runtime without CUDA
  graphs (PyTorch eager launches each layer's ~10 kernels from Python; Spec-Bench's reference code runs
  this way, TensorRT-LLM replays a CUDA graph);
* ``level_s``: per EAGLE drafter level, the launches and top-k / tree bookkeeping between levels
  (EAGLE-2 paper, Li et al. 2024, section 4: each level is one drafter forward plus a re-ranking);
* ``tree_row_s``: per verified tree row of Medusa and EAGLE, building the tree-attention mask and the
  positions, and the acceptance walk over the tree (Medusa, Cai et al. 2024, section 2.1.2);
* ``lookahead_row_s``: per Lookahead row, the (W + G)(N - 1) rows under its custom mask beyond what the
  roofline charges and the n-gram pool's per-step lookups and updates (Fu et al. 2024, section 3);
* ``request_s``: per request in a step, the host work each sequence costs whatever its rows (the CPU
  reference backend's per-sequence attention, sampling and streamed response; the GPU step model
  does not use it).

``trtllm`` (TensorRT-LLM 1.2 engines, what specdeploy deploys): no published TensorRT-LLM result gives
an acceptance length, so nothing could be fitted on it. Its host side keeps the model's documented
assumptions (CUDA graphs: 0.3 ms a step, 0.03 ms a drafter level, no per-layer launches); its kernel
side (``KERNEL_SIDE``: the draft rows' GEMMs, tree and Lookahead row work, the same kind of GPU work
in any runtime) is transferred from the ``pytorch-eager`` fit. ``specdeploy calibrate`` fits it on
the user's own servers. ``pytorch-eager`` is fitted on published Spec-Bench results (bench/costmodel_published.py
writes ``profiles.json`` beside this module; tests hold the file to a fresh fit).

A prediction's error comes from held-out residuals (leave-one-source-out): an :class:`ErrorBand` is
the 10th and 90th percentile of ``predicted / published - 1`` for one method and profile, and turns a
point prediction into a :class:`SpeedupInterval`:

    >>> ErrorBand(low_error=-0.10, high_error=0.20, residuals=12).interval(1.5).text()
    '1.50x (1.25-1.67)'
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pipeline import methods

Runtime = Literal["trtllm", "pytorch-eager"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
DEFAULT_RUNTIME: Runtime = "trtllm"
PROFILES_FILE = Path(__file__).with_name("profiles.json")
FITTED = ("row_compute", "host_step_s", "host_layer_s", "level_s", "tree_row_s", "lookahead_row_s", "request_s")
KERNEL_SIDE = ("row_compute", "tree_row_s", "lookahead_row_s")  # GPU work, not host launches
LOW_PERCENTILE, HIGH_PERCENTILE = 10.0, 90.0


@dataclass(frozen=True, kw_only=True)
class RuntimeProfile:
    """The constants one runtime adds to the roofline (see the module docstring), by name: a run of
    seconds and fractions in a row is too easy to misplace by position."""

    runtime: str
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.7
    row_compute: float = 0.0
    host_step_s: float = 0.3e-3
    host_layer_s: float = 0.0
    level_s: float = 0.03e-3
    tree_row_s: float = 0.0
    lookahead_row_s: float = 0.0
    request_s: float = 0.0

    def with_constants(self, values: dict[str, float]) -> RuntimeProfile:
        unknown = set(values) - set(FITTED)
        if unknown:
            raise ValueError(f"not a fitted constant: {', '.join(sorted(unknown))}")
        return RuntimeProfile(**{**dataclasses.asdict(self), **values})

    def constants(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in FITTED}


@dataclass(frozen=True, kw_only=True)
class SpeedupInterval:
    """A predicted speedup and the range its method's held-out error puts around it."""

    point: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.point:.2f}x ({self.low:.2f}-{self.high:.2f})"

    def to_dict(self) -> dict[str, float]:
        return {"point": self.point, "low": self.low, "high": self.high}

    def overlaps(self, other: SpeedupInterval) -> bool:
        return self.low <= other.high and other.low <= self.high


@dataclass(frozen=True, kw_only=True)
class ErrorBand:
    """Percentiles of held-out relative error (predicted / measured - 1) of one method and profile."""

    low_error: float  # LOW_PERCENTILE
    high_error: float  # HIGH_PERCENTILE
    residuals: int  # how many held-out results they come from
    borrowed_from: str | None = None  # the profile whose residuals these are, when not this one's

    def interval(self, point: float) -> SpeedupInterval:
        """measured = predicted / (1 + error): an over-predicting model (error > 0) lowers the low end."""
        return SpeedupInterval(point=point, low=point / (1 + self.high_error), high=point / (1 + self.low_error))


EXACT = ErrorBand(low_error=0.0, high_error=0.0, residuals=0)  # plain decoding against itself: 1.0x by definition


@dataclass(frozen=True)
class Calibration:
    """A profile with the error bands of its methods, and where both came from."""

    profile: RuntimeProfile
    bands: dict[str, ErrorBand]  # by method: medusa | eagle | lookahead
    source: str  # what it was fitted on, one line

    def band(self, method: str) -> ErrorBand:
        if method == methods.PLAIN:
            return EXACT
        if method in self.bands:
            return self.bands[method]
        # A method no calibration has fitted (NGram): the widest of the fitted bands, not a narrower guess.
        return ErrorBand(
            low_error=min(b.low_error for b in self.bands.values()),
            high_error=max(b.high_error for b in self.bands.values()),
            residuals=sum(b.residuals for b in self.bands.values()),
            borrowed_from=f"every fitted method ({', '.join(sorted(self.bands))}): {method} has no fitted band",
        )

    def interval(self, method: str, point: float) -> SpeedupInterval:
        return self.band(method).interval(point)

    def to_dict(self) -> dict:
        return {
            "profile": dataclasses.asdict(self.profile),
            "bands": {m: dataclasses.asdict(b) for m, b in sorted(self.bands.items())},
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        return cls(
            RuntimeProfile(**data["profile"]),
            {m: ErrorBand(**b) for m, b in data["bands"].items()},
            data["source"],
        )


def load_calibrations(path: Path = PROFILES_FILE) -> dict[str, Calibration]:
    """The shipped calibrations by runtime (profiles.json)."""
    data = json.loads(path.read_text())
    return {runtime: Calibration.from_dict(entry) for runtime, entry in data.items()}


def calibration(runtime: str, path: Path = PROFILES_FILE) -> Calibration:
    """The shipped calibration of ``runtime``; ValueError for a runtime it does not know."""
    found = load_calibrations(path)
    if runtime not in found:
        raise ValueError(f"unknown runtime {runtime!r}: one of {', '.join(RUNTIMES)}")
    return found[runtime]
