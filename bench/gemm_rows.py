"""What a bf16 weight GEMM costs by row count on this CPU: how big a draft tree may get for free.

    .venv/bin/python bench/gemm_rows.py [--rows 1 8 16 17 24 32 48 64] [--repeats 7]

Times the reference engine's bf16 GEMM (pipeline/runtime/model/gemm.py: oneDNN, weights pre-packed,
AMX where the CPU has it) on SmolLM2's weight shapes for each row count, one thread, row counts
interleaved within every repeat (this host's speed drifts), and prints each median relative to
one row. A verification pass feeds 1 + draft tokens rows per request, so where the cost steps up
is where a bigger tree (or Lookahead window) stops being nearly free. Rows above 32 are cut into
32-row calls (row-invariance, see gemm.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.runtime.model.gemm import Gemm, onednn_bf16

# SmolLM2-135M: hidden 576, MLP 1536, vocab 49152 (the lm_head is a fifth of a decoding step).
SHAPES = {"qkv": (960, 576), "mlp gate": (1536, 576), "mlp down": (576, 1536), "lm_head": (49152, 576)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 16, 17, 24, 32, 48, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not onednn_bf16():
        print("this CPU has no oneDNN bf16 GEMMs (AVX512-BF16 or AMX); bf16 engines would fall back")
    gen = torch.Generator().manual_seed(0)
    print(f"{'weight':10s} " + " ".join(f"{m:>6d}" for m in args.rows) + "   (rows; cost relative to 1 row)")
    for name, (out, inp) in SHAPES.items():
        gemm = Gemm(torch.randn(out, inp, generator=gen), bf16=True)
        inputs = {m: torch.randn(m, inp, generator=gen) for m in args.rows}
        calls = max(1, 200_000_000 // (out * inp))  # ~10 ms per timing on small weights
        times: dict[int, list[float]] = {m: [] for m in args.rows}
        for _ in range(args.repeats):
            for m in args.rows:
                start = time.perf_counter()
                for _ in range(calls):
                    gemm(inputs[m])
                times[m].append((time.perf_counter() - start) / calls)
        one = statistics.median(times[args.rows[0]])
        print(
            f"{name:10s} "
            + " ".join(f"{statistics.median(times[m]) / one:6.2f}" for m in args.rows)
            + f"   ({one * 1000:.2f} ms for {args.rows[0]} row)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
