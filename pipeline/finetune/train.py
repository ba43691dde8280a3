"""Train a LoRA adapter with PEFT on CPU: fixed seed, bounded steps and time, measured before/after.

The adapter is evaluated the way a spec deploys it: merged into the base by
:func:`pipeline.checkpoint.merge.merge_adapters` (the merge stage's code), then the held-out loss
and the greedy outputs on the eval prompts are compared with the base model's. The folder
(adapter_config.json, adapter_model.safetensors, training_report.json) appears atomically.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from pipeline.errors import InputError, host_error
from pipeline.finetune.data import FORMATS, IGNORE, TASKS, DataSettings, Example, TaskData, code_task, format_task
from pipeline.geometry import ModelGeometry
from pipeline.heads.data import greedy_answers, load_base, stop_ids
from pipeline.io.atomic import check_replaceable, check_writable_beside, replace_folder
from pipeline.io.files import read_json

REPORT_FILE = "training_report.json"
SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TrainSettings:
    task: str
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")
    last_layers: int | None = None  # adapt only the last N decoder layers: backward stops there (cheaper)
    steps: int = 200
    batch: int = 4
    lr: float = 5e-4
    warmup: int = 10
    seed: int = 0
    max_minutes: float = 30.0  # a safety stop; the report says when it cut training short
    bf16_autocast: bool = False  # bfloat16 autocast: only faster on CPUs with AVX512-BF16/AMX
    save_dtype: str = "float32"
    max_adapter_mib: float = 5.0
    eval_new_tokens: int = 48
    base_model_name: str | None = None  # written as base_model_name_or_path
    data: DataSettings = field(default_factory=DataSettings)

    def check(self) -> None:
        if self.task not in TASKS:
            raise InputError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        if self.save_dtype not in SAVE_DTYPES:
            raise InputError(f"save dtype {self.save_dtype!r}: choose one of {', '.join(SAVE_DTYPES)}")
        if not self.targets:
            raise InputError("--targets must name at least one module (e.g. q_proj,v_proj)")
        unknown = sorted(set(self.targets) - set(MODULE_SHAPES))
        if unknown:
            raise InputError(
                f"--targets {','.join(unknown)}: not a Llama projection; choose from {', '.join(MODULE_SHAPES)}"
            )
        for name in ("rank", "steps", "batch", "eval_new_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("lr", "alpha", "max_minutes", "max_adapter_mib"):  # NaN fails "> 0" too
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{name.replace('_', '-')} {value}: must be a finite number above 0")
        if self.last_layers is not None and self.last_layers < 1:
            raise InputError("--last-layers must be at least 1")


# A Llama projection's (in, out) features: what a LoRA pair of rank r on it stores, r * (in + out) values.
MODULE_SHAPES = {
    "q_proj": ("hidden_size", "q_out"),
    "k_proj": ("hidden_size", "kv_out"),
    "v_proj": ("hidden_size", "kv_out"),
    "o_proj": ("q_out", "hidden_size"),
    "gate_proj": ("hidden_size", "intermediate_size"),
    "up_proj": ("hidden_size", "intermediate_size"),
    "down_proj": ("intermediate_size", "hidden_size"),
}


def adapter_bytes(geometry: ModelGeometry, settings: TrainSettings) -> int:
    """The size of adapter_model.safetensors' tensors, known before any training: lora_A [r, in] and
    lora_B [out, r] of every targeted module of every adapted layer, in the save dtype."""
    sizes = {
        "hidden_size": geometry.hidden_size,
        "intermediate_size": geometry.intermediate_size,
        "q_out": geometry.num_heads * geometry.head_dim,
        "kv_out": geometry.num_kv_heads * geometry.head_dim,
    }
    layers = min(settings.last_layers or geometry.num_layers, geometry.num_layers)
    values = sum(settings.rank * (sizes[a] + sizes[b]) for a, b in (MODULE_SHAPES[t] for t in settings.targets))
    return layers * values * SAVE_DTYPES[settings.save_dtype].itemsize


def _adapter_folder(out: Path) -> bool:
    """An adapter this command wrote: its training report, and nothing but its files."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    return REPORT_FILE in names and names <= {"adapter_config.json", "adapter_model.safetensors", REPORT_FILE}


