"""`specdeploy calibrate`: bench runs of a known cost model calibrate back to it; data that cannot
determine the constants is refused in one line; bench records what a repository serves."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline import trees
from pipeline.costmodel import calibrate, served
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.pricing import target_step
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.costmodel.step import Deployment
from pipeline.spec import presets

GPU = "h100-sxm-80gb"
ARCH = presets.preset("llama-3.1-8b")
# What the user's servers "are": constants the shipped trtllm profile does not have.
TRUE = RuntimeProfile(
    runtime="trtllm", row_compute=0.6, host_step_s=0.9e-3, level_s=0.1e-3, tree_row_s=0.004e-3, lookahead_row_s=0.01e-3
)
SERVED = {
    "none": {"method": "none", "settings": {}},
    "lookahead": {"method": "lookahead", "settings": {"lookahead": [4, 3, 4], "max_draft_len": 15}},
    "medusa": {
        "method": "medusa",
        "settings": {"medusa_choices": [list(n) for n in trees.MC_SIM_7B_63], "medusa_heads": 4, "max_draft_len": 63},
    },
}
AL = {"none": 1.0, "lookahead": 1.6, "medusa": 2.4}


def server(method: str, arch=ARCH) -> dict:
    return {**SERVED[method], "arch": arch.to_dict(), "dtype": "bfloat16", "kv_dtype": "bfloat16", "tp": 1, "pp": 1}


def measured_tps(method: str, concurrency: int, mix: dict | None = None) -> float:
    """tokens/s a server with the TRUE constants gives: requests decoding x AL / step time, every step
    at ``concurrency`` or at the batches of ``mix`` ({requests decoding: share of the steps})."""
    d = Deployment(ARCH, gpu_perf(GPU), context_len=512, profile=TRUE)
    mix = mix or {concurrency: 1.0}
    if method == "none":
        steps = {k: target_step(d, k, 1, logit_rows=1).total_s for k in mix}
    else:
        steps = {p.batch: p.method_s for p in predict(d, served.drafting(server(method)), AL[method], list(mix))}
    return sum(k * share for k, share in mix.items()) * AL[method] / sum(mix[k] * steps[k] for k in mix)


def bench_run(folder: Path, method: str, concurrency: int, **overrides) -> Path:
    folder.mkdir(parents=True)
    body = {
        "concurrency": concurrency,
        "completed": 8,
        "tokens_per_second": measured_tps(method, concurrency),
        "acceptance": {"mean_acceptance_length": None if method == "none" else AL[method]},
        "server": server(method),
    } | overrides
    (folder / "bench.json").write_text(json.dumps(body))
    return folder


def test_runs_whose_slots_were_not_all_full_calibrate_back_at_their_batch_mix(tmp_path):
    """Each run is priced at its own batch mix; the speedup compares the runs per request decoding."""
    mixes = {1: {1: 1.0}, 4: {2: 0.2, 3: 0.2, 4: 0.6}, 16: {12: 0.5, 16: 0.5}}
    paths = [
        bench_run(tmp_path / f"{m}-{c}", m, c, tokens_per_second=measured_tps(m, c, mix), batch_mix=mix)
        for m in ("none", "lookahead", "medusa")
        for c, mix in mixes.items()
    ]
    content = calibrate.calibrate([calibrate.read_run(p) for p in paths], GPU, "trtllm", 512)
    for name in content["fitted"]:
        assert content["calibration"]["profile"][name] == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    # A plain run that kept its 4 slots full against a Lookahead run that did not: per request decoding.
    full = calibrate.read_run(bench_run(tmp_path / "full", "none", 4, batch_mix={4: 1.0}))
    partial = calibrate.read_run(paths[4])  # lookahead at concurrency 4, 3.4 requests a step
    plain_1, lookahead_1 = calibrate.read_run(paths[0]), calibrate.read_run(paths[3])
    o = calibrate.observations([full, partial, plain_1, lookahead_1], GPU, 512)[0]
    assert o.method == "lookahead"
    assert o.speedup == pytest.approx(partial.tokens_per_second / full.tokens_per_second * 4 / 3.4)


def runs(tmp_path: Path, methods=("none", "lookahead", "medusa"), concurrencies=(1, 4)) -> list[Path]:
    return [bench_run(tmp_path / f"{m}-{c}", m, c) for m in methods for c in concurrencies]


def test_runs_of_a_known_model_calibrate_back_to_it(tmp_path):
    found = [calibrate.read_run(r) for r in runs(tmp_path, concurrencies=(1, 4, 16))]
    content = calibrate.calibrate(found, GPU, "trtllm", 512)
    assert content["fitted"] == ["lookahead_row_s", "tree_row_s", "row_compute", "host_step_s"]
    for name in content["fitted"]:
        assert content["calibration"]["profile"][name] == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    path = tmp_path / "cal.json"
    calibrate.write(content, path)
    loaded = calibrate.load(path, GPU)
    # A held-out concurrency: predicted from the calibration as the TRUE server measures it.
    for method in ("lookahead", "medusa"):
        d = Deployment(ARCH, gpu_perf(GPU), context_len=512, profile=loaded.profile)
        (p,) = predict(d, served.drafting(server(method)), AL[method], [8])
        measured = measured_tps(method, 8) / measured_tps("none", 8)
        assert p.speedup == pytest.approx(measured, rel=1e-4), method
        assert loaded.bands[method].borrowed_from is None and loaded.bands[method].residuals == 3
    assert loaded.bands["eagle"].borrowed_from == "pytorch-eager"  # not benched: the shipped band, said so
    with pytest.raises(
        calibrate.CalibrationError, match="calibrated on h100-sxm-80gb, but the plan's GPU type is l40s"
    ):
        calibrate.load(path, "l40s")


def test_refusals(tmp_path):
    def refused(paths, match):
        with pytest.raises(calibrate.CalibrationError, match=match):
            calibrate.calibrate([calibrate.read_run(p) for p in paths], GPU, "trtllm", 512)

    refused(runs(tmp_path / "a", concurrencies=(4,)), "every run is at concurrency 4: one concurrency cannot")
    refused(runs(tmp_path / "b", methods=("medusa",)), "the runs serve medusa only: a speedup needs plain decoding")
    refused(runs(tmp_path / "c", methods=("none",)), "the runs serve none only")
    mixed = [bench_run(tmp_path / "d" / "p", "none", 1), bench_run(tmp_path / "d" / "m", "medusa", 4)]
    refused(mixed, "no speculative run has a plain-decoding run at two concurrencies")
    other = runs(tmp_path / "e")
    body = json.loads((other[0] / "bench.json").read_text())
    body["server"] = server("none", dataclasses.replace(ARCH, num_layers=16))
    (other[0] / "bench.json").write_text(json.dumps(body))
    refused(other, "different models or engines")
    bare = bench_run(tmp_path / "f", "none", 1, server=None)
    body = json.loads((bare / "bench.json").read_text())
    del body["server"]
    (bare / "bench.json").write_text(json.dumps(body))
    with pytest.raises(calibrate.CalibrationError, match="--repository"):
        calibrate.read_run(bare)


def test_calibrate_cli(cli, tmp_path):
    out = tmp_path / "cal.json"
    rc, stdout, err = cli("calibrate", "--gpu", GPU, *map(str, runs(tmp_path)), "--out", str(out))
    assert rc == 0, err
    assert json.loads(out.read_text())["format"] == calibrate.FORMAT and "gpu: {type: h100-sxm-80gb" in stdout
    rc, _, err = cli("calibrate", "--gpu", GPU, *map(str, runs(tmp_path / "one", concurrencies=(1,))))
    assert rc == 2 and err.count("\n") == 1 and "one concurrency cannot" in err, err


def test_bench_records_what_a_repository_serves(tmp_path):
    from pipeline.stages import package
    from tests.triton.triton_fixtures import fake_engine, tiny_plan

    variant = tiny_plan(tmp_path)
    engine = fake_engine(variant)
    config = json.loads((engine / "config.json").read_text())
    arch = variant.arch
    config["pretrained_config"] |= {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "intermediate_size": arch.intermediate_size,
        "dtype": "float32",  # a reference engine: recorded as it is, priced as 16-bit
    }
    (engine / "config.json").write_text(json.dumps(config))
    stage = variant.stage("package")
    stage.output.mkdir(parents=True)
    package.run(variant, stage, stage.output)
    found = served.describe(stage.output)
    assert found["method"] == "lookahead" and found["settings"]["lookahead"] == [3, 2, 2]
    assert found["arch"]["num_layers"] == arch.num_layers and found["tp"] == 1
    assert found["dtype"] == found["kv_dtype"] == "float32" and served.priced_dtype(found["dtype"]) == "bfloat16"
    assert served.drafting(found).rows == 1 + variant.build.max_draft_len
    with pytest.raises(Exception, match="expected one tensorrt_llm model"):
        served.describe(tmp_path)
