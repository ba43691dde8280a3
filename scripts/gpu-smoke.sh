#!/usr/bin/env bash
# GPU smoke test for users with an NVIDIA GPU.
#
# For each SmolLM2 spec (lookahead, medusa, eagle) it builds the TensorRT engine at tp 1
# (target: tensorrt, through a generated copy of the spec), serves it with Triton's C++
# tensorrtllm backend, serves the same spec on the CPU reference backend, and checks that
# greedy outputs for the same prompts are equal. On a host with two or more GPUs it first
# quantizes SmolLM2 to FP8 dispatched over all visible GPUs (accelerate device_map, as the
# quantize stage does for models larger than one GPU) and checks the FP8 codes and scales equal
# those of the same quantization on one GPU. Exit 0: all equal; 1: a mismatch or failure.
#
# Run it INSIDE the Triton TensorRT-LLM 1.2.1 container; the TensorRT engine flow exists
# only in TensorRT-LLM 1.2.x (it was removed after 1.2):
#
#   docker run --rm -it --gpus all --net host --shm-size=2g --ulimit memlock=-1 \
#       -v "$PWD":/work -w /work nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 \
#       bash -c 'pip install --no-deps -e . && pip install pydantic pyyaml rich safetensors \
#                "tritonclient[grpc]" nvidia-pytriton transformers && scripts/gpu-smoke.sh'
#
# 26.04 is the first Triton release with TensorRT-LLM 1.2.1 (26.05 to 26.07 carry it too; see
# TRITON_TRTLLM_CONTAINER in pipeline/trtllm/__init__.py). This script refuses any other version.
# `--no-deps` keeps the container's CUDA torch (pyproject pins the CPU wheel's version).
#
# Environment: SMOKE_METHODS ("lookahead medusa eagle"), SMOKE_MAX_TOKENS (48),
# SMOKE_WORK (a fresh temp folder), SPECDEPLOY (specdeploy), SMOKE_READY_TIMEOUT (600 s),
# SMOKE_DISPATCH (auto: the dispatched-quantize step when two or more GPUs are visible; 0 skips it).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
read -r -a METHODS <<< "${SMOKE_METHODS:-lookahead medusa eagle}"
MAX_TOKENS=${SMOKE_MAX_TOKENS:-48}
READY_TIMEOUT=${SMOKE_READY_TIMEOUT:-600}
WORK=${SMOKE_WORK:-$(mktemp -d /tmp/specdeploy-smoke.XXXXXX)}
read -r -a SPECDEPLOY <<< "${SPECDEPLOY:-specdeploy}"
CACHE="$WORK/cache"
PROMPTS=(
  "The capital of France is"
  "def fibonacci(n):"
  "Write three short facts about the Moon."
)
# grpc http metrics, one set per backend so both servers run side by side.
GPU_PORTS=(8001 8000 8002)
CPU_PORTS=(9001 9000 9002)
SERVER_GROUPS=()
FAILED_METHODS=()

say() { printf '[gpu-smoke] %s\n' "$*"; }
fail() { printf '[gpu-smoke] FAIL: %s\n' "$*" >&2; exit 1; }

stop_servers() {
  local group
  for group in "${SERVER_GROUPS[@]}"; do
    # Each server runs in its own process group (setsid): this stops specdeploy, mpirun and
    # every tritonserver rank it started, and nothing else.
    kill -TERM -- "-$group" 2>/dev/null || true
  done
  for group in "${SERVER_GROUPS[@]}"; do
    wait "$group" 2>/dev/null || true
  done
  SERVER_GROUPS=()
}
trap stop_servers EXIT

preflight() {
  command -v nvidia-smi >/dev/null || fail "no nvidia-smi: run this on a GPU host, inside the container"
  command -v trtllm-build >/dev/null \
    || fail "trtllm-build not on PATH: run inside the Triton TensorRT-LLM 1.2.1 container"
  local version
  version=$(python3 -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))' 2>/dev/null) \
    || fail "tensorrt_llm is not installed: run inside the Triton TensorRT-LLM 1.2.1 container"
  [[ "$version" == 1.2.* ]] || fail "TensorRT-LLM $version found; the engine flow needs 1.2.x (removed after 1.2)"
  "${SPECDEPLOY[@]}" --version >/dev/null || fail "specdeploy is not installed (pip install --no-deps -e .)"
  say "TensorRT-LLM $version; work folder $WORK"
  nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader
}

