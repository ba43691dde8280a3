"""The CLI reference page, read off the argparse parsers ``specdeploy --help`` prints.

Every command, each of its arguments and options (value, default, help) and the exit codes: the
global table of :data:`pipeline.cli.EXIT_CODES` and what a command's own epilog adds. Defaults that
come from the environment (``SPECDEPLOY_ENGINES``, ...) are read with those variables unset, so the
page does not depend on the shell that wrote it.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline import cli
from pipeline.docs_gen.markdown import GENERATED_NOTE, code, docstring, paragraph, table

ENVIRONMENT_DEFAULTS = ("SPECDEPLOY_ENGINES", "SPECDEPLOY_TRITON_REPO", "SPECDEPLOY_CACHE")
_FLAG_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._CountAction,
    argparse.BooleanOptionalAction,
)


@contextmanager
def _without_environment_defaults() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in ENVIRONMENT_DEFAULTS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def parser() -> argparse.ArgumentParser:
    """The ``specdeploy`` parser as a shell without ``SPECDEPLOY_*`` variables builds it."""
    with _without_environment_defaults():
        return cli.build_parser()


def commands(root: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) per command, in ``--help`` order (by :data:`pipeline.cli.GROUPS`)."""
    (action,) = (a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return [(name, helps.get(name, ""), action.choices[name]) for _, names in cli.GROUPS for name in names]


def exit_codes(text: str = cli.EXIT_CODES) -> list[tuple[str, str]]:
    """(code, meaning) from the ``exit codes:`` epilog of ``specdeploy --help``."""
    return [(m[1], m[2]) for m in re.finditer(r"^\s+(\d+)\s+(.+)$", text, flags=re.MULTILINE)]


def _visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest.upper()


def value(action: argparse.Action) -> str:
    """How the value is written: ``SPEC``, ``[ADDRESS]``, ``N [N ...]``; empty for a flag."""
    if isinstance(action, _FLAG_ACTIONS) or action.nargs == 0:
        return ""
    name = _metavar(action)
    if action.nargs == "?":
        return f"[{name}]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    if action.nargs == "*":
        return f"[{name} ...]"
    if isinstance(action.nargs, int):
        return " ".join([name] * action.nargs)
    return name


def default(action: argparse.Action) -> str:
    if isinstance(action, _FLAG_ACTIONS) or action.default in (None, argparse.SUPPRESS):
        return ""
    if isinstance(action.default, list | tuple):
        return code(" ".join(str(v) for v in action.default))
    return code(action.default)


def help_text(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion: %(default)s, %(prog)s, %%
        text = text % dict(vars(action), prog=prog)
    notes = []
    if action.required and action.option_strings:
        notes.append("required")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        notes.append("repeatable")
    return "; ".join(part for part in (text, *notes) if part)


def module_of(p: argparse.ArgumentParser) -> str | None:
    """The module whose handler a command runs (``pipeline.commands.engine``)."""
    handler = p._defaults.get("handler")
    return getattr(handler, "__module__", None)


def details(module: str | None) -> str:
    """What the command module's docstring says beyond its first line (the synopsis)."""
    doc = inspect.getdoc(sys.modules[module]) if module in sys.modules else None
    parts = (doc or "").split("\n\n", 1)
    return docstring(parts[1]) if len(parts) == 2 else ""


def usage(name: str, p: argparse.ArgumentParser) -> str:
    words = ["specdeploy", "[GLOBAL OPTIONS]", name]
    actions = _visible(p)
    if any(a.option_strings for a in actions):
        words.append("[OPTIONS]")
    words += [value(a) for a in actions if not a.option_strings]
    return " ".join(words)


def _options_table(p: argparse.ArgumentParser, prog: str) -> str:
    rows = [
        [
            ", ".join(code(s) for s in a.option_strings),
            code(value(a)) if value(a) else "",
            default(a),
            help_text(a, prog),
        ]
        for a in _visible(p)
        if a.option_strings
    ]
    return table(["option", "value", "default", "description"], rows) if rows else ""


def _arguments_table(p: argparse.ArgumentParser, prog: str) -> str:
    rows = [
        [code(value(a)), default(a) or ("required" if a.nargs not in ("?", "*") else ""), help_text(a, prog)]
        for a in _visible(p)
        if not a.option_strings
    ]
    return table(["argument", "default", "description"], rows) if rows else ""


def render() -> str:
    root = parser()
    listed = commands(root)
    out = [
        GENERATED_NOTE.format(source="the argparse parsers of `pipeline/cli.py` and `pipeline/commands/`"),
        "",
        "# CLI reference",
        "",
        "Every command of `specdeploy` (or `python -m pipeline`), as `specdeploy --help` and "
        "`specdeploy COMMAND --help` print them.",
        "",
        f"Usage: {code('specdeploy [GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGUMENTS]')}",
        "",
        "## Global options",
        "",
        "Given before the command (`specdeploy --engines-dir /shared/engines engine SPEC`).",
        "",
        _options_table(root, root.prog),
        "",
        "## Exit codes",
        "",
        "Every command exits with one of these; what to do about each is under "
        "[Exit codes](exit-codes.md). A command's own notes on them follow its options below.",
        "",
        table(["code", "meaning"], [[code(c), meaning] for c, meaning in exit_codes()]),
        "",
        "## Commands",
        "",
    ]
    helps = {name: text for name, text, _ in listed}
    for title, names in cli.GROUPS:
        rows = [[f"[`{name}`](#{name})", helps[name]] for name in names]
        out += [f"{title[:1].upper()}{title[1:]}:", "", table(["command", "what it does"], rows), ""]
    out.pop()
    described: dict[str, str] = {}  # module -> the first command it was shown with
    for name, text, sub in listed:
        prog = f"{root.prog} {name}"
        out += ["", f"## `specdeploy {name}` {{#{name}}}", "", text[:1].upper() + text[1:] + "." if text else ""]
        if sub.description:
            out += ["", paragraph(sub.description)]
        module = module_of(sub)
        if module in described:
            out += ["", f"Described with [`{described[module]}`](#{described[module]})."]
        elif details(module):
            described[module or ""] = name
            out += ["", details(module)]
        out += ["", f"Usage: {code(usage(name, sub))}"]
        for block in (_arguments_table(sub, prog), _options_table(sub, prog)):
            if block:
                out += ["", block]
        if sub.epilog:
            out += ["", paragraph(sub.epilog)]
    return "\n".join(out).rstrip() + "\n"
