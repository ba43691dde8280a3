"""`specdeploy calibrate`: the cost model's constants fitted on your own servers' bench runs.

    specdeploy calibrate --gpu h100-sxm-80gb --runtime trtllm RUN_DIR... [--out calibration.json]

Each RUN_DIR is what `specdeploy bench --repository DIR` wrote (bench.json: tokens/s, acceptance,
concurrency and what the server served). Plain decoding and at least one speculative method, each at
two concurrencies or more, on one model: anything less is refused with what to bench
(pipeline/costmodel/calibrate.py). The file goes into a spec as `gpu: {type: ..., calibration: PATH}`:
predictions, `best` and the release gates then use it, intervals from its own residuals. With
``--gpu cpu`` (the CPU reference backend) it also needs the host's GEMMs by rows: the probes the runs
recorded (`specdeploy bench --probe-host`), else it measures this host's (~15 s for SmolLM2). "decoding"
is how many requests a step decoded on average (bench's batch mix): each run is priced at its mix.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.costmodel.profile import DEFAULT_RUNTIME, RUNTIMES
from pipeline.spec import gpus

if TYPE_CHECKING:
    from rich.console import Console


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("calibrate", help="fit the cost model on `specdeploy bench --repository` runs")
    parser.add_argument("runs", nargs="+", help="bench output folders (or bench.json files)")
    parser.add_argument(
        "--gpu",
        required=True,
        choices=[*sorted(gpus.GPU_TYPES), "cpu"],
        help="the GPU type the runs ran on (cpu: the CPU reference backend, priced by its own step model)",
    )
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES, help="the profile to start from")
    parser.add_argument("--context-len", type=int, default=512, help="mean cached tokens per request in the runs")
    parser.add_argument("--out", default="calibration.json", help="the calibration file to write")
    parser.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from pipeline.costmodel import calibrate
    from pipeline.errors import InputError
    from pipeline.io.atomic import check_replaceable, json_of

    out = Path(args.out)  # a calibration file only: checked before anything is measured
    check_replaceable(out, "--out", lambda p: (json_of(p) or {}).get("format") == calibrate.FORMAT, folder=False)
    try:
        runs = [calibrate.read_run(Path(r)) for r in args.runs]
        device = None
        if args.gpu == "cpu":
            calibrate.refuse_undetermined(runs)  # before measuring anything
            device = calibrate.cpu_device(runs, say=console.print)
        content = calibrate.calibrate(runs, args.gpu, args.runtime, args.context_len, device)
    except calibrate.CalibrationError as exc:
        raise InputError(str(exc)) from None
    try:
        calibrate.write(content, out)
    except OSError as exc:
        from pipeline.errors import host_error

        raise host_error(exc, f"writing the calibration {out}") from None
    table = Table(title=f"{args.runtime} on {args.gpu}: {content['calibration']['source']}", title_justify="left")
    for column in ("run", "method", "concurrency", "decoding", "AL", "measured speedup", "residual"):
        table.add_column(column)
    for o in content["observations"]:
        table.add_row(
            o["run"], o["method"], str(o["concurrency"]), f"{o['mean_batch']:.2f}", f"{o['acceptance_length']:.2f}",
            f"{o['speedup']:.2f}x", f"{o['residual']:+.1%}",
        )  # fmt: skip
    console.print(table)
    profile = content["calibration"]["profile"]
    console.print(", ".join(f"{k} {profile[k]:.4g}" for k in content["fitted"]), highlight=False)
    console.print(f"wrote {out}; use it with gpu: {{type: {args.gpu}, calibration: {out}}}", highlight=False)
    return 0
