"""`specdeploy plan [SPEC] [--json]`: each variant resolved into method, build config and stages.

``--json`` adds, per variant, the exact trtllm-build and GPU launch argv the plan implies.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, add_spec_argument, add_variant_filter, load_plan, print_json

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.plan.types import Plan


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from pipeline.errors import InputError

    plan = load_plan(args)
    unknown = set(args.variant or ()) - {v.name for v in plan.variants}
    if unknown:
        raise InputError(
            f"--variant {', '.join(sorted(unknown))}: not in {plan.spec_file} "
            f"(variants: {', '.join(v.name for v in plan.variants)})"
        )
    if args.json:
        print_json(plan_with_commands(plan))
        return 0
    from pipeline.release.report import print_plan

    print_plan(plan, console, details=args.details, only=frozenset(args.variant or ()))
    return 0


def plan_with_commands(plan: Plan) -> dict:
    """The plan plus, per variant, the exact trtllm-build and GPU launch argv it implies (trtllm-serve's on
    the PyTorch backend)."""
    from pipeline import targets
    from pipeline.llm_api.deployment import launch_argv
    from pipeline.triton.launch_gpu import gpu_launch_argv
    from pipeline.trtllm.build_command import trtllm_build_argv

    body = json.loads(plan.to_json())
    for data, variant in zip(body["variants"], plan.variants):
        if not targets.definition(variant.target).builds_engines:
            data["commands"] = {"trtllm_serve": launch_argv(variant)}
            continue
        data["commands"] = {
            "trtllm_build": trtllm_build_argv(
                variant, variant.stage("convert").output, variant.stage("build").output, visible_gpus=None
            ),
            "gpu_launch": gpu_launch_argv(variant, variant.stage("package").output, world_size=variant.world_size),
        }
    return body


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    plan = commands.add_parser("plan", help="resolve each variant into method, build config and stages")
    add_spec_argument(plan)
    add_variant_filter(plan)
    plan.add_argument(
        "--details",
        action="store_true",
        help="every variant's whole table (build, memory, stages, notes); a spec of more than three variants "
        "otherwise gets one row each after the answer",
    )
    add_json_flag(
        plan,
        'the plan: {"spec", "name", "repository", "variants": [{"name", "speculative", "build", "stages", ..., '
        '"commands": {"trtllm_build", "gpu_launch"}}]}',
    )
    plan.set_defaults(handler=cmd_plan)
