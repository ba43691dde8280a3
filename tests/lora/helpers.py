"""Tiny random PEFT adapters for the LoRA tests."""

from __future__ import annotations

import copy

import torch


def make_adapter(model, folder, seed, **config):
    """A random PEFT LoRA adapter of ``model`` with B large enough to change the greedy text."""
    import peft

    torch.manual_seed(seed)
    options = {"lora_alpha": 8, "init_lora_weights": False, **config}
    peft_model = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(**options)).eval()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    peft_model.save_pretrained(folder)
    return peft_model
