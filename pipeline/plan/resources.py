"""What each stage needs of a machine, at the spec's size: GPUs, GPU memory per GPU, host RAM, disk.

So that a build that cannot run on the GPUs a spec names fails in ``plan``, before they are
rented, and ``doctor`` can compare each stage with the host it runs on. All figures are GiB.
Sizes below: H hidden, I intermediate, V vocabulary, S = calibration.max_seq_len, b the bytes
of model.dtype (2 for bf16/fp16), P the model's parameters, G the GPUs of ``gpu.count``.

quantize (ModelOpt FP8 PTQ of the HF model; on GPUs, dispatched over all G by accelerate):
  weights     P * b over the G GPUs (balanced), plus one module of slack per GPU: accelerate
              places whole decoder layers (or the embedding), so a GPU may hold one more.
  calibration one sample at a time at batch 1 (the stage raises the batch into what is left):
              S * (6H + 3I) * b (hidden states, q/k/v/o, MLP gate/up/act) + heads * S^2 * 4
              (attention scores) + S * V * 4 (float32 logits).
  fake quant  2 x the largest linear weight (its quantized copy while calibrating).
  export      the largest linear weight in float32 (scales are divided in float32) and the
              embedding once more in float32 on its GPU (unquantized tensors are exported fp32).
  overhead    2 GiB per GPU (CUDA context, cuBLAS workspaces, allocator slack).
  host RAM    4 GiB (Python, torch, transformers, ModelOpt) + the larger of one checkpoint
              shard being read (5 GiB) and two 5 GB export shards; weights never sit in host
              RAM whole (meta-device init, each shard streamed to its GPU at the target dtype),
              unless offload is asked for: then the part that does not fit the GPUs, with disk
              offload too (accelerate reads disk-offloaded safetensors weights from the checkpoint
              files themselves, but ModelOpt 0.47 keeps the weights it writes back in host RAM:
              its accelerate plugin warns "writing updates back to disk offload files is TODO").
  disk        the FP8 checkpoint: decoder weights 1 byte each, embedding and lm_head at b.
  Without GPUs (target reference, or no ``gpu`` in the spec) it calibrates in float32 on the
  CPU: host RAM = P * 4 + calibration + 4 GiB.
  Check against reports: a 70B fp16 -> FP8 quantization needs ~140 GB of GPU memory and ~140 GB
  of host RAM when loaded whole (basetenlabs/truss#1423); "a BF16 LLaMA 70B is about 140G"
  (NVIDIA/TensorRT-LLM#1331). Here Llama-3.1-70B's weights are 70.6e9 * 2 bytes = 141 GB over
  the GPUs (35 GB on each of 4), and host RAM is a shard at a time, not the whole 140 GB.

convert (pipeline.checkpoint, streamed): no GPU; host RAM 2 GiB + three 8 MiB chunks (the
  converter's bound, measured in tests/checkpoint/test_streaming.py) + the heads, which are
  loaded whole in float32; disk = the TensorRT-LLM checkpoint, world size x a rank's weights
  (``pipeline.plan.memory``: the embedding is replicated on every rank) + the heads as stored.

build (trtllm-build, target tensorrt): each worker builds one rank on one GPU, which holds that
  rank's weights and heads, the activation workspace TensorRT times tactics with and 2 GiB:
  ``pipeline.plan.memory``'s serving estimate without the KV cache (NVIDIA/TensorRT-Model-Connect#1386
  reports a 27.45 GiB FP8 engine built with 28.8 GB of GPU memory). Host RAM per worker is 3 x the
  rank's weights (the checkpoint arrays, TensorRT's copy in the network, the serialized engine)
  + 2 GiB; ``--workers W`` builds W ranks at once (W GPUs, W x the host RAM), one worker builds
  them in turn. Disk: the engines, about the checkpoint's size. Target reference: the engine
  folder links the checkpoint's rank files (no GPU, 1 GiB).

package: no GPU; 1 GiB of host RAM; the repository holds configs and the tokenizer (0.1 GiB).

serve (not a stage: the Triton server): ``pipeline.plan.memory``'s per-GPU estimate on tp x pp GPUs;
  host RAM 4 GiB + each rank's engine read once into memory. Target reference: no GPU, host RAM
  2 x the checkpoint (weights are dequantized for the CPU runtime) + 2 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline import targets
from pipeline.geometry import ModelGeometry
from pipeline.plan.memory import BYTES_PER_ELEMENT, GIB, RUNTIME_OVERHEAD_BYTES, MemoryEstimate
from pipeline.plan.speculative import SpeculativeConfig
from pipeline.spec.gpus import GpuType

QUANTIZE_HOST_BASE_GIB = 4.0
CHECKPOINT_SHARD_GIB = 5.0
EXPORT_SHARD = "5GB"  # max_shard_size of the FP8 export
EXPORT_SHARD_GIB = 5e9 / GIB
CONVERT_HOST_BASE_GIB = 2.0
CONVERT_CHUNK_BYTES = 8 * 1024 * 1024
BUILD_HOST_FACTOR = 3.0
BUILD_HOST_BASE_GIB = 2.0
SERVE_HOST_BASE_GIB = 4.0
PACKAGE_HOST_GIB = 1.0
PACKAGE_DISK_GIB = 0.1


@dataclass(frozen=True)
class StageResources:
    """One stage's needs; ``gpus`` 0 means it runs on the CPU."""

    gpus: int
    gpu_memory_gib_per_gpu: float
    host_memory_gib: float
    disk_gib: float
    detail: str  # the terms, for plan output and error messages
    # GPU memory that is not weights (activations, transients, overhead): the quantize stage
    # leaves this much free on each GPU when it places the weights.
    working_gib_per_gpu: float = 0.0
    one_worker: StageResources | None = None  # build: the same without --workers (one GPU at a time)

    def rounded(self) -> StageResources:
        """Rounded to 0.1 GiB, as the plan reports them."""
        return StageResources(
            self.gpus,
            _round(self.gpu_memory_gib_per_gpu),
            _round(self.host_memory_gib),
            _round(self.disk_gib),
            self.detail,
            _round(self.working_gib_per_gpu),
            self.one_worker.rounded() if self.one_worker else None,
        )


