"""A LoRA fleet served as ONE shared engine against every fine-tune merged, side by side in one run.

    .venv/bin/python bench/lora_fleet.py [SPEC] [--requests 16] [--max-tokens 32] [--concurrency 1,8] [--replot]

SPEC (default specs/smollm2-lora-fleet.yaml) is a base and its LoRA fine-tunes with ``serving.lora:
shared``. Three copies of it are built with `specdeploy engine`, each into its own folders under
bench/out/lora-fleet/<copy's name> (up-to-date stages are skipped), and served one after the other by
the real tritonserver with the reference backend:

* ``base``: the base variant alone (one engine);
* ``shared``: the spec as it is: one engine with the LoRA plugin serves every fine-tune;
* ``merged``: every fine-tune ``serving.lora: merged``: an engine each, all in one server.

For each: the server's resident memory once every model is ready (the RSS of tritonserver and all
its backend stub processes, summed from /proc; shared pages are counted in each process, so it is an
upper bound; and their PSS, which counts each shared page once, with the part per kind of process:
tritonserver itself, the stubs of the tokenizing Python models, the others' stubs), the startup
time (launch to every model ready), and `specdeploy bench --models` over
every fine-tune (the same requests spread round-robin; EOS ignored, so each request decodes
``--max-tokens``) at each concurrency: tokens/s. It prints the ratios the product targets: shared RSS
over base RSS (target <= 1.5x for 8 fine-tunes; merged: about 8x) and shared tokens/s over merged
tokens/s at the highest concurrency (target >= 0.8x). Not a test: the machine's load moves absolute
figures; the ratios are measured in one run. Writes bench/out/lora-fleet/result.json and draws it in
lora_fleet.png beside it: each fleet's server memory (PSS per kind of process, RSS marked) and its
tokens/s at each concurrency; ``--replot`` only redraws the PNG from result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml

from bench.serve import free_ports, memory_of, process_tree
from pipeline.cli import main as cli
from pipeline.triton.launch_cpu import CpuServerConfig, CpuTritonServer

OUT = REPO / "bench" / "out" / "lora-fleet"
PROMPTS = [
    "Name three uses of a paperclip.",
    "What is the capital of Australia?",
    "Explain what a hash table is.",
    "Give two tips for a job interview.",
    "Why do leaves change colour in autumn?",
    "What does a compiler do?",
    "Describe a sunset in one sentence.",
    "How many legs does a spider have?",
]


def fleet_specs(spec: Path) -> dict[str, tuple[Path, list[str]]]:
    """{fleet: (its spec copy, the model names bench sends to)}; adapter paths made absolute."""
    data = yaml.safe_load(spec.read_text())
    for variant in data["variants"]:
        adapter = (variant.get("model") or {}).get("adapter")
        if adapter:
            variant["model"]["adapter"] = str((spec.parent / adapter).resolve())
    tunes = [v["name"] for v in data["variants"] if (v.get("model") or {}).get("adapter")]
    copies: dict[str, tuple[dict, list[str]]] = {
        # one variant: its own repository, where the ensemble keeps NVIDIA's name
        "base": ({**data, "name": f"{data['name']}-base", "variants": [data["variants"][0]]}, ["ensemble"]),
        "shared": ({**data, "name": f"{data['name']}-shared"}, tunes),
        "merged": (
            {
                **data,
                "name": f"{data['name']}-merged",
                "variants": [
                    {**v, "serving": {**(v.get("serving") or {}), "lora": "merged"}} if v["name"] in tunes else v
                    for v in data["variants"]
                ],
            },
            tunes,
        ),
    }
    out = {}
    for fleet, (body, models) in copies.items():
        path = OUT / "specs" / f"{body['name']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        out[fleet] = (path, models)
    return out


def build(spec: Path, cache: Path) -> Path:
    """`specdeploy engine SPEC` into output folders of its own (an output folder belongs to one spec); the
    repository to serve (the whole-spec one when there are several variants)."""
    body = yaml.safe_load(spec.read_text())
    engines, repo = OUT / body["name"] / "engines", OUT / body["name"] / "repo"
    roots = ["--engines-dir", str(engines), "--triton-repo", str(repo), "--cache-dir", str(cache)]
    if cli([*roots, "engine", str(spec)]) != 0:
        raise SystemExit(f"specdeploy engine {spec} failed")
    variants = body["variants"]
    return repo / (body["name"] if len(variants) > 1 else variants[0]["name"])


def server_memory(pid: int) -> dict[str, float]:
    """GiB of the server's process tree: RSS and PSS in all, and PSS per kind of process."""
    found = {"rss_gib": 0.0, "pss_gib": 0.0, "pss_tritonserver_gib": 0.0, "pss_tokenizer_stubs_gib": 0.0}
    found |= {"pss_other_stubs_gib": 0.0, "stubs": 0}
    for process in process_tree(pid):
        rss, pss = memory_of(process)
        found["rss_gib"] += rss / 2**30
        found["pss_gib"] += pss / 2**30
        try:
            command = Path(f"/proc/{process}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            command = ""
        if process == pid:
            kind = "tritonserver"
        elif "processing" in command:  # <repo>/<name>preprocessing/1/model.py, postprocessing: a tokenizer each
            kind = "tokenizer_stubs"
        else:
            kind = "other_stubs"
        found[f"pss_{kind}_gib"] += pss / 2**30
        found["stubs"] += process != pid
    return found


def measure(repo: Path, models: list[str], args: argparse.Namespace, cache: Path) -> dict:
    http, grpc, metrics = free_ports(3)
    config = CpuServerConfig(
        repositories=(repo,), cache_dir=cache, http_port=http, grpc_port=grpc, metrics_port=metrics,
        models=tuple(models),
    )  # fmt: skip
    prompts = OUT / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    start = time.monotonic()
    with CpuTritonServer(config) as server:
        startup = time.monotonic() - start
        found = {"startup_s": startup, **server_memory(server.process.pid), "tokens_per_second": {}}
        for c in args.concurrency:
            out = OUT / "runs" / f"{repo.name}-c{c}"
            argv = ["bench", "--url", server.grpc_url, "--models", ",".join(models), "--prompts", str(prompts)]
            argv += ["--concurrency", str(c), "--requests", str(max(args.requests, 2 * c)), "--ignore-eos"]
            if cli([*argv, "--max-tokens", str(args.max_tokens), "--out", str(out)]) != 0:
                raise SystemExit(f"bench on {repo} at concurrency {c} failed")
            found["tokens_per_second"][c] = json.loads((out / "bench.json").read_text())["tokens_per_second"]
        found["rss_after_gib"] = server_memory(server.process.pid)["rss_gib"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path, default=REPO / "specs" / "smollm2-lora-fleet.yaml")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8])
    parser.add_argument("--replot", action="store_true", help="only redraw lora_fleet.png from result.json")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads((OUT / "result.json").read_text()), OUT / "lora_fleet.png")
        print(f"wrote {OUT / 'lora_fleet.png'}")
        return 0
    cache = Path(os.environ.get("SPECDEPLOY_CACHE", REPO / ".cache"))
    load = [os.getloadavg()[0]]
    results = {}
    for fleet, (spec, models) in fleet_specs(args.spec).items():
        print(f"== {fleet}: {spec.name}", flush=True)
        results[fleet] = measure(build(spec, cache), models, args, cache)
    load.append(os.getloadavg()[0])
    tunes = len(fleet_specs(args.spec)["shared"][1])
    top = max(args.concurrency)
    print(f"\n{args.spec.name}: {tunes} fine-tunes, {args.max_tokens} tokens/request, EOS ignored")
    print(
        f"{'':<8} {'RSS GiB':>8} {'x base':>7} {'PSS GiB':>8} {'x base':>7} {'server':>7} {'tok stubs':>9} "
        f"{'others':>7} {'stubs':>6} {'startup s':>10} "
        + " ".join(f"{'tok/s c=' + str(c):>11}" for c in args.concurrency)
    )
    base = results["base"]
    for fleet, r in results.items():
        rates = " ".join(f"{r['tokens_per_second'][c]:>11.1f}" for c in args.concurrency)
        print(
            f"{fleet:<8} {r['rss_gib']:>8.2f} {r['rss_gib'] / base['rss_gib']:>7.2f} {r['pss_gib']:>8.2f} "
            f"{r['pss_gib'] / base['pss_gib']:>7.2f} {r['pss_tritonserver_gib']:>7.2f} "
            f"{r['pss_tokenizer_stubs_gib']:>9.2f} "
            f"{r['pss_other_stubs_gib']:>7.2f} {r['stubs']:>6} {r['startup_s']:>10.1f} {rates}"
        )
    shared, merged = results["shared"], results["merged"]
    for what in ("rss", "pss"):
        print(f"shared {what.upper()} / base: {shared[f'{what}_gib'] / base[f'{what}_gib']:.2f} (target <= 1.5)")
        print(f"merged {what.upper()} / base: {merged[f'{what}_gib'] / base[f'{what}_gib']:.2f}")
    ratio = shared["tokens_per_second"][top] / merged["tokens_per_second"][top]
    print(f"shared / merged tokens/s at concurrency {top}: {ratio:.2f} (target >= 0.8)")
    print(f"load average before / after: {load[0]:.1f} / {load[1]:.1f}")
    (OUT / "result.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(json.loads((OUT / "result.json").read_text()), OUT / "lora_fleet.png")
    print(f"wrote {OUT / 'result.json'}, {OUT / 'lora_fleet.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    """Left: each fleet's server memory, its PSS stacked by kind of process, its RSS marked; right: its
    tokens/s at each concurrency. ``results`` as result.json holds it (concurrencies as strings)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fleets = list(results)
    fig, (memory, speed) = plt.subplots(1, 2, figsize=(11, 4.3))
    kinds = {"tritonserver": "tritonserver", "tokenizer_stubs": "tokenizer stubs", "other_stubs": "other stubs"}
    bottom = [0.0] * len(fleets)
    for i, (kind, label) in enumerate(kinds.items()):
        part = [results[f][f"pss_{kind}_gib"] for f in fleets]
        memory.bar(fleets, part, 0.6, bottom=bottom, color=f"C{i}", label=f"PSS: {label}")
        bottom = [b + p for b, p in zip(bottom, part)]
    base = results[fleets[0]]["rss_gib"]
    for x, f in enumerate(fleets):
        label = "RSS (shared pages counted per process)" if x == 0 else None
        memory.plot([x - 0.3, x + 0.3], [results[f]["rss_gib"]] * 2, color="black", lw=2, label=label)
        memory.annotate(f"{results[f]['rss_gib']:.2f} GiB ({results[f]['rss_gib'] / base:.2f}x)",
                        (x, results[f]["rss_gib"]), xytext=(0, 5), textcoords="offset points", ha="center",
                        fontsize=8)  # fmt: skip
    memory.set_ylim(0, max(r["rss_gib"] for r in results.values()) * 1.15)
    memory.set_ylabel("server memory (GiB)")
    memory.set_title("memory once every model is ready")
    memory.legend(fontsize=8, loc="upper left")
    levels = list(results[fleets[0]]["tokens_per_second"])
    width = 0.8 / len(fleets)
    for i, f in enumerate(fleets):
        rates = [results[f]["tokens_per_second"][c] for c in levels]
        xs = [x + (i - (len(fleets) - 1) / 2) * width for x in range(len(levels))]
        speed.bar(xs, rates, width, label=f, color=f"C{i + len(kinds)}")
        for x, rate in zip(xs, rates):
            speed.annotate(f"{rate:.1f}", (x, rate), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    speed.set_xticks(range(len(levels)), [f"concurrency {c}" for c in levels])
    speed.set_ylabel("tokens/s over every fine-tune")
    speed.set_title("throughput")
    speed.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
