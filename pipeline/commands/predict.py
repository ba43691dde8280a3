"""`specdeploy predict`: predicted step costs and speedup of a method on a GPU type, without weights.

    specdeploy predict --preset llama-3.1-8b --gpu l40s --method eagle --tree mc_sim_7b_63 \\
        --acceptance-length 2.5 --batch 1 8 32 [--tp 2] [--dtype fp8] [--context-len 1024] \\
        [--runtime trtllm|pytorch-eager] [--json]
    specdeploy predict --preset llama-3.1-8b --gpu l40s --method none --lora-rank 16 \\
        --lora-modules q_proj,v_proj --lora-adapters 4 --batch 8

With ``--lora-rank``, the step is the shared LoRA engine's: its LoRA GEMMs and adapter mixing are
parts of the step (pipeline/costmodel/lora.py) and the speedup is over plain decoding without LoRA
(below 1.0x: what serving the fine-tune unmerged costs). TensorRT-LLM 1.2.1 builds LoRA engines
without speculative heads, so only ``--method none`` takes it.

Each speedup comes with the interval its method's held-out error puts around it (the runtime
profile's error band, pipeline/costmodel/profile.py). The formulas and GPU figures are in
pipeline/costmodel/ (step.py, hardware.py, profile.py).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline import trees
from pipeline.commands.common import add_json_flag, print_json
from pipeline.costmodel.profile import DEFAULT_RUNTIME, RUNTIMES, calibration
from pipeline.errors import InputError
from pipeline.spec import gpus, presets

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_LOOKAHEAD = "4,3,4"  # the spec's defaults for (W, N, G)
DEFAULT_TREE = "mc_sim_7b_63"  # TensorRT-LLM's default medusa_choices / eagle_choices


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("predict", help="predicted GPU step cost and speedup of a method (no weights)")
    parser.add_argument("--preset", required=True, choices=sorted(presets.PRESETS), help="architecture preset")
    parser.add_argument("--gpu", required=True, choices=sorted(gpus.GPU_TYPES), help="GPU type")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "fp8"], help="weights (and KV cache)")
    parser.add_argument(
        "--method",
        required=True,
        choices=["medusa", "eagle", "eagle3", "lookahead", "ngram", "none"],
        help="the speculative method (eagle3: a chain of --max-draft-len drafts, default 3)",
    )
    parser.add_argument("--tree", help=f"draft tree preset for medusa/eagle (default {DEFAULT_TREE})")
    parser.add_argument("--medusa-heads", type=int, help="Medusa heads (default: the tree depth)")
    parser.add_argument(
        "--eagle-dynamic-top-k", type=int, help="EAGLE-2 (with --method eagle3: EAGLE-3) dynamic tree of this top_k"
    )
    parser.add_argument(
        "--max-total-draft-tokens", type=int, help="EAGLE-3 dynamic tree: nodes verified (default top_k x K)"
    )
    parser.add_argument("--eagle-layers", type=int, default=4, help="EAGLE-2 tree depth (default 4)")
    parser.add_argument(
        "--max-draft-len",
        type=int,
        help="EAGLE-2 nodes verified (default top_k x layers); NGram's K (default 4); EAGLE-3's chain (default 3)",
    )
    parser.add_argument("--lookahead", metavar="W,N,G", help=f"Lookahead (W, N, G) (default {DEFAULT_LOOKAHEAD})")
    parser.add_argument(
        "--acceptance-length",
        type=float,
        default=1.0,
        help="mean acceptance length: tokens per step per request (1 for --method none)",
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32], help="batch sizes (requests in flight)")
    parser.add_argument("--context-len", type=int, default=1024, help="cached tokens per request")
    parser.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        choices=RUNTIMES,
        help="the runtime profile: trtllm (TensorRT-LLM engines, what specdeploy deploys) or pytorch-eager "
        "(the papers' and Spec-Bench's reference code, evaluation.device cuda)",
    )
    parser.add_argument("--lora-rank", type=int, help="price the LoRA plugin's work at this adapter rank")
    parser.add_argument(
        "--lora-modules",
        default="q_proj,v_proj",
        help="LoRA target modules, comma-separated PEFT names (default q_proj,v_proj)",
    )
    parser.add_argument("--lora-adapters", type=int, default=1, help="distinct adapters mixed in one step (default 1)")
    add_json_flag(
        parser,
        '{"runtime", "speedup": {"<batch>": x}, "interval": {"<batch>": {...}}, "error_band": {...}, '
        '"step_cost": {"<batch>": {...}}, "rows_per_step", "lora": null | {"rank", "modules", "adapters"}}',
    )
    parser.set_defaults(handler=cmd_predict)


def drafting_from_args(args: argparse.Namespace):
    from pipeline.methods.drafting import Drafting
    from pipeline.methods.eagle3 import tree_problem
    from pipeline.methods.lookahead import LookaheadConfig, lookahead_problem

    if args.method == "none":
        return Drafting.plain()
    if args.method in ("ngram", "eagle3"):
        k = args.max_draft_len or (4 if args.method == "ngram" else 3)
        if k < 1:
            raise InputError("--max-draft-len must be >= 1")
        if args.method == "ngram":
            return Drafting.ngram(k)
        top_k, nodes = args.eagle_dynamic_top_k, args.max_total_draft_tokens
        if top_k is None and nodes is None:
            return Drafting.eagle3(k)
        problem = tree_problem(k, top_k, nodes)
        if problem:
            raise InputError(f"--eagle-dynamic-top-k / --max-total-draft-tokens: {problem}")
        assert top_k is not None  # tree_problem requires it
        return Drafting.eagle3_dynamic(top_k, k, nodes or top_k * k)
    if args.method == "lookahead":
        text = args.lookahead or DEFAULT_LOOKAHEAD
        try:
            w, n, g = (int(v) for v in text.split(","))
        except ValueError:
            raise InputError(f"--lookahead {text!r}: give W,N,G as three integers, e.g. 4,3,4") from None
        problem = lookahead_problem(w, n, g)
        if problem:
            raise InputError(f"--lookahead {text}: {problem}")
        return Drafting.lookahead(LookaheadConfig(w, n, g))
    if args.method == "eagle" and args.eagle_dynamic_top_k:
        if args.tree:
            raise InputError("--tree and --eagle-dynamic-top-k are mutually exclusive (EAGLE-2 builds its own tree)")
        k, layers = args.eagle_dynamic_top_k, args.eagle_layers
        if k < 1 or layers < 1:
            raise InputError("--eagle-dynamic-top-k and --eagle-layers must be >= 1")
        return Drafting.eagle_dynamic(k, layers, args.max_draft_len or k * layers)
    try:
        tree = trees.resolve_tree(args.tree or DEFAULT_TREE)
    except ValueError as exc:
        raise InputError(f"--tree: {exc}") from None
    if args.method == "medusa":
        if args.medusa_heads is not None and args.medusa_heads < trees.tree_depth(tree):
            raise InputError(f"--medusa-heads {args.medusa_heads} is less than the tree depth {trees.tree_depth(tree)}")
        return Drafting.medusa(tree, args.medusa_heads)
    return Drafting.eagle(tree)


def lora_from_args(args: argparse.Namespace):
    """The LoRA work of a step from --lora-*, or None without --lora-rank."""
    from pipeline.costmodel.lora import LoraLoad

    if args.lora_rank is None:
        if args.lora_adapters != 1:
            raise InputError("--lora-adapters needs --lora-rank (the adapters' rank)")
        return None
    if args.method != "none":
        raise InputError(
            f"--lora-rank with --method {args.method}: TensorRT-LLM 1.2.1 builds LoRA engines without "
            "speculative heads; use --method none (a merged fine-tune is priced without --lora-rank)"
        )
    modules = tuple(m.strip() for m in args.lora_modules.split(",") if m.strip())
    try:
        return LoraLoad(args.lora_rank, modules, args.lora_adapters)
    except ValueError as exc:
        raise InputError(f"--lora-*: {exc}") from None


def cmd_predict(args: argparse.Namespace, console: Console) -> int:
    from pipeline.console import Table
    from pipeline.costmodel.hardware import gpu_perf
    from pipeline.costmodel.predict import predict
    from pipeline.costmodel.step import Deployment

    arch = presets.preset(args.preset)
    gpu = gpus.gpu_type(args.gpu)
    if args.dtype == "fp8" and not gpu.supports_fp8:
        raise InputError(
            f"--dtype fp8 needs FP8 tensor cores (compute capability >= 8.9); {gpu.name} is "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
        )
    if args.tp < 1 or args.pp < 1 or args.context_len < 0:
        raise InputError("--tp and --pp must be >= 1 and --context-len >= 0")
    calibrated = calibration(args.runtime)
    deployment = Deployment(
        arch,
        gpu_perf(args.gpu),
        dtype=args.dtype,
        kv_dtype=args.dtype,
        tp=args.tp,
        pp=args.pp,
        context_len=args.context_len,
        profile=calibrated.profile,
    )
    drafting = drafting_from_args(args)
    lora = lora_from_args(args)
    try:
        rows = predict(deployment, drafting, args.acceptance_length, args.batch, lora=lora)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    band = calibrated.band(drafting.method)
    intervals = {p.batch: band.interval(p.speedup) for p in rows}
    if args.json:
        print_json(
            {
                "runtime": args.runtime,
                "speedup": {str(p.batch): p.speedup for p in rows},
                "interval": {str(b): i.to_dict() for b, i in intervals.items()},
                "error_band": {
                    "low_error": band.low_error,
                    "high_error": band.high_error,
                    "residuals": band.residuals,
                    "borrowed_from": band.borrowed_from,
                },
                "step_cost": {str(p.batch): p.to_dict() for p in rows},
                "rows_per_step": drafting.rows,
                "lora": None
                if lora is None
                else {"rank": lora.rank, "modules": list(lora.modules), "adapters": lora.adapters},
            }
        )
        return 0
    table = Table(
        title=f"{args.method} on {args.preset}, {args.gpu} x tp{args.tp} pp{args.pp}, {args.dtype}, "
        f"AL {args.acceptance_length}, {drafting.rows} rows/step, context {args.context_len}, {args.runtime}"
        + ("" if lora is None else f", LoRA rank {lora.rank} on {','.join(lora.modules)} x {lora.adapters} adapters"),
        title_justify="left",
    )
    for column in ("batch", "plain step ms", "method step ms", "speedup (interval)", "method step parts (ms)"):
        table.add_column(column)
    for p in rows:
        parts = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in p.parts.items())
        table.add_row(
            str(p.batch), f"{p.plain_s * 1e3:.2f}", f"{p.method_s * 1e3:.2f}", intervals[p.batch].text(), parts
        )
    console.print(table)
    if drafting.method != "none":
        console.print(error_note(args.runtime, band, calibrated.source))
    return 0


def error_note(runtime: str, band, source: str) -> str:
    """One line: where the interval comes from, and how far it can be trusted."""
    borrowed = f", borrowed from {band.borrowed_from}" if band.borrowed_from else ""
    return (
        f"interval: the 10th-90th percentile of {band.residuals} held-out errors "
        f"({band.low_error:+.0%} .. {band.high_error:+.0%}{borrowed}); {runtime} profile {source}"
    )
