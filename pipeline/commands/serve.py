"""`specdeploy serve [SPEC]`: serve a packaged variant, or every variant of the spec, with Triton.

With ``--variant`` (or a spec of one variant) the variant's repository ``triton_repo/<variant>/``;
without it, for a spec of several variants, the whole-spec repository ``triton_repo/<spec>/`` from
one server, each variant's ensemble named after the variant (``query --model <variant>``).

* target ``reference`` (CPU): the tritonserver from nvidia-pytriton with the reference
  ``tensorrtllm`` backend, in the foreground until Ctrl-C or SIGTERM;
* target ``pytorch``: ``trtllm-serve`` where it is installed on a GPU host; elsewhere its CPU
  stand-in, the reference backend behind the same OpenAI-compatible API;
* target ``tensorrt``: the mpirun command from ``pipeline.triton.launch_gpu`` (one tritonserver
  per rank; for a whole spec, one tritonserver in orchestrator mode whose backend spawns each
  variant's ranks on its gpu_device_ids); run on a GPU host, printed elsewhere (exit code 3: not
  runnable here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pipeline import targets
from pipeline.commands.common import DEFAULT_SPEC, add_spec_argument, load_plan
from pipeline.errors import InputError, StageError
from pipeline.targets import on_gpus

if TYPE_CHECKING:
    from rich.console import Console

if TYPE_CHECKING:
    from pipeline.plan.types import Plan, VariantPlan


def resolve_variant(plan: Plan, args: argparse.Namespace) -> VariantPlan:
    """The variant named by --variant, or the spec's only one (a spec of several is served whole)."""
    names = [variant.name for variant in plan.variants]
    if args.variant is None:
        return plan.variants[0]
    if args.variant not in names:
        raise InputError(f"{args.spec} has no variant '{args.variant}' (known: {', '.join(names)})")
    return plan.variants[names.index(args.variant)]


def with_overrides(variant: VariantPlan, args: argparse.Namespace) -> VariantPlan:
    """Command-line host/ports win over the spec's serving section."""
    update = {
        key: getattr(args, key)
        for key in ("host", "grpc_port", "http_port", "metrics_port")
        if getattr(args, key, None) is not None
    }
    ports = [update.get(k, getattr(variant.serving, k)) for k in ("grpc_port", "http_port", "metrics_port")]
    if len(set(ports)) != 3:
        raise InputError(f"grpc, http and metrics ports must differ (got {ports})")
    return dataclasses.replace(variant, serving=variant.serving.model_copy(update=update))


def package_dir(default: Path, what: str, rebuild: str, args: argparse.Namespace, console: Console) -> Path:
    """The repository to serve (``--repo`` or ``default``), validated, with its engines found on this
    host under ``--engines-dir`` (:mod:`pipeline.triton.relocate`); ``rebuild`` is the engine command."""
    from pipeline.triton.repository import stale_models, validate_repository

    repo = Path(args.repo) if getattr(args, "repo", None) else default
    if not repo.is_dir():
        raise InputError(f"{repo}: no Triton repository for {what}; build and package it first (`{rebuild}`)")
    validate_repository(repo)
    stale = stale_models(repo)
    if stale:
        console.print(
            f"[yellow]warning[/yellow]: {repo}: {', '.join(stale)} packaged by another specdeploy version; "
            f"re-package with `{rebuild} --force`",
            highlight=False,
        )
    from pipeline.triton.relocate import served_repository

    served = served_repository(repo, Path(args.engines_dir), Path(args.cache_dir) / "serving")
    if served != repo:
        console.print(
            f"{repo}: its engines are not where it names them (deploy.mount_path); serving {served}, "
            f"a copy naming the engines under {args.engines_dir}",
            highlight=False,
            markup=False,
        )
    return served


