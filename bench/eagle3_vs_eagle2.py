"""EAGLE-3 vs EAGLE-2 on SmolLM2 through the reference backend: heads/smollm2-eagle3 against heads/smollm2-eagle.

    .venv/bin/python bench/eagle3_vs_eagle2.py [--sets code chat] [--batch 1 4] [--prompts 10] [--new-tokens 64]
        [--eagle3 heads/smollm2-eagle3] [--eagle3-k 3] [--eagle2-top-k 4] [--equal-budget-eagle DIR]
        [--methods NAME ...] [--fine-tunes [code json ...]] [--fine-tune-drafter NAME=DIR ...] [--skip-base]
        [--dtype float32] [--out JSON]

In one process: builds the EAGLE and Lookahead SmolLM2 engines through the pipeline as
bench/speculative.py does (``specs/smollm2-{eagle,lookahead}.yaml``; up-to-date stages are skipped),
then for each prompt set (pipeline/data/prompts/{code,chat}_eval.jsonl, the held-out prompts every
heads bench uses) and each batch size decodes the same prompts greedily, interleaved group by group:

* ``plain``: plain decoding (on the Lookahead engine's weights, which hold no heads);
* ``eagle2``: the shipped EAGLE drafter (heads/smollm2-eagle) with EAGLE-2's dynamic tree (top_k
  ``--eagle2-top-k``), on the EAGLE engine;
* ``eagle[chain_K]``: the same drafter drafting a chain of K, the structure EAGLE-3 drafts here, so
  the two drafters' acceptance compare like for like;
* ``eagle3``: the EAGLE-3 drafter (ModelOpt's export, ``--eagle3``) with TensorRT-LLM's dynamic tree
  shaped as ``eagle2``'s (the same depth, top_k and node count, the same tree rule), and
  ``eagle3[chain_K]``: drafting a chain of K (the specs' default), both in the reference EAGLE-3 loop
  (pipeline/runtime/spec_decode/eagle3.py) on a view of the plain weights built without a speculative
  mode, as the PyTorch backend serves it;
* with ``--equal-budget-eagle DIR``: an EAGLE drafter trained on the same data as the EAGLE-3 one
  (``specdeploy train-heads --method eagle --tokens N --out DIR``), as ``eagle2=`` and ``eagle[chain_K]=``
  on an EAGLE engine of its own (spec copy under bench/out/specs).

Reports, per set and batch, the mean acceptance length (AL) and the speedup over plain decoding of the
same run (tokens per CPU-second; wall-clock in brackets), whether every output equals plain decoding's,
and each drafter's training budget from its manifest (training tokens, data generation and training
seconds on one thread). With ``--fine-tunes``, the base EAGLE-3 drafter also drafts, unchanged, for each
shipped LoRA fine-tune (adapters/smollm2-<name>) whose adapter is applied to the target only (merged
into its weights here: the same target TensorRT-LLM's per-request LoRA computes), on the fine-tune's
kind of prompts (code for smollm2-code, chat for the others), against plain decoding of the same
fine-tune; with ``--fine-tune-drafter NAME=DIR``, a drafter refreshed for that fine-tune
(``specdeploy train-heads --method eagle3 --adapter adapters/smollm2-<name> --init heads/smollm2-eagle3``)
drafts beside it as ``eagle3[chain_K]@DIR``. Writes bench/out/eagle3_vs_eagle2.json (``--out``). Not a
test: acceptance depends on the prompts, CPU time on the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.speculative import (
    OUT,
    Overrides,
    Tally,
    build,
    build_through_pipeline,
    compare_with_plain,
    load_prompts,
    run,
    same_as_plain,
)
from pipeline import trees
from pipeline.evaluation.candidates import engine_as
from pipeline.geometry import ModelGeometry
from pipeline.methods.eagle3 import Eagle3Config
from pipeline.methods.eagle3_reader import read_eagle3
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.spec.document import load_spec
from pipeline.trtllm.engine_config import predict_engine_config

EAGLE_HEADS = REPO / "heads" / "smollm2-eagle"
EAGLE3_HEADS = REPO / "heads" / "smollm2-eagle3"
FINE_TUNES = tuple(sorted(p.name.removeprefix("smollm2-") for p in (REPO / "adapters").glob("smollm2-*")))
END_ID = 2  # SmolLM2's <|im_end|>, as bench/speculative.py


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def budget(folder: Path) -> dict:
    """Training tokens and seconds (one thread) from a heads folder's manifest: the shipped EAGLE heads
    list their data shards (train_* ones train; eval is held out), refreshed heads and EAGLE-3 drafters
    one self-distilled set."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data, seconds = manifest["data"], manifest.get("seconds", {})
    if "shards" in data:
        train = {k: v for k, v in data["shards"].items() if k.startswith("train")}
        tokens = sum(v["tokens"] for v in train.values())
        sequences = sum(v["sequences"] for v in train.values())
        data_s = sum(v["seconds"] for v in train.values())
    else:
        tokens, sequences, data_s = data["tokens"], data["sequences"], seconds.get("data", 0.0)
    config = manifest.get("train_config", {})
    return {
        "folder": str(folder.relative_to(REPO)) if folder.is_relative_to(REPO) else folder.name,
        "method": manifest["method"],
        "tokens": tokens,
        "sequences": sequences,
        "epochs": config.get("epochs"),
        "data_s": round(data_s, 1),
        "train_s": seconds.get("train"),
        "command": manifest.get("command", ""),
    }


