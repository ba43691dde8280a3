"""Serving throughput on CPU: SmolLM2 behind the real tritonserver, total tokens/s at concurrency 1, 4 and 8.

    .venv/bin/python bench/serve.py [--spec specs/smollm2-lookahead.yaml] [--max-tokens 48]

Builds what it needs through the pipeline (``specdeploy engine SPEC``: embedded model, convert,
build, package; up-to-date stages are skipped), starts tritonserver with the reference backend
on free ports, warms up, then runs N concurrent streaming clients per level and prints a table.
Target: in-flight batching makes concurrency 8 give >= 3x the tokens/s of concurrency 1.
Every request ignores EOS (end_id -1) so each level generates the same number of tokens.
Bounded: requests per level are fixed and each level stops at --time-limit seconds.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.client import GenerationRequest, TritonClient
from pipeline.client.load import run_load, summarize
from pipeline.errors import SpecdeployError, StageUnavailable
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, VariantPlan
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer, reference_backend_available

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "List five tips for writing clear technical documentation.",
    "Describe the water cycle to a ten year old.",
    "What are the main differences between a list and a tuple in Python?",
    "Summarize the plot of a detective novel set in a small harbour town.",
    "Give a recipe for a simple vegetable soup.",
    "Why is the sky blue? Answer in a few sentences.",
]
TARGET_RATIO = 3.0


def process_tree_stat(pid: int, fields: tuple[int, ...]) -> float:
    """The sum of /proc/<p>/stat ``fields`` (0-based, after the command name) over ``pid`` and every live
    descendant: tritonserver and its backend stubs."""
    total = 0.0
    for process in process_tree(pid):
        try:
            stat = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(float(stat[f]) for f in fields)
    return total


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def memory_of(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in bytes, from /proc/<pid>/smaps_rollup: PSS splits each shared page
    among the processes that map it, so PSS summed over processes counts every page once."""
    values = {"Rss:": 0, "Pss:": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, *rest = line.split()
            if key in values:
                values[key] = int(rest[0]) * 1024
    except OSError:
        pass
    return values["Rss:"], values["Pss:"]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def build(spec: Path) -> VariantPlan:
    """`specdeploy engine SPEC` in-process; the package output is the repository to serve."""
    plan = make_plan(load_spec(spec), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache"))
    variant = plan.variants[0]
    (outcome,) = execute_plan(plan, only={variant.name}, say=lambda text: print(f"  {text}"))
    if outcome.stopped_at:
        raise StageUnavailable(f"{variant.name} stopped at {outcome.stopped_at}: {outcome.reason}")
    return variant


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "smollm2-lookahead.yaml"))
    parser.add_argument("--levels", default="1,4,8", help="concurrency levels (comma list)")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds per level at most")
    args = parser.parse_args()
    if not reference_backend_available():
        print("the reference backend (pipeline/runtime/triton/backend.py) is not in this checkout")
        return 3
    levels = [int(level) for level in args.levels.split(",")]
    try:
        print(f"building {args.spec} through the pipeline")
        variant = build(Path(args.spec))
        repo = variant.stage("package").output
        http, grpc, metrics = free_ports(3)
        config = CpuServerConfig(
            repositories=(repo,),
            cache_dir=REPO / ".cache",
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            models=(variant.serving.model_name,),
        )
        print(f"starting tritonserver ({variant.name}, {variant.method}); log {config.cache_dir}/tritonserver/logs")
        with CpuTritonServer(config) as server:

            def request(prompt: str) -> GenerationRequest:
                return GenerationRequest(prompt, max_tokens=args.max_tokens, end_id=-1, return_perf_metrics=True)

            with TritonClient(server.grpc_url, variant.serving.model_name) as client:  # warm-up (first-call costs)
                client.generate(request(PROMPTS[0]))
            rows = []
            for level in levels:
                run = run_load(
                    server.grpc_url,
                    variant.serving.model_name,
                    PROMPTS,
                    concurrency=level,
                    requests=level * args.requests_per_client,
                    make_request=request,
                    time_limit=args.time_limit,
                )
                rows.append(summarize(run))
                print(f"  concurrency {level}: {rows[-1]['tokens_per_second']:.1f} tokens/s", flush=True)
    except SpecdeployError as exc:
        print(f"error: {exc}")
        return exc.exit_code
    print_table(rows)
    by_level = {row["concurrency"]: row["tokens_per_second"] for row in rows}
    if 1 in by_level and max(levels) in by_level and by_level[1] > 0:
        ratio = by_level[max(levels)] / by_level[1]
        verdict = "meets" if ratio >= TARGET_RATIO else "misses"
        print(
            f"concurrency {max(levels)} / concurrency 1 = {ratio:.2f}x tokens/s "
            f"({verdict} the {TARGET_RATIO:.0f}x target)"
        )
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"spec": args.spec, "max_tokens": args.max_tokens, "levels": rows}, indent=2))
    print(f"wrote {path}")
    return 0


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'clients':>7} {'done':>5} {'tokens':>7} {'wall s':>7} {'tokens/s':>9} {'TTFT p50 ms':>12} "
        f"{'ITL p50 ms':>11} {'ITL p99 ms':>11} {'accept':>7} {'len':>5}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        acceptance = row["acceptance"]
        rate, length = acceptance["acceptance_rate"], acceptance["mean_acceptance_length"]
        print(
            f"{row['concurrency']:>7} {row['completed']:>5} {row['output_tokens']:>7} {row['wall_seconds']:>7.1f} "
            f"{row['tokens_per_second']:>9.1f} {row['ttft_ms']['p50'] or 0:>12.0f} {row['itl_ms']['p50'] or 0:>11.1f} "
            f"{row['itl_ms']['p99'] or 0:>11.1f} {'-' if rate is None else f'{rate:.2f}':>7} "
            f"{'-' if length is None else f'{length:.2f}':>5}"
        )


if __name__ == "__main__":
    sys.exit(main())
