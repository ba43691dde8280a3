"""A runtime profile calibrated on the user's own servers, from ``specdeploy bench --repository`` runs.

Each run is one served variant (method, settings, engine shape: ``served.describe``) loaded at one
concurrency: its tokens/s and mean acceptance length. A speculative run at concurrency ``c`` against a
plain-decoding run of the same model at the same ``c`` is one observed speedup, priced at batch ``c``;
:func:`calibrate` fits the profile's constants on them (pipeline/costmodel/fit.py) and takes the error
bands from leave-one-out residuals (each observation predicted by a fit on the others; in-sample when
there are no more observations than constants, said so in the file).

A run at concurrency ``c`` does not decode ``c`` requests every step: a slot is empty while its next
request is sent and prefilled, and once its last request is done while others still decode (EAGLE
at concurrency 4 with 8 requests of 64 tokens decoded 3.5 requests a step on average, plain
decoding 4.0). `specdeploy bench` measures each run's batch mix (the share of decode steps by
requests decoding, pipeline/client/load.py), and each run is priced at its mix: a step time is mean
batch x acceptance length / tokens/s, and a speedup compares the two runs per request decoding.

What the data can determine is checked first, each refusal one :class:`CalibrationError` line:

* every run at one concurrency: per-step and per-row costs cannot be told apart;
* one method only, or no plain-decoding run beside a speculative one at the same concurrency: a
  speedup needs both;
* runs of different models or engines (shape, dtype, tp/pp): one profile per model and GPU type.

Then the constants are taken greedily in order (the served methods' own terms, the draft rows' GEMMs,
host work a step, a layer) as long as each adds a dimension the observations resolve; the others keep
the shipped profile's values.

The CPU reference backend (``--gpu cpu``, hardware.CPU_DEVICE) goes the same way with three
differences. Its step model (pipeline/costmodel/step_cpu.py) has no roofline to anchor a speedup, so
every run, plain decoding's too, is one observed step time (mean batch x acceptance length /
tokens/s) and the residuals are relative errors of tokens/s. Its device has no datasheet: the weight
GEMMs are measured by rows on the host that served the runs (:func:`cpu_device`: recorded by each
run, or probed when calibrating; the file records them, and predictions from it are priced on them:
:func:`priced_on`), since a CPU GEMM's cost per row falls as its rows grow and no constant can say
so. And it starts from no constants at all (``CPU_BASE``: a constant the runs do not determine costs
nothing), taking the physical terms first (a row's FLOPs, a request's host work, the weight
streaming a layer, the host work a step) and the methods' own terms after them: on the CPU a draft
row costs what any row costs, so a method's row term is what is left once those are fitted (usually
nothing the runs resolve). The weight streaming comes before the host work a step: both are fixed
per step for the target, but only the first prices an EAGLE drafter level, so a held-out EAGLE is
not charged its levels at zero. And it keeps at least one observation more than constants: a step
time on a shared host is noisy, and an exact fit takes one run's noise into every constant (four
runs, plain and Lookahead at two concurrencies, fitted exactly with Lookahead's row term: held-out
Medusa and EAGLE 26-39% off in one bench run; the three physical terms by least squares on the same
runs: within 9%). The reference backend's Lookahead feeds its window's W(N - 1) rows (the root is the
window's first) and the trie of the n-grams its pool holds, not (W + G)(N - 1) rows every step: a
run's rows are taken from its own draft counts (:func:`drafting`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import methods
from pipeline.costmodel import fit, gemm_probe, inputs, served
from pipeline.costmodel.hardware import CPU, GpuPerf, gpu_perf
from pipeline.costmodel.profile import Calibration, RuntimeProfile, calibration
from pipeline.costmodel.step import Deployment
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting

FORMAT = "specdeploy-calibration/1"
SHARED_TERMS = ("row_compute", "host_step_s", "host_layer_s")
CPU_SHARED_TERMS = ("row_compute", "request_s", "host_layer_s", "host_step_s")
CPU_BASE = RuntimeProfile(runtime="reference", row_compute=0.0, host_step_s=0.0, level_s=0.0)


class CalibrationError(ValueError):
    """The runs cannot calibrate a profile (one line: what is missing and what to run)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    path: Path  # the bench.json
    served: dict[str, Any]
    concurrency: int
    tokens_per_second: float
    acceptance_length: float
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    host_gemms: gemm_probe.CpuProfile | None = None  # `bench --probe-host`: the host's GEMMs after the run
    # (requests decoding, share of the decode steps) as `bench` measured them (load.batch_mix); empty
    # in a bench.json written before bench measured it: then every step counts at the concurrency
    batch_mix: fit.BatchMix = ()

    @property
    def mean_batch(self) -> float:
        return fit.mean_batch(self.batch_mix, self.concurrency)