# Writes a copy of spec $1 to $2 with target $3 and ports $4 $5 $6 (grpc http metrics), at tp 1;
# relative paths are made absolute so the copy works from any folder.
derive_spec() {
  python3 - "$@" <<'PY'
import sys
from pathlib import Path

import yaml

source, target_file, target, grpc, http, metrics = sys.argv[1:7]
base = Path(source).resolve().parent
data = yaml.safe_load(Path(source).read_text())


def absolute(section, key):
    if isinstance(section, dict) and isinstance(section.get(key), str) and not Path(section[key]).is_absolute():
        section[key] = str((base / section[key]).resolve())


absolute(data.get("model"), "path")
for head in (data.get("heads") or {}).values():
    absolute(head, "path")
absolute((data.get("quantization") or {}).get("calibration"), "data")
data["target"] = target
data["parallel"] = {"tp": 1, "pp": 1}
data["serving"] = {**(data.get("serving") or {}), "grpc_port": int(grpc), "http_port": int(http),
                   "metrics_port": int(metrics)}
Path(target_file).write_text(yaml.safe_dump(data, sort_keys=False))
PY
}

check_heads() {
  local spec=$1
  python3 - "$spec" <<'PY' || fail "$(basename "$spec"): heads folder missing; train the heads first (see README)"
import sys
from pathlib import Path

import yaml

heads = yaml.safe_load(Path(sys.argv[1]).read_text()).get("heads") or {}
missing = [h["path"] for h in heads.values() if not Path(h["path"]).exists()]
sys.exit(1 if missing else 0)
PY
}

wait_ready() {
  local http_port=$1 group=$2 log=$3
  python3 - "$http_port" "$group" "$READY_TIMEOUT" <<'PY' || fail "server on port $http_port not ready; see $log"
import os, sys, time, urllib.request

port, pid, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)  # the server died
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as response:
            if response.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(2)
sys.exit(1)
PY
}

start_server() {  # roots spec log -> appends the server's process group to SERVER_GROUPS
  local roots_name=$1 spec=$2 log=$3
  local -n roots=$roots_name
  setsid "${SPECDEPLOY[@]}" "${roots[@]}" serve "$spec" >"$log" 2>&1 &
  SERVER_GROUPS+=("$!")
}

query() {  # grpc_port prompt -> greedy completion on stdout
  "${SPECDEPLOY[@]}" query "$2" --url "127.0.0.1:$1" --max-tokens "$MAX_TOKENS" --top-k 1 --no-stream
}

smoke_method() {
  local method=$1
  local source="$REPO_ROOT/specs/smollm2-$method.yaml"
  local dir="$WORK/$method"
  mkdir -p "$dir"
  [[ -f "$source" ]] || fail "$source not found"
  local gpu_spec="$dir/gpu.yaml" cpu_spec="$dir/cpu.yaml"
  derive_spec "$source" "$gpu_spec" tensorrt "${GPU_PORTS[@]}"
  derive_spec "$source" "$cpu_spec" reference "${CPU_PORTS[@]}"
  check_heads "$gpu_spec"
  local gpu_roots=(--engines-dir "$dir/gpu/engines" --triton-repo "$dir/gpu/repo" --cache-dir "$CACHE")
  local cpu_roots=(--engines-dir "$dir/cpu/engines" --triton-repo "$dir/cpu/repo" --cache-dir "$CACHE")

  say "$method: doctor"
  "${SPECDEPLOY[@]}" "${gpu_roots[@]}" doctor "$gpu_spec" || fail "$method: this host cannot build $gpu_spec"
  say "$method: build (GPU, trtllm-build) and package"
  "${SPECDEPLOY[@]}" "${gpu_roots[@]}" engine "$gpu_spec"
  say "$method: build (CPU reference) and package"
  "${SPECDEPLOY[@]}" "${cpu_roots[@]}" engine "$cpu_spec"

  say "$method: serve both"
  start_server gpu_roots "$gpu_spec" "$dir/serve-gpu.log"
  local gpu_group=${SERVER_GROUPS[-1]}
  start_server cpu_roots "$cpu_spec" "$dir/serve-cpu.log"
  local cpu_group=${SERVER_GROUPS[-1]}
  wait_ready "${GPU_PORTS[1]}" "$gpu_group" "$dir/serve-gpu.log"
  wait_ready "${CPU_PORTS[1]}" "$cpu_group" "$dir/serve-cpu.log"

  local prompt index=0 mismatches=0 gpu_text cpu_text
  for prompt in "${PROMPTS[@]}"; do
    index=$((index + 1))
    gpu_text=$(query "${GPU_PORTS[0]}" "$prompt")
    cpu_text=$(query "${CPU_PORTS[0]}" "$prompt")
    printf '%s\n' "$gpu_text" >"$dir/prompt$index.gpu.txt"
    printf '%s\n' "$cpu_text" >"$dir/prompt$index.cpu.txt"
    if [[ "$gpu_text" == "$cpu_text" ]]; then
      say "$method: prompt $index equal"
    else
      mismatches=$((mismatches + 1))
      say "$method: prompt $index DIFFERS"
      diff "$dir/prompt$index.cpu.txt" "$dir/prompt$index.gpu.txt" || true
    fi
  done
  stop_servers
  if ((mismatches)); then
    FAILED_METHODS+=("$method")
  else
    say "$method: PASS (greedy GPU output == CPU reference)"
  fi
}

