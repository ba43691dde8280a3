"""Build and deploy speculative decoding on TensorRT-LLM from one YAML spec.

The commands live one module each in ``pipeline.commands``; each registers its parser and imports
what it needs only when it runs, so ``--help`` answers at once. Every user-facing error is one
line per problem on stderr (``error: file:line:col path: message``) and an exit code
(:data:`EXIT_CODES`); never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from pipeline import __version__
from pipeline.commands import (
    bench,
    build,
    calibrate,
    doctor,
    engine,
    evaluate,
    heads,
    plan,
    predict,
    prepare_model,
    query,
    report,
    schema,
    serve,
    train_adapter,
    validate,
    verify,
)
from pipeline.errors import SpecdeployError

EXIT_CODES = """exit codes:
  0    done
  1    a stage failed
  2    bad input (spec, checkpoint, heads, tokenizer, request)
  3    a stage cannot run on this host
  4    the filesystem refused (read-only, permission, wrong kind of path)
  5    the disk is full
  6    a release gate failed (release.on_fail: fail), after every variant was processed
  130  interrupted"""

# Each module has register(subparsers); `specdeploy --help` lists the commands by GROUPS.
COMMANDS = (
    validate,
    plan,
    engine,
    verify,
    prepare_model,
    build,
    serve,
    query,
    bench,
    doctor,
    heads,
    train_adapter,
    schema,
    predict,
    calibrate,
    evaluate,
    report,
)

# The commands in the order a user meets them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("build and deploy", ("validate", "plan", "engine", "build", "doctor", "prepare-model", "schema")),
    ("rehearse and predict", ("evaluate", "predict", "calibrate")),
    ("serve and query", ("serve", "query", "bench")),
    ("heads and adapters", ("train-heads", "expand-heads", "train-adapter")),
    ("release", ("report", "verify")),
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help, where it has one worth saying and the help does not say it
    (argparse's ArgumentDefaultsHelpFormatter would also print "default: None" and "default: False")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == argparse.SUPPRESS or action.required
        if action.option_strings and not quiet and "default" not in text:
            text += " (default: %(default)s)"
        return text


class CommandParser(argparse.ArgumentParser):
    """A command's parser: :class:`HelpFormatter` unless the command asks for another."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def command_list(commands: argparse._SubParsersAction) -> str:
    """The commands by group, each with its one-line help."""
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    width = max(len(name) for name in helps) + 4
    lines = []
    for title, names in GROUPS:
        lines += ["", f"{title}:"]
        for name in names:
            text = textwrap.wrap(helps[name], 79 - width)
            lines += [f"  {name:<{width - 2}}{text[0]}"] + [" " * width + more for more in text[1:]]
    return "\n".join(lines[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdeploy",
        usage="specdeploy [GLOBAL OPTIONS] COMMAND [OPTIONS]",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specdeploy {__version__}")
    parser.add_argument(
        "--engines-dir",
        default=os.environ.get("SPECDEPLOY_ENGINES", "engines"),
        help="where the stages' outputs go, one folder per variant (default engines, or $SPECDEPLOY_ENGINES)",
    )
    parser.add_argument(
        "--triton-repo",
        default=os.environ.get("SPECDEPLOY_TRITON_REPO", "triton_repo"),
        help="where the Triton model repositories go (default triton_repo, or $SPECDEPLOY_TRITON_REPO)",
    )
    parser.add_argument(
        "--cache-dir",
        default=os.environ.get("SPECDEPLOY_CACHE", ".cache"),
        help="where the embedded model is prepared (default .cache, or $SPECDEPLOY_CACHE)",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, parser_class=CommandParser
    )
    for command in COMMANDS:
        command.register(commands)
    parser.epilog = f"{command_list(commands)}\n\n`specdeploy COMMAND --help` for its options.\n\n{EXIT_CODES}"
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipeline.console import make_console  # rich: after parsing, so --help answers at once

    # --json: stdout carries the JSON document alone, so the progress lines and tables go to stderr.
    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        return args.handler(args, console)
    except SpecdeployError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `specdeploy plan --json | head`
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
