"""Published performance figures of the GPU types in ``pipeline.gpus``, for the cost model.

Every figure is the vendor's datasheet value: HBM/GDDR bandwidth, dense (no 2:4 sparsity)
tensor-core peaks for BF16 and FP8 with FP32 accumulation, and the GPU-to-GPU link a tensor-parallel
all-reduce runs over, as bandwidth per direction (datasheets quote NVLink bidirectional: half of it).

Sources (datasheets, fetched 2026):
* A10 (the A10G is AWS's A10 part; NVIDIA publishes no separate A10G sheet, so A10's figures are
  used): nvidia.com "NVIDIA A10 Tensor Core GPU" datasheet: 600 GB/s, BF16 125 TFLOPS dense, PCIe 4.0.
* A100 40/80 GB SXM: "NVIDIA A100 Tensor Core GPU" datasheet: 1555 / 2039 GB/s, BF16 312 TFLOPS,
  NVLink 600 GB/s (bidirectional). No FP8.
* L4: "NVIDIA L4 Tensor Core GPU" datasheet: 300 GB/s, BF16 121 / FP8 242.5 TFLOPS dense, PCIe 4.0.
* L40S: "NVIDIA L40S" datasheet: 864 GB/s, BF16 362 / FP8 733 TFLOPS dense, PCIe 4.0.
* RTX 4090 and RTX 6000 Ada: "NVIDIA Ada GPU Architecture" whitepaper, appendix tables: 1008 / 960
  GB/s; FP16/BF16 tensor with FP32 accumulate 82.6 / 364.2 TFLOPS dense (GeForce runs FP32
  accumulation at half rate), FP8 with FP32 accumulate 165.2 / 728.5; PCIe 4.0.
* H100 SXM / PCIe / NVL: "NVIDIA H100 Tensor Core GPU" datasheet: 3.35 / 2.0 / 3.9 TB/s, BF16 989 /
  756 / 835 TFLOPS dense, FP8 1979 / 1513 / 1671; NVLink 900 GB/s (SXM), 600 GB/s bridge (PCIe, NVL).
* H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet: 4.8 TB/s, BF16 989, FP8 1979, NVLink 900 GB/s.
* GH200 (96 GB HBM3): "NVIDIA GH200 Grace Hopper Superchip" datasheet: 4 TB/s, Hopper's 989 / 1979,
  NVLink 900 GB/s.
* B200 (HGX B200): "NVIDIA HGX B200" datasheet, per GPU (the eight-GPU totals / 8, dense = sparse / 2):
  8 TB/s, BF16 2250, FP8 4500 TFLOPS; NVLink 5 1800 GB/s.
* PCIe 4.0 x16: 32 GB/s per direction (PCI-SIG).

The attainable fractions of those peaks (``BANDWIDTH_EFFICIENCY``, ``COMPUTE_EFFICIENCY``) and the
latencies are the model's assumptions, not datasheet figures: the ``trtllm`` runtime profile's host
side (pipeline/costmodel/profile.py, where the fitted constants and their sources are).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import gpus
from pipeline.costmodel.gemm_probe import CpuProfile

# Fraction of peak HBM bandwidth a decode-phase GEMV/GEMM or attention kernel streams at (an
# assumption: memory-bound kernels reach 80-90% of peak on A100/H100 in NVIDIA's own STREAM-like
# figures; 0.8 leaves room for the many small kernels of a step).
BANDWIDTH_EFFICIENCY = 0.8
# Fraction of the dense tensor-core peak a compute-bound step reaches (an assumption; large GEMMs
# reach 70-80% on Hopper, a step of many medium GEMMs less).
COMPUTE_EFFICIENCY = 0.7
# Fixed host/runtime cost of one decoding step (scheduling, sampling, launch), an assumption for an
# engine with CUDA graphs (TensorRT-LLM); a framework without them pays several milliseconds.
STEP_OVERHEAD_S = 0.3e-3
# Launch cost of one more sequential pass inside a step (an EAGLE drafter level), an assumption.
PASS_OVERHEAD_S = 0.03e-3
# Latency of one small all-reduce (NCCL/TensorRT-LLM's custom all-reduce over NVLink; PCIe is slower).
NVLINK_ALLREDUCE_LATENCY_S = 8e-6
PCIE_ALLREDUCE_LATENCY_S = 25e-6


@dataclass(frozen=True)
class GpuPerf:
    name: str
    memory_gbps: float  # GB/s (1e9 bytes)
    bf16_tflops: float  # dense tensor-core peak, FP32 accumulate
    fp8_tflops: float | None  # None: no FP8 tensor cores
    link_gbps: float  # GPU-to-GPU bandwidth per direction, GB/s
    nvlink: bool
    kind: str = "gpu"  # "cpu": the reference backend's device, priced by step.py's CPU step model
    # The CPU device's weight GEMMs measured by rows on its host (gemm_probe.probe); None: a GEMM costs
    # its FLOPs at the nominal peak.
    gemms: CpuProfile | None = None

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s of the tensor cores for this weight dtype (fp8 falls back to bf16 where absent)."""
        if dtype == "fp8" and self.fp8_tflops is not None:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12

    @property
    def allreduce_latency_s(self) -> float:
        return NVLINK_ALLREDUCE_LATENCY_S if self.nvlink else PCIE_ALLREDUCE_LATENCY_S


_PCIE4 = 32.0

GPU_PERF: dict[str, GpuPerf] = {
    perf.name: perf
    for perf in (
        GpuPerf("a10g", 600, 125, None, _PCIE4, False),
        GpuPerf("a100-40gb", 1555, 312, None, 300, True),
        GpuPerf("a100-80gb", 2039, 312, None, 300, True),
        GpuPerf("l4", 300, 121, 242.5, _PCIE4, False),
        GpuPerf("l40s", 864, 362, 733, _PCIE4, False),
        GpuPerf("rtx-4090", 1008, 82.6, 165.2, _PCIE4, False),
        GpuPerf("rtx-6000-ada", 960, 364.2, 728.5, _PCIE4, False),
        GpuPerf("h100-pcie-80gb", 2000, 756, 1513, 300, True),
        GpuPerf("h100-sxm-80gb", 3350, 989, 1979, 450, True),
        GpuPerf("h100-nvl-94gb", 3900, 835, 1671, 300, True),
        GpuPerf("h200-141gb", 4800, 989, 1979, 450, True),
        GpuPerf("gh200-96gb", 4000, 989, 1979, 450, True),
        GpuPerf("b200-180gb", 8000, 2250, 4500, 900, True),
    )
}


# The CPU the reference backend runs on: no datasheet and no bandwidth figure (its weight streaming is
# the fitted ``host_layer_s``). `specdeploy calibrate --gpu cpu` measures its GEMMs by rows on the host
# (``gemms``: ``row_compute`` is then how many times their measured seconds a pass pays); without
# them a nominal 1 TFLOP/s "peak" (``row_compute`` in seconds per TFLOP of a pass's GEMMs).
CPU = "cpu"
CPU_DEVICE = GpuPerf(CPU, 0.0, 1.0, None, 0.0, False, kind="cpu")


def gpu_perf(name: str) -> GpuPerf:
    """The figures of a ``pipeline.gpus`` type (or the CPU device, ``cpu``); ValueError for a name it
    does not know."""
    if name == CPU:
        return CPU_DEVICE
    gpus.gpu_type(name)  # the same unknown-name message as the planner's
    return GPU_PERF[name]
