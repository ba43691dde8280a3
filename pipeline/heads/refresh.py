"""Heads for any Llama target: data from the target itself, optionally warm-started from existing heads.

What the ``train-heads`` stage (``heads.<method>.train`` in a spec) and ``specdeploy train-heads
--init/--data/--adapter`` run. A fine-tune makes its base model's heads stale; the Medusa paper's
answer (Cai et al. 2024) is to retrain them with the new target, and starting from the base's heads
(``init``) makes that cheap: the heads only have to follow the drift.

Data (``RefreshSettings.data``):

* ``self-distill``: the target's own greedy answers to the training prompts
  (pipeline/data/prompts/*_train*.jsonl, never the held-out *_eval.jsonl), then one teacher-forced
  pass for the features and the labels (:mod:`pipeline.heads.data`). One decoding step per answer
  token: slow, hence cached (:func:`training_data`).
* ``fixed-text`` or a file: teacher-forced on fixed text, one batched forward pass per block
  (:mod:`pipeline.heads.fixed_text`).

Either way the labels are the target's own next-token distribution (:mod:`pipeline.heads.teacher`).

``tokens`` bounds the training tokens; every ``VALID_EVERY``-th sequence is held back and the epoch
with the best validation tokens/step ships. The output is the folder the convert stage reads:
EAGLE-1 (config.json + model.safetensors) or the compact Medusa ResBlocks, with a manifest; EAGLE-3
drafters are trained by ModelOpt (:mod:`pipeline.heads.eagle3`) into the folder its export writes.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from pipeline.checkpoint.merge import PROVENANCE_FILE
from pipeline.errors import InputError, StageUnavailable
from pipeline.geometry import ModelGeometry
from pipeline.heads.data import DATA_VERSION, DataSettings, SeqData, build_split, load_base
from pipeline.heads.eagle import EagleTrainConfig, train_eagle
from pipeline.heads.evaluate import evaluate_eagle, evaluate_medusa
from pipeline.heads.expand import base_lm_head, is_compact_medusa
from pipeline.heads.export import export_eagle, export_medusa, load_eagle_folder, load_medusa_folder, write_json
from pipeline.heads.fixed_text import BUILTIN_TEXT, fixed_text_data
from pipeline.heads.medusa import MedusaTrainConfig, train_medusa
from pipeline.heads.prompts import PROMPTS_DIR, load_prompts
from pipeline.heads.teacher import TEACHER_TOP_K
from pipeline.heads.train import EAGLE_TREES, MEDUSA_TREES, VALID_EVERY, base_embedding, best_epoch, validation_score
from pipeline.heads.train import split_validation as split_every
from pipeline.io.hashing import HashCache, sha256_file

Progress = Callable[[str], None]
SELF_DISTILL = "self-distill"
# Training prompts of self-distillation, in order (never the held-out *_eval files).
SELF_DISTILL_PARTS = {"chat": ("train", "train_extra", "train_more"), "code": ("train", "train_extra")}
# The data cache keeps the most recently used entries up to this size (an entry of 120k self-distilled
# tokens is ~145 MB); the entry just written or reused always stays, however large.
DATA_CACHE_BYTES = 2 << 30
# Warm starts follow a small drift: half the learning rate of a training from scratch.
WARM_START_LR_FACTOR = 0.5


@dataclass(frozen=True)
class RefreshSettings:
    method: str  # medusa | eagle | eagle3
    init: Path | None  # heads folder to start from; None: random initialization
    data: str = SELF_DISTILL  # self-distill | fixed-text | a text/JSONL file (as the spec's default)
    tokens: int = 200_000
    epochs: int = 2
    device: str = "cpu"
    seed: int = 0
    num_heads: int = 3  # Medusa from a random start; a warm start keeps the init's head count
    block: int = 256  # fixed text: tokens per sequence
    max_new_tokens: int = 128  # self-distillation: answer length limit
    lr: float | None = None  # None: the method's default (halved for a warm start, WARM_START_LR_FACTOR)
    draft_vocab: int | None = None  # eagle3 from a random start: the drafter's vocabulary (None: the trainer's 8192)


def fast_bf16() -> bool:
    """bfloat16 autocast only where the CPU computes it natively (AMX or AVX512-BF16); emulated, it is
    several times slower than float32."""
    cpu = torch.cpu
    return any(
        getattr(cpu, probe, lambda: False)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise StageUnavailable("heads training with device: cuda needs a CUDA GPU and a CUDA torch on this host")
    return torch.device(name)


def self_distilled_data(model, tokenizer, settings: RefreshSettings, say: Progress) -> tuple[SeqData, dict]:
    """The target's greedy answers to training prompts (chat and code alternating), about ``tokens`` in all,
    labelled with the target's top-k distribution at every position (as teacher-forced text is)."""
    chat = [("chat", r) for part in SELF_DISTILL_PARTS["chat"] for r in load_prompts("chat", part)]
    code = [("code", r) for part in SELF_DISTILL_PARTS["code"] for r in load_prompts("code", part)]
    mixed = [pair for pairs in zip(chat, code) for pair in pairs]
    count = max(2, min(len(mixed), settings.tokens // (settings.max_new_tokens + 40)))  # ~40 prompt tokens
    records = mixed[:count]
    say(f"self-distillation: {len(records)} training prompts, up to {settings.max_new_tokens} new tokens each")
    data = build_split(
        model, tokenizer, records, DataSettings(max_new_tokens=settings.max_new_tokens), say, teacher=True
    )
    meta = {
        "source": SELF_DISTILL,
        "sequences": len(data),
        "tokens": int(data.tokens.numel()),
        "labels": f"target top-{TEACHER_TOP_K}",
        "teacher_mass": data.teacher_mass(),
    }
    return data, meta


def data_key(target_dir: Path, settings: RefreshSettings, hashes: HashCache | None = None) -> str:
    """What the training data depends on: the target's files (its weights, config and tokenizer, not where a
    merge found its adapters), the data source and the settings that shape it.

    ``hashes`` remembers the target's file hashes, so a large target is read once, not on every run."""
    digest = hashlib.sha256(
        f"v{DATA_VERSION}|top{TEACHER_TOP_K}|{settings.data}|{settings.tokens}|{settings.block}|"
        f"{settings.max_new_tokens}|{settings.device}".encode()
    )
    files = (hashes or HashCache(None)).tree(Path(target_dir))
    if isinstance(files, dict):  # the merge's record names the adapters' paths, which shape no weight
        files.pop(PROVENANCE_FILE, None)
    digest.update(json.dumps(files, sort_keys=True).encode())
    if settings.data == SELF_DISTILL:
        for kind, parts in SELF_DISTILL_PARTS.items():
            for part in parts:
                digest.update((PROMPTS_DIR / f"{kind}_{part}.jsonl").read_bytes())
    elif settings.data == BUILTIN_TEXT:
        digest.update(platform.python_version().encode())  # the standard library's source
    elif Path(settings.data).is_file():
        digest.update(sha256_file(Path(settings.data)).encode())
    return digest.hexdigest()[:16]


def training_data(
    target_dir: Path, settings: RefreshSettings, say: Progress, cache: Path | None
) -> tuple[SeqData, dict]:
    """(data, meta) for the target, from ``cache`` (a folder) when an earlier run built the same data.

    Self-distillation costs one decoding step per token; caching it makes a second training on the same
    target (other epochs, learning rate or method) cost only the training."""
    stem = cache / f"refresh-{data_key(target_dir, settings, HashCache(cache))}" if cache is not None else None
    if stem is not None and stem.with_suffix(".json").is_file():
        say(f"training data: reusing {stem}.safetensors")
        stem.with_suffix(".json").touch()  # recently used: pruned last
        return SeqData.load(stem.with_suffix(".safetensors")), json.loads(stem.with_suffix(".json").read_text())
    model, tokenizer = load_base(Path(target_dir))
    model = model.to(_device(settings.device))
    if settings.data == SELF_DISTILL:
        data, meta = self_distilled_data(model, tokenizer, settings, say)
    else:
        data, meta = fixed_text_data(
            model, tokenizer, settings.data, tokens=settings.tokens, block=settings.block, say=say
        )
    if stem is not None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        partial = stem.with_name(f".{stem.name}.partial.safetensors")
        data.save(partial)
        partial.replace(stem.with_suffix(".safetensors"))
        write_json(stem.with_suffix(".json"), meta)  # written last: marks the entry complete
        prune_data_cache(stem.parent, keep=stem, say=say)
    return data, meta


def prune_data_cache(folder: Path, keep: Path, say: Progress, max_bytes: int = DATA_CACHE_BYTES) -> None:
    """Delete the least recently used ``refresh-*`` entries of ``folder`` (by their marker's time) until the
    entries fill at most ``max_bytes``; ``keep`` (an entry's stem) stays."""
    markers = sorted(folder.glob("refresh-*.json"), key=lambda m: m.stat().st_mtime, reverse=True)
    total, full = 0, False
    for marker in markers:
        data = marker.with_suffix(".safetensors")
        size = data.stat().st_size if data.is_file() else 0
        full = full or (total + size > max_bytes and marker.with_suffix("") != keep)
        if not full or marker.with_suffix("") == keep:
            total += size
            continue
        marker.unlink()  # first: a half-deleted entry is never taken for a complete one
        data.unlink(missing_ok=True)
        say(f"training data: removed {data.name} from the cache (least recently used; it keeps {max_bytes >> 20} MiB)")


def split_validation(data: SeqData) -> tuple[SeqData, SeqData]:
    """(fit, valid); with fewer than ``VALID_EVERY`` sequences nothing is held back (no best-epoch choice)."""
    if len(data) < VALID_EVERY:
        return data, SeqData.from_sequences([], [], [], [])
    return split_every(data)


def _check_init(method: str, init: Path, target: ModelGeometry) -> None:
    config_file = init / "config.json"
    if not config_file.is_file():
        raise InputError(f"{config_file}: missing; heads.{method}.train.init: base needs the heads folder there")
    config = json.loads(config_file.read_text())
    hidden = config.get("hidden_size")
    if hidden != target.hidden_size:
        raise InputError(
            f"{config_file}: hidden size {hidden} does not match the target's {target.hidden_size}; "
            "warm-start from heads of the same base model, or use init: random"
        )
    if method == "eagle3":
        from pipeline.methods.eagle3_reader import read_eagle3

        read_eagle3(init, target)  # an EAGLE-3 drafter for this target, or an InputError that says why
    if method == "medusa" and not is_compact_medusa(init):
        raise InputError(
            f"{init}: init: base needs specdeploy's compact Medusa heads (medusa_resblocks.safetensors); "
            "use init: random for FasterDecoding folders"
        )


def refresh_heads(
    target_dir: Path,
    out: Path,
    settings: RefreshSettings,
    say: Progress = print,
    command: str = "",
    cache: Path | None = None,
) -> dict:
    """Train ``settings.method`` heads for the target in ``target_dir`` into ``out``; returns the manifest.

    ``cache``: a folder keeping the training data by what it depends on (:func:`training_data`)."""

    start = time.monotonic()
    _device(settings.device)  # no CUDA for device: cuda: fail before any work
    config = json.loads((Path(target_dir) / "config.json").read_text())
    geometry = ModelGeometry.from_hf(config, str(Path(target_dir) / "config.json"), require_architecture=False)
    if settings.init is not None:
        _check_init(settings.method, settings.init, geometry)
    data, data_meta = training_data(Path(target_dir), settings, say, cache)
    data_seconds = time.monotonic() - start
    fit, valid = split_validation(data)
    lm_head = base_lm_head(Path(target_dir)).float()
    info: dict = {
        "name": Path(out).name,
        "method": settings.method,
        "target": {"model_type": config.get("model_type"), "hidden_size": geometry.hidden_size},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "data": {**data_meta, "fit_sequences": len(fit), "validation_sequences": len(valid)},
        "command": command,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    t0 = time.monotonic()
    if settings.method == "medusa":
        init = load_medusa_folder(settings.init) if settings.init is not None else None
        cfg = MedusaTrainConfig(
            num_heads=init.num_heads if init is not None else settings.num_heads,
            num_layers=init.num_layers if init is not None else MedusaTrainConfig.num_layers,
            epochs=settings.epochs,
            seed=settings.seed,
            bf16=fast_bf16(),
        )
        if init is not None:
            cfg = replace(cfg, lr=cfg.lr * WARM_START_LR_FACTOR)
        if settings.lr is not None:
            cfg = replace(cfg, lr=settings.lr)
        validate = (
            (lambda m: validation_score(evaluate_medusa(m, lm_head, valid, MEDUSA_TREES))) if len(valid) else None
        )
        blocks, log = train_medusa(fit, lm_head, cfg, say, validate=validate, init=init)
        info.update(train_config=asdict(cfg), train_log=log, best_epoch=best_epoch(log))
        info["seconds"] = {"data": round(data_seconds, 1), "train": round(time.monotonic() - t0, 1)}
        manifest = export_medusa(
            blocks,
            Path(out),
            hidden_size=geometry.hidden_size,
            vocab_size=lm_head.shape[0],
            base_model=str(config.get("_name_or_path") or Path(target_dir).name),
            info=info,
            readme=_readme(info),
        )
    elif settings.method == "eagle":
        eagle_init = load_eagle_folder(settings.init) if settings.init is not None else None
        eagle_cfg = EagleTrainConfig(epochs=settings.epochs, seed=settings.seed, bf16=fast_bf16())
        if eagle_init is not None:
            eagle_cfg = replace(eagle_cfg, lr=eagle_cfg.lr * WARM_START_LR_FACTOR)
        if settings.lr is not None:
            eagle_cfg = replace(eagle_cfg, lr=settings.lr)
        embed = base_embedding(Path(target_dir)).float()
        validate_eagle = (
            (lambda m: validation_score(evaluate_eagle(m, embed, lm_head, valid, EAGLE_TREES))) if len(valid) else None
        )
        drafter, log = train_eagle(
            fit, embed, lm_head, geometry, eagle_cfg, say, validate=validate_eagle, init=eagle_init
        )
        info.update(train_config=asdict(eagle_cfg), train_log=log, best_epoch=best_epoch(log))
        info["seconds"] = {"data": round(data_seconds, 1), "train": round(time.monotonic() - t0, 1)}
        manifest = export_eagle(drafter, Path(out), info=info, readme=_readme(info))
    elif settings.method == "eagle3":
        from pipeline.heads.eagle3 import Eagle3TrainConfig, train_eagle3_folder

        eagle3_cfg = Eagle3TrainConfig(epochs=settings.epochs, seed=settings.seed)
        if settings.draft_vocab is not None:  # a warm start keeps its init's vocabulary
            eagle3_cfg = replace(eagle3_cfg, draft_vocab=settings.draft_vocab)
        if settings.init is not None:
            eagle3_cfg = replace(eagle3_cfg, lr=eagle3_cfg.lr * WARM_START_LR_FACTOR)
        if settings.lr is not None:
            eagle3_cfg = replace(eagle3_cfg, lr=settings.lr)
        # No validation split: ModelOpt's loss is the score, and every sequence trains.
        # ModelOpt's loss reads the target's whole next-token distribution, computed online; the data's top-k is unused.
        kept = {k: v for k, v in data_meta.items() if k not in ("labels", "teacher_mass")}
        info["data"] = {**kept, "fit_sequences": len(data), "validation_sequences": 0}
        info["seconds"] = {"data": round(data_seconds, 1)}
        manifest = train_eagle3_folder(
            Path(target_dir), Path(out), data, eagle3_cfg, say, init=settings.init, info=info, readme=_readme(info)
        )
    else:
        raise InputError(f"unknown heads method {settings.method!r} (medusa, eagle or eagle3)")
    say(f"{settings.method} heads: wrote {out} in {time.monotonic() - start:.0f} s")
    return manifest


def _readme(info: dict) -> str:
    s, d = info["settings"], info["data"]
    start = f"warm-started from {s['init']}" if s["init"] not in (None, "None") else "from a random start"
    lines = [
        f"# {info['name']}: {info['method']} heads trained by specdeploy for their target",
        "",
        f"Trained {start}, {s['epochs']} epoch(s), seed {s['seed']}, on {d['tokens']} tokens of "
        f"{d['source']} ({d['sequences']} sequences; {d['validation_sequences']} held back to pick the epoch"
        + (f", epoch {info['best_epoch']} shipped)." if info.get("best_epoch") else ")."),
    ]
    if d.get("labels"):
        lines.append(
            f"Labels ({d['labels']}): the target's own next-token distribution at every position (the kept "
            f"tokens hold {d.get('teacher_mass')} of its probability on average), not the text's tokens "
            "(pipeline/heads/teacher.py)."
        )
    if info.get("command"):
        lines.append(f"Reproduce: `{info['command']}`.")
    if info["method"] == "eagle3":
        lines += [
            "",
            "Layout: ModelOpt's EAGLE-3 export (config.json + model.safetensors in bfloat16), written by",
            (
                "ModelOpt's export_speculative_decoding after training with its HF EAGLE-3 model "
                "(pipeline/heads/eagle3.py) against the target's own next-token distribution; the last epoch ships."
            ),
        ]
    else:
        lines += ["", "Layout: as the shipped heads of the base model (see heads/smollm2-eagle, heads/smollm2-medusa)."]
    lines.append("")
    return "\n".join(lines)
