"""Command line: ``specdeploy validate|plan|engine|prepare-model``.

Every user-facing error is one line per problem on stderr (``error: file:line:col path:
message``) and exit code 2 for bad input, 1 for a failed stage, 3 for a stage that
cannot run on this host; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from pipeline import __version__
from pipeline.errors import SpecdeployError
from pipeline.plan import OutputRoots, Plan, make_plan
from pipeline.spec import load_spec

DEFAULT_SPEC = Path("specs/smollm2-lookahead.yaml")
EXTRA_COMMANDS = ("build", "serve", "query", "bench", "doctor", "heads", "train_adapter")


def _roots(args: argparse.Namespace) -> OutputRoots:
    return OutputRoots(Path(args.engines_dir), Path(args.triton_repo), Path(args.cache_dir))


def _load_plan(args: argparse.Namespace) -> Plan:
    return make_plan(load_spec(Path(args.spec)), _roots(args))


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    plan = _load_plan(args)
    for variant in plan.variants:
        console.print(f"[green]ok[/green] {variant.name}: {variant.method} ({variant.speculative.reason})")
        for note in variant.notes:
            console.print(f"   note: {note}")
    return 0


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    plan = _load_plan(args)
    if args.json:
        print(json.dumps(_plan_with_commands(plan), indent=2))
        return 0
    from pipeline.report import print_plan

    print_plan(plan, console)
    return 0


def _plan_with_commands(plan: Plan) -> dict:
    """The plan plus, per variant, the exact trtllm-build and GPU launch argv it implies."""
    from pipeline.trtllm.build_command import trtllm_build_argv
    from pipeline.triton.launch_gpu import gpu_launch_argv

    body = json.loads(plan.to_json())
    for data, variant in zip(body["variants"], plan.variants):
        data["commands"] = {
            "trtllm_build": trtllm_build_argv(variant, variant.stage("convert").output,
                                              variant.stage("build").output, visible_gpus=None),
            "gpu_launch": gpu_launch_argv(variant, variant.stage("package").output, world_size=variant.world_size),
        }
    return body


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    from pipeline.stages.execute import execute_plan

    plan = _load_plan(args)
    outcomes = execute_plan(plan, only=set(args.variant or ()), force=args.force,
                            say=lambda text: console.print(text, highlight=False, markup=False))
    stopped = [outcome for outcome in outcomes if outcome.stopped_at]
    if stopped:
        console.print(f"[yellow]{len(stopped)} variant(s) stopped at a stage this host cannot run yet[/yellow]")
        return max(outcome.exit_code for outcome in stopped)
    console.print(f"[green]done[/green]: {len(outcomes)} variant(s)")
    return 0


def cmd_prepare_model(args: argparse.Namespace, console: Console) -> int:
    from pipeline.embedded import prepare_embedded_model

    folder = prepare_embedded_model(Path(args.cache_dir))
    console.print(f"embedded model ready: {folder}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"specdeploy {__version__}")
    parser.add_argument("--engines-dir", default=os.environ.get("SPECDEPLOY_ENGINES", "engines"))
    parser.add_argument("--triton-repo", default=os.environ.get("SPECDEPLOY_TRITON_REPO", "triton_repo"))
    parser.add_argument("--cache-dir", default=os.environ.get("SPECDEPLOY_CACHE", ".cache"),
                        help="where the embedded model is prepared (default .cache)")
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check a spec and print every problem at once")
    validate.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    validate.set_defaults(handler=cmd_validate)

    plan = commands.add_parser("plan", help="resolve each variant into method, build config and stages")
    plan.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    plan.add_argument("--json", action="store_true", help="machine-readable plan")
    plan.set_defaults(handler=cmd_plan)

    engine = commands.add_parser("engine", help="run the stages: quantize, convert, build, package")
    engine.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    engine.add_argument("--variant", action="append", help="only this variant (repeatable)")
    engine.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    engine.set_defaults(handler=cmd_engine)

    prepare = commands.add_parser("prepare-model", help="prepare the embedded SmolLM2 model in the cache")
    prepare.set_defaults(handler=cmd_prepare_model)
    for name in EXTRA_COMMANDS:
        importlib.import_module(f"pipeline.commands.{name}").register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(soft_wrap=True)
    try:
        return args.handler(args, console)
    except SpecdeployError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `specdeploy plan --json | head`
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
