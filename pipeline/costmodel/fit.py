"""Fitting a runtime profile's constants on observed speedups, and the error left when a source is held out.

An :class:`Observation` is one result: a deployment (model shape, GPU, dtype), a method's drafting, the
acceptance length it reached and the speedup over plain decoding that was measured at a batch size.
Every step time of the model is linear in the fitted constants (profile.FITTED) once the efficiencies
are fixed, ``t = t0 + sum_k c_k f_k``, so an observed speedup ``s`` at acceptance length ``a`` says

    t_method = (a / s) x t_plain   =>   sum_k c_k (f_k,method - r f_k,plain) = r t0,plain - t0,method

with ``r = a / s``: one linear equation per observation. :func:`fit` solves them by non-negative least
squares, each equation weighted by ``1 / t_method`` so the residual is a relative error of the step
time (which is the relative error of the speedup), re-weighted twice at the fitted times.

Batch-1 speedups fix the constants only relative to the roofline, whose bandwidth efficiency stays the
profile's assumption: that is why the efficiencies are not fitted.

:func:`leave_one_source_out` refits without each source and predicts that source's results: the
held-out errors the intervals come from (:func:`bands`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.costmodel.pricing import method_step
from pipeline.costmodel.profile import FITTED, HIGH_PERCENTILE, LOW_PERCENTILE, ErrorBand, RuntimeProfile
from pipeline.costmodel.step import Deployment
from pipeline.methods.drafting import Drafting

# (requests decoding, share of the steps) of a measured run (load.batch_mix); empty: every step at
# the run's nominal batch.
BatchMix = tuple[tuple[int, float], ...]


def batches(mix: BatchMix, batch: int) -> BatchMix:
    """``mix``, or every step at ``batch`` where none was measured."""
    return mix or ((batch, 1.0),)


def mean_batch(mix: BatchMix, batch: int) -> float:
    """Requests decoding per step, on average over ``mix`` (``batch`` where none was measured)."""
    return sum(k * share for k, share in batches(mix, batch))


def mean_step_s(d: Deployment, drafting: Drafting, mix: BatchMix) -> float:
    """Seconds of one step of ``drafting`` (plain decoding: Drafting.plain()), the mean over ``mix``."""
    return sum(share * method_step(d, drafting, b).total_s for b, share in mix)


@dataclass(frozen=True, kw_only=True)
class Observation:
    source: str
    method: str  # medusa | eagle | lookahead
    deployment: Deployment
    drafting: Drafting
    acceptance_length: float
    speedup: float  # measured or published, over plain decoding at ``batch``
    batch: int = 1
    label: str = ""  # for tables: model, GPU, settings
    # Measured seconds of one step of the method at its batch mix (mean batch x acceptance length /
    # tokens/s), where the step model prices absolute times (the CPU device): then the equation is
    # the step time itself and the residual the relative error of tokens/s.
    step_s: float | None = None
    batch_mix: BatchMix = ()  # its steps are priced at these batches, not all at ``batch``


class FitError(ValueError):
    """The observations cannot determine the constants (said in the message)."""


def _times(obs: Observation, profile: RuntimeProfile) -> tuple[float, float]:
    """(plain step, method step) seconds, each the mean over the observation's batch mix."""
    d = dataclasses.replace(obs.deployment, profile=profile)
    mix = batches(obs.batch_mix, obs.batch)
    return mean_step_s(d, Drafting.plain(), mix), mean_step_s(d, obs.drafting, mix)


def design(
    observations: Sequence[Observation], base: RuntimeProfile, names: Sequence[str] = FITTED
) -> tuple[np.ndarray, np.ndarray]:
    """(A, y) of the linear equations, unweighted: one row per observation, one column per constant in
    ``names`` (the others stay at ``base``'s values, inside y)."""
    zero = base.with_constants(dict.fromkeys(names, 0.0))
    rows, targets = [], []
    for obs in observations:
        p0, m0 = _times(obs, zero)
        ones = [_times(obs, zero.with_constants({name: 1.0})) for name in names]
        if obs.step_s is not None:  # sum_k c_k f_k,method = measured step - t0,method
            rows.append([m1 - m0 for _, m1 in ones])
            targets.append(obs.step_s - m0)
            continue
        r = obs.acceptance_length / obs.speedup
        rows.append([(m1 - m0) - r * (p1 - p0) for p1, m1 in ones])
        targets.append(r * p0 - m0)
    return np.array(rows), np.array(targets)


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by active set: drop the most negative coefficient and refit."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def identifiable(observations: Sequence[Observation], base: RuntimeProfile) -> list[str]:
    """The constants these observations say something about (a non-zero column)."""
    a, _ = design(observations, base)
    return [name for name, column in zip(FITTED, a.T) if np.abs(column).max() > 0]


def fit(observations: Sequence[Observation], base: RuntimeProfile, only: Sequence[str] | None = None) -> RuntimeProfile:
    """``base`` with its constants fitted (those in ``only``, default every one the data touches; the
    others keep ``base``'s values). FitError when there is nothing to fit on."""
    if not observations:
        raise FitError("no observations to fit on")
    names = list(only) if only is not None else identifiable(observations, base)
    a, y = design(observations, base, names)
    profile = base
    for _ in range(3):
        weights = np.array([1.0 / (obs.step_s or _times(obs, profile)[1]) for obs in observations])
        x = nnls(a * weights[:, None], y * weights)
        profile = base.with_constants(dict(zip(names, (float(v) for v in x))))
    return profile


def relative_errors(observations: Sequence[Observation], profile: RuntimeProfile) -> list[float]:
    """predicted / observed - 1 of each observation's speedup (as predict() has it: acceptance length x
    plain step / method step, at the observation's batch mix); of its tokens/s where the observation is
    a measured step (``step_s``)."""
    out = []
    for obs in observations:
        if obs.step_s is not None:
            out.append(obs.step_s / _times(obs, profile)[1] - 1)
            continue
        plain, method = _times(obs, profile)
        out.append(obs.acceptance_length * plain / method / obs.speedup - 1)
    return out


def leave_one_source_out(
    observations: Sequence[Observation], base: RuntimeProfile, only: Sequence[str] | None = None
) -> list[float]:
    """Each observation's relative error predicted by a fit on every other source's observations."""
    errors = [0.0] * len(observations)
    for source in sorted({o.source for o in observations}):
        held = [i for i, o in enumerate(observations) if o.source == source]
        rest = [o for o in observations if o.source != source]
        if not rest:
            raise FitError(f"only one source ({source}): nothing to hold it out against")
        profile = fit(rest, base, only)
        for i, error in zip(held, relative_errors([observations[i] for i in held], profile)):
            errors[i] = error
    return errors


def band(errors: Sequence[float], borrowed_from: str | None = None) -> ErrorBand:
    """The 10th-90th percentile of ``errors`` (linear interpolation between order statistics)."""
    if not errors:
        raise FitError("no residuals to make an error band from")
    low, high = np.percentile(np.array(errors), [LOW_PERCENTILE, HIGH_PERCENTILE])
    return ErrorBand(low_error=float(low), high_error=float(high), residuals=len(errors), borrowed_from=borrowed_from)


def bands(observations: Sequence[Observation], errors: Sequence[float]) -> dict[str, ErrorBand]:
    """One error band per method from its observations' held-out errors."""
    by_method: dict[str, list[float]] = {}
    for obs, error in zip(observations, errors):
        by_method.setdefault(obs.method, []).append(error)
    return {method: band(found) for method, found in sorted(by_method.items())}
