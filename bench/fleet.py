"""Fleet build benchmark: `specdeploy engine SPEC --ray` on a local Ray cluster vs the sequential runner.

    python bench/fleet.py [--spec specs/smollm2-tp-fleet.yaml] [--repeat 1] [--cache-dir DIR]

In one run, each in a fresh output folder and as its own `specdeploy` process (as a user runs it):
* sequential: `specdeploy engine SPEC` (variants one after another), then again (the no-op re-run),
* ray:        `specdeploy engine SPEC --ray` (a local cluster started by the command, every CPU of
  the host), then again (the no-op re-run: cluster start, storage check, every task skips),
* ray joined: `specdeploy engine SPEC --ray ADDRESS` on a cluster this script started beforehand
  (as on a real cluster, where the head node keeps running), cold and no-op.
Prints wall seconds, the cold-build ratios sequential / ray, and the no-op overhead of --ray over
the sequential no-op re-run. The embedded model is prepared before timing (all runs share it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def engine(spec: Path, workdir: Path, cache: Path, *extra: str) -> float:
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "--engines-dir",
        str(workdir / "engines"),
        "--triton-repo",
        str(workdir / "triton_repo"),
        "--cache-dir",
        str(cache),
        "engine",
        str(spec),
        *extra,
    ]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "specs" / "smollm2-tp-fleet.yaml")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache")))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.embedded import prepare_embedded_model

    prepare_embedded_model(args.cache_dir)
    import ray

    ray.init(include_dashboard=False, logging_level="ERROR")  # the cluster the "joined" runs use
    address = ray.get_runtime_context().gcs_address
    rows = []
    for _ in range(args.repeat):
        with (
            tempfile.TemporaryDirectory(prefix="fleet-seq-") as seq,
            tempfile.TemporaryDirectory(prefix="fleet-ray-") as par,
        ):
            row = {
                "sequential": engine(args.spec, Path(seq), args.cache_dir),
                "sequential no-op": engine(args.spec, Path(seq), args.cache_dir),
            }
            row["ray"] = engine(args.spec, Path(par), args.cache_dir, "--ray")
            row["ray no-op"] = engine(args.spec, Path(par), args.cache_dir, "--ray")
        with tempfile.TemporaryDirectory(prefix="fleet-joined-") as joined:
            row["ray joined"] = engine(args.spec, Path(joined), args.cache_dir, "--ray", address)
            row["ray joined no-op"] = engine(args.spec, Path(joined), args.cache_dir, "--ray", address)
        rows.append(row)
        print("  ".join(f"{name} {seconds:.1f} s" for name, seconds in row.items()), flush=True)
    best = {name: min(row[name] for row in rows) for name in rows[0]}
    print(
        f"{args.spec.name} on {os.cpu_count()} CPU(s): cold build sequential {best['sequential']:.1f} s, "
        f"--ray {best['ray']:.1f} s (ratio sequential/ray {best['sequential'] / best['ray']:.2f}); "
        f"no-op re-run sequential {best['sequential no-op']:.1f} s, --ray {best['ray no-op']:.1f} s "
        f"(overhead {best['ray no-op'] - best['sequential no-op']:.1f} s); on a running cluster: cold "
        f"{best['ray joined']:.1f} s (ratio {best['sequential'] / best['ray joined']:.2f}), no-op "
        f"{best['ray joined no-op']:.1f} s (overhead {best['ray joined no-op'] - best['sequential no-op']:.1f} s)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
