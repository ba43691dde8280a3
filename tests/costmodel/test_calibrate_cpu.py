"""`specdeploy calibrate --gpu cpu`: bench runs of a CPU reference backend with known step constants
calibrate back to them, predict a held-out method (EAGLE) and concurrency exactly, on a device whose
GEMMs were measured by rows too, and data that cannot determine the constants is refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline import trees
from pipeline.costmodel import calibrate, gemm_probe, served
from pipeline.costmodel.hardware import CPU_DEVICE, GpuPerf, gpu_perf
from pipeline.costmodel.pricing import method_step
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.costmodel.step import Deployment
from pipeline.spec import presets

ARCH = presets.preset("smollm2-135m-instruct")
CONTEXT = 64
# What the user's CPU "is": seconds per TFLOP, host work a request, weight streaming a layer, host
# work a step. The Medusa heads' pass streams weights without being a step: that tells the two fixed
# costs apart (plain decoding and Lookahead alone cannot). No method row terms: on the CPU a draft
# row is a row (its per-row term is collinear with the FLOPs and per-request terms).
TRUE = RuntimeProfile(
    runtime="reference", row_compute=25.0, host_step_s=4e-3, host_layer_s=1.5e-3, level_s=0.0, request_s=20e-3
)  # fmt: skip
SERVED = {
    "none": {"method": "none", "settings": {}},
    "lookahead": {"method": "lookahead", "settings": {"lookahead": [4, 3, 4], "max_draft_len": 15}},
    "medusa": {
        "method": "medusa",
        "settings": {"medusa_choices": [list(n) for n in trees.TREE_PRESETS["smollm2_medusa_10"]], "medusa_heads": 3},
    },
    "eagle": {
        "method": "eagle",
        "settings": {"eagle_choices": [list(n) for n in trees.TREE_PRESETS["cpu_small_10_depth_3"]]},
    },
}
AL = {"none": 1.0, "lookahead": 1.6, "medusa": 2.0, "eagle": 2.4}


def server(method: str) -> dict:
    # A Medusa engine names its own architecture (as TensorRT-LLM's checkpoints do): the same model.
    arch = ARCH.to_dict() | ({"architecture": "MedusaForCausalLM"} if method == "medusa" else {})
    return {**SERVED[method], "arch": arch, "dtype": "bfloat16", "kv_dtype": "bfloat16", "tp": 1, "pp": 1}


# A measured CPU whose GEMMs get cheaper per row as the rows grow (seconds ~ rows^0.6, the shape a
# float32 GEMM has here), which no constant times the FLOPs can follow; its probe read the lm_head
# from memory (113 MB in float32), so the passes do not stream it again.
ROWS = gemm_probe.PROBE_ROWS
SHAPES = gemm_probe.gemm_shapes(ARCH)
CURVE = {name: tuple(2 * o * i * 2e-12 * r**0.6 for r in ROWS) for name, (o, i) in SHAPES.items()}
MEASURED = dataclasses.replace(CPU_DEVICE, gemms=gemm_probe.CpuProfile(ROWS, CURVE, frozenset({"lm_head"})))


def measured_tps(method: str, concurrency: int, device: GpuPerf = CPU_DEVICE, mix: dict | None = None) -> float:
    """tokens/s a CPU with the TRUE constants gives: requests decoding x AL / step time, every step at
    ``concurrency`` or, with a batch ``mix`` ({requests decoding: share of the steps}), at its batches."""
    d = Deployment(ARCH, device, context_len=CONTEXT, profile=TRUE)
    mix = mix or {concurrency: 1.0}
    step = sum(share * method_step(d, served.drafting(server(method)), k).total_s for k, share in mix.items())
    return sum(k * share for k, share in mix.items()) * AL[method] / step


def bench_run(
    folder: Path, method: str, concurrency: int, device: GpuPerf = CPU_DEVICE, mix: dict | None = None
) -> Path:
    folder.mkdir(parents=True)
    body = {
        "concurrency": concurrency,
        "completed": 8,
        "tokens_per_second": measured_tps(method, concurrency, device, mix),
        "acceptance": {"mean_acceptance_length": None if method == "none" else AL[method]},
        "server": server(method),
    } | ({"batch_mix": {str(k): share for k, share in mix.items()}} if mix else {})
    (folder / "bench.json").write_text(json.dumps(body))
    return folder


def runs(tmp_path: Path, methods=("none", "lookahead", "medusa"), concurrencies=(1, 4)) -> list[calibrate.Run]:
    paths = [bench_run(tmp_path / f"{m}-{c}", m, c) for m in methods for c in concurrencies]
    return [calibrate.read_run(p) for p in paths]


def test_cpu_runs_calibrate_back_to_their_constants_and_predict_what_was_held_out(tmp_path):
    content = calibrate.calibrate(runs(tmp_path, concurrencies=(1, 2, 4)), "cpu", "trtllm", CONTEXT)
    # Lookahead's row term is resolved here (Medusa's heads break its collinearity) and fits to zero.
    assert content["fitted"] == ["row_compute", "request_s", "host_layer_s", "host_step_s", "lookahead_row_s"]
    profile = content["calibration"]["profile"]
    for name in content["fitted"]:
        assert profile[name] == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-9), name
    assert [o["method"] for o in content["observations"]].count("none") == 3  # plain's step times are data too
    assert max(abs(o["residual"]) for o in content["observations"]) < 1e-6  # leave-one-out, exact data
    assert "step times" in content["calibration"]["source"] and "of tokens/s" in content["calibration"]["source"]
    path = tmp_path / "cal.json"
    calibrate.write(content, path)
    loaded = calibrate.load(path, "cpu")
    assert set(loaded.bands) >= {"lookahead", "medusa"} and "none" not in loaded.bands
    # Held out: EAGLE (its drafter levels priced by the fitted weight streaming and FLOPs) and
    # concurrency 8, as tokens/s.
    d = Deployment(ARCH, gpu_perf("cpu"), context_len=CONTEXT, profile=loaded.profile)
    for method in ("none", "lookahead", "medusa", "eagle"):
        step = method_step(d, served.drafting(server(method)), 8).total_s
        assert 8 * AL[method] / step == pytest.approx(measured_tps(method, 8), rel=1e-6), method


def test_a_cpu_measured_by_rows_calibrates_back_and_predicts_through_its_file(tmp_path):
    methods, concurrencies = ("none", "lookahead", "medusa"), (1, 2, 4)
    paths = [bench_run(tmp_path / f"{m}-{c}", m, c, MEASURED) for m in methods for c in concurrencies]
    found = [calibrate.read_run(p) for p in paths]
    content = calibrate.calibrate(found, "cpu", "trtllm", CONTEXT, MEASURED)
    profile = content["calibration"]["profile"]
    for name in ("row_compute", "request_s", "host_layer_s", "host_step_s"):
        assert profile[name] == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-9), name
    # The file keeps the measured GEMMs: what it predicts (EAGLE, concurrency 8) is priced on them.
    path = tmp_path / "cal.json"
    calibrate.write(content, path)
    device = calibrate.priced_on(json.loads(path.read_text()))
    d = Deployment(ARCH, device, context_len=CONTEXT, profile=calibrate.load(path, "cpu").profile)
    for method in ("none", "medusa", "eagle"):
        step = method_step(d, served.drafting(server(method)), 8).total_s
        assert 8 * AL[method] / step == pytest.approx(measured_tps(method, 8, MEASURED), rel=1e-6), method
    # Priced by FLOPs instead, the same runs leave residuals: the rows' curve is what the probe adds.
    flops = calibrate.calibrate(found, "cpu", "trtllm", CONTEXT)
    assert flops["gemms"] is None and max(abs(o["residual"]) for o in flops["observations"]) > 0.02


# How bench saw the slots filled: at concurrency 4 with requests of unequal length, the last steps of
# a run decode fewer requests (bench measures the mix from the streamed responses: load.batch_mix).
MIXES = {1: {1: 1.0}, 2: {1: 0.1, 2: 0.9}, 4: {1: 0.05, 2: 0.1, 3: 0.15, 4: 0.7}}


def test_runs_whose_slots_were_not_all_full_calibrate_back_at_their_batch_mix(tmp_path):
    methods, concurrencies = ("none", "lookahead", "medusa"), (1, 2, 4)
    paths = [bench_run(tmp_path / f"{m}-{c}", m, c, MEASURED, MIXES[c]) for m in methods for c in concurrencies]
    found = [calibrate.read_run(p) for p in paths]
    assert found[-1].mean_batch == pytest.approx(3.5)
    content = calibrate.calibrate(found, "cpu", "trtllm", CONTEXT, MEASURED)
    for name in ("row_compute", "request_s", "host_layer_s", "host_step_s"):
        assert content["calibration"]["profile"][name] == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-9)
    # A held-out EAGLE run at concurrency 4 is predicted at its own mix.
    path = tmp_path / "cal.json"
    calibrate.write(content, path)
    eagle = calibrate.read_run(bench_run(tmp_path / "eagle-4", "eagle", 4, MEASURED, MIXES[4]))
    predicted = calibrate.predicted_tokens_per_second(json.loads(path.read_text()), eagle)
    assert predicted == pytest.approx(eagle.tokens_per_second, rel=1e-6)
    # Priced as if every step had decoded the concurrency, the same runs calibrate to other constants
    # (the steps with fewer requests taken for dearer full ones: 16% on the host work a request).
    for p in paths:
        body = json.loads((p / "bench.json").read_text())
        (p / "bench.json").write_text(json.dumps({k: v for k, v in body.items() if k != "batch_mix"}))
    nominal = calibrate.calibrate([calibrate.read_run(p) for p in paths], "cpu", "trtllm", CONTEXT, MEASURED)
    assert nominal["calibration"]["profile"]["request_s"] > 1.1 * TRUE.request_s


@pytest.mark.parametrize("mix", [{"0": 1.0}, {"1": 0.5}, {"two": 1.0}, [1, 2]])
def test_a_batch_mix_bench_did_not_write_is_refused_in_one_line(tmp_path, mix):
    path = bench_run(tmp_path / "none-1", "none", 1)
    body = json.loads((path / "bench.json").read_text())
    (path / "bench.json").write_text(json.dumps(body | {"batch_mix": mix}))
    with pytest.raises(calibrate.CalibrationError, match="batch_mix") as raised:
        calibrate.read_run(path)
    assert "\n" not in str(raised.value)


def test_cpu_device_measures_the_runs_model_on_this_host(tmp_path):
    tiny = presets.preset("smollm2-135m-instruct").to_dict() | {"num_layers": 1, "vocab_size": 512}
    run = calibrate.read_run(bench_run(tmp_path / "none-1", "none", 1))
    run = dataclasses.replace(run, served=run.served | {"arch": tiny})
    gemms = calibrate.cpu_device([run], repeats=1).gemms
    assert gemms is not None and gemms.rows == ROWS
    assert set(gemms.seconds) == set(SHAPES) and min(min(s) for s in gemms.seconds.values()) > 0


def test_noisy_cpu_runs_show_their_noise_in_the_leave_one_out_residuals(tmp_path):
    found = runs(tmp_path, concurrencies=(1, 2, 4))
    noisy = [
        run
        if i % 3
        else calibrate.Run(
            path=run.path,
            served=run.served,
            concurrency=run.concurrency,
            tokens_per_second=run.tokens_per_second * 1.08,
            acceptance_length=run.acceptance_length,
        )
        for i, run in enumerate(found)
    ]
    content = calibrate.calibrate(noisy, "cpu", "trtllm", CONTEXT)
    assert "leave-one-out" in content["calibration"]["source"]
    assert 0.01 < max(abs(o["residual"]) for o in content["observations"]) < 0.3


def test_cpu_refusals(tmp_path):
    def refused(found, match):
        with pytest.raises(calibrate.CalibrationError, match=match):
            calibrate.calibrate(found, "cpu", "trtllm", CONTEXT)

    refused(runs(tmp_path / "a", concurrencies=(4,)), "every run is at concurrency 4: one concurrency cannot")
    refused(runs(tmp_path / "b", methods=("none",)), "the runs serve none only")
    refused(runs(tmp_path / "c", methods=("lookahead",)), "the runs serve lookahead only")
    mixed = runs(tmp_path / "d", methods=("none",), concurrencies=(1, 4)) + runs(
        tmp_path / "e", methods=("lookahead",), concurrencies=(2,)
    )
    refused(mixed, "no speculative run has a plain-decoding run at two concurrencies")


def test_calibrate_cli_takes_the_cpu_device(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(gemm_probe, "probe", lambda *args, **kwargs: MEASURED.gemms)  # the real one takes seconds
    paths = [str(r.path.parent) for r in runs(tmp_path)]
    out = tmp_path / "cal.json"
    rc, stdout, err = cli("calibrate", "--gpu", "cpu", "--context-len", str(CONTEXT), *paths, "--out", str(out))
    assert rc == 0, err
    written = json.loads(out.read_text())
    assert written["gpu"] == "cpu" and written["gemms"]["rows"] == list(ROWS)
    assert "host_layer_s" in stdout and "measuring this host's GEMMs" in stdout
    rc, _, err = cli("calibrate", "--gpu", "cpu", *paths[:1], *paths[3:4])
    assert rc == 2 and err.count("\n") == 1, err


def test_cpu_lookahead_is_charged_the_rows_its_run_fed(tmp_path):
    """The reference backend feeds Lookahead's window (W(N - 1) = 8 rows, the root the first of them) and
    the n-grams its pool held: 50 accepted at AL 1.25 is 200 steps, 400 draft tokens 2 a step, so 10
    rows, not 16."""
    path = bench_run(tmp_path / "la", "lookahead", 1)
    body = json.loads((path / "bench.json").read_text())
    body["acceptance"] |= {"mean_acceptance_length": 1.25, "draft_tokens": 400, "accepted_draft_tokens": 50}
    (path / "bench.json").write_text(json.dumps(body))
    run = calibrate.read_run(path)
    assert calibrate.drafting(run, "cpu").rows == 10
    assert calibrate.drafting(run, "h100-sxm-80gb").rows == 16  # other devices: the configured rows


def recorded(run: calibrate.Run, scale: float, rows=ROWS, unscaled=()) -> calibrate.Run:
    """``run`` as `bench --probe-host` writes it: the MEASURED curve times ``scale`` but on ``unscaled``."""
    curve = {
        name: tuple(s * (scale if name not in unscaled else 1) for s in CURVE[name][: len(rows)]) for name in CURVE
    }
    return dataclasses.replace(run, host_gemms=gemm_probe.CpuProfile(tuple(rows), curve, MEASURED.gemms.out_of_cache))


def test_cpu_device_takes_the_fastest_of_the_runs_recorded_probes_without_probing(tmp_path, monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("probed, though every run recorded its probe")

    monkeypatch.setattr(gemm_probe, "probe", no_probe)
    a, b = runs(tmp_path, methods=("none",), concurrencies=(1, 4))
    # entry by entry: a's probe is faster on qkv, b's on every other shape
    said: list[str] = []
    gemms = calibrate.cpu_device([recorded(a, 1.5, unscaled=("qkv",)), recorded(b, 1.2)], say=said.append).gemms
    assert gemms is not None and gemms.rows == ROWS
    assert said[-1].endswith("so passes do not stream them again: lm_head") and gemms.out_of_cache == {"lm_head"}
    assert gemms.seconds["qkv"] == CURVE["qkv"]
    assert gemms.seconds["fc"] == pytest.approx([s * 1.2 for s in CURVE["fc"]])


def test_cpu_device_probes_the_host_unless_every_run_recorded_one(tmp_path, monkeypatch):
    monkeypatch.setattr(gemm_probe, "probe", lambda *args, **kwargs: MEASURED.gemms)
    a, b = runs(tmp_path, methods=("none",), concurrencies=(1, 4))
    assert calibrate.cpu_device([recorded(a, 2.0), b]).gemms == MEASURED.gemms


def test_recorded_probes_that_do_not_match_or_read_are_refused(tmp_path):
    a, b = runs(tmp_path, methods=("none",), concurrencies=(1, 4))
    with pytest.raises(calibrate.CalibrationError, match="recorded GEMM probes cannot be combined"):
        calibrate.cpu_device([recorded(a, 1.0), recorded(b, 1.0, rows=ROWS[:4])])
    body = json.loads(a.path.read_text())
    a.path.write_text(json.dumps(body | {"host_gemms": {"rows": [1, 2]}}))  # no seconds
    with pytest.raises(calibrate.CalibrationError, match=r"bench.json: host_gemms: not a GEMM probe"):
        calibrate.read_run(a.path)
