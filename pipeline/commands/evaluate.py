"""`specdeploy evaluate SPEC [--variant V] [--force] [--junit-xml PATH] [--json]`: the evaluate stage alone
(and the stages before it).

Works on any spec: a variant without an ``evaluation:`` section is evaluated with the defaults
(the repository's held-out chat and code prompts, 32 prompts x 64 tokens). Prints one line per
candidate: mean acceptance length, CPU step cost and speedup, predicted GPU speedup per batch size.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.console import Table


def register(commands: argparse._SubParsersAction) -> None:
    from pipeline.commands.common import add_ci_options, add_json_flag, add_spec_argument, add_variant_filter

    parser = commands.add_parser(
        "evaluate",
        help="measure every candidate method on the variant's prompts",
        epilog="exit 6: a release gate failed (release.on_fail: fail), one line per variant after every variant "
        "was processed; 4/5: the filesystem refused / the disk is full; all codes: specdeploy --help",
    )
    add_spec_argument(parser, required=True)
    add_variant_filter(parser)
    parser.add_argument("--force", action="store_true", help="re-run even if the evaluation is up to date")
    add_ci_options(parser)
    add_json_flag(
        parser,
        '{"command", "spec", "spec_file", "exit_code", "variants": [{"name", "method", "exit_code", "stopped_at", '
        '"stages": [{"stage", "state", "seconds", "message"}], "evaluation": {"chosen", "reason", "release_failed", '
        '"gates", "candidates": [...], "reports": [...], ...}}]}',
    )
    parser.set_defaults(handler=cmd_evaluate)


def with_default_evaluation(spec):
    """The spec with ``evaluation: {}`` (the defaults) for every variant that has no evaluation section."""
    import dataclasses

    from pipeline.spec.document import EvaluationSpec

    variants = tuple(
        v if v.evaluation is not None else v.model_copy(update={"evaluation": EvaluationSpec()}) for v in spec.variants
    )
    return dataclasses.replace(spec, variants=variants)


def cmd_evaluate(args: argparse.Namespace, console: Console) -> int:
    from pipeline.commands.common import run_reporting_errors

    return run_reporting_errors("evaluate", args, lambda: _evaluate(args, console))


def _evaluate(args: argparse.Namespace, console: Console) -> int:
    from pipeline.commands.common import output_roots, report_run, spec_path
    from pipeline.errors import InputError, StageUnavailable
    from pipeline.evaluation.result import GATE_FAILED, RELEASE_EXIT_CODE, read_result
    from pipeline.plan.planner import make_plan
    from pipeline.release.ci.records import UNAVAILABLE, RunRecord, StageRecord, variant_record
    from pipeline.spec.document import load_spec
    from pipeline.stages.execute import stage_body
    from pipeline.stages.runner import run_stage

    plan = make_plan(with_default_evaluation(load_spec(spec_path(args.spec))), output_roots(args))
    only = set(args.variant or ())
    unknown = only - {v.name for v in plan.variants}
    if unknown:
        raise InputError(
            f"{args.spec}: no variant {', '.join(sorted(unknown))} (variants: "
            f"{', '.join(v.name for v in plan.variants)})"
        )
    from pipeline.stages.owners import claim_outputs

    claim_outputs(plan, only)  # another spec's folders are refused before anything is written
    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    code, failures, records = 0, [], []
    for variant in plan.variants:
        if only and variant.name not in only:
            continue
        if variant.builtin and variant.model_dir is not None:
            from pipeline.embedded import prepare_embedded_model

            prepare_embedded_model(variant.model_dir.parent)
        names = [stage.name for stage in variant.stages]
        done: list[StageRecord] = []
        stopped: StageRecord | None = None
        variant_code = 0
        for stage in variant.stages[: names.index("evaluate") + 1]:
            body = stage_body(stage.name)
            try:
                result = run_stage(
                    stage,
                    functools.partial(body, variant, stage),
                    force=args.force and stage.name == "evaluate",
                    on_wait=say,
                )
            except StageUnavailable as exc:
                say(f"[{variant.name}] {stage.name}: {exc}")
                stopped, variant_code = StageRecord(stage.name, UNAVAILABLE, None, str(exc)), exc.exit_code
                code = max(code, exc.exit_code)
                break
            say(f"[{variant.name}] {stage.name}: {result.status} ({result.seconds:.1f} s)")
            done.append(StageRecord(stage.name, result.status, result.seconds))
        else:
            evaluation = read_result(variant.stage("evaluate").output)
            assert evaluation is not None  # the stage just wrote it (or found it up to date)
            console.print(summary_table(evaluation))
            console.print(
                f"[{variant.name}] choice: {evaluation['choice']['candidate']}: {evaluation['choice']['reason']}",
                highlight=False,
                markup=False,
            )
            if evaluation["choice"].get("failed"):
                failures.append(f"{variant.name}: release gate failed: {evaluation['choice']['failed']}")
                stopped = StageRecord("evaluate", GATE_FAILED, None, evaluation["choice"]["failed"])
                variant_code = RELEASE_EXIT_CODE
        records.append(variant_record(variant, done, stopped_by=stopped, exit_code=variant_code, last="evaluate"))
    for failure in failures:  # after every variant, so a release pipeline sees them all at once
        print(f"error: {failure}", file=sys.stderr)
    code = max(code, RELEASE_EXIT_CODE if failures else 0)
    report_run(RunRecord("evaluate", plan.spec_name, str(plan.spec_file), tuple(records), code), args)
    return code


def summary_table(evaluation: dict) -> Table:
    from rich.markup import escape

    from pipeline.console import Table
    from pipeline.evaluation.choose import interval_text

    batches = evaluation["settings"]["batch_sizes"]
    gpu = evaluation["gpu"]
    table = Table(
        title=f"{escape(evaluation['variant'])}: {evaluation['prompts']['count']} prompts, predicted on "
        f"{gpu['type']}{' (assumed)' if gpu['assumed'] else ''}",
        title_justify="left",
        # short lines: a console that is not a terminal soft-wraps, so a long caption would be one long line
        caption=f"GPU bN: {gpu.get('runtime', 'trtllm')} profile, point (interval)",
        caption_justify="left",
    )
    for column in (
        "candidate",
        "AL",
        "rows/step",
        "CPU step",
        "CPU speedup",
        "= plain",
        *[f"GPU b{b}" for b in batches],
    ):
        table.add_column(column)
    for c in evaluation["candidates"]:
        ident = c["identity"]
        same = (
            "yes"
            if ident["identical"] == ident["prompts"]
            else (f"{ident['identical']}/{ident['prompts']}" + ("" if ident["lossless"] else " NOT LOSSLESS"))
        )
        table.add_row(
            escape(c["name"]),  # "eagle[cpu_small_10_depth_3]" is not a style
            f"{c['mean_acceptance_length']:.2f}",
            f"{c['rows_per_step']:.1f}",
            f"{c['cpu_step_cost']:.2f}",
            f"{c['cpu_speedup']:.2f}x",
            same,
            *[interval_text(c, b) for b in batches],
        )
    return table
