"""What a bf16 weight GEMM costs by row count on this CPU: how big a draft tree may get for free.

    .venv/bin/python bench/gemm_rows.py [--rows 1 8 16 17 24 32 48 64] [--repeats 7] [--dtype float32]
        [--plot PNG]

Times the reference engine's bf16 GEMM (pipeline/runtime/model/gemm.py: oneDNN, weights pre-packed,
AMX where the CPU has it) on SmolLM2's weight shapes for each row count, one thread, row counts
interleaved within every repeat (this host's speed drifts), and prints each median relative to
one row. A verification pass feeds 1 + draft tokens rows per request, so where the cost steps up
is where a bigger tree (or Lookahead window) stops being nearly free. Rows above 32 are cut into
32-row calls (row-invariance, see gemm.py). ``--dtype float32`` times the float32 engines' GEMM
instead (pipeline/runtime/model/gemm.py's float32 path: MKL, column-major weights); ``--plot`` draws
the relative costs by rows, a line per weight (docs/img/gemm_rows_float32.png).
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
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="the engine's dtype")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the relative costs by rows to PNG")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bf16 = args.dtype == "bfloat16"
    if bf16 and not onednn_bf16():
        print("this CPU has no oneDNN bf16 GEMMs (AVX512-BF16 or AMX); bf16 engines would fall back")
    relative: dict[str, list[float]] = {}
    gen = torch.Generator().manual_seed(0)
    print(f"{'weight':10s} " + " ".join(f"{m:>6d}" for m in args.rows) + "   (rows; cost relative to 1 row)")
    for name, (out, inp) in SHAPES.items():
        gemm = Gemm(torch.randn(out, inp, generator=gen), bf16=bf16)
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
        relative[f"{name} ({out} x {inp})"] = [statistics.median(times[m]) / one for m in args.rows]
        print(
            f"{name:10s} "
            + " ".join(f"{statistics.median(times[m]) / one:6.2f}" for m in args.rows)
            + f"   ({one * 1000:.2f} ms for {args.rows[0]} row)"
        )
    if args.plot:
        plot(args.rows, relative, args.dtype, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "this CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "this CPU")


def plot(rows: list[int], relative: dict[str, list[float]], dtype: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, costs in relative.items():
        ax.plot(rows, costs, "o-", label=name)
    ax.plot(rows, [m / rows[0] for m in rows], ":", color="0.5", label="cost proportional to rows")
    ax.axhline(1.0, color="black", lw=0.8)
    ticks = [m for i, m in enumerate(rows) if i == 0 or m - rows[i - 1] >= 4]  # 16 and 17: one label
    ax.set_xticks(ticks, [str(m) for m in ticks])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.set_ylim(0, rows[-1] / rows[0] * 1.05)
    ax.set_xlabel("rows fed (1 + draft tokens, per request)")
    ax.set_ylabel(f"time relative to {rows[0]} row")
    ax.set_title(f"{dtype} weight GEMM by rows, SmolLM2-135M shapes, one thread\n{cpu_name()}", fontsize=9.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
