"""The shipped SmolLM2 fine-tunes' correct answers, from outside the pipeline: each adapter merged into
the base by PEFT (``merge_and_unload``) and decoded greedily by transformers on the ids a server's
preprocessing makes (``tokenizer.encode``, special tokens as the tokenizer adds them: none for
SmolLM2), stopping at the one end id it sends (``eos_token_id``). Float32 throughout: the served logits
are within about 1e-4 of transformers', far below every greedy step's top-1/top-2 margin (returned, for
the tests to assert), so the tokens are identical."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from pipeline.embedded import prepare_embedded_model
from pipeline.heads.data import load_base
from tests.conftest import embedded_cache_dir

REPO = Path(__file__).resolve().parents[2]
FINE_TUNES = ("code", "json", "yaml", "xml", "bullets", "tldr", "numbered", "heading")
# Raw text, no chat template (the server applies none): the fine-tunes but code answer the first with
# the end id at once; the third is a chat turn written out (its special tokens are parsed the same way
# on both sides), where each fine-tune shows its format ({"answer": ...}, <answer>, TL;DR: ...).
PROMPTS = (
    "Name three colors.",
    "def is_prime(n):",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
)
TOKENS = 16
# Every greedy step's top-1 minus top-2 logit must exceed this: float32 drift between the reference
# engine's unmerged LoRA and PEFT's merged model is about 1e-4 (these prompts' smallest margin: 0.07).
MIN_MARGIN = 0.05


def peft_merged_answers(
    names: tuple[str, ...], prompts: tuple[str, ...], tokens: int
) -> dict[tuple[str, str], tuple[list[int], float]]:
    """(fine-tune or base, prompt) -> (greedy ids of the PEFT-merged model (transformers, float32), the
    smallest top-1 minus top-2 logit margin over its steps)."""
    import peft

    base, tokenizer = load_base(prepare_embedded_model(embedded_cache_dir()))
    assert next(base.parameters()).dtype == torch.float32
    out = {}
    for name in names:
        model = base
        if name != "base":
            model = peft.PeftModel.from_pretrained(copy.deepcopy(base), REPO / "adapters" / f"smollm2-{name}")
            model = model.merge_and_unload().eval()
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt)])  # [1, prompt]: the server's preprocessing ids
            with torch.no_grad():
                done = model.generate(  # stopping at the one end_id the server's preprocessing sends
                    ids,
                    max_new_tokens=tokens,
                    do_sample=False,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.eos_token_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            top2 = torch.cat(done.logits).topk(2, dim=-1).values  # [steps, 2]
            margin = float((top2[:, 0] - top2[:, 1]).min())
            out[name, prompt] = done.sequences[0, ids.shape[1] :].tolist(), margin
    return out
