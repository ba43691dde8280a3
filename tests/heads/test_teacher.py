"""Distillation labels: teacher-forced heads learn the target's next-token distribution, not the text's tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.heads.data import SeqData
from pipeline.heads.eagle import EagleDrafter, EagleTrainConfig, train_eagle
from pipeline.heads.evaluate import evaluate_medusa
from pipeline.heads.fixed_text import fixed_text_data
from pipeline.heads.medusa import MedusaTrainConfig, train_medusa
from pipeline.heads.teacher import TEACHER_TOP_K, soft_cross_entropy
from pipeline.heads.train import split_validation
from pipeline.trees import CHAIN_3
from tests.heads.conftest import HIDDEN, TINY_DRAFTER, VOCAB, fake_data, tiny_llama_model
from tests.quantize.conftest import build_tiny_llama

LOUD = 7  # the token the synthetic teacher always predicts


def _with_teacher(data: SeqData, token: int = LOUD) -> SeqData:
    """``data`` whose teacher puts 0.9 on ``token`` everywhere (the text's tokens are random)."""
    n = data.tokens.numel()
    ids = torch.stack([torch.full((n,), token), *(torch.full((n,), 10 + i) for i in range(TEACHER_TOP_K - 1))], 1)
    probs = torch.full((n, TEACHER_TOP_K), 0.1 / (TEACHER_TOP_K - 1))
    probs[:, 0] = 0.9
    return SeqData(data.tokens, data.hidden, data.offsets, data.prompt_lens, data.kinds, ids, probs.half())


def test_fixed_text_labels_are_the_targets_top_k(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_llama(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("write short code python def return print function class data model text " * 6)
    data, meta = fixed_text_data(model, tokenizer, text, tokens=64, block=32, batch=2, say=lambda _: None)
    assert meta["labels"] == f"target top-{TEACHER_TOP_K}" and 0 < meta["teacher_mass"] <= 1
    tokens, _, _ = data.seq(1)
    teacher = data.teacher(1)
    assert teacher is not None
    with torch.no_grad():
        expected = model(tokens[None]).logits[0].softmax(-1).topk(TEACHER_TOP_K)
    assert torch.equal(teacher[0], expected.indices)
    torch.testing.assert_close(teacher[1].float(), expected.values, atol=1e-3, rtol=1e-2)
    assert torch.equal(data.next_labels(1), expected.indices[:, 0])  # what evaluation ranks, not tokens[1:]
    fit, valid = split_validation(data, every=2)
    assert fit.teacher(0) is not None and valid.teacher(0) is not None  # splits keep the labels
    data.save(tmp_path / "d.safetensors")
    back = SeqData.load(tmp_path / "d.safetensors")
    assert back.teacher_ids is not None and torch.equal(back.teacher_ids, data.teacher_ids)


def test_soft_cross_entropy_is_the_renormalised_expectation():
    logits = torch.randn(3, 12)
    ids = torch.tensor([[1, 4], [0, 2], [5, 11]])
    probs = torch.tensor([[0.6, 0.2], [0.5, 0.5], [1.0, 0.0]])
    log_q = F.log_softmax(logits, -1)
    expected = -sum(float(probs[r, j] / probs[r].sum() * log_q[r, ids[r, j]]) for r in range(3) for j in range(2))
    assert abs(float(soft_cross_entropy(logits, ids, probs)) - expected) < 1e-5
    table = torch.full((20,), -1, dtype=torch.long)
    table[torch.arange(12) + 8] = torch.arange(12)  # ids 8..19 are the columns 0..11
    assert abs(float(soft_cross_entropy(logits, ids + 8, probs, table)) - expected) < 1e-5


def test_medusa_learns_the_teacher_not_the_text():
    data = _with_teacher(fake_data(num_seqs=8, length=32))
    lm_head = tiny_llama_model().model.embed_tokens.weight.detach()
    cfg = MedusaTrainConfig(num_heads=2, epochs=6, batch_tokens=64, lr=3e-2, vocab_top_k=None, bf16=False)
    blocks, _ = train_medusa(data, lm_head, cfg, say=lambda _: None)
    with torch.no_grad():
        top1 = [(x @ lm_head.T).argmax(-1) for x in blocks(data.hidden.float())]
    assert all(float((t == LOUD).float().mean()) > 0.6 for t in top1)  # text labels: ~1/96 of the rows
    metrics = evaluate_medusa(blocks, lm_head, data, {"chain_3": CHAIN_3})
    assert all(m["top1_per_depth"][0] > 0.6 for m in metrics.values())  # ranked against the teacher's top-1


def test_eagle_learns_the_teacher_not_the_text():
    data = _with_teacher(fake_data(num_seqs=8, length=32))
    base = tiny_llama_model()
    embed = base.model.embed_tokens.weight.detach()
    cfg = EagleTrainConfig(
        epochs=6, batch_tokens=64, lr=1e-2, warmup_steps=1, w_cls=1.0, noise=0.0, vocab_top_k=4, bf16=False
    )
    drafter, log = train_eagle(data, embed, embed, TINY_DRAFTER, cfg, say=lambda _: None)
    assert log[-1]["step1_acc"] > 0.9 and log[-1]["step2_acc"] > 0.9  # accuracy against the teacher's top-1
    assert isinstance(drafter, EagleDrafter) and VOCAB > HIDDEN


def test_refresh_records_the_labels_and_takes_a_learning_rate(tmp_path):
    from pipeline.heads.refresh import RefreshSettings, refresh_heads

    folder = build_tiny_llama(tmp_path / "tiny", tie_word_embeddings=True)
    text = tmp_path / "text.txt"
    text.write_text("write short code python def return print function class data model text " * 12)
    settings = RefreshSettings(method="medusa", init=None, data=str(text), tokens=96, epochs=1, num_heads=2, lr=3e-3)
    manifest = refresh_heads(folder, tmp_path / "heads", settings, say=lambda _: None)
    assert manifest["train_config"]["lr"] == 3e-3
    assert manifest["data"]["labels"] == f"target top-{TEACHER_TOP_K}"
    assert "Labels (target top-10)" in (tmp_path / "heads" / "README.md").read_text()
