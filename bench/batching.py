"""Measure in-flight batching: generated tokens/s at concurrency 1 vs N through the scheduler.

    .venv/bin/python bench/batching.py [HF_MODEL_DIR] [--concurrency 1 8] [--threads 2]

Converts the HF Llama folder (default: the embedded SmolLM2-135M-Instruct) with the project's
converter into a temporary reference engine, then, per concurrency c, submits c greedy requests
at once (each a different prompt of --prompt-len tokens, --new-tokens to generate) and reports
generated tokens / wall seconds. Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.checkpoint import convert_checkpoint
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest
from pipeline.runtime.serving.metrics import StepStats
from pipeline.runtime.serving.scheduler import Scheduler

DEFAULT_MODEL = REPO / ".cache" / "smollm2-135m-instruct"


def make_engine(hf_dir: Path, out: Path, max_batch_size: int) -> Path:
    out.mkdir(parents=True)
    convert_checkpoint(hf_dir, out, tp=1, pp=1, dtype="float32")
    pretrained = json.loads((out / "config.json").read_text())
    build = {
        "max_batch_size": max_batch_size,
        "max_input_len": 1024,
        "max_seq_len": 2048,
        "max_num_tokens": 4096,
        "max_draft_len": 0,
        "speculative_decoding_mode": None,
        "plugin_config": {"tokens_per_block": 32},
    }
    (out / "config.json").write_text(
        json.dumps({"version": "1.2.1", "pretrained_config": pretrained, "build_config": build})
    )
    return out


def measure(engine: Engine, concurrency: int, prompt_len: int, new_tokens: int) -> dict[str, float]:
    stats: list[StepStats] = []
    scheduler = Scheduler(engine, on_step=stats.append)
    done: list[int] = []
    vocab = engine.config.model.vocab_size
    for i in range(concurrency):
        prompt = tuple((1000 + 37 * i + 11 * j) % vocab for j in range(prompt_len))
        request = GenerationRequest(str(i), prompt, new_tokens, exclude_input_in_output=True)
        scheduler.submit(request, lambda out: done.append(len(out.tokens)) if out.finished else None)
    started, cpu_started = time.perf_counter(), time.thread_time()
    scheduler.run_until_idle()
    seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
    decode = [s for s in stats if s.prefill_tokens == 0]
    decode_seconds = sum(s.seconds for s in decode)
    return {
        "tokens_per_s": sum(done) / seconds,
        # CPU seconds of this thread: what the rate would be on an otherwise idle machine
        # (with 1 torch thread), independent of other processes' load.
        "tokens_per_cpu_s": sum(done) / cpu_seconds,
        "decode_tokens_per_s": sum(s.generated_tokens for s in decode) / max(decode_seconds, 1e-9),
        "mean_decode_step_ms": 1000 * decode_seconds / max(len(decode), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        engine = Engine.load(make_engine(args.model, Path(tmp) / "engine", max(args.concurrency)))
        measure(engine, 1, 8, 4)  # warm-up: first-call allocations and thread pools
        results = {c: measure(engine, c, args.prompt_len, args.new_tokens) for c in args.concurrency}
    base = results[args.concurrency[0]]
    print(f"model {args.model.name}, torch threads {args.threads}, prompt {args.prompt_len}, new {args.new_tokens}")
    for c, r in results.items():
        print(
            f"concurrency {c:3d}: {r['tokens_per_s']:7.1f} tok/s wall x{r['tokens_per_s'] / base['tokens_per_s']:.2f}"
            f" | {r['tokens_per_cpu_s']:7.1f} tok/CPU-s x{r['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}"
            f" | decode steps {r['mean_decode_step_ms']:.1f} ms ({r['decode_tokens_per_s']:.1f} tok/s)"
        )


if __name__ == "__main__":
    main()
