"""Split rules against a literal transcription of TensorRT-LLM's (dup_kv_weight + torch.chunk, pad, tensor_split)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.checkpoint.sharding import (
    check_heads,
    chunk,
    kv_heads_per_rank,
    padded_vocab,
    pp_layers,
    qkv_rows,
    vocab_rows,
)
from pipeline.errors import InputError


def trtllm_qkv(q, k, v, num_heads, num_kv_heads, head_dim, tp, rank):
    """TRT-LLM convert.py: replicate KV heads when fewer than tp, chunk q/k/v on dim 0, concat."""
    if num_kv_heads < tp:
        reps = tp // num_kv_heads

        def dup(w):
            return (
                w.reshape(num_kv_heads, head_dim, -1)[:, None]
                .expand(num_kv_heads, reps, head_dim, w.shape[1])
                .reshape(num_kv_heads * reps * head_dim, -1)
            )

        k, v = dup(k), dup(v)
    return torch.cat([torch.chunk(w, tp, dim=0)[rank] for w in (q, k, v)])


@st.composite
def attention_shapes(draw):
    tp = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    kv = draw(st.sampled_from([d for d in (1, 2, 3, 4, 6, 8, 12) if (d % tp == 0 if d >= tp else tp % d == 0)]))
    group = draw(st.integers(1, 4))
    heads = kv * group
    if heads % tp:
        heads = kv * tp  # keep heads divisible by tp (a multiple of kv)
    head_dim = draw(st.sampled_from([2, 4, 8]))
    return heads, kv, head_dim, tp


@settings(max_examples=150, deadline=None)
@given(attention_shapes(), st.data())
def test_qkv_rows_match_trtllm(shape, data):
    heads, kv, d, tp = shape
    rank = data.draw(st.integers(0, tp - 1))
    H = 8
    q = torch.randn(heads * d, H)
    k = torch.randn(kv * d, H)
    v = torch.randn(kv * d, H)
    check_heads(heads, kv, tp, "cfg")
    (q0, q1), (k0, k1) = qkv_rows(heads, kv, d, tp, rank)
    ours = torch.cat([q[q0:q1], k[k0:k1], v[k0:k1]])
    assert torch.equal(ours, trtllm_qkv(q, k, v, heads, kv, d, tp, rank))
    assert ours.shape[0] == (heads // tp + 2 * kv_heads_per_rank(kv, tp)) * d


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 8), st.data())
def test_vocab_padding_matches_pad_vocab_size(vocab, tp, data):
    rank = data.draw(st.integers(0, tp - 1))
    table = torch.arange(vocab, dtype=torch.float32)[:, None]
    padded = padded_vocab(vocab, tp)
    assert padded % tp == 0 and vocab <= padded < vocab + tp
    full = torch.cat([table, torch.zeros(padded - vocab, 1)])
    (a, b), pad = vocab_rows(vocab, tp, rank)
    ours = torch.cat([table[a:b], torch.zeros(pad, 1)])
    assert torch.equal(ours, torch.chunk(full, tp)[rank])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 80), st.integers(1, 8))
def test_pp_layers_match_tensor_split(layers, pp):
    if pp > layers:
        return
    want = [t.tolist() for t in torch.tensor_split(torch.arange(layers), pp)]
    assert [list(pp_layers(layers, pp, r)) for r in range(pp)] == want


def test_row_parallel_chunk_and_errors():
    w = torch.arange(24.0).reshape(2, 12)
    for r in range(3):
        a, b = chunk(12, 3, r, "dense")
        assert torch.equal(w[:, a:b], torch.chunk(w, 3, dim=1)[r])
    with pytest.raises(InputError, match="size 10 is not divisible by tp=4"):
        chunk(10, 4, 0, "intermediate_size")
    with pytest.raises(InputError, match="num_key_value_heads 6 is not divisible by tp=4"):
        check_heads(12, 6, 4, "cfg")
