"""``specdeploy train-heads``: data -> training -> offline evaluation -> shipped folder + report.

Everything is seeded and single-threaded by default, so a rerun on the same machine type
reproduces the shipped bytes (the manifest records the settings and sha256 of each file).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from pipeline import methods
from pipeline.geometry import ModelGeometry
from pipeline.heads.data import DataSettings, SeqData, prepare_data
from pipeline.heads.eagle import EagleTrainConfig, train_eagle
from pipeline.heads.evaluate import evaluate_eagle, evaluate_medusa
from pipeline.heads.expand import base_lm_head
from pipeline.heads.export import export_eagle, export_medusa, load_eagle_folder
from pipeline.heads.medusa import MedusaTrainConfig, train_medusa
from pipeline.methods.base import HeadsNeed
from pipeline.trees import CHAIN_3, CHAIN_4, CPU_SMALL_10_DEPTH_3

Progress = Callable[[str], None]


def _heads(method: str) -> HeadsNeed:
    """The heads ``method`` trains; ValueError for a method without heads."""
    heads = methods.definition(method).heads
    if heads is None:
        raise ValueError(f"{method} has no heads to train ({', '.join(d.name for d in methods.with_heads())} have)")
    return heads


MEDUSA_TREES = {"cpu_small_10_depth_3": CPU_SMALL_10_DEPTH_3, "chain_3": CHAIN_3}
EAGLE_TREES = {"chain_4": CHAIN_4, "cpu_small_10_depth_3": CPU_SMALL_10_DEPTH_3}
# Every VALID_EVERY-th training sequence is a validation sequence (training side; the held-out
# eval prompts are never used for any choice): its tokens/step picks the best epoch.
VALID_EVERY = 40


def split_validation(data: SeqData, every: int = VALID_EVERY) -> tuple[SeqData, SeqData]:
    """(fit, valid): sequence s is validation when s % every == every - 1."""

    sequences = range(len(data))
    return (
        data.subset([s for s in sequences if s % every != every - 1]),
        data.subset([s for s in sequences if s % every == every - 1]),
    )


def best_epoch(log: list[dict]) -> int | None:
    scored = [e for e in log if "valid_score" in e]
    return max(scored, key=lambda e: e["valid_score"])["epoch"] if scored else None


def validation_score(metrics: dict, tree: str = "cpu_small_10_depth_3") -> float:
    """Mean over kinds of the offline tokens/step on ``tree``."""
    values = [m["tokens_per_step"][tree] for m in metrics.values()]
    return sum(values) / max(1, len(values))


def base_embedding(base_dir: Path) -> torch.Tensor:
    from safetensors import safe_open

    for file in sorted(Path(base_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if "model.embed_tokens.weight" in handle.keys():
                return handle.get_tensor("model.embed_tokens.weight")
    raise FileNotFoundError(f"{base_dir}: no model.embed_tokens.weight")


def _base_identity(base_dir: Path) -> dict:
    marker = Path(base_dir) / ".specdeploy-embedded.json"
    if marker.exists():
        data = json.loads(marker.read_text())
        return {
            "name": data.get("model"),
            "gguf_sha256": data.get("gguf", {}).get("sha256"),
            "prepare_version": data.get("prepare_version"),
        }
    return {"name": Path(base_dir).name}


def _readme(method: str, info: dict) -> str:
    metrics = info["eval"]
    lines = [
        f"# {info['name']}: {method} heads for {info['base_model'].get('name')}",
        "",
        "Trained by specdeploy on the base model's own greedy answers (self-distillation); do not edit.",
        f"Reproduce: `{info['command']}`.",
        "",
    ]
    if method == "medusa":
        lines += [
            "Format `specdeploy-medusa-resblocks`: `medusa_resblocks.safetensors` holds the trained ResBlocks",
            "(FasterDecoding names `{h}.{l}.linear.weight|bias`, float32). Every head's lm_head is the base",
            "model's lm_head (tied to its embedding) and is not stored: `pipeline.heads.expand.expand_medusa`",
            "(or `specdeploy expand-heads`) writes the standard FasterDecoding folder",
            "(`medusa_lm_head.safetensors` with `{h}.{L}.weight`).",
            "",
            "Head i reads the base model's last hidden state h_t (after the final norm) and predicts token",
            "t+2+i: x = h; x = x + silu(W x + b) per ResBlock; logits = lm_head(x).",
            "",
        ]
    else:
        lines += [
            "EAGLE-1 layout (TensorRT-LLM `examples/eagle/convert_checkpoint.py --eagle_model_dir`):",
            "`config.json` (drafter LlamaConfig, 1 layer) + `model.safetensors` (float16) with `fc.weight`",
            "[H, 2H], `fc.bias`, `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj",
            ".weight`, `layers.0.post_attention_layernorm.weight`; no input_layernorm in layer 0 and no",
            "`embed_tokens.weight`: the drafter uses the base model's embedding (and its lm_head).",
            "",
            "Input at position t: concat[embed(token_{t+1}), f_t] (embedding first), f_t = base last hidden",
            "state after the final norm; output f'_{t+1}; logits = base lm_head(f'_{t+1}).",
            "",
        ]
    data = info.get("data", {})
    shards = data.get("shards", {})
    if shards:
        train_shards = {k: v for k, v in shards.items() if k != "eval"}
        answers = sum(v.get("answer_tokens", 0) for v in train_shards.values())
        seqs = sum(v.get("sequences", 0) for v in train_shards.values())
        lines += [
            f"Training data: {seqs} self-distilled sequences, {answers} answer tokens (shards "
            f"{', '.join(sorted(train_shards))}; prompts in pipeline/data/prompts/*_train*.jsonl, disjoint",
            f"from the held-out *_eval.jsonl). Every {VALID_EVERY}th training sequence is held back for",
            "validation; the epoch with the best validation tokens/step is the one shipped"
            + (f" (epoch {info['best_epoch']})." if info.get("best_epoch") else "."),
            "",
        ]
    lines += ["Held-out estimates (offline greedy simulation, not the reference backend):", ""]
    for kind, m in metrics.items():
        steps = ", ".join(f"{k} {v}" for k, v in m["tokens_per_step"].items())
        lines.append(f"* {kind} ({m['sequences']} prompts): top-1 per depth {m['top1_per_depth']}; tokens/step {steps}")
    return "\n".join(lines) + "\n"


def update_report(path: Path, method: str, section: dict) -> None:
    report = json.loads(path.read_text()) if path.exists() else {}
    chat = section.get("eval", {}).get("chat", {}).get("tokens_per_step", {})
    # The target: mean tokens per step on held-out chat prompts, greedy (Medusa: its tree; EAGLE: best of chain/tree).
    target = _heads(method).training_target
    section["target_chat_tokens_per_step"] = target
    section["meets_target"] = bool(chat) and max(chat.values()) >= target
    report[method] = section
    report["note"] = (
        "offline estimates on held-out prompts (pipeline/data/prompts/*_eval.jsonl): greedy "
        "acceptance simulated from the base model's own greedy answers; tokens_per_step = 1 + "
        "accepted draft tokens per verification step"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def train_heads(
    method: str,
    base_dir: Path,
    out_dir: Path,
    cache_dir: Path,
    *,
    seed: int = 0,
    epochs: int | None = None,
    report: Path | None = None,
    command: str = "",
    say: Progress = print,
) -> dict:
    _heads(method)
    start = time.monotonic()
    settings = DataSettings()
    train, held, data_meta = prepare_data(base_dir, cache_dir, settings, say)
    data_seconds = time.monotonic() - start
    train, valid = split_validation(train)
    say(f"training data: {len(train)} sequences, validation {len(valid)} (every {VALID_EVERY}th)")
    lm_head = base_lm_head(base_dir).float()
    base_config = json.loads((Path(base_dir) / "config.json").read_text())
    base_identity = _base_identity(base_dir)
    info = {
        "name": Path(out_dir).name,
        "method": method,
        "base_model": base_identity,
        "seed": seed,
        "command": command or f"specdeploy train-heads --method {method} --out {out_dir}",
        "data": {
            **data_meta,
            "settings": asdict(settings),
            "validation_sequences": len(valid),
            "fit_sequences": len(train),
        },
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    t0 = time.monotonic()
    if method == "medusa":
        cfg = MedusaTrainConfig(seed=seed, epochs=epochs or MedusaTrainConfig.epochs)
        blocks, log = train_medusa(
            train,
            lm_head,
            cfg,
            say,
            validate=lambda m: validation_score(evaluate_medusa(m, lm_head, valid, MEDUSA_TREES)),
        )
        train_seconds = time.monotonic() - t0
        metrics = evaluate_medusa(blocks, lm_head, held, MEDUSA_TREES)
        info.update(
            train_config=asdict(cfg),
            train_log=log,
            eval=metrics,
            best_epoch=best_epoch(log),
            seconds={"data": round(data_seconds, 1), "train": round(train_seconds, 1)},
        )
        manifest = export_medusa(
            blocks,
            Path(out_dir),
            hidden_size=lm_head.shape[1],
            vocab_size=lm_head.shape[0],
            base_model=base_identity.get("name") or "",
            info=info,
            readme=_readme(method, info),
        )
    else:
        eagle_cfg = EagleTrainConfig(seed=seed, epochs=epochs or EagleTrainConfig.epochs)
        embed = base_embedding(base_dir).float()
        drafter, log = train_eagle(
            train,
            embed,
            lm_head,
            ModelGeometry.from_hf(base_config, str(Path(base_dir) / "config.json"), require_architecture=False),
            eagle_cfg,
            say,
            validate=lambda m: validation_score(evaluate_eagle(m, embed, lm_head, valid, EAGLE_TREES)),
        )
        train_seconds = time.monotonic() - t0
        # Evaluate what ships (float16 weights), so the numbers describe the artifact.
        export_eagle(drafter, Path(out_dir), info={}, readme="")
        metrics = evaluate_eagle(load_eagle_folder(Path(out_dir)), embed, lm_head, held, EAGLE_TREES)
        info.update(
            train_config=asdict(eagle_cfg),
            train_log=log,
            eval=metrics,
            best_epoch=best_epoch(log),
            seconds={"data": round(data_seconds, 1), "train": round(train_seconds, 1)},
        )
        manifest = export_eagle(drafter, Path(out_dir), info=info, readme=_readme(method, info))
    say(f"{method}: wrote {out_dir} in {time.monotonic() - start:.0f} s")
    for kind, m in metrics.items():
        say(f"  {kind}: top-1 per depth {m['top1_per_depth']}, tokens/step {m['tokens_per_step']}")
    if report is not None:
        data_summary = {
            **{k: v for k, v in data_meta.items() if k != "settings"},
            "fit_sequences": len(train),
            "validation_sequences": len(valid),
        }
        update_report(
            Path(report),
            method,
            {
                "heads": str(out_dir),
                "eval": metrics,
                "seconds": info["seconds"],
                "data": data_summary,
                "train_config": info["train_config"],
                "train_log": info["train_log"],
                "files": manifest["files"],
                "command": info["command"],
                "threads": info["threads"],
                "best_epoch": info["best_epoch"],
            },
        )
    return manifest
