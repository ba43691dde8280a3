"""The build stage: the reference (CPU) build, the TensorRT path against a fake trtllm-build,
failures that leave no engine folder, and `specdeploy build [--dry-run]`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "trtllm"))
from trtllm_helpers import write_checkpoint  # noqa: E402

from pipeline.errors import StageError  # noqa: E402
from pipeline.plan.planner import make_plan  # noqa: E402
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec  # noqa: E402
from pipeline.stages import build  # noqa: E402
from pipeline.stages.execute import StageUnavailable  # noqa: E402
from pipeline.stages.runner import run_stage  # noqa: E402
from tests.standins import fake_tensorrt_llm  # noqa: E402


@pytest.fixture
def variant_of(tmp_path, write_spec, hf_config_dir):
    """Plan a one-variant spec on a tiny Llama config, with a convert-stage checkpoint written."""
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")
    model = hf_config_dir()

    def make(
        extra: str = "",
        target: str = "tensorrt",
        build_extra: str = "",
        limits: str = "max_batch_size: 4, max_input_len: 256, max_seq_len: 512, max_num_tokens: 32",
    ):
        spec = write_spec(
            f"name: v\nmodel: {{path: {model}, dtype: float32}}\ntarget: {target}\n"
            f"build: {{{limits}{build_extra}}}\n" + extra
        )
        variant = make_plan(load_spec(spec), roots).variants[0]
        write_checkpoint(variant)
        return variant, spec

    return make


@pytest.fixture
def fake_trtllm(tmp_path, monkeypatch):
    def install(version: str = "1.2.1") -> Path:
        bin_dir, site = fake_tensorrt_llm(tmp_path / f"fake-{version}", version)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        monkeypatch.syspath_prepend(str(site))
        return bin_dir

    return install


def run_build(variant):
    stage = variant.stage("build")
    return run_stage(stage, lambda out: build.run(variant, stage, out), on_wait=print)


def leftovers(variant) -> list[str]:
    names = (p.name for p in variant.stage("build").output.parent.iterdir())
    return sorted(name for name in names if ".engine.tmp-" in name or ".engine.old-" in name)


# --- reference target ------------------------------------------------------------------------------


def test_reference_build_links_weights_and_writes_the_engine_config(variant_of):
    variant, _ = variant_of("parallel: {tp: 2}\n", target="reference")
    result = run_build(variant)
    engine, checkpoint = result.output, variant.stage("convert").output
    assert sorted(p.name for p in engine.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "rank0.safetensors",
        "rank1.safetensors",
    ]
    assert not list(engine.glob("*.engine"))
    for rank in range(2):  # hard links: same inode, no copy of the weights
        name = f"rank{rank}.safetensors"
        assert (engine / name).stat().st_ino == (checkpoint / name).stat().st_ino
    config = json.loads((engine / "config.json").read_text())
    assert config["build_config"]["max_seq_len"] == 512 + 15 and config["build_config"]["max_num_tokens"] == 64
    assert run_build(variant).status == "skipped"


def test_reference_build_copies_across_filesystems(variant_of, monkeypatch):
    variant, _ = variant_of(target="reference")

    def no_link(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    engine = run_build(variant).output
    source = variant.stage("convert").output / "rank0.safetensors"
    assert (engine / "rank0.safetensors").read_bytes() == source.read_bytes()


def test_missing_or_mismatched_checkpoint_fails_before_building(variant_of):
    variant, _ = variant_of(target="reference")
    (variant.stage("convert").output / "rank0.safetensors").unlink()
    with pytest.raises(StageError, match="missing rank0.safetensors"):
        run_build(variant)
    (variant.stage("convert").output / "config.json").unlink()
    with pytest.raises(StageError, match="run the convert stage first"):
        run_build(variant)
    assert not variant.stage("build").output.exists() and leftovers(variant) == []


# --- tensorrt target -----------------------------------------------------------------------------


def test_tensorrt_build_is_unavailable_without_trtllm(variant_of, monkeypatch, tmp_path):
    variant, _ = variant_of()
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(StageUnavailable) as info:
        run_build(variant)
    message = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in message
    assert "trtllm-build is not on PATH" in message and "nvcr.io/nvidia/tritonserver:" in message
    assert f"trtllm-build --checkpoint_dir {variant.stage('convert').output}" in message
    assert f"--output_dir {variant.stage('build').output}" in message
    assert not variant.stage("build").output.exists()


def test_tensorrt_build_refuses_trtllm_after_1_2_with_fake_trtllm_build(variant_of, fake_trtllm):
    variant, _ = variant_of()
    fake_trtllm("1.3.0")
    with pytest.raises(StageUnavailable, match="TensorRT-LLM 1.3.0 is installed but engines need 1.2.x"):
        run_build(variant)


@pytest.mark.parametrize("extra", ["", "heads:\n  eagle: {path: nowhere}\nparallel: {tp: 2}\n"])
def test_tensorrt_build_with_fake_trtllm_build(variant_of, fake_trtllm, extra):
    variant, _ = variant_of(extra)
    fake_trtllm()
    engine = run_build(variant).output
    call = json.loads((engine / "fake-call.json").read_text())
    assert Path(call["cwd"]).name.startswith(".engine.tmp-")  # ran inside the runner's temp folder
    assert call["argv"][call["argv"].index("--workers") + 1] == "1"  # CUDA_VISIBLE_DEVICES=0
    assert sorted(p.name for p in engine.glob("rank*")) == [f"rank{r}.engine" for r in range(variant.world_size)]
    assert (engine / "model.cache").is_file()  # the timing cache lands in the engine folder, not the CWD
    log = (engine.parent / "build.log").read_text()
    assert log.startswith("$ (cd ") and "trtllm-build --checkpoint_dir" in log and "Total time of building" in log
    assert leftovers(variant) == []


def test_failing_fake_trtllm_build_leaves_no_engine_folder(variant_of, fake_trtllm, monkeypatch):
    variant, _ = variant_of()
    fake_trtllm()
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "1")
    with pytest.raises(StageError) as info:
        run_build(variant)
    log = variant.stage("build").output.parent / "build.log"
    message = str(info.value)
    assert "trtllm-build failed for v (exit 1)" in message and "could not be allocated" in message
    assert f"full log: {log}" in message and "could not be allocated" in log.read_text()
    assert not variant.stage("build").output.exists() and leftovers(variant) == []


def test_fake_trtllm_build_output_that_disagrees_with_the_plan_is_refused(variant_of, fake_trtllm, monkeypatch):
    variant, _ = variant_of()
    fake_trtllm()
    monkeypatch.setenv("FAKE_TRTLLM_NO_DRAFT", "1")
    with pytest.raises(StageError, match="max_draft_len is 0, the plan needs 15"):
        run_build(variant)
    assert not variant.stage("build").output.exists()


def test_max_num_tokens_clamp_matches_plan_with_fake_trtllm_build(variant_of, fake_trtllm):
    variant, _ = variant_of(limits="max_batch_size: 1, max_input_len: 128, max_seq_len: 256, max_num_tokens: 8192")
    fake_trtllm()
    run_build(variant)  # trtllm-build stores min(8192, 1 * 256); the plan must predict the same


# --- the CLI -------------------------------------------------------------------------------------------


def test_cli_build_dry_run_prints_commands_and_runs_nothing(cli, tmp_path):
    spec = Path(__file__).resolve().parents[2] / "specs" / "llama8b-fleet.yaml"
    rc, out, _ = cli("build", str(spec), "--dry-run", "--variant", "code-ft")
    assert rc == 0
    assert "trtllm-build --checkpoint_dir" in out and "--max_draft_len 55" in out and "--workers 2" in out
    assert "mpirun --allow-run-as-root -n 1 /opt/tritonserver/bin/tritonserver" in out
    # Two ranks, in the serve command here and in the Kubernetes deployment's.
    assert out.count("shm-region-prefix-name=prefix") == 4 and "support-ft" not in out
    assert "# serve in Kubernetes (deploy.mount_path /models)" in out
    assert not (tmp_path / "engines").exists()


def test_cli_build_runs_only_the_build_stage(cli, variant_of, tmp_path):
    _, spec = variant_of(target="reference")
    rc, out, _ = cli("build", str(spec))
    assert rc == 0 and "[v] build: done" in out
    assert (tmp_path / "engines" / "v" / "engine" / "config.json").is_file()
    assert not (tmp_path / "triton_repo").exists()


def test_cli_build_reports_unavailable_with_exit_3(cli, variant_of, monkeypatch, tmp_path):
    _, spec = variant_of()
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rc, out, _ = cli("build", str(spec))
    assert rc == 3 and "trtllm-build is not on PATH" in out


def test_cli_build_rejects_bad_extra_flags_with_exit_2(cli, variant_of):
    _, spec = variant_of(target="reference", build_extra=", extra_flags: {tp_size: 2}")
    rc, _, err = cli("build", str(spec), "--dry-run")
    assert rc == 2 and "build.extra_flags.tp_size: not a trtllm-build 1.2.1 flag" in err


def test_cli_build_without_a_checkpoint_is_exit_3_with_what_to_do(cli, write_spec):
    spec = write_spec("name: big\nmodel: {path: /nonexistent/llama, preset: llama-3.1-8b}\ntarget: reference\n")
    rc, out, _ = cli("build", str(spec))
    assert rc == 3
    assert "[big] build: the converted checkpoint files are not on this host" in out
    assert "run the convert stage first (specdeploy engine SPEC)" in out