def describe_budget(b: dict) -> str:
    data = f"{b['data_s'] / 60:.0f} min" if b["data_s"] >= 10 else "reused from the cache"
    return (
        f"{b['folder']}: {b['tokens']} tokens ({b['sequences']} sequences), {b['epochs']} epochs; "
        f"data generation {data}, training {b['train_s'] / 60:.0f} min (one thread)"
    )


def eagle_engine(heads: Path, overrides: Overrides) -> Engine:
    """An EAGLE engine with ``heads`` instead of the shipped ones: a copy of specs/smollm2-eagle.yaml
    under bench/out/specs, built through the pipeline (its own engine folder)."""
    name = f"smollm2-eagle-{heads.name}{overrides.suffix('eagle')}"
    text = (REPO / "specs" / "smollm2-eagle.yaml").read_text()
    text = text.replace("name: smollm2-eagle\n", f"name: {name}\n").replace(
        "path: ../heads/smollm2-eagle\n", f"path: {heads.resolve()}\n"
    )
    text = text.replace("dtype: float32", f"dtype: {overrides.dtype}")
    spec = OUT / "specs" / f"{name}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    plan = make_plan(load_spec(spec), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache"))
    return Engine.load(build_through_pipeline(spec, plan.variants[0]))


def fine_tune_engine(name: str, plain_variant, dtype: str) -> Engine:
    """The plain engine's build with adapters/smollm2-<name> merged into the weights (bench/out/engines)."""
    from pipeline.checkpoint import convert_checkpoint
    from pipeline.checkpoint.merge import merge_adapters

    root = OUT / "engines" / f"finetune-{name}-{dtype}"
    engine_dir = root / "engine"
    if not (engine_dir / "config.json").exists():
        merged, checkpoint = root / "merged", root / "checkpoint"
        if not (merged / "config.json").exists():
            merged.mkdir(parents=True, exist_ok=True)
            for stale in merged.iterdir():
                stale.unlink()
            merge_adapters(plain_variant.model_dir, [REPO / "adapters" / f"smollm2-{name}"], merged)
        checkpoint.mkdir(parents=True, exist_ok=True)
        convert_checkpoint(merged, checkpoint, tp=1, pp=1, dtype=dtype)
        config = predict_engine_config(
            plain_variant, json.loads((checkpoint / "config.json").read_text()), output_dir=engine_dir
        )
        engine_dir.mkdir(parents=True, exist_ok=True)
        target = engine_dir / "rank0.safetensors"
        if not target.exists():
            target.hardlink_to(checkpoint / "rank0.safetensors")
        (engine_dir / "config.json").write_text(json.dumps(config, indent=2))
    return Engine.load(engine_dir)


def eagle3_method(
    plain_engine: Engine, folder: Path, k: int, model_dir: Path, tree: tuple[int, int] | None = None
) -> tuple[Engine, DecodingMethod]:
    """EAGLE-3 on a view of the plain weights built without a speculative mode (as the PyTorch backend):
    a chain of ``k``, or with ``tree`` = (top_k, nodes) TensorRT-LLM's dynamic tree ``k`` deep; the drafter
    read strictly for the target in ``model_dir`` first."""
    config = model_dir / "config.json"
    layout = read_eagle3(folder, ModelGeometry.from_hf(json.loads(config.read_text()), str(config)))
    chain = Eagle3Config(k, tuple(layout.capture_layers))
    if tree is not None:
        chain = dataclasses.replace(
            chain, use_dynamic_tree=True, dynamic_tree_max_top_k=tree[0], max_total_draft_tokens=tree[1]
        )
    view = engine_as(plain_engine, "none", chain.total_draft_tokens)
    return view, make_method(view, MethodSettings(eagle3=chain, eagle3_drafter=folder))[0]


