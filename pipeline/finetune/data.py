"""Training data for LoRA fine-tunes that the project writes or derives itself (no downloads).

Two tasks, each with a training set, a held-out set (loss before/after) and eval prompts
(how many greedy outputs the fine-tune changes):

* ``code``: the Python standard library's own source, as raw text in blocks of ``block`` tokens.
  Modules that the code eval prompts come from are excluded from training; every 8th remaining
  module (by a stable hash of its name) is held out for the loss. Eval prompts: code_eval.jsonl.
* format tasks (``json``, ``yaml``, ``xml``, ``bullets``, ``numbered``, ``tldr``, ``heading``): a
  format shift. The base model's own greedy answers to the chat training prompts, rewritten by the
  task's formatter (:data:`FORMATS`); the fine-tune learns to answer in that format (the kind of
  structured-output or house-style fine-tune a service ships). Held out: the same for chat_eval,
  which are also the eval prompts; the format's ``matches`` check counts the eval answers in format
  before/after. The base answers are generated once (float32), cached, and shared by every format task.

  >>> FORMATS["json"].render("Paris.")
  '{"answer": "Paris."}'
  >>> print(FORMATS["bullets"].render("It is big. It is old."))
  - It is big.
  - It is old.
  >>> FORMATS["tldr"].matches("TL;DR: Paris.")
  True

Examples are (input_ids, labels) with labels -100 where no loss is taken (the chat prompt).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import InputError
from pipeline.finetune.tasks import TASKS  # noqa: F401  (re-exported: the trainer and tests read it here)
from pipeline.heads.chat_templates import stable_rank
from pipeline.heads.data import encode_prompt, greedy_answers, stop_ids
from pipeline.heads.prompts import CODE_EXTRA_MODULES, PROMPTS_DIR, load_prompts

DATA_VERSION = 1
IGNORE = -100


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]


@dataclass(frozen=True)
class TaskData:
    train: list[Example]
    heldout: list[Example]
    eval_prompts: list[list[int]]  # token ids fed for the greedy comparison
    description: str


@dataclass(frozen=True)
class DataSettings:
    block: int = 256  # code: tokens per training block
    max_train_blocks: int = 4096
    max_heldout_blocks: int = 48
    answer_tokens: int = 96  # json: the base answers' length limit
    gen_batch: int = 32
    max_train_prompts: int | None = None  # json: None = every chat training prompt


def _module_source(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    try:
        return Path(origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def code_modules() -> tuple[list[str], list[str]]:
    """(training modules, held-out modules) of the standard library, deterministic."""
    eval_modules = {r["source"].rsplit(".", 1)[0] for r in load_prompts("code", "eval")}
    candidates = sorted(set(CODE_EXTRA_MODULES) - eval_modules)
    heldout = [m for m in candidates if int(stable_rank(m), 16) % 8 == 0]
    return [m for m in candidates if m not in heldout], heldout


def _blocks(tokenizer, modules: list[str], block: int, limit: int) -> list[Example]:
    examples: list[Example] = []
    for name in modules:
        source = _module_source(name)
        if source is None:
            continue
        ids = tokenizer(f"# {name}\n{source}", add_special_tokens=False).input_ids
        for start in range(0, len(ids) - block // 4, block):
            chunk = ids[start : start + block]
            examples.append(Example(chunk, list(chunk)))
    examples.sort(key=lambda e: stable_rank(json.dumps(e.input_ids[:16])))  # mix modules, deterministically
    return examples[:limit]


def code_task(tokenizer, settings: DataSettings) -> TaskData:
    train_modules, heldout_modules = code_modules()
    return TaskData(
        train=_blocks(tokenizer, train_modules, settings.block, settings.max_train_blocks),
        heldout=_blocks(tokenizer, heldout_modules, settings.block, settings.max_heldout_blocks),
        eval_prompts=[encode_prompt(tokenizer, "code", r["prompt"]) for r in load_prompts("code", "eval")],
        description=f"Python {len(train_modules)} stdlib modules (held out: {', '.join(heldout_modules)})",
    )


def sentences(text: str) -> list[str]:
    """The text's sentences (split after . ! ?), stripped, empty ones dropped.

    >>> sentences("One. Two!  Three")
    ['One.', 'Two!', 'Three']
    """
    return [part.strip() for part in re.split(r"(?<=[.!?])\s+", text.strip()) if part.strip()]


def json_answer(text: str) -> str:
    return json.dumps({"answer": text.strip()}, ensure_ascii=False)


def yaml_answer(text: str) -> str:
    """``answer: "..."``: a YAML mapping whose value is a double-quoted scalar (JSON string syntax is valid YAML)."""
    return "answer: " + json.dumps(text.strip(), ensure_ascii=False)


def xml_answer(text: str) -> str:
    escaped = text.strip().replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"<answer>{escaped}</answer>"


def bullets_answer(text: str) -> str:
    return "\n".join(f"- {s}" for s in sentences(text) or [text.strip()])


def numbered_answer(text: str) -> str:
    return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences(text) or [text.strip()], start=1))


def tldr_answer(text: str) -> str:
    return "TL;DR: " + (sentences(text) or [text.strip()])[0]


def heading_answer(text: str) -> str:
    return "## Answer\n\n" + text.strip()


@dataclass(frozen=True)
class Format:
    """A format task: how a base answer is rewritten, and the check that an output is in that format."""

    render: Callable[[str], str]
    matches: Callable[[str], bool]
    description: str


FORMATS: dict[str, Format] = {
    "json": Format(json_answer, lambda t: t.lstrip().startswith('{"answer":'), '{"answer": ...} JSON objects'),
    "yaml": Format(yaml_answer, lambda t: t.lstrip().startswith('answer: "'), 'YAML mappings answer: "..."'),
    "xml": Format(xml_answer, lambda t: t.lstrip().startswith("<answer>"), "<answer>...</answer> XML elements"),
    "bullets": Format(
        bullets_answer, lambda t: t.lstrip().startswith("- "), "markdown bullet lists, one sentence per bullet"
    ),
    "numbered": Format(
        numbered_answer, lambda t: t.lstrip().startswith("1. "), "numbered lists, one sentence per item"
    ),
    "tldr": Format(tldr_answer, lambda t: t.lstrip().startswith("TL;DR: "), 'one sentence "TL;DR: ..." answers'),
    "heading": Format(
        heading_answer, lambda t: t.lstrip().startswith("## Answer"), 'markdown under a "## Answer" heading'
    ),
}


def _format_examples(
    tokenizer, render: Callable[[str], str], prompts: list[list[int]], answers: list[list[int]]
) -> list[Example]:
    stops = set(stop_ids(tokenizer))
    end = tokenizer.eos_token_id
    examples = []
    for prompt, answer in zip(prompts, answers):
        text = tokenizer.decode([t for t in answer if t not in stops], skip_special_tokens=True)
        target = tokenizer(render(text), add_special_tokens=False).input_ids + [end]
        examples.append(Example(prompt + target, [IGNORE] * len(prompt) + target))
    return examples


def _answers_cache(cache: Path, base_dir: Path, part: str, settings: DataSettings) -> Path:
    digest = hashlib.sha256()
    digest.update((base_dir / "config.json").read_bytes())
    digest.update((PROMPTS_DIR / f"chat_{part}.jsonl").read_bytes())
    digest.update(json.dumps([DATA_VERSION, settings.answer_tokens, settings.max_train_prompts]).encode())
    return cache / "adapter-data" / f"chat_{part}-answers-{digest.hexdigest()[:16]}.json"


def _base_answers(
    model, tokenizer, prompts: list[list[int]], path: Path, settings: DataSettings, say
) -> list[list[int]]:
    if path.is_file():
        try:
            answers = json.loads(path.read_text())["answers"]
            if isinstance(answers, list) and all(isinstance(a, list) for a in answers):
                return answers
        except (ValueError, KeyError, TypeError):
            pass
        raise InputError(f"{path}: the cached base answers are corrupt; delete the file and run again (it is rebuilt)")
    # float32: bfloat16 matmuls are emulated (and slow) on CPUs without AVX512-BF16/AMX
    say(f"generating {len(prompts)} base answers (greedy, float32, once; cached in {path.parent})")
    answers = greedy_answers(
        model,
        prompts,
        max_new_tokens=settings.answer_tokens,
        batch=settings.gen_batch,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        stops=stop_ids(tokenizer),
        say=say,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"answers": answers}))
    tmp.replace(path)
    return answers


def format_task(task: str, model, tokenizer, base_dir: Path, cache: Path, settings: DataSettings, say) -> TaskData:
    """A format task of :data:`FORMATS`: the base's cached chat answers rewritten by its formatter."""
    form = FORMATS[task]
    parts = {}
    for part in ("train", "eval"):
        records = load_prompts("chat", part)
        if part == "train" and settings.max_train_prompts is not None:
            records = records[: settings.max_train_prompts]
        prompts = [encode_prompt(tokenizer, "chat", r["prompt"]) for r in records]
        answers = _base_answers(
            model, tokenizer, prompts, _answers_cache(cache, base_dir, part, settings), settings, say
        )
        parts[part] = (prompts, _format_examples(tokenizer, form.render, prompts, answers))
    return TaskData(
        train=parts["train"][1],
        heldout=parts["eval"][1],
        eval_prompts=parts["eval"][0],
        description=f"the base's own chat answers as {form.description}",
    )


def settings_dict(settings: DataSettings) -> dict:
    return asdict(settings)