def read_run(folder: Path) -> Run:
    """A ``bench.json`` (or the folder holding one), every field checked (:mod:`pipeline.costmodel.inputs`):
    CalibrationError naming the file and the field."""
    path = folder / "bench.json" if folder.is_dir() else folder
    try:
        body = inputs.read_object(path, "bench run")
        if "server" not in body:
            raise CalibrationError(
                f"{path}: the run does not say what was served; run `specdeploy bench --repository DIR` "
                "with the Triton repository the server loaded"
            )
        served = inputs.section(body, "server")
        method = inputs.choice(served, "method", methods.names(), "server.")
        inputs.architecture(served, "server.")
        if not body.get("completed"):
            raise CalibrationError(f"{path}: no completed requests to calibrate on")
        tokens_per_second = inputs.number(body, "tokens_per_second", 0.0, inputs.MAX_TOKENS_PER_SECOND, open_low=True)
        concurrency = inputs.integer(body, "concurrency", 1, inputs.MAX_CONCURRENCY)
        acceptance = body.get("acceptance") or {}
        if not isinstance(acceptance, dict):
            raise inputs.FieldError("acceptance", "not an object")
        if method == methods.PLAIN:
            al = 1.0
        elif acceptance.get("mean_acceptance_length") is None:
            raise CalibrationError(f"{path}: a {method} run without an acceptance length")
        else:
            al = inputs.number(acceptance, "mean_acceptance_length", 1.0, inputs.MAX_ACCEPTANCE_LENGTH, "acceptance.")
        drafts = {
            key: inputs.integer(acceptance, key, 0, 1 << 62, "acceptance.") if key in acceptance else 0
            for key in ("draft_tokens", "accepted_draft_tokens")
        }
        mix = inputs.batch_mix(body.get("batch_mix"))
        try:
            gemms = gemm_probe.CpuProfile.from_dict(body["host_gemms"]) if body.get("host_gemms") else None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise inputs.FieldError("host_gemms", f"not a GEMM probe `specdeploy bench` wrote ({exc})") from None
    except inputs.FieldError as exc:
        raise CalibrationError(f"{path}: {exc}") from None
    except InputError as exc:
        raise CalibrationError(str(exc)) from None
    return Run(
        path=path,
        served=served,
        concurrency=concurrency,
        tokens_per_second=tokens_per_second,
        acceptance_length=al,
        draft_tokens=drafts["draft_tokens"],
        accepted_draft_tokens=drafts["accepted_draft_tokens"],
        host_gemms=gemms,
        batch_mix=mix,
    )


def drafting(run: Run, gpu: str) -> Drafting:
    """What the cost model charges for ``run``: on the CPU device, Lookahead's rows as the run fed them
    (W(N - 1) window rows, the root among them, + its draft tokens a step; steps = accepted / (AL - 1))."""
    found = served.drafting(run.served)
    if gpu != CPU or found.method != "lookahead" or run.acceptance_length <= 1 or not run.accepted_draft_tokens:
        return found
    w, n, _ = run.served["settings"]["lookahead"]
    steps = run.accepted_draft_tokens / (run.acceptance_length - 1)
    fed = w * (n - 1) + run.draft_tokens / steps
    return dataclasses.replace(found, rows=max(1, min(found.rows, round(fed))))


