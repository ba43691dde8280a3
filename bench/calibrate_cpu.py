"""Calibration round trip on the CPU reference backend: bench, calibrate, predict what was held out.

    .venv/bin/python bench/calibrate_cpu.py [--fit none,lookahead] [--held-out medusa,eagle]
        [--fit-concurrency 1,4] [--held-out-concurrency 2] [--requests 4] [--max-tokens 64] [--rounds 3]

Builds the shipped SmolLM2 specs through the pipeline (specs/smollm2-{lookahead,medusa,eagle}.yaml,
and the Lookahead spec with ``speculative.method: none`` for plain decoding; under
bench/out/calibrate-cpu, up-to-date stages are skipped), serves every variant's repository at once
with the real tritonserver and the reference backend on free ports, and runs ``specdeploy bench
--repository --probe-host`` (each run records the host's GEMMs after it) for every method at every
concurrency, in ``--rounds`` rounds whose order of methods rotates: a slow minute of the host then
falls on each method in turn, not on one, and the round with the median tokens/s stands for each
method and concurrency. Then ``specdeploy calibrate --gpu cpu`` on the runs of the fitted methods
at the fitted concurrencies alone, and prints for every run the tokens/s the calibration predicts
(at the run's measured acceptance length and batch mix, as a rehearsal would give it) beside the
measured tokens/s, and their ratio; the target is within 10% for the held-out methods and
concurrency. Not a test: the machine's load moves every figure (the load average is printed before
and after). So the round trip runs twice: on the wall-clock tokens/s ``bench``
measured, and on tokens per CPU-second of the server's processes (tritonserver and its backend
stubs, from /proc, around each run), which takes out how much of the shared cores each run got.
``--reuse`` keeps runs already measured (to refit without benching again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve import free_ports, process_tree_stat
from pipeline.cli import main as cli
from pipeline.client import GenerationRequest, TritonClient
from pipeline.costmodel import calibrate
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, VariantPlan
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer

OUT = REPO / "bench" / "out" / "calibrate-cpu"
TARGET = 0.10
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "List five tips for writing clear technical documentation.",
    "Describe the water cycle to a ten year old.",
    "What are the main differences between a list and a tuple in Python?",
    "Give a recipe for a simple vegetable soup.",
    "Why is the sky blue? Answer in a few sentences.",
    "Write a Python function that reverses a linked list.",
]
SPECS = {"none": "smollm2-lookahead.yaml", "lookahead": "smollm2-lookahead.yaml"}
SPECS |= {"medusa": "smollm2-medusa.yaml", "eagle": "smollm2-eagle.yaml"}


def spec_copy(method: str) -> Path:
    """The shipped spec with absolute head paths; plain decoding: the Lookahead spec without speculation."""
    text = (REPO / "specs" / SPECS[method]).read_text().replace("path: ../heads/", f"path: {REPO}/heads/")
    if method == "none":
        text = text.replace("name: smollm2-lookahead", "name: smollm2-plain")
        head, _, rest = text.partition("speculative:\n")
        tail = rest.split("build:", 1)[1]
        text = f"{head}speculative:\n  method: none\nbuild:{tail}"
    path = OUT / "specs" / f"smollm2-{'plain' if method == 'none' else method}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def build(method: str) -> VariantPlan:
    """`specdeploy engine SPEC` in-process; the package output is the repository to serve."""
    cache = Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache"))
    plan = make_plan(load_spec(spec_copy(method)), OutputRoots(OUT / "engines", OUT / "triton_repo", cache))
    variant = plan.variants[0]
    (outcome,) = execute_plan(plan, only={variant.name}, say=lambda text: print(f"  {text}", flush=True))
    if outcome.stopped_at:
        raise SystemExit(f"{variant.name} stopped at {outcome.stopped_at}: {outcome.reason}")
    return variant


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant, from /proc."""
    return process_tree_stat(pid, (11, 12)) / os.sysconf("SC_CLK_TCK")