def variant_package_dir(plan: Plan, variant: VariantPlan, args: argparse.Namespace, console: Console) -> Path:
    """The variant's packaged repository, refused when another spec's build sits in its folder."""
    from pipeline.stages.owners import foreign_owner

    folder = variant.stage("package").output
    owner = None if getattr(args, "repo", None) else foreign_owner(folder, plan.spec_name)
    if owner is not None:
        raise InputError(
            f"{folder} belongs to spec {owner}: serving it would serve that spec's build, not "
            f"{plan.spec_name}'s; build this spec into other folders (--engines-dir, --triton-repo), serve from there"
        )
    rebuild = f"specdeploy engine {args.spec} --variant {variant.name}"
    return package_dir(folder, f"variant {variant.name}", rebuild, args, console)


def _stop_on_signals() -> None:
    """SIGTERM, and SIGINT even when inherited as ignored (a background job): an orderly stop."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def serve_cpu(
    variant: VariantPlan, repo: Path, args: argparse.Namespace, console: Console, models: tuple[str, ...] = ()
) -> int:
    """Serve ``repo`` with ``variant``'s serving settings; ``models``: the ensembles (default: the variant's)."""
    from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer

    s = variant.serving
    models = models or (s.model_name,)
    config = CpuServerConfig(
        repositories=(repo,),
        cache_dir=Path(args.cache_dir),
        host=s.host,
        http_port=s.http_port,
        http=s.http,
        http_max_request_bytes=s.http_max_request_bytes,
        grpc_port=s.grpc_port,
        metrics_port=s.metrics_port,
        ready_timeout=args.ready_timeout,
        models=models,
        backend_model=Path(args.backend_model) if args.backend_model else None,
        log_file=Path(args.log_file) if args.log_file else None,
    )
    server = CpuTritonServer(config)
    _stop_on_signals()
    what = f"{variant.name} ({variant.method})" if len(models) == 1 else f"{len(models)} variants"
    console.print(f"starting tritonserver for {what}, CPU reference backend; log: {server.log_file}", highlight=False)
    try:
        server.start()
        http = f"http {server.http_url} (bodies up to {s.http_max_request_bytes} bytes)" if s.http else "http off"
        console.print(
            f"[green]ready[/green]: model(s) {', '.join(repr(m) for m in models)} on grpc {server.grpc_url}, "
            f"{http}, "
            f"metrics {s.host}:{s.metrics_port}. Ctrl-C stops.",
            highlight=False,
        )
        console.print(
            f'try: specdeploy query "Hello" --url {server.grpc_url} --model {models[0]} --perf', highlight=False
        )
        while server.is_alive():
            time.sleep(0.5)
        raise StageError(f"{server.death()}; its log: {server.log_file}")
    except KeyboardInterrupt:
        console.print("stopping tritonserver")
        return 0
    finally:
        server.stop()


def _gpu_host() -> bool:
    try:
        from pipeline.trtllm.host import local_gpus
    except ImportError:
        import shutil

        return shutil.which("nvidia-smi") is not None
    return bool(local_gpus())


def serve_gpu(variant: VariantPlan, repo: Path, args: argparse.Namespace, console: Console) -> int:
    from pipeline.triton.launch_gpu import gpu_launch_argv

    argv = gpu_launch_argv(variant, repo.resolve(), world_size=variant.world_size)
    return run_gpu_command(argv, args, console, f"{variant.world_size} GPU(s), ranks = tp*pp")


def run_gpu_command(argv: list[str], args: argparse.Namespace, console: Console, needs: str) -> int:
    """Print (--print-command, or no GPU here: exit 3) or run the GPU server's command line."""
    command = shlex.join(argv)
    if args.print_command:
        print(command)
        return 0
    if not _gpu_host():
        console.print(f"[yellow]no GPU on this host[/yellow]: run this on the GPU host ({needs}):", highlight=False)
        print(command)
        return 3
    console.print(f"running: {command}", highlight=False)
    try:
        return subprocess.run(argv, check=False).returncode  # mpirun forwards Ctrl-C to the ranks
    except KeyboardInterrupt:
        return 130