def _round(value: float) -> float:
    return math.ceil(value * 10) / 10


@dataclass(frozen=True)
class Sizing:
    """What the estimates read from the plan."""

    arch: ModelGeometry
    dtype: str  # model.dtype
    speculative: SpeculativeConfig
    memory: MemoryEstimate  # the serving estimate (pipeline.plan.memory)
    tp: int
    world_size: int
    target: str
    gpu: GpuType | None
    gpu_count: int | None
    calibration_max_seq_len: int
    offload: str  # "none" | "cpu" | "disk"
    build_workers: int | None = None  # build.workers (None: one per rank)


def calibration_bytes(hidden: int, intermediate: int, vocab: int, heads: int, seq: int, element_bytes: int) -> int:
    """Activations of one calibration sample of ``seq`` tokens (see the module docstring)."""
    return seq * (6 * hidden + 3 * intermediate) * element_bytes + heads * seq * seq * 4 + seq * vocab * 4


def quantize_resources(s: Sizing) -> StageResources:
    a = s.arch
    calib_bytes = BYTES_PER_ELEMENT[s.dtype] if s.gpu is not None else 4  # float32 on the CPU
    out_bytes = BYTES_PER_ELEMENT[s.dtype]
    total = a.total_params() * calib_bytes
    calibration = calibration_bytes(
        a.hidden_size, a.intermediate_size, a.vocab_size, a.num_heads, s.calibration_max_seq_len, calib_bytes
    )
    edge = a.vocab_size * a.hidden_size
    fp8_disk = (a.num_layers * a.decoder_layer_params() + edge * (1 if a.tie_word_embeddings else 2) * out_bytes) / GIB
    if s.gpu is None:
        host = total / GIB + calibration / GIB + QUANTIZE_HOST_BASE_GIB
        return StageResources(
            0,
            0.0,
            host,
            fp8_disk,
            f"CPU: float32 weights {total / GIB:.1f} + calibration {calibration / GIB:.2f} "
            f"+ {QUANTIZE_HOST_BASE_GIB:.0f} GiB host RAM",
        )
    gpus = max(1, s.gpu_count or 1)
    largest_linear = a.hidden_size * max(a.intermediate_size, a.num_heads * a.head_dim)
    module = max(a.decoder_layer_params(), edge) * calib_bytes
    share = total / gpus + module
    working = calibration + 2 * largest_linear * calib_bytes + largest_linear * 4 + edge * 4 + RUNTIME_OVERHEAD_BYTES
    per_gpu = (share + working) / GIB
    host = QUANTIZE_HOST_BASE_GIB + max(CHECKPOINT_SHARD_GIB, 2 * EXPORT_SHARD_GIB)
    disk = fp8_disk
    spill = max(0.0, per_gpu - s.gpu.memory_gib) * gpus
    offloaded = ""
    if spill and s.offload != "none":
        per_gpu = math.floor(s.gpu.memory_gib * 10) / 10  # all of it (rounded down: the plan rounds up)
        host += spill  # disk offload too: see the module docstring
        offloaded = f"; {spill:.1f} GiB offloaded to {s.offload}"
    detail = (
        f"weights {total / GIB:.1f} GiB over {gpus} GPU(s) = {total / gpus / GIB:.1f} + one module "
        f"{module / GIB:.1f}, + calibration {calibration / GIB:.2f}, fake-quant/export transients "
        f"{(working - calibration - RUNTIME_OVERHEAD_BYTES) / GIB:.1f}, overhead "
        f"{RUNTIME_OVERHEAD_BYTES / GIB:.0f}{offloaded}"
    )
    return StageResources(gpus, per_gpu, host, disk, detail, working_gib_per_gpu=working / GIB)