def bench_rounds(variants: dict[str, VariantPlan], concurrencies: list[int], args: argparse.Namespace) -> dict:
    """Every variant served at once (a fresh server each), then ``args.rounds`` rounds of one `specdeploy
    bench --repository` run per variant and concurrency, the variants' order rotated each round: a
    drift of the host lands on every method alike. Per (method, concurrency), the round with the
    median rate stands for it (:func:`median_round`)."""
    cache = Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache"))
    prompts = OUT / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    rounds: dict[tuple[str, int], list[Path]] = {}
    with ExitStack() as stack:
        servers = {}
        for method, variant in variants.items():
            http, grpc, metrics = free_ports(3)
            repo = variant.stage("package").output
            config = CpuServerConfig(
                repositories=(repo,), cache_dir=cache, http_port=http, grpc_port=grpc, metrics_port=metrics,
                models=(variant.serving.model_name,),
            )  # fmt: skip
            server = stack.enter_context(CpuTritonServer(config))
            with TritonClient(server.grpc_url, variant.serving.model_name) as client:  # warm-up (first-call costs)
                client.generate(GenerationRequest(PROMPTS[0], max_tokens=8))
            servers[method] = server
        methods = list(variants)
        for k in range(args.rounds):
            for method in methods[k % len(methods) :] + methods[: k % len(methods)]:
                variant, server = variants[method], servers[method]
                for c in concurrencies:
                    out = OUT / "runs" / f"{method}-c{c}" / f"round{k}"
                    cpu_before = tree_cpu_seconds(server.process.pid)
                    code = cli(
                        ["bench", "--url", server.grpc_url, "--model", variant.serving.model_name, "--prompts",
                         str(prompts), "--concurrency", str(c), "--requests", str(max(args.requests, 2 * c)),
                         "--max-tokens", str(args.max_tokens), "--ignore-eos", "--repository",
                         str(variant.stage("package").output), "--probe-host", "--out", str(out)]
                    )  # fmt: skip
                    if code:
                        raise SystemExit(f"bench {variant.name} at concurrency {c} failed ({code})")
                    cpu = tree_cpu_seconds(server.process.pid) - cpu_before
                    (out / "server_cpu.json").write_text(json.dumps({"server_cpu_seconds": cpu}))
                    rounds.setdefault((method, c), []).append(out)
    return rounds


