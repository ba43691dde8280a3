"""What the specdeploy preprocessing and postprocessing models share: reading a config parameter and
loading the model's tokenizer (a helper module of Triton Python models, not a model itself).

Copied beside each one's ``model.py`` as ``<repo>/<model>/1/specdeploy_tokenizer.py`` by the package
stage (pipeline/triton/repository.py, ``MODEL_HELPERS``): the models never import ``pipeline``, so
the repository also runs in a stock Triton + TensorRT-LLM container, and Triton's Python backend puts
a model's version folder on ``sys.path`` before it imports ``model.py`` (NVIDIA's own BLS model
imports its ``1/lib/`` the same way). The ``specdeploy_`` prefix keeps the name clear of installed
packages: that folder comes last on ``sys.path``. Imports only transformers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import overload

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub from a server
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402


@overload
def parameter(config: dict, key: str, default: str) -> str: ...
@overload
def parameter(config: dict, key: str, default: None = None) -> str | None: ...
def parameter(config: dict, key: str, default: str | None = None) -> str | None:
    """A model-config parameter; a leftover ``${...}`` template value counts as unset."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value is None or value.startswith("${") else value


def load_tokenizer(model_dir: str, config: dict):
    """The tokenizer of the ``tokenizer_dir`` parameter: relative to ``model_dir`` (the model's folder,
    ``tokenizer`` when unset) or absolute; never from a model hub."""
    folder = Path(parameter(config, "tokenizer_dir", "tokenizer"))
    if not folder.is_absolute():
        folder = Path(model_dir) / folder
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
