"""The Hugging Face checkpoint a runtime loads as it is (TensorRT-LLM's LLM API): checked, then copied.

The PyTorch backend reads ``config.json``, the safetensors shards (and their index), ModelOpt's
``hf_quant_config.json`` for an FP8 export, ``generation_config.json`` and the tokenizer; those files
are copied into the output (``shutil.copyfile``: the kernel's copy_file_range, a reflink where the file
system has them), so the deployment's volume holds the model beside its configuration whatever the
source folder was. Not hard links: a link changes the source's ctime, which the stages' fingerprints
read, so every later run would see its inputs changed. The checkpoint is opened as the
merge and convert stages open one first (every shard's header against the index, FP8 scales next to
their weights), so a broken folder is refused here, with the file named, not by the GPU server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.checkpoint.hf_reader import open_hf_checkpoint
from pipeline.llm_api.deployment import DRAFTER_FOLDER
from pipeline.quantize.hf import TOKENIZER_FILES

MODEL_FILES = ("config.json", "generation_config.json", "hf_quant_config.json", "model.safetensors.index.json")


def place_checkpoint(model: Path, tokenizer: Path, out: Path, drafter: Path | None = None) -> tuple[int, int]:
    """Check ``model`` and place its files (and ``tokenizer``'s tokenizer files it lacks) in ``out``, and
    an EAGLE-3 ``drafter`` folder's config.json and safetensors in ``out/DRAFTER_FOLDER`` (the planner
    read it: pipeline/methods/eagle3_reader.py); returns (files placed, bytes)."""
    checkpoint = open_hf_checkpoint(model)
    try:
        shards = [f.path for f in checkpoint.files]
    finally:
        checkpoint.close()
    names = [n for n in MODEL_FILES if (model / n).is_file()] + [s.name for s in shards]
    placed = [(model / n, out / n) for n in names]
    for name in TOKENIZER_FILES:
        if (model / name).is_file():
            placed.append((model / name, out / name))
        elif (tokenizer / name).is_file():
            placed.append((tokenizer / name, out / name))
    if drafter is not None:
        (out / DRAFTER_FOLDER).mkdir()
        files = ["config.json", *sorted(p.name for p in drafter.glob("*.safetensors")), "model.safetensors.index.json"]
        placed += [(drafter / n, out / DRAFTER_FOLDER / n) for n in dict.fromkeys(files) if (drafter / n).is_file()]
    for source, target in placed:
        shutil.copyfile(source, target)
    return len(placed), sum(source.stat().st_size for source, _ in placed)