def _rank_gib(s: Sizing) -> float:
    return s.memory.weights_gib + s.memory.heads_gib


def _heads_file_params(s: Sizing) -> int:
    """Parameters of the heads as stored (TensorRT-LLM instantiates EAGLE's drafter once per
    draft layer on the GPU, but the checkpoint holds it once)."""
    stored_heads_params = getattr(s.speculative.config, "stored_heads_params", None)  # the method's config says
    return 0 if stored_heads_params is None else int(stored_heads_params(s.arch))


def merge_resources(s: Sizing) -> StageResources:
    """LoRA merge: one base tensor, its float32 update and the result at a time; writes a copy of the base."""
    a = s.arch
    largest = max(a.vocab_size * a.hidden_size, a.intermediate_size * a.hidden_size) * 4 / GIB
    disk = a.total_params() * 4 / GIB  # at most: the base's own dtype, float32 at most
    return StageResources(
        0,
        0.0,
        CONVERT_HOST_BASE_GIB + 3 * largest,
        disk,
        f"streamed: {CONVERT_HOST_BASE_GIB:.0f} GiB + 3 x the largest tensor in float32 "
        f"({largest:.2f} GiB); writes the merged checkpoint (<= {disk:.1f} GiB)",
    )


def lora_resources(s: Sizing) -> StageResources:
    """Adapter conversion: one adapter's tensors at a time, in float32 (small next to the base)."""
    return StageResources(0, 0.0, CONVERT_HOST_BASE_GIB, 1.0, "the group's adapters, one at a time")


def checkpoint_resources(s: Sizing) -> StageResources:
    """The served Hugging Face checkpoint: files hard-linked (or copied) into the output, none loaded."""
    disk = s.memory.weights_gib * s.world_size
    return StageResources(0, 0.0, PACKAGE_HOST_GIB, disk, f"links or copies the checkpoint (<= {disk:.1f} GiB)")


def train_heads_resources(s: Sizing) -> StageResources:
    """Heads training: the target in float32 for its forward passes, the features of the training tokens
    (float16) and the heads with their optimizer state; on the CPU (device: cuda adds one GPU)."""
    target = s.arch.total_params() * 4 / GIB
    heads = _heads_file_params(s) * 4 * 4 / GIB  # weights, gradients, two Adam moments
    return StageResources(
        0,
        0.0,
        CONVERT_HOST_BASE_GIB + 2 * target + heads,
        heads / 4 + 0.1,
        f"the target in float32 ({target:.1f} GiB) + heads and optimizer ({heads:.1f} GiB); writes the heads",
    )