def _model_key(s: dict[str, Any]) -> tuple:
    """The model and engine shape, whatever the method: a Medusa or EAGLE engine's architecture
    (MedusaForCausalLM, EagleForCausalLM) wraps the same target as the plain engine's."""
    arch = {k: v for k, v in s["arch"].items() if k != "architecture"}
    return (json.dumps(arch, sort_keys=True), s["dtype"], s["kv_dtype"], s["tp"], s["pp"])


def refuse_undetermined(runs: Sequence[Run]) -> None:
    """CalibrationError for runs that cannot determine the constants (see the module docstring)."""
    if len({_model_key(r.served) for r in runs}) > 1:
        raise CalibrationError(
            "the runs serve different models or engines (shape, dtype or tp/pp): calibrate one model at a time"
        )
    concurrencies = sorted({r.concurrency for r in runs})
    served = sorted({r.served["method"] for r in runs})
    if len(concurrencies) < 2:
        raise CalibrationError(
            f"every run is at concurrency {concurrencies[0]}: one concurrency cannot tell per-step from per-row "
            "costs apart; bench each variant at a second --concurrency"
        )
    if len(served) < 2 or methods.PLAIN not in served:
        raise CalibrationError(
            f"the runs serve {' and '.join(served)} only: a speedup needs plain decoding and a speculative "
            "method on the same model at the same concurrency; bench both"
        )
    plain = {r.concurrency for r in runs if r.served["method"] == methods.PLAIN}
    if len({r.concurrency for r in runs if r.served["method"] != methods.PLAIN and r.concurrency in plain}) < 2:
        raise CalibrationError(
            "no speculative run has a plain-decoding run at two concurrencies: bench plain decoding at the "
            "speculative runs' concurrencies"
        )


def observations(
    runs: Sequence[Run], gpu: str, context_len: int, device: GpuPerf | None = None
) -> list[fit.Observation]:
    """One observation per speculative run with a plain run at its concurrency, priced on ``device``
    (default: ``gpu``'s figures); refusals as documented."""
    refuse_undetermined(runs)
    plain = {r.concurrency: r for r in runs if r.served["method"] == methods.PLAIN}
    found = []
    for r in runs:
        absolute = gpu == CPU  # every run a measured step time (see the module docstring)
        if r.concurrency not in plain or (r.served["method"] == methods.PLAIN and not absolute):
            continue
        s = r.served
        deployment = Deployment(
            ModelGeometry(**s["arch"]),
            device or gpu_perf(gpu),
            dtype=served.priced_dtype(s["dtype"]),
            kv_dtype=served.priced_dtype(s["kv_dtype"]),
            tp=s["tp"],
            pp=s["pp"],
            context_len=context_len,
        )
        charged, base = drafting(r, gpu), plain[r.concurrency]
        found.append(
            fit.Observation(
                source=f"{r.path}",
                method=s["method"],
                deployment=deployment,
                drafting=charged,
                acceptance_length=min(max(r.acceptance_length, 1.0), charged.rows),
                # per request decoding: the two runs' slots were not filled alike (see the module docstring)
                speedup=r.tokens_per_second / base.tokens_per_second * base.mean_batch / r.mean_batch,
                batch=r.concurrency,
                label=f"{s['method']} at concurrency {r.concurrency}",
                step_s=r.mean_batch * r.acceptance_length / r.tokens_per_second if absolute else None,
                batch_mix=r.batch_mix,
            )
        )
    return found


