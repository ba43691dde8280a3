"""`specdeploy build SPEC [--variant V] [--dry-run [--repository DIR]]`: the build stage alone.

``--dry-run`` prints, per variant, the exact trtllm-build argv and the GPU serving
command (here, and in the Kubernetes deployment's container), and runs nothing; with
``--repository DIR`` it also writes the Triton model repositories the package stages will write on
the GPU host, for review (:mod:`pipeline.triton.review`). Without it, only
the build stage runs (through the stage runner: atomic output, fingerprints, locks); the
checkpoint must already exist.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import targets
from pipeline.commands.common import add_json_flag, add_spec_argument, add_variant_filter, print_json
from pipeline.targets import on_gpus

if TYPE_CHECKING:
    from rich.console import Console


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    parser = commands.add_parser("build", help="run (or --dry-run: print) the trtllm-build step of each variant")
    add_spec_argument(parser, required=True)
    add_variant_filter(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the trtllm-build and serving commands only")
    parser.add_argument(
        "--repository",
        type=Path,
        metavar="DIR",
        help="with --dry-run: also write into DIR the Triton model repositories the package stage will "
        "write on the GPU host (every config.pbtxt and model.py), to review before GPU time",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the engine is up to date")
    add_json_flag(
        parser,
        '{"variants": [{"name", "trtllm_build": [argv], "gpu_launch": [argv]}]} with --dry-run, else '
        '{"variants": [{"name", "state": "ran|skipped|unavailable", "seconds", "message", "exit_code"}]}',
    )
    parser.set_defaults(handler=cmd_build)


def cmd_build(args: argparse.Namespace, console: Console) -> int:
    from pipeline.commands.common import load_plan
    from pipeline.errors import InputError

    plan = load_plan(args)
    wanted = set(args.variant or ())
    unknown = wanted - {variant.name for variant in plan.variants}
    if unknown:
        raise InputError(
            f"--variant {', '.join(sorted(unknown))}: not in {plan.spec_file} "
            f"(variants: {', '.join(v.name for v in plan.variants)})"
        )
    variants = [variant for variant in plan.variants if not wanted or variant.name in wanted]
    if args.repository is not None and not args.dry_run:
        raise InputError("--repository writes the repositories for review and needs --dry-run")
    review = _review(plan, args.repository, variants) if args.repository is not None else None
    if args.dry_run and args.json:
        print_json(
            {"variants": [{"name": v.name, **_commands(v)} for v in variants]} | ({"review": review} if review else {})
        )
        return 0
    if args.dry_run:
        for variant in variants:
            _print_commands(variant, console)
        if not wanted:
            _print_spec_command(plan, console)
        if review is not None:
            _print_review(review, args.repository, console)
        return 0
    from pipeline.stages.owners import claim_outputs

    claim_outputs(plan, set(args.variant or ()), {"build"})  # another spec's engines are refused before it runs
    engines = [v for v in variants if targets.definition(v.target).builds_engines]
    for variant in variants:
        if variant not in engines:
            console.print(
                f"[{variant.name}] target {variant.target}: no engine to build", highlight=False, markup=False
            )
    built = [_build(variant, args.force, console) for variant in engines]
    if args.json:
        print_json({"variants": built})
    return max((b["exit_code"] for b in built), default=0)


def _review(plan, out: Path, variants) -> dict:
    from pipeline.triton.review import write_review

    return write_review(plan, out, variants)


def _print_review(review: dict, out: Path, console: Console) -> None:
    console.print(f"# Triton model repositories for review, in {out}", highlight=False, markup=False)
    for repo in review["repositories"]:
        note = (
            "" if repo["tokenizer"] is not False else " (no tokenizer here: its copies and chat template are left out)"
        )
        console.print(f"  {out / repo['name']}{note}", highlight=False, markup=False)


def _commands(variant) -> dict[str, list[str]]:
    from pipeline.release.kubernetes import launch_argv
    from pipeline.triton.launch_gpu import gpu_launch_argv
    from pipeline.trtllm.build_command import trtllm_build_argv

    if not targets.definition(variant.target).builds_engines:  # no engine: trtllm-serve loads the checkpoint
        return {"kubernetes_launch": launch_argv(variant)}

    checkpoint, engine = variant.stage("convert").output, variant.stage("build").output
    commands = {
        "trtllm_build": trtllm_build_argv(variant, checkpoint, engine, visible_gpus=None),
        "gpu_launch": gpu_launch_argv(variant, variant.stage("package").output, world_size=variant.world_size),
    }
    if on_gpus(variant.target):  # the container's argv in engines/<spec>/deploy/deployment.yaml
        commands["kubernetes_launch"] = launch_argv(variant)
    return commands


def _print_commands(variant, console: Console) -> None:
    from pipeline.trtllm.build_command import display

    commands = _commands(variant)
    if "trtllm_build" not in commands:
        console.print(
            f"{variant.name}: {variant.method}, tp={variant.tp} pp={variant.pp} (target {variant.target}: no engine "
            "build; trtllm-serve loads the checkpoint)",
            markup=False,
        )
        mount = variant.deploy.mount_path
        console.print(f"# serve (deploy.mount_path {mount})", highlight=False, markup=False)
        console.print(display(commands["kubernetes_launch"]), highlight=False, markup=False, soft_wrap=True)
        return
    engine = variant.stage("build").output
    build_argv, serve_argv = commands["trtllm_build"], commands["gpu_launch"]
    where = "" if on_gpus(variant.target) else " (target reference: on a GPU host this is the build)"
    console.print(f"{variant.name}: {variant.method}, tp={variant.tp} pp={variant.pp}{where}", markup=False)
    lines = [f"# build (in {engine})", display(build_argv), "# serve", display(serve_argv)]
    if on_gpus(variant.target):  # the container's argv in engines/<spec>/deploy/deployment.yaml
        mount = variant.deploy.mount_path
        lines += [f"# serve in Kubernetes (deploy.mount_path {mount})", display(commands["kubernetes_launch"])]
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _print_spec_command(plan, console: Console) -> None:
    """The whole-spec repository's container argv, when the manifests run it (pipeline/release/kubernetes.py)."""
    from pipeline.fleet.placement import sharing_problem
    from pipeline.release.kubernetes import served, spec_launch_argv
    from pipeline.trtllm.build_command import display

    if plan.repository is None or sharing_problem(plan) is not None:
        return
    servers = served(plan, True)[0]
    if [server.repository for server in servers] == [plan.repository.output.name]:
        console.print(f"{plan.spec_name}: every variant from one server", markup=False)
        console.print("# serve the whole spec in Kubernetes", highlight=False, markup=False)
        console.print(display(spec_launch_argv(plan)), highlight=False, markup=False, soft_wrap=True)


def _build(variant, force: bool, console: Console) -> dict:
    """Runs the build stage; its state for --json (``exit_code`` 3: it cannot run on this host)."""
    from pipeline.errors import StageUnavailable
    from pipeline.stages import build
    from pipeline.stages.execute import require_inputs
    from pipeline.stages.runner import run_stage

    stage = variant.stage("build")
    # markup=False: "[name]" would otherwise be eaten as a rich style tag.
    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    say(f"[{variant.name}] build -> {stage.output}")
    try:
        require_inputs(variant, stage, produced=set())
        result = run_stage(stage, lambda out: build.run(variant, stage, out), force=force, on_wait=say)
    except StageUnavailable as exc:
        say(f"[{variant.name}] build: {exc}")
        return {
            "name": variant.name,
            "state": "unavailable",
            "seconds": None,
            "message": str(exc),
            "exit_code": exc.exit_code,
        }
    say(
        f"[{variant.name}] build: {'up to date, skipped' if result.status == 'skipped' else 'done'}"
        f" ({result.seconds:.1f} s)"
    )
    return {"name": variant.name, "state": result.status, "seconds": result.seconds, "message": None, "exit_code": 0}
