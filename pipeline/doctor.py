"""``specdeploy doctor``: can this host build (and serve) the engines of a spec?

The host probe is separate from the verdicts so tests can assess any host: ``probe_host``
looks around (versions, GPUs, MPI, Triton backends, disk), ``assess_variant`` decides per
variant. Reference-target variants build anywhere; TensorRT ones need TensorRT-LLM 1.2.x,
trtllm-build, enough GPUs of the right architecture and enough memory and disk. PyTorch-backend ones
(``target: pytorch``) build anywhere too (no engine: the checkpoint, the adapters and the server's
options), and what their GPU serving needs here (trtllm-serve, the GPUs, their memory) is said as
notes. Every stage
(and the server) is also compared with the host: its GPUs, GPU memory, host RAM and disk, as
``pipeline.plan.resources`` estimates them in the plan.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline import targets
from pipeline.plan.types import VariantPlan
from pipeline.spec.gpus import GpuType
from pipeline.trtllm import TRTLLM_BACKEND_DIR, TRTLLM_SERIES, container_hint, host

FP8_MIN_SM = (8, 9)


@dataclass(frozen=True)
class HostReport:
    python: str
    torch: str | None
    tensorrt: str | None
    trtllm: str | None
    engine_flow_missing: tuple[str, ...]  # empty: trtllm-build can run here
    gpus: tuple[host.LocalGpu, ...]
    mpi: str | None
    trtllm_backend: bool  # the Triton C++ tensorrtllm backend (GPU serving)
    cpu_tritonserver: str | None  # nvidia-pytriton's bundled tritonserver (CPU serving)
    cpu_bf16_gemm: bool  # oneDNN bf16 GEMMs (AMX / AVX512-BF16): fast bfloat16 reference engines
    engines_dir: str
    free_disk_gib: float | None
    host_memory_gib: float | None = None  # physical RAM
    llm_api_missing: tuple[str, ...] = ()  # empty: trtllm-serve (the PyTorch backend) can run here


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "missing" | "warn" | "info"
    detail: str


@dataclass(frozen=True)
class StageFit:
    """One stage's needs against this host."""

    stage: str
    gpus: int
    gpu_memory_gib_per_gpu: float
    host_memory_gib: float
    disk_gib: float
    fits: bool
    why: str  # empty when it fits


@dataclass
class Verdict:
    variant: str
    target: str
    method: str
    world_size: int
    can_build: bool = True
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stages: list[StageFit] = field(default_factory=list)

    def refuse(self, reason: str) -> None:
        self.can_build = False
        self.reasons.append(reason)


