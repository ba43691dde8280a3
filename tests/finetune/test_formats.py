"""The format tasks' formatters and checks, on small literal cases (no model)."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.finetune.data import FORMATS, TASKS, sentences

ANSWER = "Paris is the capital of France. It is on the Seine!  Visit <soon> & often"


def test_sentences_split_after_end_marks():
    assert sentences(ANSWER) == ["Paris is the capital of France.", "It is on the Seine!", "Visit <soon> & often"]
    assert sentences("  ") == []


def test_each_formatter_on_a_literal_answer():
    render = {task: form.render(ANSWER) for task, form in FORMATS.items()}
    assert json.loads(render["json"]) == {"answer": ANSWER}
    assert yaml.safe_load(render["yaml"]) == {"answer": ANSWER}
    escaped = "Paris is the capital of France. It is on the Seine!  Visit &lt;soon&gt; &amp; often"
    assert render["xml"] == f"<answer>{escaped}</answer>"
    assert render["bullets"] == "- Paris is the capital of France.\n- It is on the Seine!\n- Visit <soon> & often"
    assert render["numbered"] == "1. Paris is the capital of France.\n2. It is on the Seine!\n3. Visit <soon> & often"
    assert render["tldr"] == "TL;DR: Paris is the capital of France."
    assert render["heading"] == "## Answer\n\n" + ANSWER


def test_yaml_keeps_quotes_and_colons_a_string():
    text = 'He said "yes": no.'
    assert yaml.safe_load(FORMATS["yaml"].render(text)) == {"answer": text}


def test_one_sentence_answers_still_format():
    assert FORMATS["bullets"].render("Blue") == "- Blue"
    assert FORMATS["numbered"].render("Blue.") == "1. Blue."
    assert FORMATS["tldr"].render("Blue") == "TL;DR: Blue"


@pytest.mark.parametrize("task", list(FORMATS))
def test_matches_accepts_its_own_format_and_rejects_the_others(task):
    assert FORMATS[task].matches(FORMATS[task].render(ANSWER))
    assert FORMATS[task].matches("\n " + FORMATS[task].render(ANSWER)[:12])  # a truncated output still counts
    assert not FORMATS[task].matches(ANSWER)  # the base's plain answer
    for other, form in FORMATS.items():
        if other != task:
            assert not FORMATS[task].matches(form.render(ANSWER)), other


def test_tasks_are_code_and_the_formats():
    assert TASKS == ("code", "json", "yaml", "xml", "bullets", "numbered", "tldr", "heading")


def test_the_clis_task_list_names_every_task_in_order():
    """train-adapter --task lists pipeline/finetune/tasks.py's names without importing the data code."""
    from pipeline.finetune import tasks

    assert tasks.TASKS == TASKS == ("code", *FORMATS)
