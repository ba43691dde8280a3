"""`specdeploy plan [SPEC] [--json]`: each variant resolved into method, build config and stages.

``--json`` adds, per variant, the exact trtllm-build and GPU launch argv the plan implies.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from pipeline.commands.common import add_json_flag, add_spec_argument, load_plan, print_json
from pipeline.plan import Plan


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    plan = load_plan(args)
    if args.json:
        print_json(plan_with_commands(plan))
        return 0
    from pipeline.report import print_plan

    print_plan(plan, console)
    return 0


def plan_with_commands(plan: Plan) -> dict:
    """The plan plus, per variant, the exact trtllm-build and GPU launch argv it implies."""
    from pipeline.triton.launch_gpu import gpu_launch_argv
    from pipeline.trtllm.build_command import trtllm_build_argv

    body = json.loads(plan.to_json())
    for data, variant in zip(body["variants"], plan.variants):
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
    add_json_flag(
        plan,
        'the plan: {"spec", "name", "repository", "variants": [{"name", "speculative", "build", "stages", ..., '
        '"commands": {"trtllm_build", "gpu_launch"}}]}',
    )
    plan.set_defaults(handler=cmd_plan)
