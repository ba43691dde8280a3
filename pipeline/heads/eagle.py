"""EAGLE-1 drafter (the format TensorRT-LLM 1.2's EagleForCausalLM takes), trained on cached features.

Convention (the converter and the reference runtime follow it):

* Feature f_t = the base model's last hidden state at position t AFTER the final RMSNorm (what
  ``lm_head`` sees). This matches the EAGLE reference code, which takes
  ``hidden_states[-1]`` of the HF base model (post-norm), and TensorRT-LLM, which feeds the
  base model's final hidden states to EagleNet.
* Drafter input at position t: concat[embed(token_{t+1}), f_t] (embedding FIRST) -> ``fc``
  (2H -> H, with bias) -> one Llama decoder layer WITHOUT input_layernorm (attention with
  RoPE theta 100000, GQA 9/3 heads, residual, post_attention_layernorm, SwiGLU MLP, residual)
  -> f'_{t+1}, the predicted next feature. Token logits = base lm_head(f'_{t+1}), no extra norm.
* Drafting is autoregressive in feature space: the next input is
  concat[embed(drafted token_{t+2}), f'_{t+1}] at position t+1, attending to the drafter's keys
  of the accepted prefix (computed from true features) plus its own draft path.
* The embedding is the base model's (frozen, not shipped: no ``embed_tokens.weight`` in the
  export; the converter falls back to the base embedding). lm_head = base lm_head (tied).

Losses (EAGLE paper): smooth-L1 regression of f' against the true next feature
+ ``w_cls`` x cross-entropy of lm_head(f') against the target's next token: against its distribution
when the data carries one (teacher-forced text, :mod:`pipeline.heads.teacher`, EAGLE's soft label), else
against the data's next token (self-distilled data is the target's own greedy output, so that token is
its argmax), with uniform noise
U(-a, a), a = ``noise`` x RMS of the features, added to the input features. Beyond EAGLE-1,
``unroll`` > 1 also trains draft steps 2.. on the drafter's own predicted features (the
"training-time test" of HASS/EAGLE-3) with the exact attention pattern of drafting: true-prefix
keys plus the keys of the path's earlier draft steps. The exported format is plain EAGLE-1.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.geometry import ModelGeometry
from pipeline.heads.data import SeqData
from pipeline.heads.teacher import soft_cross_entropy
from pipeline.heads.vocab import loss_lm_head
from pipeline.progress import step_progress

Progress = Callable[[str], None]


def drafter_llama_config(c: ModelGeometry, dtype: str) -> dict:
    """The drafter's LlamaConfig (config.json of the EAGLE-1 folder): one decoder layer of the base's shape."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.norm_epsilon,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # as transformers: normalise in float32, scale in the input dtype
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF Llama (GPT-NeoX, rotate-half) RoPE. x [..., T, d], positions [T] or broadcastable [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.float().unsqueeze(-1) * inv
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c: ModelGeometry):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> q [B, nh, T, d], k and v [B, nh, T, d] (KV heads repeated for GQA)."""
        c, (B, T, _) = self.c, x.shape
        q = self.q_proj(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        group = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def out(self, ctx: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = ctx.shape
        return self.o_proj(ctx.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: ModelGeometry):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Llama decoder layer 0 of an EAGLE-1 drafter: no input_layernorm."""

    def __init__(self, c: ModelGeometry):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_epsilon)

    def finish(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Residual around attention (ctx = attention context), then the MLP block."""
        x = x + self.self_attn.out(ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    extra: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
) -> torch.Tensor:
    """Softmax attention of q [B,h,T,d] over k/v [B,h,S,d] where ``allowed`` [B or 1,1,T,S] is True,
    plus per-row extra keys: each (k_m, v_m) [B,h,T,d] is one more key for row t only."""
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    if extra:
        diag = torch.stack([(q * km).sum(-1) * scale for km, _ in extra], -1)  # [B,h,T,m]
        probs = torch.cat([scores, diag], -1).softmax(-1)
        S = k.shape[2]
        ctx = probs[..., :S] @ v
        for m, (_, vm) in enumerate(extra):
            ctx = ctx + probs[..., S + m : S + m + 1] * vm
        return ctx
    return scores.softmax(-1) @ v


class EagleDrafter(nn.Module):
    """fc + one decoder layer; state-dict keys are the EAGLE-1 names (``fc.*``, ``layers.0.*``)."""

    def __init__(self, c: ModelGeometry):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=True)
        self.layers = nn.ModuleList([DecoderLayer(c)])

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([embeds, features], dim=-1))

    def export_state(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}

    def unrolled(
        self, embed: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, valid: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Teacher-forced drafting for every anchor at once.

        tokens [B, T], feats [B, T, H] (true features), valid [B, T] (real, non-pad tokens).
        Row j of step s (1-based) predicts f_{j+s}: step 1 reads (token_{j+1}, f_j) at position j;
        step s > 1 reads (token_{j+s}, step s-1's prediction) at position j+s-1 and attends to the
        true-prefix keys of positions <= j plus its own path's keys of steps 2..s.
        Returns one [B, T, H] prediction per step (rows past the sequence are garbage; mask them).
        """
        layer: DecoderLayer = self.layers[0]  # type: ignore[assignment]
        attn = layer.self_attn
        B, T = tokens.shape
        rows = torch.arange(T)
        causal = (rows[None, :] <= rows[:, None])[None, None] & valid[:, None, None, :]

        def token_at(shift: int) -> torch.Tensor:  # token_{j+shift} for each row j (clamped past the end)
            return tokens.gather(1, (rows + shift).clamp(max=T - 1).expand(B, T))

        x = self.inputs(embed[token_at(1)], feats)
        q, k1, v1 = attn.qkv(x, rows)
        out = layer.finish(x, attend(q, k1, v1, causal))
        preds, extra = [out], []
        for s in range(2, steps + 1):
            x = self.inputs(embed[token_at(s)], out)
            q, k, v = attn.qkv(x, rows + (s - 1))
            extra.append((k, v))
            out = layer.finish(x, attend(q, k1, v1, causal, extra))
            preds.append(out)
        return preds


@dataclass(frozen=True)
class EagleTrainConfig:
    # Still improving after 3 passes at 2048 tokens per batch; 512 tokens per batch reached the same
    # validation score in 2 passes (4x the optimizer steps for the same work), so: 6 x 512.
    epochs: int = 6
    batch_tokens: int = 512
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    w_cls: float = 0.1
    noise: float = 0.05  # uniform noise amplitude, relative to the feature RMS
    unroll: int = 2  # draft steps trained per anchor (1 = plain EAGLE-1)
    step_decay: float = 0.8
    grad_clip: float = 0.5
    vocab_top_k: int | None = 10  # softmax over data tokens + base top-k (pipeline/heads/vocab.py); None: all
    bf16: bool = True  # bfloat16 autocast for the matmuls (AMX); the weights stay float32
    seed: int = 0


def _batches(data: SeqData, batch_tokens: int, gen: torch.Generator) -> list[list[int]]:
    """Sequences grouped by length (little padding), the groups in a seeded random order."""
    order = sorted(range(len(data)), key=lambda s: int(data.offsets[s + 1] - data.offsets[s]))
    groups: list[list[int]] = []
    current: list[int] = []
    width = 0
    for s in order:
        length = int(data.offsets[s + 1] - data.offsets[s])
        if current and max(width, length) * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, width = [], 0
        current.append(s)
        width = max(width, length)
    if current:
        groups.append(current)
    return [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]


def pad_batch(data: SeqData, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B,T], feats [B,T,H] float32, valid [B,T], answer_start [B] for the given sequences."""
    parts = [data.seq(s) for s in seqs]
    T = max(len(p[0]) for p in parts)
    H = parts[0][1].shape[1]
    tokens = torch.zeros(len(parts), T, dtype=torch.long)
    feats = torch.zeros(len(parts), T, H)
    valid = torch.zeros(len(parts), T, dtype=torch.bool)
    for b, (tk, hd, _) in enumerate(parts):
        tokens[b, : len(tk)], feats[b, : len(tk)], valid[b, : len(tk)] = tk, hd.float(), True
    return tokens, feats, valid, torch.tensor([p[2] for p in parts])


def pad_teacher(data: SeqData, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The teacher of :func:`pad_batch`'s batch: ids [B,T,K] and probs [B,T,K] (zero past the end); None
    when the data has none."""
    teachers = [data.teacher(s) for s in seqs]
    if any(t is None for t in teachers):
        return None
    pairs = [t for t in teachers if t is not None]
    T, K = max(len(p[0]) for p in pairs), pairs[0][0].shape[1]
    ids = torch.zeros(len(pairs), T, K, dtype=torch.long)
    probs = torch.zeros(len(pairs), T, K)
    for b, (i, p) in enumerate(pairs):
        ids[b, : len(i)], probs[b, : len(i)] = i, p.float()
    return ids, probs


def step_targets(
    tokens: torch.Tensor, valid: torch.Tensor, start: torch.Tensor, s: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For draft step s: (target feature index [B,T], target token [B,T], mask [B,T]).

    Row j predicts feature j+s and token j+s+1; only answer tokens (index >= start) count.
    """
    B, T = tokens.shape
    rows = torch.arange(T).expand(B, T)
    feat_idx = (rows + s).clamp(max=T - 1)
    tok_idx = (rows + s + 1).clamp(max=T - 1)
    lengths = valid.sum(1, keepdim=True)
    mask = (rows + s + 1 < lengths) & (rows + s + 1 >= start[:, None])
    return feat_idx, tokens.gather(1, tok_idx), mask


def eagle_loss(
    drafter: EagleDrafter,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    batch,
    cfg: EagleTrainConfig,
    noise_amp: float,
    gen: torch.Generator | None,
    table: torch.Tensor | None = None,
    teacher: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[dict]]:
    """Loss of one padded batch; ``lm_head`` may be a vocabulary subset, ``table`` maps ids into it.

    ``teacher`` (:func:`pad_teacher`): the target's next-token distribution at each position, the label of
    the row predicting that token (soft cross-entropy); None: the data's next token (hard label).
    """
    tokens, feats, valid, start = batch
    noisy = feats
    if noise_amp > 0 and gen is not None:
        noisy = feats + (torch.rand(feats.shape, generator=gen) * 2 - 1) * noise_amp
    preds = drafter.unrolled(embed, tokens, noisy, valid, cfg.unroll)
    total, stats = torch.zeros(()), []
    for s, pred in enumerate(preds, start=1):
        feat_idx, target_tok, mask = step_targets(tokens, valid, start, s)
        n = mask.sum().clamp(min=1)
        target = feats.gather(1, feat_idx[..., None].expand_as(feats))
        reg = (F.smooth_l1_loss(pred, target, reduction="none").mean(-1) * mask).sum() / n
        logits = (pred[mask] @ lm_head.T).float()  # cross-entropy wants float32; argmax is 2x faster on it too
        if teacher is None:
            labels = target_tok[mask] if table is None else table[target_tok[mask]]
            cls = F.cross_entropy(logits, labels, reduction="sum") / n
        else:  # row j predicts token j+s+1: the target's distribution at position j+s (= feat_idx)
            K = teacher[0].shape[-1]
            ids = teacher[0].gather(1, feat_idx[..., None].expand(-1, -1, K))[mask]
            probs = teacher[1].gather(1, feat_idx[..., None].expand(-1, -1, K))[mask]
            cls = soft_cross_entropy(logits, ids, probs, table) / n
            labels = ids[:, 0] if table is None else table[ids[:, 0]]
        total = total + cfg.step_decay ** (s - 1) * (reg + cfg.w_cls * cls)
        # A progress figure only: every 4th row (a full argmax costs ~5% of the step).
        acc = (logits.detach()[::4].argmax(-1) == labels[::4]).float().mean()
        stats.append({"reg": float(reg.detach()), "cls": float(cls.detach()), "acc": float(acc)})
    return total, stats


def train_eagle(
    data: SeqData,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    config: ModelGeometry,
    cfg: EagleTrainConfig,
    say: Progress = print,
    validate: Callable[[EagleDrafter], float] | None = None,
    init: EagleDrafter | None = None,
) -> tuple[EagleDrafter, list[dict]]:
    """AdamW with warmup + cosine decay; with ``validate``, the best epoch's weights are returned.

    ``init``: start from these weights (a warm start, e.g. the base model's drafter for a fine-tune).
    """
    from pipeline.heads.medusa import keep_best

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    drafter = EagleDrafter(config)
    if init is not None:
        drafter.load_state_dict(init.state_dict())
    embed = embed.detach().float()
    lm_head, table = loss_lm_head(data, lm_head, cfg.vocab_top_k, cfg.bf16)
    if table is not None:
        say(f"  eagle: softmax over {lm_head.shape[0]} of {table.numel()} tokens")
    noise_amp = cfg.noise * float(data.hidden[:100000].float().pow(2).mean().sqrt())
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    steps_per_epoch = len(_batches(data, cfg.batch_tokens, torch.Generator().manual_seed(0)))
    total = steps_per_epoch * cfg.epochs

    def lr_factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        return 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    log, best = [], None
    with step_progress(f"eagle: {cfg.epochs} epoch(s) of {steps_per_epoch} batches", total) as advance:
        for epoch in range(cfg.epochs):
            start, n = time.monotonic(), 0
            sums: list[float] | None = None
            drafter.train()
            for seqs in _batches(data, cfg.batch_tokens, gen):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                    batch, teacher = pad_batch(data, seqs), pad_teacher(data, seqs)
                    loss, stats = eagle_loss(drafter, embed, lm_head, batch, cfg, noise_amp, gen, table, teacher)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
                opt.step()
                sched.step()
                flat = [v for st in stats for v in st.values()]
                sums = flat if sums is None else [a + b for a, b in zip(sums, flat)]
                n += 1
                advance(1)
            keys = [f"step{s + 1}_{k}" for s in range(cfg.unroll) for k in ("reg", "cls", "acc")]
            entry = {
                "epoch": epoch + 1,
                **{k: round(v / n, 4) for k, v in zip(keys, sums or [])},
                "seconds": round(time.monotonic() - start, 1),
            }
            best = keep_best(drafter, validate, entry, best)
            log.append(entry)
            say(
                f"  eagle epoch {epoch + 1}/{cfg.epochs}: "
                + ", ".join(f"{k} {v}" for k, v in entry.items() if k != "epoch")
            )
    if best is not None:
        drafter.load_state_dict(best[1])
    return drafter.eval(), log


def train_config_dict(cfg: EagleTrainConfig) -> dict:
    return asdict(cfg)
