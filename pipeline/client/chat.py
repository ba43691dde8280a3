"""Client-side chat formatting with the template the server's preprocessing model carries.

The ensemble takes raw text (the same API as NVIDIA's), so a chat template is applied by the
client, before sending. The package stage stores the tokenizer's template, its special tokens
and whether preprocessing adds a BOS itself in the preprocessing model's parameter
``specdeploy_chat_template`` (:func:`template_parameter`); ``query`` reads it from the running
server's model config, so the prompt is formatted for the model that is actually served,
whatever directory the command runs in. ``--repo`` reads it from a repository on disk instead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.io.files import hf_offline

TOKENIZER_IN_REPO = Path("preprocessing") / "tokenizer"
PARAMETER = "specdeploy_chat_template"


@dataclass(frozen=True)
class ChatTemplate:
    template: str
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... as HF passes them
    strip_prefix: str = ""  # a BOS the template writes and preprocessing adds again

    def render(self, prompt: str, system: str | None = None) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        specials: dict[str, Any] = dict(self.special_tokens)  # bos_token etc., as the tokenizer passes them
        result: Any = render_jinja_template(
            conversations=[messages], chat_template=self.template, add_generation_prompt=True, **specials
        )
        text = result[0][0]  # (rendered conversations, generation indices)
        if self.strip_prefix and text.startswith(self.strip_prefix):
            text = text[len(self.strip_prefix) :]
        return text

    def to_parameter(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_parameter(cls, value: str, source: str) -> ChatTemplate:
        try:
            data = json.loads(value)
            return cls(
                str(data["template"]),
                {str(k): str(v) for k, v in data.get("special_tokens", {}).items()},
                str(data.get("strip_prefix", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{source}: parameter {PARAMETER} is not a chat template ({exc})") from None


def from_tokenizer(tokenizer_dir: Path, add_special_tokens: bool = True) -> ChatTemplate | None:
    """The tokenizer's chat template, or None when it has none."""
    hf_offline()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return None
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    bos = tokenizer.bos_token
    adds_bos = (
        add_special_tokens
        and bos is not None
        and tokenizer("x", add_special_tokens=True).input_ids[:1] == [tokenizer.bos_token_id]
    )
    return ChatTemplate(template, special, bos if adds_bos else "")


def template_parameter(tokenizer_dir: Path, add_special_tokens: bool) -> dict[str, str]:
    """The preprocessing parameter to package ({} for a tokenizer without a chat template)."""
    template = from_tokenizer(tokenizer_dir, add_special_tokens)
    return {} if template is None else {PARAMETER: template.to_parameter()}


def served_template(model_config: dict, source: str) -> ChatTemplate | None:
    """From a preprocessing model config as Triton serves it (JSON form)."""
    value = (model_config.get("parameters") or {}).get(PARAMETER, {}).get("string_value")
    return None if not value else ChatTemplate.from_parameter(value, source)


def preprocessing_model(config: dict) -> str:
    """The model that tokenizes for a client-facing model (an ensemble, or the BLS model)."""
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    if steps:
        return steps[0]["model_name"]
    value = (config.get("parameters") or {}).get("specdeploy_steps", {}).get("string_value")
    try:
        return json.loads(value)[0]["model"] if value else "preprocessing"
    except (ValueError, KeyError, IndexError, TypeError):
        return "preprocessing"


def repo_template(repo: Path) -> ChatTemplate | None:
    """From a repository on disk: the packaged parameter, else (older packages) its tokenizer."""
    from google.protobuf import json_format

    from pipeline.triton import pbtxt

    config_path = Path(repo) / "preprocessing" / "config.pbtxt"
    folder = Path(repo) / TOKENIZER_IN_REPO
    if not config_path.is_file() or not folder.is_dir():
        raise InputError(
            f"{repo}: no preprocessing model with a tokenizer (not a packaged repository; run `specdeploy engine SPEC`)"
        )
    config = json_format.MessageToDict(pbtxt.load(config_path), preserving_proto_field_name=True)
    return served_template(config, str(config_path)) or from_tokenizer(folder)