def measure(
    methods: dict[str, tuple[Engine, DecodingMethod]], prompts: list[list[int]], batch: int, new_tokens: int
) -> dict[str, dict]:
    """Every method on the same prompts, interleaved by groups of ``batch``; rows with speedups over plain."""
    tallies = {name: Tally() for name in methods}
    for first in range(0, len(prompts), batch):
        for name, (engine, method) in methods.items():
            run(engine, method, prompts[first : first + batch], new_tokens, END_ID, tallies[name])
    plain = tallies["plain"]
    rows = {}
    for name, (engine, method) in methods.items():
        row = tallies[name].row(method)
        row.update(
            speedup_wall=row["tokens_per_s"] / (plain.tokens / plain.wall_s),
            speedup_cpu=row["tokens_per_cpu_s"] / (plain.tokens / plain.cpu_s),
            **compare_with_plain(engine, prompts, plain.outputs, tallies[name].outputs),
        )
        rows[name] = row
    return rows


def print_rows(title: str, rows: dict[str, dict]) -> None:
    for name, r in rows.items():
        print(
            f"{title} {name:22s} AL {r['mean_acceptance_length']:.2f}  x{r['speedup_cpu']:.2f} per CPU-s "
            f"[x{r['speedup_wall']:.2f} wall]  {r['tokens_per_cpu_s']:6.1f} tok/CPU-s  = plain: {same_as_plain(r)}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["code", "chat"], choices=["code", "chat"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 4], help="requests in flight")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set (the eval sets have 25)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--eagle3", type=Path, default=EAGLE3_HEADS, help="the EAGLE-3 drafter folder")
    parser.add_argument("--eagle3-k", type=int, default=3, help="EAGLE-3 chain length (the specs' default: 3)")
    parser.add_argument("--eagle2-top-k", type=int, default=4, help="EAGLE-2 expansion top_k (bench/speculative.py's)")
    parser.add_argument(
        "--equal-budget-eagle",
        type=Path,
        metavar="DIR",
        help="EAGLE heads trained on the EAGLE-3 drafter's data budget (train-heads --method eagle --tokens N)",
    )
    parser.add_argument(
        "--fine-tunes",
        nargs="*",
        choices=FINE_TUNES,
        help="also the base EAGLE-3 drafter on these fine-tunes (no names: all of them); default: none",
    )
    parser.add_argument(
        "--fine-tune-drafter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also this EAGLE-3 drafter (e.g. refreshed for the fine-tune) on fine-tune NAME (repeatable)",
    )
    parser.add_argument("--skip-base", action="store_true", help="only the fine-tunes (with --fine-tunes)")
    parser.add_argument(
        "--methods",
        nargs="+",
        help="only these of the base rows (and plain decoding), e.g. eagle2= 'eagle[chain_3]=' eagle3; default: all",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="engine dtype")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the backend default here: 1)")
    parser.add_argument("--out", type=Path, default=OUT / "eagle3_vs_eagle2.json", help="the JSON report to write")
    args = parser.parse_args()
    refreshed = {}
    for item in args.fine_tune_drafter:
        name, sep, folder = item.partition("=")
        if not sep or name not in FINE_TUNES:
            raise SystemExit(f"--fine-tune-drafter {item}: expected NAME=DIR with NAME one of {FINE_TUNES}")
        refreshed[name] = Path(folder).resolve()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    overrides = Overrides(dtype=args.dtype)
    k = args.eagle3_k
    chain = f"chain_{k}"
    trees.resolve_tree(chain)  # a preset for every K the bench uses
    eagle3_folder = args.eagle3.resolve()
    plain_built = build("lookahead", overrides)
    plain_engine = Engine.load(plain_built.engine_dir)
    model_dir = plain_built.variant.model_dir
    budgets = {"eagle3": budget(eagle3_folder), "eagle": budget(EAGLE_HEADS)}
    budgets.update({f"eagle3@{name}": budget(folder) for name, folder in refreshed.items()})
    methods: dict[str, tuple[Engine, DecodingMethod]] = {"plain": (plain_engine, PlainDecoding())}
    eagle2_tree = ""
    if not args.skip_base:
        eagle_built = build("eagle", overrides)
        if not eagle_built.heads.startswith("trained"):
            raise SystemExit(f"{EAGLE_HEADS} not found: the comparison needs the shipped EAGLE heads")
        eagle_engine_ = Engine.load(eagle_built.engine_dir)
        drafters = {"": eagle_engine_}
        if args.equal_budget_eagle is not None:
            drafters["="] = eagle_engine(args.equal_budget_eagle, overrides)
            budgets["eagle="] = budget(args.equal_budget_eagle.resolve())
        for mark, engine in drafters.items():
            dynamic = MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=args.eagle2_top_k)
            methods[f"eagle2{mark}"] = (engine, make_method(engine, dynamic)[0])
            fixed = MethodSettings("eagle", eagle_choices=trees.resolve_tree(chain))
            methods[f"eagle[{chain}]{mark}"] = (engine, make_method(engine, fixed)[0])
        methods[f"eagle3[{chain}]"] = eagle3_method(plain_engine, eagle3_folder, k, model_dir)
        # EAGLE-3's dynamic tree shaped as EAGLE-2's above: the same depth, top_k and node count.
        eagle2 = methods["eagle2"][1]
        tree = (args.eagle2_top_k, eagle2.max_draft_len)
        methods["eagle3"] = eagle3_method(plain_engine, eagle3_folder, eagle2.draft_positions, model_dir, tree)
        eagle2_tree = f"dynamic tree, top_k {tree[0]}, {eagle2.draft_positions} deep, at most {tree[1]} nodes"
    if args.methods:
        unknown = set(args.methods) - set(methods)
        if unknown:
            raise SystemExit(f"--methods: unknown {sorted(unknown)}; this run has {sorted(methods)}")
        methods = {name: m for name, m in methods.items() if name == "plain" or name in args.methods}
    results: dict = {
        "settings": {**vars(args), "eagle3": str(args.eagle3), "equal_budget_eagle": str(args.equal_budget_eagle)},
        "budgets": budgets,
        "methods": {
            "plain": "PlainDecoding",
            "eagle2": f"{EAGLE_HEADS.relative_to(REPO)}, EAGLE-2 {eagle2_tree}",
            f"eagle[{chain}]": f"{EAGLE_HEADS.relative_to(REPO)}, eagle_choices {chain}",
            "eagle3": f"{budgets['eagle3']['folder']}, EAGLE-3 {eagle2_tree}",
            f"eagle3[{chain}]": f"{budgets['eagle3']['folder']}, a chain of {k} (reference EAGLE-3 loop)",
            "=": "suffix: the EAGLE heads trained on the EAGLE-3 drafter's data budget",
        },
        "runs": [],
        "fine_tunes": [],
    }
    for b in budgets.values():
        print(f"budget {describe_budget(b)}", flush=True)
    for engine, method in methods.values():  # warm-up: first-call allocations, thread pools
        run(engine, method, [[1, 2, 3, 4]], 4, -1, Tally())
    for kind in args.sets if not args.skip_base else []:
        prompts, source = load_prompts(kind, args.prompts, model_dir)
        results.setdefault("prompt_sets", {})[kind] = source
        for batch in args.batch:
            rows = measure(methods, prompts, batch, args.new_tokens)
            print_rows(f"{kind:4s} batch {batch}", rows)
            results["runs"] += [{"set": kind, "batch": batch, "method": n, **r} for n, r in rows.items()]
            write(results, args.out)
    for name in FINE_TUNES if args.fine_tunes == [] else args.fine_tunes or []:
        engine = fine_tune_engine(name, plain_built.variant, args.dtype)
        tuned = {
            "plain": (engine, PlainDecoding()),
            f"eagle3[{chain}]": eagle3_method(engine, eagle3_folder, k, model_dir),
        }
        if name in refreshed:
            tuned[f"eagle3[{chain}]@{refreshed[name].name}"] = eagle3_method(engine, refreshed[name], k, model_dir)
        for e, m in tuned.values():
            run(e, m, [[1, 2, 3, 4]], 4, -1, Tally())
        kind = "code" if name == "code" else "chat"
        prompts, source = load_prompts(kind, args.prompts, model_dir)
        for batch in args.batch:
            rows = measure(tuned, prompts, batch, args.new_tokens)
            print_rows(f"{name:8s} ({kind}) batch {batch}", rows)
            results["fine_tunes"] += [
                {"fine_tune": name, "set": kind, "batch": batch, "method": n, **r} for n, r in rows.items()
            ]
            write(results, args.out)
    results["seconds"] = round(time.monotonic() - start, 1)
    write(results, args.out)
    print(f"wrote {args.out} in {results['seconds']:.0f} s")
    return 0


def write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