def serve_spec(plan: Plan, args: argparse.Namespace, console: Console) -> int:
    """Every variant of the spec from one server: the whole-spec repository triton_repo/<spec>/."""
    from pipeline.fleet.placement import sharing_problem
    from pipeline.triton.launch_gpu import gpu_spec_launch_argv

    assert plan.repository is not None
    targets = sorted({variant.target for variant in plan.variants})
    if len(targets) > 1:
        raise InputError(
            f"{args.spec}: variants of targets {' and '.join(targets)} cannot share one server; "
            "serve them one at a time (--variant NAME)"
        )
    problem = sharing_problem(plan)
    if problem is not None:
        raise InputError(
            f"{args.spec}: the variants cannot share one server ({'; '.join(problem.splitlines())}); "
            "serve them one at a time (--variant NAME)"
        )
    first = with_overrides(plan.variants[0], args)  # the server's host and ports: the spec's serving section
    rebuild = f"specdeploy engine {args.spec}"
    if targets == ["reference"]:
        if args.print_command:
            raise InputError("--print-command is for target tensorrt (the GPU command)")
        repo = package_dir(plan.repository.output, f"spec {plan.spec_name}", rebuild, args, console)
        return serve_cpu(first, repo, args, console, models=tuple(v.name for v in plan.variants))
    if args.print_command:  # only a command line: the repository may be packaged later, on the GPU host
        repo = Path(args.repo) if args.repo else plan.repository.output
    else:
        repo = package_dir(plan.repository.output, f"spec {plan.spec_name}", rebuild, args, console)
    return run_gpu_command(gpu_spec_launch_argv(plan, first, repo.resolve()), args, console, "the variants' GPUs")


def serve_llm_api(variant: VariantPlan, args: argparse.Namespace, console: Console) -> int:
    """Target pytorch: ``trtllm-serve`` on a GPU host where it is installed (--print-command: the
    deployment's argv); elsewhere the CPU stand-in, the reference backend behind the same
    OpenAI-compatible API (:mod:`pipeline.llm_api.standin_server`)."""
    import shutil
    import tempfile

    from pipeline.llm_api.deployment import OPTIONS_FILE, SERVE_FILE, launch_argv, serve_argv

    if args.print_command:
        print(shlex.join(launch_argv(variant)))
        return 0
    checkpoint, package = variant.stage("checkpoint").output, variant.stage("package").output
    if not (package / OPTIONS_FILE).is_file() or not checkpoint.is_dir():
        raise InputError(
            f"{package}: variant {variant.name} is not built; build it first (`specdeploy engine {args.spec}`)"
        )
    s = variant.serving
    if shutil.which("trtllm-serve") and _gpu_host():
        model, options = PurePosixPath(checkpoint.resolve()), PurePosixPath(package.resolve() / OPTIONS_FILE)
        serve = json.loads((package / SERVE_FILE).read_text(encoding="utf-8"))
        if serve.get("fine_tunes"):
            return _serve_behind_front(variant, serve, model, options, console)
        return run_gpu_command(serve_argv(model, options, s.host, s.http_port), args, console, "the GPU(s)")
    import uvicorn

    from pipeline.llm_api.standin_runtime import load_standin
    from pipeline.llm_api.standin_server import make_app

    console.print(
        "trtllm-serve is not installed here: serving the CPU stand-in (the reference backend behind the same "
        "OpenAI-compatible API)",
        highlight=False,
    )
    with tempfile.TemporaryDirectory(prefix="standin-", dir=Path(args.cache_dir)) as scratch:
        runtime = load_standin(
            variant, Path(scratch), say=lambda line: console.print(line, highlight=False, markup=False)
        )
        names = ", ".join(runtime.adapters)
        console.print(
            f"[green]ready[/green]: {variant.name} ({runtime.method}) at http://{s.host}:{s.http_port}/v1, "
            f"models {names}. Ctrl-C stops.",
            highlight=False,
        )
        tune = next(iter(reversed(runtime.adapters)))
        console.print(
            f'try: specdeploy query "Hello" --url http://{s.host}:{s.http_port} --model {tune} --perf', highlight=False
        )
        try:
            uvicorn.run(make_app(runtime), host=s.host, port=s.http_port, log_level="warning")
        finally:
            runtime.stop()
    return 0


