"""`specdeploy train-adapter`: a LoRA fine-tune of a base model with PEFT on CPU.

    specdeploy train-adapter --task code --out my-code-adapter --last-layers 12 [--model DIR] [--steps N] [--seed 0]
    specdeploy train-adapter --task json --out my-json-adapter --last-layers 12
    specdeploy train-adapter --task yaml --out my-yaml-adapter --rank 4 --targets q_proj,v_proj,o_proj --last-layers 8

(rank 8 on every layer of SmolLM2 would be 7.4 MiB, over the default ``--max-adapter-mib`` 5; the
shipped adapters' own commands are in their ``training_report.json``.)

``--model`` defaults to the embedded SmolLM2 (prepared in ``--cache-dir``). The folder it writes is
a PEFT LoRA folder that ``model.adapter`` in a spec accepts, plus ``training_report.json`` (held-out
loss before/after, how many eval prompts' greedy outputs changed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

SMOLLM2_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def cmd_train_adapter(args: argparse.Namespace, console) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from pipeline.finetune.data import DataSettings
    from pipeline.finetune.train import TrainSettings, train_adapter

    if args.model:
        base, name = Path(args.model), None
    else:
        from pipeline.embedded import prepare_embedded_model

        base, name = prepare_embedded_model(Path(args.cache_dir)), SMOLLM2_HUB_NAME
    data = DataSettings(
        block=args.block,
        max_train_prompts=args.max_train_prompts,
        max_heldout_blocks=args.heldout_blocks,
        answer_tokens=args.answer_tokens,
    )
    settings = TrainSettings(
        task=args.task,
        rank=args.rank,
        alpha=args.alpha,
        targets=_targets(args.targets) if args.targets else TrainSettings.targets,
        last_layers=args.last_layers,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        max_minutes=args.max_minutes,
        bf16_autocast=args.bf16,
        save_dtype=args.save_dtype,
        max_adapter_mib=args.max_adapter_mib,
        eval_new_tokens=args.eval_new_tokens,
        base_model_name=name,
        data=data,
    )
    argv = sys.argv[1:]
    command = "specdeploy " + " ".join(shlex.quote(a) for a in argv) if "train-adapter" in argv else ""
    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    train_adapter(base, Path(args.out), cache, settings, command=command, say=say)
    return 0


def _targets(text: str) -> tuple[str, ...]:
    """``q_proj,v_proj`` -> ("q_proj", "v_proj") (TrainSettings.check says which names are known)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def register(commands: argparse._SubParsersAction) -> None:
    from pipeline.finetune.tasks import TASKS

    train = commands.add_parser("train-adapter", help="train a LoRA adapter (PEFT, CPU) on data the project derives")
    train.add_argument(
        "--task",
        choices=TASKS,
        required=True,
        help="code: stdlib Python source; the others: the base's chat answers rewritten in that format",
    )
    train.add_argument("--out", required=True, help="adapter folder to write (e.g. adapters/smollm2-code)")
    train.add_argument("--model", help="base HF model folder (default: the embedded SmolLM2)")
    train.add_argument("--steps", type=int, default=200, help="optimizer steps")
    train.add_argument("--batch", type=int, default=4, help="examples per step")
    train.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate")
    train.add_argument("--rank", type=int, default=8, help="LoRA rank r")
    train.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha (the update is scaled by alpha / r)")
    train.add_argument(
        "--max-adapter-mib",
        type=float,
        default=5.0,
        help="refuse (before training) an adapter whose saved weights would be larger than this",
    )
    train.add_argument(
        "--targets", help="comma-separated modules to adapt (default: q,k,v,o,up,down_proj), e.g. q_proj,v_proj,o_proj"
    )
    train.add_argument("--last-layers", type=int, help="adapt only the last N decoder layers (default: all)")
    train.add_argument("--block", type=int, default=256, help="code: tokens per training block")
    train.add_argument("--heldout-blocks", type=int, default=48, help="code: held-out blocks for the loss")
    train.add_argument("--answer-tokens", type=int, default=96, help="format tasks: length limit of the base answers")
    train.add_argument("--max-train-prompts", type=int, help="format tasks: use only the first N chat training prompts")
    train.add_argument("--eval-new-tokens", type=int, default=48, help="tokens generated per held-out prompt")
    train.add_argument("--seed", type=int, default=0, help="the random seed of the adapter's initialisation")
    train.add_argument("--max-minutes", type=float, default=30.0, help="stop training after this long")
    train.add_argument("--bf16", action="store_true", help="bfloat16 autocast (default: float32)")
    train.add_argument(
        "--save-dtype", choices=("float32", "bfloat16"), default="float32", help="the dtype of the saved adapter"
    )
    train.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: reproducible, and fair on a shared CPU)"
    )
    train.set_defaults(handler=cmd_train_adapter)
