"""EAGLE-3 drafters trained by self-distillation with ModelOpt's own HF EAGLE-3 model.

``specdeploy train-heads --method eagle3`` and the train-heads stage (``heads.eagle3.train``) run
:func:`train_eagle3_folder`: the target is loaded into transformers (float32), converted with
``mtsp.convert(model, [("eagle", EAGLE3_DEFAULT_CFG["config"])])`` sized like one of the target's
decoder layers (its heads, KV heads, head size and MLP width), and trained online: ModelOpt's
``HFEagleModel.forward`` runs the frozen target over a training sequence (capturing its low, middle
and high layers), then the drafter ``eagle_ttt_steps`` times, each step fed the drafter's own outputs
of the previous one (training-time test), and returns the summed loss against the target's own
next-token distribution (``eagle_loss``; ``labels`` only feed a base-model loss, which a frozen base
model never computes). An AdamW optimizer updates the eagle_module's parameters only. The data are the
target's own greedy answers to the training prompts (:func:`pipeline.heads.refresh.training_data`, as
the other trainers'); the loss counts the answer positions (``loss_mask``).

Choices ModelOpt leaves to its training scripts:

* the draft vocabulary: the ``draft_vocab`` most frequent target ids of the training sequences (ModelOpt's
  ``calibrate_draft_vocab``), sorted, as ``d2t`` offsets; the drafter's lm_head starts from the target's
  lm_head rows of those ids;
* the first decoder layer's ``input_layernorm`` stays frozen at ones: ModelOpt 0.47's training forward
  applies it to the fused hidden half too, TensorRT-LLM (and :mod:`pipeline.runtime.spec_decode.eagle3`)
  does not, and the two agree only while it is all ones;
* ``init`` (a drafter folder, ``init: base``) warm-starts from that drafter's weights, architecture and
  draft vocabulary: a fine-tune's drafter follows the drift from the base's.

The folder is written by ModelOpt's ``export_speculative_decoding`` (config.json + model.safetensors,
bfloat16 as its config declares: ~20 MB for SmolLM2), with specdeploy's manifest and README beside it;
:func:`pipeline.methods.eagle3_reader.read_eagle3` reads it.

Step time, measured on this project's 2-core CPU (one torch thread, SmolLM2-135M target, one
256-token sequence, 3 training-time-test steps, draft vocabulary 8192; median of 6, the host shared with
another test run, load ~3.5): the target's forward alone 1.10 s, ModelOpt's forward (the frozen target
included, and the drafter's 3 passes) 1.17 s, forward + backward + AdamW step 1.56 s. The target
dominates; a 200k-token epoch of self-distilled data (~1200 sequences) is ~25 minutes. ModelOpt's
training path is practical on CPU; only ``eagle_use_torch_compile`` is turned off (it compiles for the
GPU and costs minutes here), and its per-step attention-mask cache is cleared per sequence (it is keyed
by the TTT step only, and the sequences are not padded to one length).
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import InputError
from pipeline.heads.data import SeqData
from pipeline.progress import step_progress

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Eagle3TrainConfig:
    epochs: int = 2
    seed: int = 0
    lr: float = 5e-4
    warmup: int = 20  # steps of linear warmup, then cosine decay to 10%
    max_len: int = 384  # tokens per training sequence (a longer one is cut)
    draft_vocab: int = 8192  # the drafter's own vocabulary (the whole vocabulary when smaller)
    ttt_steps: int = 3  # ModelOpt's eagle_ttt_steps: drafter steps fed its own outputs
    grad_clip: float = 1.0
    max_steps: int | None = None  # stop after this many optimizer steps (a time budget)


def eagle_config(base_config: Any, cfg: Eagle3TrainConfig, init: dict | None = None) -> dict:
    """ModelOpt's EAGLE-3 config for the target ``base_config`` (a transformers config): one decoder layer
    shaped like the target's, or like the ``init`` drafter's (its config.json)."""
    import modelopt.torch.speculative as mtsp

    config = copy.deepcopy(mtsp.EAGLE3_DEFAULT_CFG["config"])
    config["eagle_use_torch_compile"] = False  # a GPU optimisation; on CPU it only compiles
    config["eagle_export_rope_scaling"] = {}  # keep the training RoPE in the exported config
    config["eagle_ttt_steps"] = cfg.ttt_steps
    arch = config["eagle_architecture_config"]
    source = init or {
        "num_attention_heads": base_config.num_attention_heads,
        "num_key_value_heads": base_config.num_key_value_heads,
        "head_dim": getattr(base_config, "head_dim", None)
        or base_config.hidden_size // base_config.num_attention_heads,
        "intermediate_size": base_config.intermediate_size,
        "draft_vocab_size": min(cfg.draft_vocab, base_config.vocab_size),
    }
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "draft_vocab_size"):
        arch[key] = source[key]
    if init is not None:
        layers = (init.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if layers:
            arch["eagle_aux_hidden_state_layer_ids"] = list(layers)
    return config


def draft_vocabulary(data: SeqData, size: int, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent target ids of the training sequences, ties to the lower id, sorted."""
    counts = torch.bincount(data.tokens, minlength=vocab)[:vocab].double()
    counts -= torch.arange(vocab, dtype=torch.float64) / (2 * vocab)  # ties: lower ids first
    return counts.topk(size).indices.sort().values


