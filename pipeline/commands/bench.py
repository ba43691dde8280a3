"""`specdeploy bench --prompts FILE --concurrency N --requests M`: load a running server.

N concurrent streaming clients send M requests in total (bounded also by --time-limit), then
the command prints tokens/s, time to first token, inter-token latency (p50/p90/p99) and
speculative acceptance, and writes bench.json and bench.png into --out. With --repository (the
Triton model repository the server loaded) bench.json also records what was served: the method and
its settings, the engine's shape, dtypes and parallelism, which `specdeploy calibrate` needs; with
--probe-host as well (the server is the CPU reference backend on this host) it then measures the
host's GEMMs by rows for that model, so `specdeploy calibrate --gpu cpu` prices the runs on probes
taken beside them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, print_json

if TYPE_CHECKING:
    from rich.console import Console


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_summary(summary: dict, console: Console) -> None:
    from pipeline.console import Table

    table = Table(
        title=f"concurrency {summary['concurrency']}: {summary['completed']}/{summary['requests']} "
        f"requests in {summary['wall_seconds']:.1f} s, {summary['tokens_per_second']:.1f} tokens/s"
    )
    for column in ("", "p50 ms", "p90 ms", "p99 ms", "mean ms"):
        table.add_column(column, justify="right")
    for label, key in (
        ("time to first token", "ttft_ms"),
        ("inter-token latency", "itl_ms"),
        ("request latency", "latency_ms"),
    ):
        values = summary[key]
        table.add_row(label, *(_ms(values[p]) for p in ("p50", "p90", "p99", "mean")))
    console.print(table)
    acceptance = summary["acceptance"]
    if acceptance["acceptance_rate"] is not None:
        console.print(
            f"acceptance rate {acceptance['acceptance_rate']:.2f} ({acceptance['accepted_draft_tokens']} of "
            f"{acceptance['draft_tokens']} draft tokens), mean acceptance length "
            f"{acceptance['mean_acceptance_length'] or 0:.2f} tokens/step",
            highlight=False,
        )
    for error in summary["errors"]:
        console.print(f"[red]error[/red]: {error}", highlight=False)


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from pipeline.client.load import load_prompts, run_load, summarize, write_report
    from pipeline.commands.query import request_from_args
    from pipeline.io.atomic import check_replaceable

    if args.out:  # a folder of earlier runs' bench.json is ours; one holding anything else is not
        check_replaceable(Path(args.out), "--out", lambda folder: (folder / "bench.json").is_file())
    from pipeline.console import Table
    from pipeline.errors import InputError

    if args.probe_host and not args.repository:
        raise InputError("--probe-host measures the served model's GEMMs: say which with --repository DIR")
    served = None
    if args.repository:
        from pipeline.costmodel.served import describe

        served = describe(Path(args.repository))  # before the load: a wrong folder fails at once
    prompts = load_prompts(Path(args.prompts))
    models = [m.strip() for m in args.models.split(",")] if args.models else [args.model]
    run = run_load(
        args.url,
        models,
        prompts,
        concurrency=args.concurrency,
        requests=args.requests,
        make_request=lambda prompt: request_from_args(args, prompt, perf=True),
        time_limit=args.time_limit,
    )
    summary = summarize(run)
    host_gemms = None
    if args.probe_host and served:
        from pipeline.costmodel.calibrate import probe_host

        console.print("measuring this host's GEMMs by rows for `specdeploy calibrate --gpu cpu` (~15 s for SmolLM2)")
        host_gemms = probe_host(served).to_dict()
    out = Path(args.out or Path("bench") / "out" / time.strftime("%Y%m%d-%H%M%S"))
    path = write_report(
        run,
        summary,
        out,
        extra={"url": args.url, "model": ",".join(models), "models": models}
        | {"max_tokens": args.max_tokens, "prompts": str(args.prompts)}
        | ({"server": served} if served else {})
        | ({"host_gemms": host_gemms} if host_gemms else {}),
    )
    print_summary(summary, console)
    if "per_model" in summary:
        table = Table("model", "completed", "tokens", "tokens/s", "TTFT p50 ms", "ITL p50 ms")
        for name, figures in summary["per_model"].items():
            table.add_row(
                name,
                f"{figures['completed']}/{figures['requests']}",
                str(figures["output_tokens"]),
                f"{figures['tokens_per_second']:.1f}",
                _ms(figures["ttft_ms"]["p50"]),
                _ms(figures["itl_ms"]["p50"]),
            )
        console.print(table)
    console.print(f"wrote {path} and {path.with_suffix('.png')}", highlight=False)
    if args.json:  # what bench.json holds
        print_json(json.loads(path.read_text()))
    return 0 if summary["completed"] else 1


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    from pipeline.commands.query import add_sampling_arguments

    bench = commands.add_parser("bench", help="concurrent streaming load: tokens/s, TTFT, ITL, acceptance")
    bench.add_argument("--prompts", required=True, help="text (one prompt per line), .jsonl or .json")
    bench.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    bench.add_argument("--requests", type=int, default=16, help="requests in total")
    bench.add_argument("--time-limit", type=float, default=600.0, help="stop sending after this many seconds")
    bench.add_argument("--out", help="folder for bench.json and bench.png (default bench/out/<time>)")
    bench.add_argument(
        "--repository", help="the Triton model repository the server loaded: recorded for `specdeploy calibrate`"
    )
    bench.add_argument(
        "--probe-host",
        action="store_true",
        help="the server is the CPU reference backend on this host: after the run, measure the host's GEMMs by "
        "rows for the --repository's model and record them for `specdeploy calibrate --gpu cpu`",
    )
    add_sampling_arguments(bench)
    bench.add_argument(
        "--ignore-eos",
        action="store_true",
        help="decode every request to --max-tokens (end_id -1, which no token matches), so the concurrency "
        "holds for the whole run",
    )
    bench.add_argument(
        "--models",
        metavar="A,B,C",
        help="spread the requests round-robin over these model names (e.g. every fine-tune of a LoRA fleet "
        "on a whole-spec server) instead of --model; the summary also gives each model's figures",
    )
    add_json_flag(
        bench,
        'what bench.json holds: {"concurrency", "requests", "completed", "failed", "tokens_per_second", '
        '"ttft_ms": {"p50", "p90", "p99", "mean"}, "itl_ms", "latency_ms", "acceptance", "batch_mix" (share of '
        'decode steps by requests decoding), "errors", "models", "per_model" (with --models), ...}',
    )
    bench.set_defaults(handler=cmd_bench, max_tokens=64)