def _serve_behind_front(
    variant: VariantPlan, serve: dict, model: PurePosixPath, options: PurePosixPath, console: Console
) -> int:
    """A LoRA group on the GPU: trtllm-serve on a loopback port, and the name-routing front
    (:mod:`pipeline.llm_api.front`) where the variant listens, so a client picks a fine-tune by ``model``."""
    import socket
    import urllib.request

    import uvicorn

    from pipeline.llm_api.deployment import serve_argv
    from pipeline.llm_api.front import make_front

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = serve_argv(model, options, "127.0.0.1", port)
    console.print(f"running: {shlex.join(argv)}", highlight=False)
    server = subprocess.Popen(argv)
    upstream = f"http://127.0.0.1:{port}"
    try:
        while True:  # trtllm-serve loads the model for minutes: wait for its health, or its exit
            if server.poll() is not None:
                console.print(f"[red]trtllm-serve exited[/red] with code {server.returncode}", highlight=False)
                return server.returncode or 1
            try:
                with urllib.request.urlopen(upstream + serve.get("health", "/health"), timeout=5):
                    break
            except OSError:
                time.sleep(2)
        s = variant.serving
        names = ", ".join([variant.name, *serve["fine_tunes"]])
        console.print(f"[green]ready[/green]: http://{s.host}:{s.http_port}/v1, models {names}", highlight=False)
        uvicorn.run(make_front(serve, variant.name, upstream), host=s.host, port=s.http_port, log_level="warning")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        server.terminate()
        server.wait(timeout=60)


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    plan = load_plan(args)
    if args.variant is None and plan.repository is not None:
        return serve_spec(plan, args, console)
    variant = with_overrides(resolve_variant(plan, args), args)
    if not targets.definition(variant.target).builds_engines:
        return serve_llm_api(variant, args, console)
    if not on_gpus(variant.target):
        if args.print_command:
            raise InputError("--print-command is for target tensorrt (the GPU mpirun command)")
        return serve_cpu(variant, variant_package_dir(plan, variant, args, console), args, console)
    if args.print_command:  # only a command line: the repository may be packaged later, on the GPU host
        repo = Path(args.repo) if args.repo else variant.stage("package").output
        return serve_gpu(variant, repo, args, console)
    return serve_gpu(variant, variant_package_dir(plan, variant, args, console), args, console)


def add_variant_arguments(parser: argparse.ArgumentParser, spec_positional: bool = True) -> None:
    if spec_positional:
        add_spec_argument(parser)
    else:
        parser.add_argument("--spec", default=str(DEFAULT_SPEC), help="the spec whose repository to use")
    parser.add_argument("--variant", help="the variant to serve (default: every variant of the spec from one server)")


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    serve = commands.add_parser(
        "serve", help="serve a packaged variant, or all of a spec's, with Triton (CPU reference or GPU)"
    )
    add_variant_arguments(serve)
    serve.add_argument("--repo", help="the Triton repository (default: the variant's package output)")
    serve.add_argument("--host", help="address to bind (default: serving.host, 127.0.0.1)")
    serve.add_argument("--grpc-port", type=int, help="Triton's gRPC port (default: serving.grpc_port, 8001)")
    serve.add_argument(
        "--http-port", type=int, help="Triton's HTTP port, when serving.http is on (default: serving.http_port)"
    )
    serve.add_argument(
        "--metrics-port", type=int, help="Triton's Prometheus metrics port (default: serving.metrics_port)"
    )
    serve.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for READY")
    serve.add_argument("--log-file", help="server log (default: <cache>/tritonserver/logs/)")
    serve.add_argument("--print-command", action="store_true", help="GPU: print the mpirun command, do not run")
    serve.add_argument(
        "--backend-model",
        help="CPU: serve this Python file as the tensorrtllm backend instead of the reference backend (debugging)",
    )
    serve.set_defaults(handler=cmd_serve)
