r"""`specdeploy train-heads` and `specdeploy expand-heads` (speculative-decoding heads).

    specdeploy train-heads --method medusa --out heads/smollm2-medusa [--model DIR] [--seed 0]
    specdeploy train-heads --method eagle  --out heads/smollm2-eagle
    specdeploy train-heads --method eagle3 --tokens 60000 --epochs 2 --draft-vocab 2048 --out heads/smollm2-eagle3
    specdeploy expand-heads heads/smollm2-medusa --out DIR [--model DIR]

``--model`` defaults to the embedded SmolLM2 (prepared in ``--cache-dir``). The self-distillation
data is cached in ``<cache>/heads-data/`` (a refresh's too, keyed by the target's files and the data
settings); a rerun only trains.

With ``--init``, ``--data``, ``--tokens`` or ``--adapter`` the heads are trained for the target as the
spec's train-heads stage does (:mod:`pipeline.heads.refresh`; ``--method eagle3`` always: ModelOpt trains
the drafter, :mod:`pipeline.heads.eagle3`): ``--adapter`` (repeatable) merges PEFT
LoRA adapters into ``--model`` first, so a fine-tune's heads are refreshed by one command:

    specdeploy train-heads --threads 1 --method eagle --adapter adapters/smollm2-code --init heads/smollm2-eagle \
        --data self-distill --tokens 40000 --epochs 3 --seed 0 --out heads/smollm2-code-eagle
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from pipeline.commands.common import add_json_flag, print_json


def _base_dir(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    from pipeline.embedded import prepare_embedded_model

    return prepare_embedded_model(Path(args.cache_dir))


def _heads_folder(path: Path) -> bool:
    """A heads folder specdeploy wrote (train-heads: its manifest; expand-heads: expanded_from)."""
    from pipeline.heads.export import MANIFEST
    from pipeline.io.atomic import json_of

    return (path / MANIFEST).is_file() or "expanded_from" in (json_of(path / "config.json") or {})


def cmd_train_heads(args: argparse.Namespace, console) -> int:
    from pipeline.io.atomic import check_replaceable

    check_replaceable(Path(args.out), "--out", _heads_folder)  # before anything is trained
    if args.report:
        from pipeline.io.atomic import json_of

        check_replaceable(Path(args.report), "--report", lambda p: isinstance(json_of(p), dict), folder=False)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from pipeline.heads.train import train_heads

    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    command = "specdeploy " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    # EAGLE-3 drafters train only as the train-heads stage does (no shipped drafter to evaluate offline).
    refresh = args.init or args.data or args.tokens or args.adapter or args.lr or args.device != "cpu"
    if args.draft_vocab is not None and args.method != "eagle3":
        from pipeline.errors import InputError

        raise InputError("--draft-vocab sizes an EAGLE-3 drafter's vocabulary; use it with --method eagle3")
    if refresh or args.method == "eagle3":
        return _refresh(args, say, command if "train-heads" in command else "")
    train_heads(
        args.method,
        _base_dir(args),
        Path(args.out),
        Path(args.cache_dir),
        seed=args.seed,
        epochs=args.epochs,
        report=Path(args.report) if args.report else None,
        command=command if "train-heads" in command else "",
        say=say,
    )
    return 0


def _refresh(args: argparse.Namespace, say, command: str) -> int:
    import tempfile

    from pipeline.heads.refresh import RefreshSettings, refresh_heads
    from pipeline.io.atomic import replace_folder

    settings = RefreshSettings(
        method=args.method,
        init=Path(args.init) if args.init else None,
        data=args.data or RefreshSettings.data,
        tokens=args.tokens or RefreshSettings.tokens,
        epochs=args.epochs or RefreshSettings.epochs,
        device=args.device,
        seed=args.seed,
        lr=args.lr,
        draft_vocab=args.draft_vocab,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.tmp-", dir=out.parent) as work:
        target = _base_dir(args)
        if args.adapter:
            from pipeline.checkpoint.merge import merge_adapters

            merged = Path(work) / "merged"
            merged.mkdir()
            merge_adapters(target, [Path(a) for a in args.adapter], merged)  # copies the tokenizer too
            target = merged
        heads = Path(work) / out.name  # the folder's name is the heads' name in their README
        refresh_heads(target, heads, settings, say, command=command, cache=Path(args.cache_dir) / "heads-data")
        replace_folder(heads, out)  # complete folders only
    say(f"{args.method} heads written to {out}")
    return 0


def cmd_expand_heads(args: argparse.Namespace, console) -> int:
    from pipeline.heads.expand import expand_medusa
    from pipeline.io.atomic import check_replaceable

    check_replaceable(Path(args.out), "--out", _heads_folder)

    out = expand_medusa(Path(args.heads), _base_dir(args), Path(args.out), dtype=args.dtype)
    if args.json:
        print_json({"heads_dir": str(out)})
        return 0
    console.print(f"FasterDecoding Medusa heads written to {out}", highlight=False)
    return 0


def trainable_methods() -> tuple[str, ...]:
    """The methods whose heads train-heads trains (``HeadsNeed.trainable``)."""
    from pipeline import methods

    return tuple(d.name for d in methods.with_heads() if d.heads is not None and d.heads.trainable)


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommands; handlers take (args, console) and return an exit code."""
    train = commands.add_parser(
        "train-heads", help="train Medusa or EAGLE-1 heads, or an EAGLE-3 drafter (ModelOpt), by self-distillation"
    )
    train.add_argument(
        "--method", choices=trainable_methods(), required=True, help="the heads to train (eagle3: an EAGLE-3 drafter)"
    )
    train.add_argument("--model", help="base HF model folder (default: the embedded SmolLM2)")
    train.add_argument("--out", required=True, help="head folder to write (e.g. heads/smollm2-medusa)")
    train.add_argument(
        "--seed", type=int, default=0, help="the random seed of the heads' initialisation and data order"
    )
    train.add_argument("--epochs", type=int, help="override the method's default number of epochs")
    train.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: reproducible, and fastest on a shared 2-core CPU)",
    )
    train.add_argument("--report", help="merge the evaluation into this JSON file (e.g. bench/heads.json)")
    train.add_argument(
        "--init", help="warm-start from these heads or drafter (e.g. heads/smollm2-eagle); default: random"
    )
    train.add_argument(
        "--data",
        help="self-distill (default), fixed-text (stdlib source, teacher-forced) or a text/JSONL file",
    )
    train.add_argument("--tokens", type=int, help="training tokens at most (default 200000)")
    train.add_argument("--adapter", action="append", help="PEFT LoRA folder merged into --model first (repeatable)")
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the target and heads run")
    train.add_argument("--lr", type=float, help="learning rate (default: the method's, halved for a warm start)")
    train.add_argument(
        "--draft-vocab",
        type=int,
        help="eagle3: the drafter's vocabulary, the data's most frequent ids (default 8192; fewer: a smaller folder)",
    )
    train.set_defaults(handler=cmd_train_heads)

    expand = commands.add_parser("expand-heads", help="write the FasterDecoding folder for shipped Medusa ResBlocks")
    expand.add_argument("heads", help="shipped folder, e.g. heads/smollm2-medusa")
    expand.add_argument("--out", required=True, help="the folder to write the FasterDecoding layout into")
    expand.add_argument("--model", help="base HF model folder (default: the embedded SmolLM2)")
    expand.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="cast all tensors (default: keep stored dtypes, exact)",
    )
    add_json_flag(expand, '{"heads_dir": "<the FasterDecoding folder written>"}')
    expand.set_defaults(handler=cmd_expand_heads)
