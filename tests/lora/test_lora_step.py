"""One step's LoRA updates (LoraStep.add) on literal cases, and the CPU probe that times them."""

from __future__ import annotations

import pytest
import torch

from pipeline.costmodel.lora import LoraLoad
from pipeline.costmodel.lora_cpu import CONTEXT, DECODED, prefilled, probe
from pipeline.runtime.model.engine import Engine, StepInput
from pipeline.runtime.model.lora import LoraStep, LoraWeights
from tests.runtime.fixtures import make_hf_model, write_engine

Q, V = 0, 2  # two module ids


def adapters(gen: torch.Generator) -> list[LoraWeights]:
    """Task 1 adapts module Q of layer 0 (rank 3), task 2 modules Q and V (rank 2); in 10, out 7."""
    shapes = {1: {(0, Q): 3}, 2: {(0, Q): 2, (0, V): 2}}
    return [
        LoraWeights(
            task,
            {key: (torch.randn(r, 10, generator=gen), torch.randn(7, r, generator=gen)) for key, r in ranks.items()},
            0,
        )
        for task, ranks in shapes.items()
    ]


def test_each_row_gets_its_own_adapters_update():
    gen = torch.Generator().manual_seed(0)
    one, two = adapters(gen)
    # items: [two] [base] [two, two: a prompt of 2 rows] [one] [base]; rows 0, 1, 2-3, 4, 5
    items = [two, None, two, one, None]
    spans = [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6)]
    x, y = torch.randn(6, 10, generator=gen), torch.randn(6, 7, generator=gen)
    row_adapter = [two, None, two, two, one, None]

    def dense(module_id: int) -> torch.Tensor:  # y_i + x_i A^T B^T with row i's adapter, row by row
        rows = []
        for i, adapter in enumerate(row_adapter):
            pair = None if adapter is None else adapter.modules.get((0, module_id))
            rows.append(y[i] if pair is None else y[i] + x[i] @ pair[0].T @ pair[1].T)
        return torch.stack(rows)

    step = LoraStep(items, spans)
    for module_id in (Q, V):
        got = y.clone()
        assert step.add(got, 0, module_id, x) is got  # in place
        torch.testing.assert_close(got, dense(module_id))


def test_an_update_lands_in_a_column_view_of_the_fused_output():
    # q's update goes into columns 0..6 of a [T, 7 + 3] qkv output, the other columns untouched.
    gen = torch.Generator().manual_seed(1)
    one, _ = adapters(gen)
    x, qkv = torch.randn(2, 10, generator=gen), torch.randn(2, 10, generator=gen)
    expected = qkv.clone()
    expected[:, :7] += x @ one.modules[0, Q][0].T @ one.modules[0, Q][1].T
    LoraStep([one, one], [(0, 1), (1, 2)]).add(qkv.split([7, 3], dim=-1)[0], 0, Q, x)
    torch.testing.assert_close(qkv, expected)


def test_a_module_no_adapter_adapts_is_left_alone():
    gen = torch.Generator().manual_seed(2)
    one, _ = adapters(gen)
    step = LoraStep([one, None], [(0, 1), (1, 2)])
    assert step.module_ids == {Q}
    y = torch.randn(2, 7, generator=gen)
    before = y.clone()
    step.add(y, 0, V, torch.randn(2, 10, generator=gen))
    assert torch.equal(y, before)


LORA_BUILD = {
    "plugin_config": {"tokens_per_block": 32, "paged_kv_cache": True, "lora_plugin": "float32"},
    "lora_config": {"max_lora_rank": 4, "lora_target_modules": ["attn_q", "attn_v", "mlp_4h_to_h"]},
}


@pytest.fixture(scope="module")
def lora_engine(module_tmp) -> Engine:
    root = module_tmp("probe")
    return Engine.load(write_engine(make_hf_model(root / "hf"), root / "engine", **LORA_BUILD))


def test_the_probe_times_every_target_module_in_the_engines_passes(lora_engine):
    modules = ("q_proj", "v_proj", "down_proj")
    profile = probe(lora_engine, LoraLoad(4, modules), repeats=1, rows=(1, 2))
    for table in (profile.whole, profile.first, profile.next):
        assert set(table) == set(modules)
        assert all(set(by_rows) == {1, 2} and min(by_rows.values()) >= 0 for by_rows in table.values())
    assert min(profile.whole["q_proj"].values()) > 0
    assert lora_engine.lora_step is LoraStep  # the engine's own step is back


def test_the_probes_requests_are_copies_of_one_prefill_each_its_own(lora_engine):
    caches = prefilled(lora_engine, 3, steps=2)
    assert [c.length for c in caches] == [CONTEXT] * 3
    # one prefill copied: equal committed tokens (the room after them is uninitialised memory, which
    # may hold NaN bit patterns), separate storage
    committed = [c.keys[0][0][:, :CONTEXT] for c in caches]  # [kv_heads, CONTEXT, head_size]
    assert all(torch.equal(k, committed[0]) for k in committed)
    assert len({c.keys[0][0].data_ptr() for c in caches}) == 3
    # each decodes its two passes on its own; a request prefilled alone gives the same logits
    alone = lora_engine.new_cache(CONTEXT + 2)
    lora_engine.forward([StepInput(alone, list(range(1, 1 + CONTEXT)))])
    for _ in range(2):
        rows = lora_engine.forward([StepInput(c, [DECODED]) for c in (*caches, alone)])
    assert [c.length for c in caches] == [CONTEXT + 2] * 3
    assert all(torch.allclose(r.logits, rows[-1].logits, atol=1e-5) for r in rows[:-1])