def convert_resources(s: Sizing) -> StageResources:
    heads = _heads_file_params(s)
    host = CONVERT_HOST_BASE_GIB + 3 * CONVERT_CHUNK_BYTES / GIB + heads * 4 / GIB
    disk = s.memory.weights_gib * s.world_size + heads * BYTES_PER_ELEMENT[s.dtype] / GIB
    return StageResources(
        0,
        0.0,
        host,
        disk,
        f"streamed: {CONVERT_HOST_BASE_GIB:.0f} GiB + 3 chunks + heads in "
        f"float32 {heads * 4 / GIB:.1f}; writes {s.world_size} rank(s) "
        f"of {s.memory.weights_gib:.1f} GiB + heads",
    )


def build_resources(s: Sizing) -> StageResources:
    disk = s.memory.weights_gib * s.world_size + _heads_file_params(s) * BYTES_PER_ELEMENT[s.dtype] / GIB
    if not targets.on_gpus(s.target):
        return StageResources(0, 0.0, 1.0, disk, "reference: links the checkpoint's rank files")
    m = s.memory
    workers = min(s.build_workers or s.world_size, s.world_size)
    per_gpu = m.weights_gib + m.heads_gib + m.activations_gib + m.overhead_gib
    worker_host = BUILD_HOST_FACTOR * _rank_gib(s) + BUILD_HOST_BASE_GIB
    detail = (
        f"per rank: weights+heads {_rank_gib(s):.1f} + workspace {m.activations_gib:.1f} + overhead "
        f"{m.overhead_gib:.0f} GiB of GPU, {BUILD_HOST_FACTOR:.0f} x weights + {BUILD_HOST_BASE_GIB:.0f} "
        f"GiB of host RAM per worker; --workers {workers}"
    )
    one = StageResources(1, per_gpu, worker_host, disk, "one worker: the ranks in turn on one GPU")
    return StageResources(workers, per_gpu, worker_host * workers, disk, detail, one_worker=one)


def package_resources(s: Sizing) -> StageResources:
    return StageResources(0, 0.0, PACKAGE_HOST_GIB, PACKAGE_DISK_GIB, "configs and the tokenizer")


def serve_resources(s: Sizing) -> StageResources:
    if not targets.on_gpus(s.target):
        checkpoint = s.memory.weights_gib * s.world_size + _heads_file_params(s) * BYTES_PER_ELEMENT[s.dtype] / GIB
        return StageResources(0, 0.0, 2 * checkpoint + 2.0, 0.0, "CPU reference backend: dequantized weights")
    return StageResources(
        s.world_size, s.memory.total_gib, SERVE_HOST_BASE_GIB + _rank_gib(s) * s.world_size, 0.0, s.memory.describe()
    )


def evaluate_resources(s: Sizing) -> StageResources:
    """The reference runtime over the checkpoint on the CPU, as serving it (pipeline/evaluation/)."""
    checkpoint = s.memory.weights_gib * s.world_size + _heads_file_params(s) * BYTES_PER_ELEMENT[s.dtype] / GIB
    return StageResources(
        0,
        0.0,
        2 * checkpoint + 2.0,
        PACKAGE_DISK_GIB,
        "reference runtime on the CPU: dequantized weights, one request's KV cache at a time",
    )


STAGE_ESTIMATES = {
    "merge": merge_resources,
    "lora": lora_resources,
    "checkpoint": checkpoint_resources,
    "train-heads": train_heads_resources,
    "quantize": quantize_resources,
    "convert": convert_resources,
    "evaluate": evaluate_resources,
    "build": build_resources,
    "package": package_resources,
}


def stage_resources(stage: str, sizing: Sizing) -> StageResources:
    return STAGE_ESTIMATES[stage](sizing).rounded()


def gpu_shortfall(resources: StageResources, gpu: GpuType, gpu_count: int) -> str | None:
    """Why a stage cannot run on ``gpu_count`` x ``gpu`` (None when it can)."""
    if resources.gpus > gpu_count:
        return f"needs {resources.gpus} GPUs, the spec has {gpu_count}"
    if resources.gpus and resources.gpu_memory_gib_per_gpu > gpu.memory_gib:
        return (
            f"needs {resources.gpu_memory_gib_per_gpu:.1f} GiB per GPU ({resources.detail}), "
            f"{gpu.name} has {gpu.memory_gib:.1f} GiB"
        )
    return None
