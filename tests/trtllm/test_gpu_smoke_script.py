"""scripts/gpu-smoke.sh on a CPU host: its spec rewriting works, and it refuses to run without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trtllm_helpers import REPO

from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec

SCRIPT = REPO / "scripts" / "gpu-smoke.sh"


def bash(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "SMOKE_WORK": str(tmp_path / "work"),
    }
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60)


def test_script_uses_strict_mode_and_no_eval():
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text and "eval" not in text
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_derived_gpu_spec_is_tensorrt_tp1_with_absolute_paths(tmp_path):
    out = tmp_path / "gpu.yaml"
    result = bash(
        f"source {SCRIPT} && derive_spec {REPO}/specs/smollm2-medusa.yaml {out} tensorrt 8101 8100 8102", tmp_path
    )
    assert result.returncode == 0, result.stderr
    roots = OutputRoots(tmp_path / "e", tmp_path / "t", tmp_path / "c")
    variant = make_plan(load_spec(out), roots).variants[0]
    assert variant.target == "tensorrt" and (variant.tp, variant.pp) == (1, 1) and variant.method == "medusa"
    assert variant.heads_dir == (REPO / "heads" / "smollm2-medusa").resolve()
    assert (variant.serving.grpc_port, variant.serving.http_port, variant.serving.metrics_port) == (8101, 8100, 8102)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU host would run the real smoke test")
def test_script_refuses_a_host_without_gpu(tmp_path):
    result = bash(f"{SCRIPT}", tmp_path)
    assert result.returncode == 1 and "FAIL:" in result.stderr


def test_embedded_python_compiles_and_the_dispatch_step_runs_first():
    import re

    text = SCRIPT.read_text()
    blocks = re.findall(r"<<'PY'[^\n]*\n(.*?)\nPY\n", text, flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        compile(block, "gpu-smoke.sh", "exec")
    dispatch = next(block for block in blocks if "Placement(device_map=spread" in block)
    assert "quantize_fp8" in dispatch and 'device_map={"": 0}' in dispatch
    main = text[text.index("main() {") :]
    assert main.index("smoke_dispatched_quantize") < main.index("smoke_method")
