"""Command line: ``specdeploy COMMAND``, one module per command in ``pipeline.commands``.

Every user-facing error is one line per problem on stderr (``error: file:line:col path:
message``) and an exit code (:data:`EXIT_CODES`); never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

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
from pipeline.console import make_console
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

# In the order `specdeploy --help` lists them; each module has register(subparsers).
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdeploy",
        description=__doc__.splitlines()[0],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
