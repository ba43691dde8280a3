"""The LoRA step price against the real unmerged LoRA computation on CPU (validation, CPU side).

    .venv/bin/python bench/costmodel_lora.py [--ranks 8 16 64] [--batches 1 8 32] [--adapters 1 4 8] [--rounds 5]

On SmolLM2-135M's shapes (30 layers; q/k/v/o/gate/up/down 576/192/1536 features), one thread:

* predicted: pipeline/costmodel/lora_cpu.py's probe of one module's LoRA work by rows (whole, and
  gathered for a step mixing adapters), composed over the step's modules, layers and adapter groups;
* measured: whole decoding steps' projections, every layer with its own float32 base weights (the
  engine's Gemm) and its own adapters' A and B, each request drawn an adapter (every one of the N
  used), the per-step grouping of requests by adapter, and the LoRA update
  (``y[rows_g] += x[rows_g] @ A_g^T @ B_g^T``) after each target module's base projection; the LoRA
  update's CPU time is taken inside the step, so its caches are what the base weights leave them.

Prints per case the predicted and measured LoRA ms per step and their ratio; the target is within
15% for every case. Also prints the base projections' ms per step (the LoRA share of the step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from pipeline import presets
from pipeline.costmodel.lora import LORA_MODULES, LoraLoad, module_features
from pipeline.costmodel.lora_cpu import LoraCpuProfile, groups_of, lora_update, probe
from pipeline.runtime.model.gemm import Gemm

MODULE_SETS = {"q,v": ("q_proj", "v_proj"), "all 7": LORA_MODULES}


def build(arch, rank: int, adapters: int, gen: torch.Generator):
    """Per layer: every module's base Gemm, and per target module each adapter's (A, B)."""
    layers = []
    for _ in range(arch.num_layers):
        base, lora = {}, {}
        for module in LORA_MODULES:
            n_in, n_out = module_features(arch, module)
            base[module] = Gemm(torch.randn(n_out, n_in, generator=gen) * 0.02)
            a = [torch.randn(rank, n_in, generator=gen) * 0.02 for _ in range(adapters)]
            b = [torch.randn(n_out, rank, generator=gen) * 0.02 for _ in range(adapters)]
            lora[module] = (a, b)
        layers.append((base, lora))
    return layers


def step(arch, layers, modules, x_by_size, adapter_per_row) -> tuple[float, float]:
    """One step's projections: (base seconds, LoRA seconds), CPU time of this thread."""
    groups = groups_of(adapter_per_row) if adapter_per_row is not None else None
    base_s = lora_s = 0.0
    for base, lora in layers:
        for module in LORA_MODULES:
            n_in, _ = module_features(arch, module)
            x = x_by_size[n_in]
            t0 = time.thread_time()
            y = base[module](x)
            t1 = time.thread_time()
            base_s += t1 - t0
            if groups is not None and module in modules:
                a, b = lora[module]
                lora_update(y, x, a, b, groups)
                lora_s += time.thread_time() - t1
    return base_s, lora_s


def timer_overhead_s() -> float:
    """One thread_time() pair, to take out of the in-step LoRA time."""
    n = 20000
    start = time.thread_time()
    for _ in range(n):
        time.thread_time()
    return (time.thread_time() - start) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (probe, steps of every case)")
    parser.add_argument("--steps", type=int, default=3, help="steps of each case per round")
    parser.add_argument("--repeats", type=int, default=3, help="walks of the probe per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    arch = presets.preset("smollm2-135m-instruct")
    gen = torch.Generator().manual_seed(0)
    overhead = timer_overhead_s()
    print(f"SmolLM2-135M shapes, float32, 1 thread; timer pair {overhead * 1e6:.2f} us (taken out)")
    print(
        f"{'rank':>4s} {'modules':>7s} {'batch':>5s} {'adapters':>8s}  {'base ms':>8s}  "
        f"{'LoRA ms pred':>12s} {'meas':>7s}  {'pred/meas':>9s}"
    )
    worst = 0.0
    max_adapters = max(args.adapters)
    for rank in args.ranks:
        layers = build(arch, rank, max_adapters, gen)
        for label, modules in MODULE_SETS.items():
            cases = [
                (batch, adapters)
                for batch in args.batches
                for adapters in sorted({min(n, batch) for n in args.adapters})
            ]
            x_of = {
                batch: {
                    n: torch.randn(batch, n, generator=gen) for n in {module_features(arch, m)[0] for m in LORA_MODULES}
                }
                for batch in args.batches
            }
            profiles, base, lora = [], {c: [] for c in cases}, {c: [] for c in cases}
            calls = arch.num_layers * len(modules)
            # rounds of (probe, then a few steps of every case): probe and measurement share the host's drift
            for _ in range(args.rounds):
                profiles.append(probe(arch, LoraLoad(rank, modules), repeats=args.repeats))
                for batch, adapters in cases:
                    for _ in range(args.steps):
                        # each request draws an adapter; every one of the N is used in the step
                        ids = (torch.arange(batch) % adapters)[torch.randperm(batch, generator=gen)]
                        b, l = step(arch, layers, modules, x_of[batch], ids)
                        base[batch, adapters].append(b)
                        lora[batch, adapters].append(l - calls * overhead)
            profile = LoraCpuProfile.median(profiles)
            for batch, adapters in cases:
                predicted = profile.step_s(arch, LoraLoad(rank, modules, adapters), batch)
                measured = statistics.median(lora[batch, adapters])
                ratio = predicted / measured
                worst = max(worst, abs(ratio - 1))
                base_ms = statistics.median(base[batch, adapters]) * 1e3
                print(
                    f"{rank:4d} {label:>7s} {batch:5d} {adapters:8d}  {base_ms:8.2f}  "
                    f"{predicted * 1e3:12.3f} {measured * 1e3:7.3f}  {ratio:9.2f}",
                    flush=True,
                )
    print(f"largest error {worst:.0%} (target: within 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
