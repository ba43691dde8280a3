"""Self-distillation data: the base model's own greedy answers and its final hidden states.

For every prompt (chat prompts through the tokenizer's chat template, code prompts as raw
completion) the base model answers greedily (batched ``generate`` with left padding, KV cache,
at most ``max_new_tokens``); then one teacher-forced forward over prompt + answer gives the
final hidden state at every position (AFTER the final RMSNorm: what ``lm_head`` sees). Heads
train on these cached features, never running the 30-layer base model again.

Cache: one file per shard (a group of prompt files generated together),
``<cache>/heads-data/<shard>-<key>.safetensors`` + ``.json``; ``key`` hashes the base model's
config, the shard's prompt files, the generation settings and ``DATA_VERSION``, so a changed
input regenerates only its shard. Shards: ``eval`` (chat_eval + code_eval), ``train``
(chat_train + code_train), ``train_extra`` (chat_train_extra), ``train_chat_more``
(chat_train_more) and ``train_code_extra`` (code_train_extra). A new prompt file gets a new shard
(append it to ``SHARDS`` / ``TRAIN_SHARDS``), so the existing shards keep their keys.

Generation dtype: the first three shards were generated in float32 (batch 16,
``max_new_tokens`` 128). The later shards override this per shard (``ShardSpec``): answers are
generated in bfloat16 with batch 64 and up to 160 new tokens, which measured ~3.6x faster on this
AMX CPU (60 -> 218 generated tokens/s on one thread) -- the serving engine may run the base model in
bf16 too, so bf16 greedy answers are realistic targets. The teacher-forced features are still
computed in float32 for every shard (the held-out ``eval`` shard stays float32 throughout), so the
heads always read exact float32 base features. Tensors per shard:

* ``tokens``  int64 [N]       all sequences concatenated (prompt + answer)
* ``hidden``  float16 [N, H]  final hidden state at each token
* ``offsets`` int64 [S + 1]   sequence s is ``[offsets[s], offsets[s+1])``
* ``prompt_lens`` int64 [S]   answer of sequence s starts at ``offsets[s] + prompt_lens[s]``
* ``kinds``   int64 [S]       0 chat, 1 code

A refresh's data (:mod:`pipeline.heads.refresh`: self-distilled answers with ``teacher=True``, or
teacher-forced text, :mod:`pipeline.heads.fixed_text`) also carries the target's own next-token
distribution at every position (:mod:`pipeline.heads.teacher`), the heads' training labels:

* ``teacher_ids``   int64 [N, K]    the target's top-K next tokens at each position, best first
* ``teacher_probs`` float16 [N, K]  their probabilities (full-vocabulary softmax)
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline.heads.prompts import PROMPTS_DIR, load_prompts
from pipeline.heads.teacher import teacher_forced, teacher_forced_states
from pipeline.progress import step_progress

DATA_VERSION = 1
KINDS = ("chat", "code")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class DataSettings:
    max_new_tokens: int = 128
    gen_batch: int = 16
    feature_batch: int = 8
    max_train_per_kind: int | None = None  # None: every training prompt


@dataclass
class SeqData:
    """One split of the cache (see the module docstring)."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    offsets: torch.Tensor
    prompt_lens: torch.Tensor
    kinds: torch.Tensor
    teacher_ids: torch.Tensor | None = None
    teacher_probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.prompt_lens.numel())

    def seq(self, s: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.tokens[a:b], self.hidden[a:b], int(self.prompt_lens[s])

    def teacher(self, s: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(ids [T, K], probs [T, K]) of sequence s: the target's next-token distribution; None without one."""
        if self.teacher_ids is None or self.teacher_probs is None:
            return None
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.teacher_ids[a:b], self.teacher_probs[a:b]

    def teacher_mass(self) -> float | None:
        """The mean probability the kept teacher tokens hold per position; None without a teacher."""
        if self.teacher_probs is None or not len(self.teacher_probs):
            return None
        return round(float(self.teacher_probs.float().sum(-1).mean()), 4)

    def next_labels(self, s: int) -> torch.Tensor:
        """[T]: the target's greedy token after each position of sequence s (the last one repeats).

        With a teacher, its top-1; else the data's next token (self-distilled answers are the target's greedy
        tokens)."""
        teacher = self.teacher(s)
        if teacher is not None:
            return teacher[0][:, 0]
        tokens = self.seq(s)[0]
        return torch.cat([tokens[1:], tokens[-1:]]) if len(tokens) else tokens

    def subset(self, keep: list[int]) -> SeqData:
        """The sequences ``keep`` in that order, teacher included."""
        parts = [self.seq(s) for s in keep]
        teachers = [t for t in (self.teacher(s) for s in keep) if t is not None]
        return SeqData.from_sequences(
            [p[0] for p in parts],
            [p[1] for p in parts],
            [p[2] for p in parts],
            [int(self.kinds[s]) for s in keep],
            teachers=teachers if self.teacher_ids is not None else None,
        )

    def select(self, kind: str) -> SeqData:
        return self.subset([s for s in range(len(self)) if int(self.kinds[s]) == KINDS.index(kind)])

    @staticmethod
    def from_sequences(
        tokens: list[torch.Tensor],
        hidden: list[torch.Tensor],
        prompt_lens: list[int],
        kinds: list[int],
        teachers: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> SeqData:
        lengths = torch.tensor([0] + [len(t) for t in tokens], dtype=torch.int64)
        width = hidden[0].shape[-1] if hidden else 0
        ids = probs = None
        if teachers is not None:
            k = teachers[0][0].shape[-1] if teachers else 0
            ids = torch.cat([t[0] for t in teachers]).long() if teachers else torch.zeros(0, k, dtype=torch.int64)
            probs = torch.cat([t[1] for t in teachers]).half() if teachers else torch.zeros(0, k, dtype=torch.float16)
        return SeqData(
            tokens=torch.cat(tokens).long() if tokens else torch.zeros(0, dtype=torch.int64),
            hidden=torch.cat(hidden).half() if hidden else torch.zeros(0, width, dtype=torch.float16),
            offsets=torch.cumsum(lengths, 0),
            prompt_lens=torch.tensor(prompt_lens, dtype=torch.int64),
            kinds=torch.tensor(kinds, dtype=torch.int64),
            teacher_ids=ids,
            teacher_probs=probs,
        )

    def save(self, path: Path) -> None:
        tensors = {
            "tokens": self.tokens,
            "hidden": self.hidden.contiguous(),
            "offsets": self.offsets,
            "prompt_lens": self.prompt_lens,
            "kinds": self.kinds,
        }
        if self.teacher_ids is not None and self.teacher_probs is not None:
            tensors.update(teacher_ids=self.teacher_ids.contiguous(), teacher_probs=self.teacher_probs.contiguous())
        save_file(tensors, str(path))

    @staticmethod
    def load(path: Path) -> SeqData:
        t = load_file(str(path))
        return SeqData(
            t["tokens"],
            t["hidden"],
            t["offsets"],
            t["prompt_lens"],
            t["kinds"],
            t.get("teacher_ids"),
            t.get("teacher_probs"),
        )


@dataclass(frozen=True)
class ShardSpec:
    """Per-shard generation overrides (None: the ``DataSettings`` value); part of the shard's key."""

    max_new_tokens: int | None = None
    gen_batch: int | None = None
    gen_dtype: str = "float32"  # answers only; features are always float32

    def apply(self, settings: DataSettings) -> DataSettings:
        return DataSettings(
            max_new_tokens=self.max_new_tokens or settings.max_new_tokens,
            gen_batch=self.gen_batch or settings.gen_batch,
            feature_batch=settings.feature_batch,
            max_train_per_kind=settings.max_train_per_kind,
        )


SHARDS: dict[str, tuple[tuple[str, str], ...]] = {
    "eval": (("chat", "eval"), ("code", "eval")),
    "train": (("chat", "train"), ("code", "train")),
    "train_extra": (("chat", "train_extra"),),
    "train_chat_more": (("chat", "train_more"),),
    "train_code_extra": (("code", "train_extra"),),
}
BF16_GEN = ShardSpec(max_new_tokens=160, gen_batch=64, gen_dtype="bfloat16")
SHARD_SPECS: dict[str, ShardSpec] = {"train_chat_more": BF16_GEN, "train_code_extra": BF16_GEN}
TRAIN_SHARDS = ("train", "train_extra", "train_chat_more", "train_code_extra")


def cache_key(base_dir: Path, settings: DataSettings, shard: str, prompts_dir: Path = PROMPTS_DIR) -> str:
    spec = SHARD_SPECS.get(shard)
    digest = hashlib.sha256(f"v{DATA_VERSION}|{settings}|{shard}".encode() + (f"|{spec}".encode() if spec else b""))
    for name in ("config.json", ".specdeploy-embedded.json"):
        if (base_dir / name).exists():
            digest.update((base_dir / name).read_bytes())
    for kind, part in SHARDS[shard]:
        digest.update((prompts_dir / f"{kind}_{part}.jsonl").read_bytes())
    return digest.hexdigest()[:16]


def load_base(base_dir: Path):
    """(model, tokenizer) in float32, eval mode, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32, local_files_only=True)
    return model.eval(), tokenizer


def encode_prompt(tokenizer, kind: str, prompt: str) -> list[int]:
    """Token ids the serving stack would feed: chat via the chat template, code as raw text."""
    if kind == "chat":
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(prompt, add_special_tokens=False).input_ids


def stop_ids(tokenizer) -> list[int]:
    """``<|im_end|>`` (chat) and ``<|endoftext|>`` (what the model emits after raw text)."""
    ids = {tokenizer.eos_token_id}
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def greedy_answers(
    model, prompts: list[list[int]], *, max_new_tokens: int, batch: int, pad_id: int, stops: list[int], say: Progress
) -> list[list[int]]:
    """Greedy continuation of each prompt (batched, left padded, KV cache), stop token kept."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    start = time.monotonic()
    with step_progress(f"self-distillation: {len(prompts)} answers", len(prompts)) as advance:
        for first in range(0, len(order), batch):
            chunk = order[first : first + batch]
            width = max(len(prompts[i]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                mask[row, width - len(prompts[i]) :] = 1
            out = model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=stops,
            )
            for row, i in enumerate(chunk):
                answer = out[row, width:].cpu().tolist()
                for cut, token in enumerate(answer):
                    if token in stops:
                        answer = answer[: cut + 1]
                        break
                answers[i] = answer
            done = first + len(chunk)
            advance(len(chunk))
            say(f"  generated {done}/{len(prompts)} answers ({time.monotonic() - start:.0f} s)")
    return answers


@torch.no_grad()
def final_hidden_states(model, sequences: list[list[int]], *, batch: int) -> list[torch.Tensor]:
    """Teacher-forced last hidden state (after the final norm) of each sequence, right padded."""
    hidden: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for i, states in teacher_forced_states(model, sequences, batch=batch):
        hidden[i] = states.to("cpu", torch.float16)
    return hidden


def build_split(
    model,
    tokenizer,
    records: list[tuple[str, dict]],
    settings: DataSettings,
    say: Progress,
    gen_dtype: str = "float32",
    teacher: bool = False,
) -> SeqData:
    """Greedy answers to ``records``, then their features; with ``teacher``, also the target's top-k
    next-token distribution at every position (:mod:`pipeline.heads.teacher`), from the same pass."""
    prompts = [encode_prompt(tokenizer, kind, r["prompt"]) for kind, r in records]
    # A cast copy: casting ``model`` in place and back would round its float32 weights.
    generator = model if gen_dtype == "float32" else copy.deepcopy(model).to(getattr(torch, gen_dtype))
    answers = greedy_answers(
        generator,
        prompts,
        max_new_tokens=settings.max_new_tokens,
        batch=settings.gen_batch,
        pad_id=tokenizer.pad_token_id,
        stops=stop_ids(tokenizer),
        say=say,
    )
    del generator
    sequences = [p + a for p, a in zip(prompts, answers)]
    say(f"  sample answer: {tokenizer.decode(answers[0])[:200]!r}")
    start = time.monotonic()
    teachers = None
    if teacher:
        hidden, teachers = teacher_forced(model, sequences, batch=settings.feature_batch)
    else:
        hidden = final_hidden_states(model, sequences, batch=settings.feature_batch)
    say(f"  features for {len(sequences)} sequences ({time.monotonic() - start:.0f} s)")
    return SeqData.from_sequences(
        [torch.tensor(s) for s in sequences],
        hidden,
        [len(p) for p in prompts],
        [KINDS.index(kind) for kind, _ in records],
        teachers,
    )


def _records(shard: str, settings: DataSettings) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for kind, part in SHARDS[shard]:
        records = load_prompts(kind, part)
        if shard in TRAIN_SHARDS and settings.max_train_per_kind is not None:
            records = records[: settings.max_train_per_kind]
        out.extend((kind, r) for r in records)
    return out


def concat(parts: list[SeqData]) -> SeqData:
    seqs = [p.seq(s) for p in parts for s in range(len(p))]
    kinds = [int(k) for p in parts for k in p.kinds]
    return SeqData.from_sequences([q[0] for q in seqs], [q[1] for q in seqs], [q[2] for q in seqs], kinds)


def prepare_data(
    base_dir: Path, cache_dir: Path, settings: DataSettings = DataSettings(), say: Progress = print
) -> tuple[SeqData, SeqData, dict]:
    """(train, eval, meta) from the cache, generating missing shards first."""
    folder = Path(cache_dir) / "heads-data"
    folder.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, SeqData] = {}
    meta: dict = {"data_version": DATA_VERSION, "settings": asdict(settings), "shards": {}}
    base = None
    for shard in ("eval", *TRAIN_SHARDS):
        stem = folder / f"{shard}-{cache_key(base_dir, settings, shard)}"
        if stem.with_suffix(".json").exists():
            say(f"self-distillation data: reusing {stem}.safetensors")
            loaded[shard] = SeqData.load(stem.with_suffix(".safetensors"))
            meta["shards"][shard] = json.loads(stem.with_suffix(".json").read_text())
            continue
        base = base or load_base(base_dir)
        records = _records(shard, settings)
        say(f"self-distillation data: {shard}, {len(records)} prompts")
        start = time.monotonic()
        spec = SHARD_SPECS.get(shard, ShardSpec())
        data = build_split(base[0], base[1], records, spec.apply(settings), say, gen_dtype=spec.gen_dtype)
        data.save(stem.with_suffix(".safetensors"))
        info = {
            "sequences": len(data),
            "tokens": int(data.tokens.numel()),
            "generation": asdict(spec),
            "answer_tokens": int(data.tokens.numel() - data.prompt_lens.sum()),
            "seconds": round(time.monotonic() - start, 1),
        }
        stem.with_suffix(".json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")  # marks it complete
        loaded[shard], meta["shards"][shard] = data, info
    return concat([loaded[s] for s in TRAIN_SHARDS]), loaded["eval"], meta
