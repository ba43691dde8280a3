"""How long the CLI takes to answer, as a multiple of the bare interpreter's start-up.

    .venv/bin/python bench/cli_startup.py [--rounds 15]

Each round runs, in a fresh process each and in turn (so all of them see the same load of the host):
``python -c pass``, ``specdeploy --help``, ``specdeploy validate specs/llama70b-eagle.yaml``
(the headline spec, planned from its preset: no weights are read) and ``specdeploy plan
specs/llama8b-lora-fleet.yaml`` (24 adapters' configs, the LoRA decision, the plan's tables). Prints
each one's median wall time over the rounds and its ratio to the bare start-up; the targets are about
5x for ``--help`` and about 15x for ``validate``. What a command imports decides it: the parser is built
from every command's ``register``, which imports nothing heavy, and each command imports what it
needs (torch, numpy, scipy, tritonclient, rich) only when it runs. ``tests/test_cli_imports.py``
holds the imports themselves, which, unlike times, a test can check on a loaded host.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "specdeploy --help": [sys.executable, "-m", "pipeline", "--help"],
    "specdeploy validate llama70b-eagle": [sys.executable, "-m", "pipeline", "validate", "specs/llama70b-eagle.yaml"],
    "specdeploy plan llama8b-lora-fleet": [sys.executable, "-m", "pipeline", "plan", "specs/llama8b-lora-fleet.yaml"],
}


# As a user's shell runs it: Python caches each module's bytecode (a host that sets
# PYTHONDONTWRITEBYTECODE, as this one does, would compile every module on every run).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command, interleaved")
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the file and bytecode caches once
        wall(argv)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            times[name].append(wall(argv))
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare = medians["python -c pass"]
    for name, median in medians.items():
        print(f"{name:40s} {median * 1000:7.0f} ms   {median / bare:5.1f}x the bare start-up")


if __name__ == "__main__":
    main()
