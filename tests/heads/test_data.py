"""Self-distillation data: batched greedy answers and cached features match unbatched runs."""

from __future__ import annotations

import torch

from pipeline.heads.data import SeqData, final_hidden_states, greedy_answers
from tests.heads.conftest import tiny_llama_model


def greedy_one(model, prompt, steps, stops):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token in stops:
                break
    return ids[len(prompt) :]


def test_batched_greedy_and_features_match_unbatched():
    model = tiny_llama_model()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    answers = greedy_answers(model, prompts, max_new_tokens=6, batch=3, pad_id=2, stops=[2], say=lambda _: None)
    for prompt, answer in zip(prompts, answers):
        assert answer == greedy_one(model, prompt, 6, [2])
    sequences = [p + a for p, a in zip(prompts, answers)]
    feats = final_hidden_states(model, sequences, batch=2)
    for seq, got in zip(sequences, feats):
        with torch.no_grad():
            want = model.model(torch.tensor([seq])).last_hidden_state[0]
        assert got.dtype == torch.float16 and torch.allclose(got.float(), want, atol=2e-3)


def test_seqdata_roundtrip(tmp_path, data):
    data.save(tmp_path / "d.safetensors")
    back = SeqData.load(tmp_path / "d.safetensors")
    assert len(back) == len(data) and torch.equal(back.tokens, data.tokens)
    code = back.select("code")
    assert len(code) == len(data) // 2
    tokens, hidden, start = code.seq(0)
    assert torch.equal(tokens, data.seq(1)[0]) and start == data.seq(1)[2]