def _first_line(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def _pytriton_server() -> str | None:
    spec = importlib.util.find_spec("pytriton")  # no import: it starts nothing, but is slow
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(list(spec.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
    return str(binary) if binary.is_file() else None


def _free_disk_gib(folder: Path) -> float | None:
    existing = folder.resolve()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free / 1024**3
    except OSError:
        return None


def _cpu_bf16_gemm() -> bool:
    try:
        from pipeline.runtime.model.gemm import onednn_bf16
    except ImportError:  # no torch: nothing runs on the CPU anyway
        return False
    return onednn_bf16()


def _host_memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        return None


def probe_host(engines_dir: Path) -> HostReport:
    return HostReport(
        python=platform.python_version(),
        torch=host.package_version("torch"),
        tensorrt=host.package_version("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_libs"),
        trtllm=host.trtllm_version(),
        engine_flow_missing=tuple(host.engine_flow_missing()),
        gpus=tuple(host.local_gpus()),
        mpi=_first_line(["mpirun", "--version"]) if shutil.which("mpirun") else None,
        trtllm_backend=Path(TRTLLM_BACKEND_DIR).is_dir(),
        cpu_tritonserver=_pytriton_server(),
        cpu_bf16_gemm=_cpu_bf16_gemm(),
        engines_dir=str(engines_dir),
        free_disk_gib=_free_disk_gib(engines_dir),
        host_memory_gib=_host_memory_gib(),
        llm_api_missing=tuple(host.llm_api_missing()),
    )


def host_checks(report: HostReport) -> list[Check]:
    python_note = (
        ""
        if report.python.startswith(("3.10.", "3.12."))
        else " (TensorRT-LLM 1.2 wheels are built for Python 3.10 and 3.12 only)"
    )
    if report.trtllm is None:
        trtllm = Check("TensorRT-LLM", "missing", f"not installed; engines need {TRTLLM_SERIES}x: {container_hint()}")
    elif report.trtllm.startswith(TRTLLM_SERIES):
        trtllm = Check("TensorRT-LLM", "ok", f"{report.trtllm} (the last series with the TensorRT engine flow)")
    else:
        trtllm = Check(
            "TensorRT-LLM",
            "warn",
            f"{report.trtllm}: engines need {TRTLLM_SERIES}x; TensorRT-LLM removed "
            f"the engine flow (trtllm-build) after 1.2; {container_hint()}",
        )
    gpus = "; ".join(
        f"{g.name}, SM {g.compute_capability[0]}.{g.compute_capability[1]}, {g.memory_gib:.0f} GiB" for g in report.gpus
    )
    disk = "unknown" if report.free_disk_gib is None else f"{report.free_disk_gib:.1f} GiB free"
    return [
        Check("Python", "info", report.python + python_note),
        Check("torch", "info" if report.torch else "missing", report.torch or "not installed"),
        Check(
            "TensorRT", "ok" if report.tensorrt else "missing", report.tensorrt or "not installed (GPU builds need it)"
        ),
        trtllm,
        Check(
            "trtllm-build",
            "missing" if report.engine_flow_missing else "ok",
            "; ".join(report.engine_flow_missing) or "can run",
        ),
        Check(
            "trtllm-serve",
            "missing" if report.llm_api_missing else "ok",
            "; ".join(report.llm_api_missing)
            + " (GPU serving of target: pytorch needs it; on CPU, specdeploy serve runs its stand-in)"
            if report.llm_api_missing
            else "can run (target: pytorch)",
        ),
        Check("GPUs", "ok" if report.gpus else "missing", f"{len(report.gpus)}: {gpus}" if gpus else "none found"),
        Check(
            "MPI", "ok" if report.mpi else "missing", report.mpi or "mpirun not on PATH (multi-GPU serving needs it)"
        ),
        Check(
            "Triton tensorrtllm backend",
            "ok" if report.trtllm_backend else "missing",
            TRTLLM_BACKEND_DIR + ("" if report.trtllm_backend else " not found (GPU serving needs it)"),
        ),
        Check(
            "CPU tritonserver",
            "ok" if report.cpu_tritonserver else "missing",
            report.cpu_tritonserver or "nvidia-pytriton not installed (CPU serving needs it)",
        ),
        Check(
            "CPU bf16 GEMMs",
            "ok" if report.cpu_bf16_gemm else "info",
            "oneDNN bf16 (AMX or AVX512-BF16): bfloat16 reference engines verify draft trees at about the cost "
            "of one token"
            if report.cpu_bf16_gemm
            else "not available: bfloat16 reference engines run slower than float32 on this CPU",
        ),
        Check("disk for engines", "info", f"{report.engines_dir}: {disk}"),
        Check(
            "host memory", "info", "unknown" if report.host_memory_gib is None else f"{report.host_memory_gib:.1f} GiB"
        ),
    ]


def assess_stages(variant: VariantPlan, report: HostReport) -> list[StageFit]:
    """Each stage's (and the server's) needs against this host; disk adds up over the stages."""
    needs = [(stage.name, stage.resources) for stage in variant.stages if stage.resources is not None]
    if variant.serve_resources is not None:
        needs.append(("serve", variant.serve_resources))
    smallest = min((g.memory_gib for g in report.gpus), default=0.0)
    fits, disk = [], 0.0
    for name, r in needs:
        why = []
        if r.gpus > len(report.gpus):
            why.append(f"needs {r.gpus} GPU(s), this host has {len(report.gpus)}")
        elif r.gpus and r.gpu_memory_gib_per_gpu > smallest:
            why.append(f"needs {r.gpu_memory_gib_per_gpu:.1f} GiB per GPU, the smallest GPU here has {smallest:.1f}")
        if report.host_memory_gib is not None and r.host_memory_gib > report.host_memory_gib:
            one = r.one_worker
            hint = (
                f" ({one.host_memory_gib:.1f} GiB with one worker)"
                if one is not None and one.host_memory_gib <= report.host_memory_gib
                else ""
            )
            why.append(
                f"needs {r.host_memory_gib:.1f} GiB of host RAM{hint}, this host has {report.host_memory_gib:.1f}"
            )
        disk += r.disk_gib
        if report.free_disk_gib is not None and disk > report.free_disk_gib:
            why.append(
                f"needs {disk:.1f} GiB of disk up to this stage, {report.engines_dir} has "
                f"{report.free_disk_gib:.1f} free"
            )
        fits.append(
            StageFit(name, r.gpus, r.gpu_memory_gib_per_gpu, r.host_memory_gib, r.disk_gib, not why, "; ".join(why))
        )
    return fits


def _refuse_stages(verdict: Verdict) -> None:
    for fit in verdict.stages:
        if fit.fits:
            continue
        if fit.stage == "serve":
            verdict.notes.append(f"serving here: {fit.why}")
        else:
            verdict.refuse(f"{fit.stage} stage: {fit.why}")


def assess_variant(variant: VariantPlan, report: HostReport) -> Verdict:
    verdict = Verdict(variant.name, variant.target, variant.method, variant.world_size)
    verdict.stages = assess_stages(variant, report)
    if not targets.on_gpus(variant.target):
        verdict.notes.append("reference target: the CPU build writes the engine config and links the weights")
        if variant.build.dtype == "bfloat16" and not report.cpu_bf16_gemm:
            verdict.notes.append("dtype bfloat16 without CPU bf16 GEMMs: serving runs slowly here (float32 is faster)")
        _refuse_stages(verdict)
        return verdict
    if not targets.definition(variant.target).builds_engines:
        # No engine: the checkpoint, the adapters and the server's options are written on any host; the
        # serve stage's fit says the GPUs and their memory.
        fp8 = _fp8_problem(variant, report)
        for problem in [*report.llm_api_missing, *([fp8] if fp8 else [])]:
            verdict.notes.append(f"serving here: {problem}")
        _refuse_stages(verdict)
        return verdict
    for missing in report.engine_flow_missing:
        verdict.refuse(missing)
    for problem in _gpu_problems(variant, report):
        verdict.refuse(problem)
    if not report.gpus:
        return verdict
    weakest = min(report.gpus, key=lambda g: (g.compute_capability, g.memory_mib))
    planned: GpuType | None = variant.gpu
    if planned is not None and planned.compute_capability != weakest.compute_capability:
        sm = f"{weakest.compute_capability[0]}.{weakest.compute_capability[1]}"
        verdict.notes.append(
            f"planned for {planned.name} (SM {planned.compute_capability[0]}."
            f"{planned.compute_capability[1]}) but this host has {weakest.name} (SM {sm}); "
            "engines are not portable across GPU architectures"
        )
    # Engines hold the weights once more (per rank, plus the heads).
    engine_gib = (variant.memory.weights_gib + variant.memory.heads_gib) * variant.world_size
    if report.free_disk_gib is not None and report.free_disk_gib < engine_gib:
        verdict.refuse(
            f"engines need about {engine_gib:.1f} GiB of disk, {report.engines_dir} has "
            f"{report.free_disk_gib:.1f} GiB free"
        )
    _refuse_stages(verdict)
    return verdict


def _fp8_problem(variant: VariantPlan, report: HostReport) -> str | None:
    """Why this host's GPUs cannot run the variant's FP8 weights, or None."""
    if not report.gpus or not variant.quant.weights_fp8:
        return None
    weakest = min(report.gpus, key=lambda g: (g.compute_capability, g.memory_mib))
    if weakest.compute_capability >= FP8_MIN_SM:
        return None
    sm = f"{weakest.compute_capability[0]}.{weakest.compute_capability[1]}"
    return f"FP8 needs compute capability >= 8.9; {weakest.name} is {sm}"


def _gpu_problems(variant: VariantPlan, report: HostReport) -> list[str]:
    """What this host's GPUs lack for the variant's runtime: their count, FP8, memory."""
    if not report.gpus:
        return ["no NVIDIA GPU found"]
    problems = []
    if len(report.gpus) < variant.world_size:
        problems.append(f"needs tp*pp = {variant.world_size} GPUs, this host has {len(report.gpus)}")
    fp8 = _fp8_problem(variant, report)
    if fp8:
        problems.append(fp8)
    smallest = min(g.memory_gib for g in report.gpus)
    if variant.memory.total_gib > smallest:
        problems.append(
            f"needs about {variant.memory.total_gib:.1f} GiB per GPU ({variant.memory.describe()}); "
            f"the smallest GPU here has {smallest:.1f} GiB"
        )
    return problems


def to_json(report: HostReport, checks: list[Check], verdicts: list[Verdict]) -> dict[str, Any]:
    return {
        "host": asdict(report),
        "checks": [asdict(check) for check in checks],
        "variants": [asdict(verdict) for verdict in verdicts],
        "ok": all(verdict.can_build for verdict in verdicts),
    }
