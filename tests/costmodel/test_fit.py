"""Fitting runtime profiles: known constants come back out, intervals cover what they claim, and the
shipped profiles are the fit of the published data set."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import statistics
from pathlib import Path

import pytest

from pipeline import trees
from pipeline.costmodel import fit
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.profile import FITTED, ErrorBand, RuntimeProfile, load_calibrations
from pipeline.costmodel.step import Deployment
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.spec import presets

ROOT = Path(__file__).resolve().parents[2]
KNOWN = RuntimeProfile(
    runtime="synthetic",
    row_compute=0.8,
    host_step_s=1.5e-3,
    host_layer_s=0.02e-3,
    level_s=0.6e-3,
    tree_row_s=0.01e-3,
    lookahead_row_s=0.03e-3,
)
METHODS = {
    "medusa": Drafting.medusa(trees.MC_SIM_7B_63, 4),
    "eagle": Drafting.eagle_dynamic(8, 4, 40),
    "lookahead": Drafting.lookahead(LookaheadConfig(4, 3, 4)),
}


def synthetic(profile: RuntimeProfile, noise: float = 0.0, seed: int = 0) -> list[fit.Observation]:
    """Speedups the model itself predicts with ``profile`` (times 1 + uniform noise), over shapes, GPUs,
    batch sizes and acceptance lengths varied enough to pin every constant."""
    rng = random.Random(seed)
    out = []
    for i, (model, gpu) in enumerate(
        [("llama-3.1-8b", "a100-80gb"), ("llama-3.1-8b", "l40s"), ("llama-3.2-1b", "h100-sxm-80gb")]
        + [("llama-3.1-70b", "h100-sxm-80gb")]
    ):
        arch = presets.preset(model)
        tp = 4 if "70b" in model else 1
        for method, drafting in METHODS.items():
            for batch, al in ((1, 2.2), (2, 2.8), (3, 1.9)):  # below the ridge: linear in the constants
                d = dataclasses.replace(Deployment(arch, gpu_perf(gpu), tp=tp, context_len=512), profile=profile)
                (p,) = predict(d, drafting, al, [batch])
                speedup = p.speedup * (1 + rng.uniform(-noise, noise))
                out.append(
                    fit.Observation(
                        source=f"source{i}",
                        method=method,
                        deployment=Deployment(arch, gpu_perf(gpu), tp=tp, context_len=512),
                        drafting=drafting,
                        acceptance_length=al,
                        speedup=speedup,
                        batch=batch,
                    )
                )
    return out


def test_fit_recovers_known_constants():
    start = RuntimeProfile(runtime="synthetic")  # the trtllm assumptions: every constant wrong
    found = fit.fit(synthetic(KNOWN), start)
    for name in FITTED:
        assert getattr(found, name) == pytest.approx(getattr(KNOWN, name), rel=1e-4, abs=1e-9), name
    assert max(abs(e) for e in fit.relative_errors(synthetic(KNOWN), found)) < 1e-6


def test_held_out_errors_of_an_exact_model_are_zero_and_noise_shows_in_them():
    exact = fit.leave_one_source_out(synthetic(KNOWN), RuntimeProfile(runtime="synthetic"))
    assert max(abs(e) for e in exact) < 1e-5
    observations = synthetic(KNOWN, noise=0.05)
    noisy = fit.fit(observations, RuntimeProfile(runtime="synthetic"))
    assert max(abs(e) for e in fit.relative_errors(observations, noisy)) < 0.08  # in-sample: about the noise
    held_out = fit.leave_one_source_out(observations, RuntimeProfile(runtime="synthetic"))
    assert statistics.fmean(abs(e) for e in held_out) > statistics.fmean(
        abs(e) for e in fit.relative_errors(observations, noisy)
    )


def test_nnls_keeps_constants_non_negative():
    import numpy as np

    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # the unconstrained slope is -1
    x = fit.nnls(a, y)
    assert (x >= 0).all() and x[1] == 0 and x[0] == pytest.approx(2.0)


def test_one_source_cannot_be_held_out():
    one = [dataclasses.replace(o, source="only") for o in synthetic(KNOWN)]
    with pytest.raises(fit.FitError, match="only one source"):
        fit.leave_one_source_out(one, RuntimeProfile(runtime="synthetic"))
    with pytest.raises(fit.FitError, match="no observations"):
        fit.fit([], RuntimeProfile(runtime="synthetic"))


def test_interval_covers_the_share_it_claims():
    """Residuals of a model that over-predicts by 10% +- noise: the 10th-90th band from 400 of them
    holds ~80% of 4000 fresh ones, and the interval around a prediction holds the true value as often."""
    rng = random.Random(1)
    draw = [rng.gauss(0.10, 0.08) for _ in range(400)]
    band = fit.band(draw)
    fresh = [rng.gauss(0.10, 0.08) for _ in range(4000)]
    inside = sum(band.low_error <= e <= band.high_error for e in fresh) / len(fresh)
    assert 0.75 < inside < 0.85
    truth = 2.0
    covered = 0
    for e in fresh:
        interval = band.interval(truth * (1 + e))  # the prediction is off by e
        covered += interval.low <= truth <= interval.high
    assert covered / len(fresh) == pytest.approx(inside)


def test_interval_direction():
    """An over-predicting method (errors > 0) lowers the low end below the point."""
    interval = ErrorBand(low_error=0.0, high_error=0.25, residuals=10).interval(1.5)
    assert interval.low == pytest.approx(1.2) and interval.high == pytest.approx(1.5)
    assert interval.text() == "1.50x (1.20-1.50)"
    assert not interval.overlaps(ErrorBand(low_error=0.0, high_error=0.0, residuals=1).interval(1.1))


def _bench():
    spec = importlib.util.spec_from_file_location("costmodel_published", ROOT / "bench" / "costmodel_published.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_profiles_are_the_fit_of_the_published_data():
    bench = _bench()
    rows = bench.read_rows()
    assert len(rows) >= 40 and all(r["source"] for r in rows)
    found = bench.observations()
    assert len({o.source for o in found}) >= 4
    fresh, _ = bench.calibrations(found)
    shipped = load_calibrations()
    assert set(shipped) == {"trtllm", "pytorch-eager"}
    for runtime, calibration in fresh.items():
        assert shipped[runtime].profile.runtime == calibration.profile.runtime
        for name, value in calibration.profile.constants().items():
            assert getattr(shipped[runtime].profile, name) == pytest.approx(value, rel=1e-6, abs=1e-12), name
        for method, band in calibration.bands.items():
            assert shipped[runtime].bands[method].low_error == pytest.approx(band.low_error, abs=1e-9)
            assert shipped[runtime].bands[method].high_error == pytest.approx(band.high_error, abs=1e-9)
    assert shipped["trtllm"].bands["eagle"].borrowed_from == "pytorch-eager"


def test_every_published_row_is_fitted_or_says_why():
    """At least 40 fitted results from 5 sources; each listed row names its reason, and a row its
    notes mark "not fitted:" stays out of the fit whatever its other columns."""
    bench = _bench()
    rows = bench.read_rows()
    fitted = [r for r in rows if bench.fittable(r)]
    assert len(fitted) >= 40 and len({r["source"] for r in fitted}) >= 5
    for row in rows:
        assert row["source"] and row["speedup"], row
        reason = bench.why_not(row)
        assert (reason is None) == (row in fitted)
        if row["notes"].startswith(bench.NOT_FITTED):
            assert reason and reason in row["notes"], row
    marked = dict(fitted[0], notes="not fitted: a test reason; more")
    assert bench.why_not(marked) == "a test reason"
    assert bench.why_not(dict(fitted[0], runtime="vllm")) == "runtime vllm"


def test_predict_cli_gives_the_fitted_prediction_of_a_published_row(cli):
    """`specdeploy predict --runtime pytorch-eager` on a published result's shape, GPU and settings gives
    the fit's prediction the bench script prints beside it, inside its interval."""
    import json

    bench = _bench()
    (row,) = [
        o
        for o in bench.observations()
        if o.source == "specbench-a100-pt20" and o.method == "lookahead" and "7b" in o.label
    ]
    (expected,) = fit.relative_errors([row], load_calibrations()["pytorch-eager"].profile)
    rc, out, err = cli(
        "predict", "--preset", "vicuna-7b-v1.3", "--gpu", "a100-80gb", "--runtime", "pytorch-eager",
        "--method", "lookahead", "--lookahead", "7,5,7", "--acceptance-length", "1.66", "--context-len", "512",
        "--batch", "1", "--json",
    )  # fmt: skip
    assert rc == 0, err
    body = json.loads(out)
    assert body["speedup"]["1"] == pytest.approx(row.speedup * (1 + expected))
    assert body["interval"]["1"]["low"] <= row.speedup <= body["interval"]["1"]["high"]