def check_base(base_dir: Path) -> ModelGeometry:
    """The base model's geometry from its config.json, before anything is loaded (InputError naming it)."""
    config_file = Path(base_dir) / "config.json"
    config = read_json(config_file, "base model config")
    if not isinstance(config, dict):
        raise InputError(f"{config_file}: not a JSON object; give a Hugging Face model folder with --model")
    return ModelGeometry.from_hf(config, str(config_file))


def _batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
        labels[row, : len(e.labels)] = torch.tensor(e.labels)
        mask[row, : len(e.input_ids)] = 1
    return ids, labels, mask


@torch.no_grad()
def heldout_loss(model, examples: list[Example], pad_id: int, batch: int = 4) -> float:
    """Mean next-token cross-entropy over every labelled token (float32)."""
    total, count = 0.0, 0
    for first in range(0, len(examples), batch):
        ids, labels, mask = _batch(examples[first : first + batch], pad_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        total += float(loss)
        count += int((target != IGNORE).sum())
    return total / max(count, 1)


def _greedy(model, tokenizer, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    return greedy_answers(
        model,
        prompts,
        max_new_tokens=new_tokens,
        batch=len(prompts),
        pad_id=pad_id,
        stops=stop_ids(tokenizer),
        say=lambda _: None,
    )


def _lr(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _train(peft_model, data: TaskData, settings: TrainSettings, pad_id: int, say: Callable[[str], None]) -> dict:
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    order: list[int] = []
    losses: list[float] = []
    start = time.monotonic()
    peft_model.train()
    stopped_early = False
    for step in range(settings.steps):
        if time.monotonic() - start > settings.max_minutes * 60:
            stopped_early = True
            break
        while len(order) < settings.batch:
            order += torch.randperm(len(data.train), generator=generator).tolist()
        chosen, order = order[: settings.batch], order[settings.batch :]
        ids, labels, mask = _batch([data.train[i] for i in chosen], pad_id)
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16_autocast):
            loss = peft_model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % 10 == 0 or step == settings.steps - 1:
            say(f"  step {step + 1}/{settings.steps}: loss {losses[-1]:.3f} ({time.monotonic() - start:.0f} s)")
    peft_model.eval()
    return {
        "steps_done": len(losses),
        "stopped_early_by_time": stopped_early,
        "train_seconds": round(time.monotonic() - start, 1),
        "train_loss_first10": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
        "train_loss_last10": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
    }


def _save_adapter(peft_model, folder: Path, settings: TrainSettings) -> int:
    from safetensors.torch import load_file, save_file

    if settings.base_model_name is not None:
        peft_model.peft_config["default"].base_model_name_or_path = settings.base_model_name
    peft_model.save_pretrained(folder)
    weights = folder / "adapter_model.safetensors"
    tensors = {k: v.to(SAVE_DTYPES[settings.save_dtype]).contiguous() for k, v in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors writes 0600; the folder ships and is read by other accounts
    size = weights.stat().st_size
    for extra in folder.iterdir():  # PEFT writes a README.md model card; the training report replaces it
        if extra.name not in ("adapter_config.json", "adapter_model.safetensors"):
            extra.unlink()
    return size


def train_adapter(
    base_dir: Path,
    out: Path,
    cache: Path,
    settings: TrainSettings,
    *,
    command: str = "",
    say: Callable[[str], None] = print,
) -> dict:
    """Train, save into ``out`` (replaced atomically) and return the report (also in out/training_report.json).

    Everything knowable before the first step is checked first: the settings, the base's config, the
    output folder and the adapter's size against ``max_adapter_mib``."""
    settings.check()
    out = Path(out)
    check_replaceable(out, "--out", _adapter_folder)
    geometry = check_base(base_dir)
    if settings.last_layers is not None and settings.last_layers > geometry.num_layers:
        raise InputError(
            f"--last-layers {settings.last_layers} is more than the base's {geometry.num_layers} layers; "
            f"give at most {geometry.num_layers} (or leave it out for every layer)"
        )
    planned = adapter_bytes(geometry, settings)
    if planned > settings.max_adapter_mib * 2**20:
        raise InputError(
            f"the adapter would be {planned / 2**20:.2f} MiB (rank {settings.rank} on {', '.join(settings.targets)} "
            f"of {settings.last_layers or geometry.num_layers} layers, {settings.save_dtype}), over --max-adapter-mib "
            f"{settings.max_adapter_mib}; lower --rank, target fewer modules or raise --max-adapter-mib"
        )
    doing = f"creating the folders of --out {out} and the cache {cache}"
    check_writable_beside(out, doing)  # the adapter is written beside --out: found out now, not after training
    try:
        Path(cache).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise host_error(exc, doing) from None
    import peft

    from pipeline.checkpoint.merge import merge_adapters

    torch.manual_seed(settings.seed)
    model, tokenizer = load_base(base_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    data = (
        code_task(tokenizer, settings.data)
        if settings.task == "code"
        else format_task(settings.task, model, tokenizer, base_dir, cache, settings.data, say)
    )
    if not data.train or not data.heldout:
        raise InputError(f"task {settings.task}: no training or held-out data could be built")
    say(f"{settings.task}: {len(data.train)} training / {len(data.heldout)} held-out examples; {data.description}")
    before_loss = heldout_loss(model, data.heldout, pad_id)
    before = _greedy(model, tokenizer, data.eval_prompts, settings.eval_new_tokens, pad_id)
    say(f"base: held-out loss {before_loss:.4f}")

    torch.manual_seed(settings.seed)
    layers = model.config.num_hidden_layers
    chosen = None if settings.last_layers is None else list(range(max(0, layers - settings.last_layers), layers))
    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # a float works
        target_modules=list(settings.targets),
        layers_to_transform=chosen,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = peft.get_peft_model(model, config)
    training = _train(peft_model, data, settings, pad_id, say)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        size = _save_adapter(peft_model, tmp, settings)
        del peft_model, model
        with tempfile.TemporaryDirectory(prefix="merged-", dir=cache) as merged:
            merge_adapters(base_dir, [tmp], Path(merged))
            tuned, _ = load_base(Path(merged))
            after_loss = heldout_loss(tuned, data.heldout, pad_id)
            after = _greedy(tuned, tokenizer, data.eval_prompts, settings.eval_new_tokens, pad_id)
        changed = sum(a != b for a, b in zip(before, after))
        report = {
            "task": settings.task,
            "data": data.description,
            "base": str(base_dir),
            "command": command,
            "settings": {k: v for k, v in asdict(settings).items()},
            "train_examples": len(data.train),
            "heldout_examples": len(data.heldout),
            **training,
            "heldout_loss_before": round(before_loss, 4),
            "heldout_loss_after": round(after_loss, 4),
            "eval_prompts": len(data.eval_prompts),
            "eval_greedy_changed": changed,
            "eval_new_tokens": settings.eval_new_tokens,
            "adapter_bytes": size,
            "examples": [
                {
                    "before": tokenizer.decode(b, skip_special_tokens=True),
                    "after": tokenizer.decode(a, skip_special_tokens=True),
                }
                for b, a in list(zip(before, after))[:3]
            ],
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "peft": peft.__version__,
        }
        if settings.task in FORMATS:  # the format metric: eval answers in the task's format
            matches = FORMATS[settings.task].matches
            decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
            report[f"eval_answers_{settings.task}_before"] = sum(matches(decode(b)) for b in before)
            report[f"eval_answers_{settings.task}_after"] = sum(matches(decode(a)) for a in after)
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o755)
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(
        f"{settings.task}: held-out loss {before_loss:.4f} -> {after_loss:.4f}; greedy output changed on "
        f"{changed}/{len(before)} eval prompts; adapter {size / 2**20:.2f} MiB -> {out}"
    )
    return report
