"""`specdeploy evaluate` and the evaluate stage of a plan, end to end on a tiny Medusa spec."""

from __future__ import annotations

import json

import pytest

from pipeline.costmodel.gemm_probe import CpuProfile
from pipeline.evaluation.result import RELEASE_EXIT_CODE
from tests.runtime import fixtures as sf

SPEC = """\
name: tiny
model: {{path: {hf}, dtype: float32}}
heads: {{medusa: {{path: {medusa}}}}}
speculative: {{medusa: {{choices: cpu_small_10_depth_3}}}}
build: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 160, max_num_tokens: 1024}}
target: reference
{evaluation}
"""


@pytest.fixture
def spec(tiny, tmp_path):
    def write(
        evaluation: str = "evaluation: {prompts: prompts.jsonl, count: 3, max_new_tokens: 8, batch_sizes: [1, 4]}",
        prompts: list[str] | None = None,
    ):
        lines = prompts or [json.dumps({"input_ids": p}) for p in sf.test_prompts(96)[:4]]
        (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
        path = tmp_path / "tiny.yaml"
        path.write_text(SPEC.format(hf=tiny.hf, medusa=tiny.medusa, evaluation=evaluation))
        return path

    return write


def test_plan_puts_evaluate_between_convert_and_build(cli, spec):
    rc, out, err = cli("plan", str(spec()), "--json")
    assert rc == 0, err
    stages = [s["name"] for s in json.loads(out)["variants"][0]["stages"]]
    assert stages == ["convert", "evaluate", "build", "package"]
    rc, out, _ = cli("plan", str(spec(evaluation="")), "--json")
    assert [s["name"] for s in json.loads(out)["variants"][0]["stages"]] == ["convert", "build", "package"]


def test_evaluate_writes_a_fingerprinted_result_and_skips_when_up_to_date(cli, spec, tmp_path):
    path = spec()
    rc, out, err = cli("evaluate", str(path))
    assert rc == 0, err
    folder = tmp_path / "engines" / "tiny" / "evaluation"
    result = json.loads((folder / "evaluation.json").read_text())
    assert (folder / ".specdeploy-stage.json").is_file()
    names = [c["name"] for c in result["candidates"]]
    assert names[0] == "plain" and "lookahead(4,3,4)" in names and "medusa[cpu_small_10_depth_3]" in names
    assert result["prompts"]["count"] == 3 and result["gpu"] == {**result["gpu"], "assumed": True}
    assert result["timing"]["prefill_saved_cpu_s"] == pytest.approx(
        result["timing"]["prefill_cpu_s"] * (len(names) - 1)
    )
    # The CPU cost model's measurements, taken in the same run: engine passes by rows and the GEMM probe.
    # the passes' row counts: 1..32 by doubling, Lookahead (4,3,4)'s 8..16 and (2,3,2)'s 4..8, the trees' 11
    assert set(map(int, result["timing"]["cpu_forward_s"])) == {1, 2, *range(4, 17), 32}
    profile = CpuProfile.from_dict(result["timing"]["cpu_gemm_probe"])
    assert profile.rows[0] == 1 and profile.gemm_s("lm_head", 1) > 0
    for c in result["candidates"]:
        assert c["identity"]["lossless"] and c["identity"]["identical"] == 3
        assert c["cpu_probe"]["batch_invariant"] and c["cpu_probe"]["prompts"] == 3
        assert set(c["predicted_speedup"]) == {"1", "4"}
        for b, i in c["predicted_interval"].items():  # every prediction carries its interval
            assert i["low"] <= i["point"] == c["predicted_speedup"][b] <= i["high"]
            assert (i["low"] < i["high"]) == (c["method"] != "none")
        assert set(c["predicted_curve_interval"]) == set(c["predicted_curve"])
    assert result["gpu"]["runtime"] == "trtllm" and "pytorch-eager" in result["gpu"]["calibration"]
    assert result["choice"]["speedup_bound"] == "low"
    assert "medusa[cpu_small_10_depth_3]" in out
    assert result["choice"]["failed"] is None and result["method_requested"] == "auto"
    for name in ("report.json", "report.md", "acceptance.png", "speedup_vs_batch.png"):
        assert (folder / name).is_file(), name
    report = (folder / "report.md").read_text()
    assert "**Choice:" in report and "Release gates check the interval's lower end" in report
    medusa = next(c for c in result["candidates"] if c["method"] == "medusa")
    low, high = medusa["predicted_interval"]["1"]["low"], medusa["predicted_interval"]["1"]["high"]
    assert f"({low:.2f}-{high:.2f})" in report
    rc, out, _ = cli("evaluate", str(path))
    assert rc == 0 and "evaluate: skipped" in out
    rc, out, err = cli("report", str(path))
    assert rc == 0 and "tiny" in out and "pass" in out, err
    rc, out, _ = cli("plan", str(path))
    assert rc == 0 and "measured choice" in out and "out of date" not in out
    path.write_text(path.read_text().replace("count: 3", "count: 2"))  # other settings: no longer current
    rc, out, _ = cli("plan", str(path))
    assert rc == 0 and "measured choice" in out and "out of date" in out


def test_best_chooses_and_a_failed_gate_exits_6(cli, spec, tmp_path):
    path = spec(
        evaluation="evaluation: {prompts: prompts.jsonl, count: 2, max_new_tokens: 6}\n"
        "release: {min_acceptance_length: 50, on_fail: fail}"
    )
    text = path.read_text().replace("speculative: {", "speculative: {method: best, ")
    path.write_text(text)
    rc, out, err = cli("evaluate", str(path))
    assert rc == RELEASE_EXIT_CODE == 6, err
    assert err.count("\n") == 1 and err.startswith("error: tiny: release gate failed: ")
    assert "min_acceptance_length 50.0: measured" in err
    result = json.loads((tmp_path / "engines" / "tiny" / "evaluation" / "evaluation.json").read_text())
    assert result["method_requested"] == "best" and result["choice"]["failed"]
    # For CI: the same verdict as JSON on stdout and as a failed JUnit check with the measured value.
    rc, out, err = cli("evaluate", str(path), "--json", "--junit-xml", str(tmp_path / "evaluate.xml"))
    assert rc == RELEASE_EXIT_CODE and "evaluate: skipped" in err, err
    (variant,) = json.loads(out)["variants"]
    assert variant["stopped_at"] == "evaluate" and variant["exit_code"] == RELEASE_EXIT_CODE
    assert [s["stage"] for s in variant["stages"]] == ["evaluate"]  # method best: first; not the stages after it
    assert variant["evaluation"]["release_failed"] == result["choice"]["failed"]
    junit = (tmp_path / "evaluate.xml").read_text()
    assert '<failure message="min_acceptance_length 50.0: measured' in junit and "threshold 50.0" in junit
    rc, out, err = cli("engine", str(path))  # the build does not run for a variant that failed its gate
    assert rc == RELEASE_EXIT_CODE and err.startswith("error: tiny: release gate failed: ") and err.count("\n") == 1
    assert "misses release gate min_acceptance_length 50.0: measured" in err
    assert not (tmp_path / "engines" / "tiny" / "engine").exists()
    # The release manifest records the evaluation: the choice, the gates and each candidate against them.
    entry = json.loads((tmp_path / "engines" / "tiny" / "manifest.json").read_text())["variants"]["tiny"]
    evaluation = entry["evaluation"]
    assert evaluation["method_requested"] == "best" and evaluation["release_failed"] == result["choice"]["failed"]
    assert evaluation["gates"] == {**evaluation["gates"], "min_acceptance_length": 50.0, "on_fail": "fail"}
    by_name = {c["name"]: c for c in evaluation["candidates"]}
    assert set(by_name) == {c["name"] for c in result["candidates"]}
    assert by_name["plain"]["gate"] == "pass" and by_name["plain"]["cpu_speedup"] == 1.0
    spec_tree = by_name["medusa[cpu_small_10_depth_3]"]
    assert spec_tree["gate"].startswith("min_acceptance_length 50.0: measured") and spec_tree["lossless"]
    assert set(spec_tree["predicted_speedup"]) == {"1", "8", "32"} and spec_tree["mean_acceptance_length"] > 1
    assert set(spec_tree["predicted_interval"]) == {"1", "8", "32"} and evaluation["speedup_bound"] == "low"


def test_best_without_evaluation_is_a_spec_error(cli, spec):
    path = spec(evaluation="")
    path.write_text(path.read_text().replace("speculative: {", "speculative: {method: best, "))
    rc, _, err = cli("validate", str(path))
    assert rc == 2 and "best chooses by measurement and needs an evaluation: section" in err


def test_spec_without_evaluation_gets_the_defaults(cli, spec, tmp_path):
    # The default prompts start with a chat instruction: the tiny model's tokenizer has no chat template,
    # which the error says with the prompt's file and line.
    rc, _, err = cli("evaluate", str(spec(evaluation="")))
    assert rc == 2 and err.count("\n") == 1 and 'chat_eval.jsonl:1: "messages" need a chat template' in err, err
    assert not (tmp_path / "engines" / "tiny" / "evaluation").exists()


def test_bad_prompt_file_is_one_line_with_file_and_line(cli, spec, tmp_path):
    rc, _, err = cli("evaluate", str(spec(prompts=['{"input_ids": [1, 2]}', "{oops"])))
    assert rc == 2 and err.count("\n") == 1 and f"{tmp_path / 'prompts.jsonl'}:2: not valid JSON" in err, err
    assert not (tmp_path / "engines" / "tiny" / "evaluation").exists()


@pytest.mark.parametrize(
    "evaluation, expected",
    [
        ("evaluation: {count: 0}", "evaluation.count"),
        ("evaluation: {batch_sizes: [0]}", "batch sizes must be >= 1"),
        ("evaluation: {devices: cpu}", "unknown key 'devices'"),
        ("evaluation: {prefer: [eagle, eagle]}", "each method at most once"),
        ("evaluation: {prefer: [draft]}", "evaluation.prefer"),
        ("evaluation: {}\nrelease: {speedup_bound: mean}", "release.speedup_bound"),
    ],
)
def test_bad_evaluation_section(cli, spec, evaluation, expected):
    rc, _, err = cli("validate", str(spec(evaluation=evaluation)))
    assert rc == 2 and expected in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the host without CUDA")
def test_device_cuda_without_a_gpu_is_exit_3(cli, spec, tmp_path):
    rc, out, _ = cli(
        "evaluate",
        str(spec(evaluation="evaluation: {prompts: prompts.jsonl, count: 2, max_new_tokens: 4, device: cuda}")),
    )
    assert rc == 3 and "no CUDA device" in out
    assert not (tmp_path / "engines" / "tiny" / "evaluation").exists()


def test_best_builds_and_packages_the_measured_choice(cli, spec, tmp_path):
    # A gate no head can pass makes the choice fall back to plain decoding: the build must then be a plain
    # engine from a checkpoint without the Medusa heads, and the Triton model must not be told of them.
    path = spec(
        evaluation="evaluation: {prompts: prompts.jsonl, count: 2, max_new_tokens: 6, batch_sizes: [1]}\n"
        "release: {min_acceptance_length: 50, on_fail: fallback}"
    )
    path.write_text(path.read_text().replace("speculative: {", "speculative: {method: best, "))
    rc, out, err = cli("plan", str(path))
    assert rc == 0 and "best: no evaluation yet" in out, err
    rc, out, err = cli("engine", str(path))
    assert rc == 0, err
    engines = tmp_path / "engines" / "tiny"
    result = json.loads((engines / "evaluation" / "evaluation.json").read_text())
    assert result["choice"]["candidate"] == "plain" and "fell back to plain" in result["choice"]["reason"]
    assert "[tiny] method best: building none: best: measured choice plain: " in out
    engine = json.loads((engines / "engine" / "config.json").read_text())
    assert engine["pretrained_config"]["architecture"] == "LlamaForCausalLM"
    assert engine["build_config"]["speculative_decoding_mode"] == 1  # TensorRT-LLM's SpeculativeDecodingMode.NONE
    checkpoint = json.loads((engines / "checkpoint" / "config.json").read_text())
    assert checkpoint["architecture"] == "LlamaForCausalLM" and "num_medusa_heads" not in checkpoint
    triton = (tmp_path / "triton_repo" / "tiny" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "medusa_choices" not in triton
    # The evaluation measured the heads' candidates all the same (it converts them itself) and stays up to date.
    assert any(c["method"] == "medusa" for c in result["candidates"])
    rc, out, err = cli("engine", str(path))
    assert rc == 0 and "evaluate: up to date, skipped" in out and "build: up to date, skipped" in out, err
    rc, out, _ = cli("plan", str(path))
    assert rc == 0 and "best: measured choice plain" in out
    manifest = json.loads((engines / "manifest.json").read_text())["variants"]["tiny"]
    assert manifest["method"] == "none" and manifest["evaluation"]["chosen"] == "plain"


def test_a_calibration_file_prices_the_candidates(cli, spec, tmp_path):
    """gpu.calibration: its profile and its own bands give the predictions and intervals, the result and
    the manifest record the file; a file for another GPU type or not a calibration is a spec error."""
    from pipeline.costmodel.calibrate import FORMAT, write
    from pipeline.costmodel.profile import Calibration, ErrorBand, RuntimeProfile

    band = ErrorBand(low_error=-0.25, high_error=0.5, residuals=4)
    content = {
        "format": FORMAT,
        "gpu": "l40s",
        "calibration": Calibration(
            RuntimeProfile(runtime="trtllm", host_step_s=2e-3),
            {m: band for m in ("medusa", "eagle", "lookahead")},
            "mine",
        ).to_dict(),
    }
    write(content, tmp_path / "cal.json")
    path = spec()
    text = path.read_text() + "gpu: {type: l40s, calibration: cal.json}\n"
    path.write_text(text)
    rc, out, err = cli("evaluate", str(path))
    assert rc == 0, err
    result = json.loads((tmp_path / "engines" / "tiny" / "evaluation" / "evaluation.json").read_text())
    assert result["gpu"]["calibration"] == "mine" and result["gpu"]["calibration_file"] == str(tmp_path / "cal.json")
    medusa = next(c for c in result["candidates"] if c["method"] == "medusa")
    interval = medusa["predicted_interval"]["1"]
    assert interval["low"] == pytest.approx(interval["point"] / 1.5) and interval["high"] == pytest.approx(
        interval["point"] / 0.75
    )
    write({**content, "gpu": "h100-sxm-80gb"}, tmp_path / "cal.json")
    rc, _, err = cli("validate", str(path))
    assert (
        rc == 2 and "gpu.calibration" in err and "calibrated on h100-sxm-80gb, but the plan's GPU type is l40s" in err
    )
    (tmp_path / "cal.json").write_text("{}")
    rc, _, err = cli("validate", str(path))
    assert rc == 2 and "not a calibration `specdeploy calibrate` wrote" in err, err