def median_round(rounds: list[Path], per_cpu: bool) -> Path:
    """The round whose tokens/s (wall clock, or per server CPU-second) is the median of the rounds
    (the lower middle of an even count), as a run folder of its own next to them."""

    def rate(path: Path) -> float:
        body = json.loads((path / "bench.json").read_text())
        if not per_cpu:
            return body["tokens_per_second"]
        return body["output_tokens"] / json.loads((path / "server_cpu.json").read_text())["server_cpu_seconds"]

    chosen = sorted(rounds, key=rate)[(len(rounds) - 1) // 2]
    body = json.loads((chosen / "bench.json").read_text())
    body["tokens_per_second"] = rate(chosen)
    body["median_of_rounds"] = {"rounds": len(rounds), "rates": sorted(rate(r) for r in rounds)}
    folder = OUT / ("runs-per-cpu-second" if per_cpu else "runs-median") / chosen.parent.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(body))
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", default="none,lookahead", help="methods the calibration sees")
    parser.add_argument("--held-out", default="medusa,eagle", help="methods it predicts")
    parser.add_argument("--fit-concurrency", default="1,4")
    parser.add_argument("--held-out-concurrency", default="2")
    parser.add_argument("--requests", type=int, default=4, help="requests per run (at least twice the concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--context-len", type=int, default=64, help="mean cached tokens per request")
    parser.add_argument("--rounds", type=int, default=3, help="bench rounds of every method (the median stands)")
    parser.add_argument("--reuse", action="store_true", help="keep the runs already under bench/out/calibrate-cpu")
    args = parser.parse_args()
    fit_methods, held_methods = args.fit.split(","), args.held_out.split(",")
    fit_c = [int(c) for c in args.fit_concurrency.split(",")]
    held_c = [int(c) for c in args.held_out_concurrency.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs", flush=True)
    concurrencies = sorted(set(fit_c + held_c))
    keys = [(m, c) for m in fit_methods + held_methods for c in concurrencies]
    found = {key: sorted((OUT / "runs" / f"{key[0]}-c{key[1]}").glob("round*/bench.json")) for key in keys}
    if args.reuse and all(found.values()):
        rounds = {key: [p.parent for p in paths] for key, paths in found.items()}
    else:
        variants = {}
        for method in fit_methods + held_methods:
            print(f"building {method}", flush=True)
            variants[method] = build(method)
        print(f"benching {', '.join(variants)} at concurrency {concurrencies}, {args.rounds} rounds", flush=True)
        shutil.rmtree(OUT / "runs", ignore_errors=True)  # no round of an earlier run mixes in
        rounds = bench_rounds(variants, concurrencies, args)
    print(f"load average after: {os.getloadavg()[0]:.1f} (1 min)")
    for key, paths in sorted(rounds.items()):
        rates = [json.loads((p / "bench.json").read_text())["tokens_per_second"] for p in paths]
        print(f"  {key[0]:10s} c{key[1]}: tokens/s by round {', '.join(f'{r:.2f}' for r in rates)}")
    wall = {key: median_round(paths, per_cpu=False) for key, paths in rounds.items()}
    worst = round_trip(wall, "wall-clock tokens/s", fit_methods, fit_c, held_methods, held_c, args.context_len)
    per_cpu = {key: median_round(paths, per_cpu=True) for key, paths in rounds.items()}
    round_trip(per_cpu, "tokens per server CPU-second", fit_methods, fit_c, held_methods, held_c, args.context_len)
    return 0 if worst <= TARGET else 1


def round_trip(runs: dict[tuple[str, int], Path], rate: str, fit_methods: list[str], fit_c: list[int],
               held_methods: list[str], held_c: list[int], context_len: int) -> float:  # fmt: skip
    """Calibrate on the fitted runs alone, print every run's predicted vs measured ``rate``; the
    largest held-out error."""
    fitted = [runs[m, c] for m in fit_methods for c in fit_c]
    cal = fitted[0].parent.parent / f"calibration-{fitted[0].parent.name}.json"
    print(f"\n== {rate}: calibrate on {', '.join(fit_methods)} at concurrency {', '.join(map(str, fit_c))}")
    code = cli(["calibrate", "--gpu", "cpu", "--context-len", str(context_len), "--out", str(cal)]
               + [str(p) for p in fitted])  # fmt: skip
    if code:
        raise SystemExit(code)
    content = json.loads(cal.read_text())
    print(f"{'method':10s} {'conc':>4s} {'AL':>5s} {'measured':>9s} {'predicted':>10s} {'ratio':>6s}  role")
    worst = 0.0
    for (method, c), path in sorted(runs.items()):
        run = calibrate.read_run(path)
        predicted = calibrate.predicted_tokens_per_second(content, run)
        ratio = predicted / run.tokens_per_second
        held = method in held_methods or c in held_c
        if held:
            worst = max(worst, abs(ratio - 1))
        print(
            f"{method:10s} {c:4d} {run.acceptance_length:5.2f} {run.tokens_per_second:9.2f} {predicted:10.2f} "
            f"{ratio:6.2f}  {'held out' if held else 'fitted'}"
        )
    verdict = "meets" if worst <= TARGET else "misses"
    print(f"{rate}: largest held-out error {worst:.0%} ({verdict} the {TARGET:.0%} target)")
    return worst


if __name__ == "__main__":
    sys.exit(main())
