"""Checkpoint converter benchmark: throughput next to a plain file copy, peak RSS next to model size.

    python bench/convert.py [--size-gib 3] [--tp 1,2] [--repeat 3] [--dtype bfloat16] [--workdir DIR]

Builds a synthetic Llama-shaped bf16 checkpoint of about --size-gib in a temp folder (random
weights, real layout), then in one run:
* copies model.safetensors with shutil.copyfile (+ fsync, as the converter fsyncs its output),
* converts it once per tp in a child process (the child's peak RSS via RUSAGE_CHILDREN, and the
  growth during conversion alone via /proc VmHWM),
and prints GB/s and the ratios against the targets (>= 0.7x copy, peak RSS < 1.5 GiB).
Both the copy and the conversions read the freshly written source from the page cache. Disk
write speed on shared VMs drifts by 2x within a minute, so copy and conversions are interleaved
--repeat times; each conversion is compared with the copy of its own round and the median ratio
is reported (GB/s counts the bytes each side writes; tp>1 writes more: replicated tensors).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from pipeline.checkpoint.synthetic import DEFAULT_SYNTHETIC, scaled_to, write_synthetic_llama

GiB = 1024**3
TARGET_RATIO = 0.7
TARGET_RSS = 1.5 * GiB

CHILD = r"""
import json, re, sys, time
from pathlib import Path
from pipeline.checkpoint import convert_checkpoint

def status(key):
    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

src, out, dtype, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
Path("/proc/self/clear_refs").write_text("5")
base = status("VmRSS")
start = time.perf_counter()
summary = convert_checkpoint(Path(src), Path(out), tp=tp, pp=1, dtype=dtype)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "bytes": summary.total_bytes, "base_rss": base, "peak_rss": status("VmHWM")}))
"""


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed_copy(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    shutil.copyfile(src, dst)
    fsync_path(dst)
    return time.perf_counter() - start


def run_conversion(src: Path, out: Path, dtype: str, tp: int) -> dict:
    out.mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out), dtype, str(tp)], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # ru_maxrss of children is the max over all waited-for children (KiB on Linux); conversions are
    # the only children, and the first one runs with nothing before it.
    result["child_maxrss"] = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) * 1024
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=3.0, help="synthetic checkpoint size (default 3)")
    ap.add_argument("--tp", default="1,2", help="comma-separated tensor-parallel sizes to convert with")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="output dtype (the source is bfloat16; other dtypes add conversion work)",
    )
    ap.add_argument("--repeat", type=int, default=5, help="interleaved copy/convert rounds (medians)")
    ap.add_argument("--workdir", type=Path, default=None, help="where to put the temp folder")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = ap.parse_args(argv)
    tps = [int(x) for x in args.tp.split(",")]

    model = scaled_to(
        int(args.size_gib * GiB),
        torch.bfloat16,
        dataclasses.replace(
            DEFAULT_SYNTHETIC, hidden_size=2048, intermediate_size=5632, head_dim=128, vocab_size=64000
        ),
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.workdir))
    try:
        src = tmp / "hf"
        t0 = time.perf_counter()
        size = write_synthetic_llama(src, model, torch.bfloat16)
        fsync_path(src / "model.safetensors")
        print(
            f"synthetic checkpoint: {size / GiB:.2f} GiB, {model.num_layers} layers, hidden "
            f"{model.hidden_size}, vocab {model.vocab_size} (written in {time.perf_counter() - t0:.1f} s)"
        )

        copies: list[float] = []
        runs: dict[int, list[dict]] = {tp: [] for tp in tps}
        for _ in range(args.repeat):
            copies.append(timed_copy(src / "model.safetensors", tmp / "copy.safetensors"))
            (tmp / "copy.safetensors").unlink()
            for tp in tps:
                out = tmp / f"out_tp{tp}"
                runs[tp].append(run_conversion(src, out, args.dtype, tp))
                shutil.rmtree(out)
        copy_s = statistics.median(copies)
        copy_gbs = size / copy_s / 1e9
        print(
            f"shutil.copyfile + fsync: median {copy_s:.2f} s of {len(copies)} "
            f"({', '.join(f'{c:.2f}' for c in copies)}), {copy_gbs:.2f} GB/s"
        )

        ok = True
        print(
            f"{'tp':>3} {'seconds':>8} {'GB/s':>6} {'x copy':>7} {'peak RSS':>9} {'RSS/ckpt':>9} "
            f"{'grew in conversion':>19}   per-round x copy"
        )
        for tp in tps:
            rs = runs[tp]
            seconds = statistics.median(r["seconds"] for r in rs)
            gbs = rs[0]["bytes"] / seconds / 1e9
            # Each conversion is compared with the copy of its own round: the disk's speed drifts.
            ratios = [(r["bytes"] / r["seconds"]) / (size / c) for r, c in zip(rs, copies, strict=True)]
            ratio = statistics.median(ratios)
            peak = max(max(r["child_maxrss"], r["peak_rss"]) for r in rs)
            grew = max(r["peak_rss"] - r["base_rss"] for r in rs)
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"{tp:>3} {seconds:>8.2f} {gbs:>6.2f} {ratio:>6.2f}x {peak / GiB:>7.2f} GiB "
                f"{peak / size:>8.2f}x {grew / 2**20:>15.0f} MiB   {each}"
            )
            ok &= ratio >= TARGET_RATIO and peak < TARGET_RSS
        print(
            f"targets: throughput >= {TARGET_RATIO}x copy, peak RSS < {TARGET_RSS / GiB:.1f} GiB: "
            f"{'MET' if ok else 'NOT MET'}"
        )
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