def choose_constants(found: Sequence[fit.Observation], base: RuntimeProfile, cpu: bool = False) -> list[str]:
    """The constants the observations resolve, greedily in the module's order; on the CPU at least one
    observation more than constants (see the module docstring)."""
    terms = [t for m in sorted({o.method for o in found}) for t in methods.definition(m).cost_terms]
    order = [*CPU_SHARED_TERMS, *terms] if cpu else [*terms, *SHARED_TERMS]
    most = len(found) - 1 if cpu else len(found)
    chosen: list[str] = []
    rank = 0
    for name in dict.fromkeys(order):
        a, _ = fit.design(found, base, [*chosen, name])
        scaled = a / np.maximum(np.abs(a).max(axis=0), 1e-300)
        new_rank = int(np.linalg.matrix_rank(scaled, tol=1e-6))
        if new_rank > rank and len(chosen) < most:
            chosen.append(name)
            rank = new_rank
    return chosen


def probe_host(served: dict[str, Any], repeats: int = 5) -> gemm_probe.CpuProfile:
    """This host's GEMMs measured by rows for the served model and dtype (gemm_probe.probe, ~15 s for
    SmolLM2 in float32). Each GEMM's figure is the fastest of its repeats: on a shared host noise
    only adds time, and the fit takes the scale (``row_compute``) itself, so what must hold still is
    the curve's shape, which moved by up to 4% between fastest-of-5 probes of SmolLM2 minutes apart
    against up to 13% between median-of-3 ones (a 11-row target pass over a 1-row one: 4.52-4.75x
    against 4.68-5.26x)."""
    arch = ModelGeometry(**served["arch"])
    return gemm_probe.probe(arch, bf16=served["dtype"] == "bfloat16", repeats=repeats, statistic=min)


def cpu_device(runs: Sequence[Run], repeats: int = 5, say: Callable[[str], None] = lambda _: None) -> GpuPerf:
    """The CPU device with the host's GEMMs by rows: when every run recorded its probe (`specdeploy
    bench --probe-host`, taken on the host that served it, right after the run), the fastest of
    them entry by entry, so the same runs always calibrate alike; else measured now
    (:func:`probe_host`): calibrate on the host that served the runs. ``say`` is told which."""
    recorded = [r.host_gemms for r in runs if r.host_gemms is not None]
    if len(recorded) == len(runs):
        say("the host's GEMMs by rows: the fastest of the runs' recorded probes")
        try:
            gemms = gemm_probe.CpuProfile.fastest(recorded)
        except ValueError as exc:
            raise CalibrationError(f"the runs' recorded GEMM probes cannot be combined: {exc}") from None
    else:
        say("measuring this host's GEMMs by rows (calibrate on the host that served the runs)")
        gemms = probe_host(runs[0].served, repeats)
    if gemms.out_of_cache:
        names = ", ".join(sorted(gemms.out_of_cache))
        say(f"probed from memory (larger than the host's cache), so passes do not stream them again: {names}")
    return dataclasses.replace(gpu_perf(CPU), gemms=gemms)


def priced_on(content: dict[str, Any]) -> GpuPerf:
    """The device a calibration file's predictions are priced on (the CPU device with its probe)."""
    found = gpu_perf(content["gpu"])
    if content.get("gemms"):
        return dataclasses.replace(found, gemms=gemm_probe.CpuProfile.from_dict(content["gemms"]))
    return found


def predicted_tokens_per_second(content: dict[str, Any], run: Run) -> float:
    """The tokens/s a CPU calibration file predicts for ``run`` at its acceptance length and batch mix:
    mean batch x acceptance length / the mean step over the mix."""
    s = run.served
    profile = Calibration.from_dict(content["calibration"]).profile
    d = Deployment(ModelGeometry(**s["arch"]), priced_on(content), context_len=content["context_len"], profile=profile)
    step = fit.mean_step_s(d, drafting(run, content["gpu"]), fit.batches(run.batch_mix, run.concurrency))
    return run.mean_batch * run.acceptance_length / step