visible_gpus() {
  nvidia-smi --query-gpu=index --format=csv,noheader | grep -c .
}

# FP8 PTQ of the embedded SmolLM2 dispatched over every visible GPU (layers spread evenly, inputs
# moved by accelerate's hooks) against the same PTQ on GPU 0: the exported FP8 codes and scales
# must agree (bit for bit, up to 0.1 % of codes one step apart from GEMM rounding on other GPUs).
smoke_dispatched_quantize() {
  local count
  count=$(visible_gpus)
  if [[ "${SMOKE_DISPATCH:-auto}" == 0 ]] || ((count < 2)); then
    say "dispatched quantize: skipped ($count GPU(s) visible, needs two or more)"
    return 0
  fi
  say "dispatched quantize: SmolLM2 FP8 over $count GPUs against one GPU"
  python3 - "$CACHE" "$WORK/dispatch" <<'PY' || fail "dispatched FP8 quantization differs from one GPU's ($WORK/dispatch)"
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from pipeline.embedded import prepare_embedded_model
from pipeline.quantize import quantize_fp8
from pipeline.quantize.placement import Placement

cache, work = Path(sys.argv[1]), Path(sys.argv[2])
model = prepare_embedded_model(cache)
layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
gpus = torch.cuda.device_count()
spread = {"model.embed_tokens": 0, "model.rotary_emb": 0, "lm_head": 0, "model.norm": gpus - 1}
spread.update({f"model.layers.{i}": i * gpus // layers for i in range(layers)})
common = dict(kv_cache_fp8=True, calib_path=None, calib_size=64, calib_max_len=256)
one = quantize_fp8(model, work / "one", placement=Placement(device_map={"": 0}, calib_batch=1), **common)
multi = quantize_fp8(model, work / "multi", placement=Placement(device_map=spread, calib_batch=1), **common)


def tensors(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


a, b = tensors(work / "one"), tensors(work / "multi")
assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:5]
codes = differ = 0
worst_scale = 0.0
for name, x in a.items():
    y = b[name]
    if x.dtype == torch.float8_e4m3fn:
        codes += x.numel()
        differ += int((x.view(torch.uint8) != y.view(torch.uint8)).sum())
    elif name.endswith("_scale"):
        worst_scale = max(worst_scale, float(((x - y).abs() / x.abs().clamp_min(1e-30)).max()))
print(f"[gpu-smoke] dispatched quantize on {multi.device}: {differ}/{codes} FP8 codes differ, "
      f"largest scale difference {worst_scale:.2e} (relative), {one.num_quantized_linears} linears")
sys.exit(0 if differ <= codes * 1e-3 and worst_scale <= 1e-3 else 1)
PY
  say "dispatched quantize: PASS"
}

main() {
  preflight
  smoke_dispatched_quantize
  local method
  for method in "${METHODS[@]}"; do
    # Called plainly (not in an `if`), so `set -e` stays in force inside.
    smoke_method "$method"
  done
  if ((${#FAILED_METHODS[@]})); then
    fail "greedy outputs differ for: ${FAILED_METHODS[*]} (outputs and server logs under $WORK)"
  fi
  say "all passed: ${METHODS[*]}"
}

# Sourcing the file (tests) defines the functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