def _init_tensors(init: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(init.glob("*.safetensors")):
        tensors.update({k: v.float() for k, v in load_file(str(file)).items()})
    return tensors


def convert(target_dir: Path, cfg: Eagle3TrainConfig, data: SeqData, init: Path | None = None):
    """The target with ModelOpt's EAGLE-3 module (float32): from ``init``'s weights, or random with the
    draft vocabulary of ``data`` and the target's lm_head rows."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import modelopt.torch.speculative as mtsp
    import transformers

    torch.manual_seed(cfg.seed)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(target_dir), dtype=torch.float32, local_files_only=True
    )
    init_config = json.loads((init / "config.json").read_text()) if init is not None else None
    mtsp.convert(model, [("eagle", eagle_config(model.config, cfg, init_config))])
    module: Any = model.eagle_module
    with torch.no_grad():
        if init is not None:
            missing, unexpected = module.load_state_dict(_init_tensors(init), strict=False)
            missing = [k for k in missing if not k.startswith("rotary_emb")]
            if missing or unexpected:
                raise InputError(
                    f"{init}: not an EAGLE-3 drafter ModelOpt can continue training "
                    f"(missing {missing[:3]}, unexpected {unexpected[:3]}); use init: random"
                )
        elif hasattr(module, "d2t"):
            targets = draft_vocabulary(data, module.d2t.numel(), model.config.vocab_size)
            module.d2t.copy_(targets - torch.arange(len(targets)))
            module.lm_head.weight.copy_(model.get_output_embeddings().weight[targets])
        module.layers[0].input_layernorm.weight.fill_(1.0)
    module.layers[0].input_layernorm.weight.requires_grad_(False)  # see the module docstring
    return model


def _batches(data: SeqData, cfg: Eagle3TrainConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids [1, T], loss_mask [1, T]) per sequence with an answer; the mask covers the answer."""
    out = []
    for s in range(len(data)):
        tokens, _, prompt_len = data.seq(s)
        tokens = tokens[: cfg.max_len]
        if len(tokens) - prompt_len < 2:
            continue
        mask = torch.zeros(len(tokens), dtype=torch.long)
        mask[max(0, prompt_len - 1) :] = 1
        out.append((tokens[None].long(), mask[None]))
    return out


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_eagle3(model, data: SeqData, cfg: Eagle3TrainConfig, say: Progress = print) -> list[dict]:
    """Trains ``model.eagle_module`` in place on ``data``; returns a log per epoch (mean loss, accuracy
    per training-time-test step, seconds)."""
    batches = _batches(data, cfg)
    if not batches:
        raise InputError("EAGLE-3 training: no training sequence with an answer of 2 tokens or more")
    params = [p for p in model.eagle_module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    total = cfg.epochs * len(batches)
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total, min(cfg.warmup, total)))
    generator = torch.Generator().manual_seed(cfg.seed)
    model.train()
    log: list[dict] = []
    step = 0
    with step_progress(f"eagle3: {cfg.epochs} epoch(s) of {len(batches)} sequences", total) as advance:
        for epoch in range(1, cfg.epochs + 1):
            if step >= total:
                break
            t0, losses, accs = time.monotonic(), [], []
            for i in torch.randperm(len(batches), generator=generator).tolist():
                if step >= total:
                    break
                input_ids, loss_mask = batches[i]
                model._cached_attn_blk_masks = {}  # ModelOpt caches the TTT masks per step, not per length
                out = model(input_ids=input_ids, loss_mask=loss_mask)
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                scheduler.step()
                losses.append(float(out.loss.detach()))
                accs.append(out.train_acc[0])
                step += 1
                advance(1)
            acc = [round(sum(a[k] for a in accs) / len(accs), 4) for k in range(len(accs[0]))] if accs else []
            entry = {
                "epoch": epoch,
                "steps": len(losses),
                "loss": round(sum(losses) / max(1, len(losses)), 4),
                "first_loss": round(losses[0], 4) if losses else None,
                "last_loss": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
                "train_acc": acc,
                "seconds": round(time.monotonic() - t0, 1),
            }
            log.append(entry)
            say(f"eagle3 epoch {epoch}: loss {entry['loss']} (last 10 steps {entry['last_loss']}), accuracy {acc}")
    model.eval()
    return log


def export(model, out: Path) -> None:
    """ModelOpt's own HF export of the drafter into ``out`` (created), in bfloat16; ``model`` is spent."""
    from modelopt.torch.export import export_speculative_decoding

    out.mkdir(parents=True, exist_ok=True)
    model.eagle_module.to(torch.bfloat16)  # the torch_dtype ModelOpt's config declares (its export keeps float32)
    export_speculative_decoding(model, export_dir=out)


def train_eagle3_folder(
    target_dir: Path,
    out: Path,
    data: SeqData,
    cfg: Eagle3TrainConfig,
    say: Progress,
    *,
    init: Path | None = None,
    info: dict,
    readme: str,
) -> dict:
    """Trains and writes the drafter folder ``out`` (ModelOpt's export + manifest + README); the manifest."""
    from pipeline.heads.export import write_manifest

    model = convert(Path(target_dir), cfg, data, init)
    t0 = time.monotonic()
    log = train_eagle3(model, data, cfg, say)
    info = {**info, "train_config": asdict(cfg), "train_log": log}
    info.setdefault("seconds", {})["train"] = round(time.monotonic() - t0, 1)
    info["capture_layers"] = sorted(int(i) for i in model.eagle_config.eagle_aux_hidden_state_layer_ids)
    export(model, Path(out))
    (Path(out) / "README.md").write_text(readme)
    names = sorted(p.name for p in Path(out).iterdir() if p.is_file() and p.name != "manifest.json")
    return write_manifest(Path(out), names, info)