def calibrate(
    runs: Sequence[Run], gpu: str, runtime: str, context_len: int, device: GpuPerf | None = None
) -> dict[str, Any]:
    """The calibration file's content (see :func:`write`); ``device`` as in :func:`observations`
    (`specdeploy calibrate --gpu cpu` passes :func:`cpu_device`)."""
    found = observations(runs, gpu, context_len, device)
    base = CPU_BASE if gpu == CPU else calibration(runtime).profile
    names = choose_constants(found, base, cpu=gpu == CPU)
    if not names:
        raise CalibrationError("the runs determine no constant of the cost model")
    profile = fit.fit(found, base, names)
    if len(found) > len(names):
        residuals = []
        for i in range(len(found)):
            rest = [o for j, o in enumerate(found) if j != i]
            residuals += fit.relative_errors([found[i]], fit.fit(rest, base, names))
        how = "leave-one-out"
    else:
        residuals, how = fit.relative_errors(found, profile), "in-sample (no more observations than constants)"
    by_method: dict[str, list[float]] = {}
    for o, e in zip(found, residuals):
        if o.method != methods.PLAIN:  # plain decoding's speedup is 1 by definition (its tokens/s residuals are listed)
            by_method.setdefault(o.method, []).append(e)
    bands = {m: fit.band(e) for m, e in sorted(by_method.items())}
    shipped = calibration(runtime)
    for method, band in shipped.bands.items():  # methods not benched keep the shipped bands, said so
        bands.setdefault(method, dataclasses.replace(band, borrowed_from=band.borrowed_from or runtime))
    source = (
        f"calibrated on {len(found)} {'step times' if gpu == CPU else 'speedups'} of {len(runs)} bench runs on {gpu} "
        f"({', '.join(sorted(by_method))}); fitted {', '.join(names)}; bands: {how} residuals"
        + (" of tokens/s" if gpu == CPU else "")
    )
    return {
        "format": FORMAT,
        "gpu": gpu,
        "runtime": runtime,
        "context_len": context_len,
        "gemms": device.gemms.to_dict() if device is not None and device.gemms is not None else None,
        "calibration": Calibration(profile, bands, source).to_dict(),
        "fitted": names,
        "observations": [
            {"run": o.source, "method": o.method, "concurrency": o.batch,
             "mean_batch": fit.mean_batch(o.batch_mix, o.batch), "batch_mix": dict(o.batch_mix),
             "acceptance_length": o.acceptance_length, "speedup": o.speedup, "residual": e}
            for o, e in zip(found, residuals)
        ],
    }  # fmt: skip


def write(content: dict[str, Any], path: Path) -> None:
    """Written beside ``path`` and renamed into place: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    os.replace(tmp, path)


def check_profile(found: Calibration) -> None:
    """A profile's constants and bands as the fit writes them: finite, efficiencies in (0, 1], the rest >= 0
    (a calibration with Infinity or NaN in it would drive best and the release gates)."""
    constants = dataclasses.asdict(found.profile)
    for key in ("bandwidth_efficiency", "compute_efficiency"):
        inputs.number(constants, key, 0.0, 1.0, "calibration.profile.", open_low=True)
    for key in constants:
        if key not in ("runtime", "bandwidth_efficiency", "compute_efficiency"):
            inputs.number(constants, key, 0.0, 1e3, "calibration.profile.")
    for method, band in found.bands.items():
        values = dataclasses.asdict(band)
        for key in ("low_error", "high_error"):
            inputs.number(values, key, -0.99, 100.0, f"calibration.bands.{method}.")


def load(path: Path, gpu: str | None = None) -> Calibration:
    """A calibration file's profile and bands; CalibrationError naming the file for a bad one or one
    made for another GPU type."""
    try:
        body = inputs.read_object(path, "calibration file")
        if body.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        found = Calibration.from_dict(body["calibration"])
        check_profile(found)
    except inputs.FieldError as exc:
        raise CalibrationError(f"{path}: {exc}") from None
    except InputError as exc:
        raise CalibrationError(str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CalibrationError(f"{path}: not a calibration `specdeploy calibrate` wrote ({exc})") from None
    if gpu is not None and body["gpu"] != gpu:
        raise CalibrationError(f"{path}: calibrated on {body['gpu']}, but the plan's GPU type is {gpu}")
    return found
