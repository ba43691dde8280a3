"""Published performance figures of the GPU types in ``pipeline.spec.gpus``, for the cost model.

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

from pipeline.costmodel.gemm_probe import CpuProfile
from pipeline.spec import gpus

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


@dataclass(frozen=True, kw_only=True)
class GpuPerf:
    """A device's figures, by name (bandwidths and peaks in a row are too easy to misplace by position)."""

    name: str
    memory_gbps: float  # GB/s (1e9 bytes)
    bf16_tflops: float  # dense tensor-core peak, FP32 accumulate
    fp8_tflops: float | None  # None: no FP8 tensor cores
    link_gbps: float  # GPU-to-GPU bandwidth per direction, GB/s
    nvlink: bool
    kind: str = "gpu"  # "cpu": the reference backend's device, priced by step_cpu.py
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
        GpuPerf(name="a10g", memory_gbps=600, bf16_tflops=125, fp8_tflops=None, link_gbps=_PCIE4, nvlink=False),
        GpuPerf(name="a100-40gb", memory_gbps=1555, bf16_tflops=312, fp8_tflops=None, link_gbps=300, nvlink=True),
        GpuPerf(name="a100-80gb", memory_gbps=2039, bf16_tflops=312, fp8_tflops=None, link_gbps=300, nvlink=True),
        GpuPerf(name="l4", memory_gbps=300, bf16_tflops=121, fp8_tflops=242.5, link_gbps=_PCIE4, nvlink=False),
        GpuPerf(name="l40s", memory_gbps=864, bf16_tflops=362, fp8_tflops=733, link_gbps=_PCIE4, nvlink=False),
        GpuPerf(name="rtx-4090", memory_gbps=1008, bf16_tflops=82.6, fp8_tflops=165.2, link_gbps=_PCIE4, nvlink=False),
        GpuPerf(
            name="rtx-6000-ada", memory_gbps=960, bf16_tflops=364.2, fp8_tflops=728.5, link_gbps=_PCIE4, nvlink=False
        ),
        GpuPerf(name="h100-pcie-80gb", memory_gbps=2000, bf16_tflops=756, fp8_tflops=1513, link_gbps=300, nvlink=True),
        GpuPerf(name="h100-sxm-80gb", memory_gbps=3350, bf16_tflops=989, fp8_tflops=1979, link_gbps=450, nvlink=True),
        GpuPerf(name="h100-nvl-94gb", memory_gbps=3900, bf16_tflops=835, fp8_tflops=1671, link_gbps=300, nvlink=True),
        GpuPerf(name="h200-141gb", memory_gbps=4800, bf16_tflops=989, fp8_tflops=1979, link_gbps=450, nvlink=True),
        GpuPerf(name="gh200-96gb", memory_gbps=4000, bf16_tflops=989, fp8_tflops=1979, link_gbps=450, nvlink=True),
        GpuPerf(name="b200-180gb", memory_gbps=8000, bf16_tflops=2250, fp8_tflops=4500, link_gbps=900, nvlink=True),
    )
}


# The CPU the reference backend runs on: no datasheet and no bandwidth figure (its weight streaming is
# the fitted ``host_layer_s``). `specdeploy calibrate --gpu cpu` measures its GEMMs by rows on the host
# (``gemms``: ``row_compute`` is then how many times their measured seconds a pass pays); without
# them a nominal 1 TFLOP/s "peak" (``row_compute`` in seconds per TFLOP of a pass's GEMMs).
CPU = "cpu"
CPU_DEVICE = GpuPerf(
    name=CPU, memory_gbps=0.0, bf16_tflops=1.0, fp8_tflops=None, link_gbps=0.0, nvlink=False, kind="cpu"
)


def gpu_perf(name: str) -> GpuPerf:
    """The figures of a ``pipeline.spec.gpus`` type (or the CPU device, ``cpu``); ValueError for a name it
    does not know."""
    if name == CPU:
        return CPU_DEVICE
    gpus.gpu_type(name)  # the same unknown-name message as the planner's
    return GPU_PERF[name]
