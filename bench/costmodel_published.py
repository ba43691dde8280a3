"""The cost model fitted on published GPU speedups, with the error left on results it has not seen.

    .venv/bin/python bench/costmodel_published.py [--markdown] [--write] [--plot PNG]

Reads bench/published_speedups.csv: published (model, GPU, dtype, method and settings, mean accepted
tokens per step, speedup over plain decoding) results, each with its source. Fits the ``pytorch-eager``
profile's constants (pipeline/costmodel/profile.py) on the rows measured with PyTorch eager
implementations, by leave-one-source-out cross-validation: each source's rows are predicted by a fit
on the other sources, and those held-out errors are printed per row, per method and per source. The
profile shipped in pipeline/costmodel/profiles.json is the fit on every source, its error bands the
10th-90th percentiles of the held-out errors per method (``--write`` rewrites the file). ``--plot``
draws each fitted row's held-out predicted speedup against the published one (docs/img/costmodel_published.png).

``trtllm`` has no row to fit: the published TensorRT-LLM results found with a mean acceptance length
beside a speedup (3, ``trtllm-ngram-blog``) are of N-gram drafting on a mixture-of-experts model, which
the step model does not price; NVIDIA's TensorRT Edge-LLM figures (12, ``edge-llm-docs``) are of
another runtime, with 4-bit weights, on a Jetson the GPU table lacks. Its host-side constants stay
the model's documented assumptions, its kernel-side ones (profile.KERNEL_SIDE) are the
``pytorch-eager`` fit's, and its bands are borrowed from ``pytorch-eager``'s held-out errors (said so
wherever they are shown).

A row whose notes begin with ``not fitted:`` is listed with the reason that follows (a setting the
step model cannot price, or a GPU the source does not pin down).

Sources (every number in the CSV was read there):

* ``specbench-a100-pt20``: Spec-Bench leaderboard (hemingkx/Spec-Bench, Leaderboard.md, commit dcd2052),
  "Leaderboard on A100": one A100 80 GB, PyTorch 2.0.1, CUDA 11.4, Vicuna-v1.3 7B/13B/33B, greedy, FP16,
  batch 1; the "#Mean Accepted Tokens" and "Overall" columns. Xia et al., "Unlocking Efficiency in
  Large Language Model Inference", arXiv 2401.07851, is the harness's paper.
* ``specbench-a100-pt25``: the same leaderboard at commit fd2c1cd (re-measured: PyTorch 2.5.1, CUDA
  11.5, 96 CPU cores), with EAGLE-2 and EAGLE-3 added.
* ``specbench-3090-pt20``: its "Leaderboard on 3090" at commit a5fd1a3: one RTX 3090, PyTorch 2.0.1,
  CUDA 11.8, Vicuna-7B-v1.3.
* ``specbench-3090-pt25``: the 3090 leaderboard at commit fd2c1cd (PyTorch 2.5.1, CUDA 12.1).
* ``specbench-a100-first``: the first A100 leaderboard (commit 98387a0, PyTorch 2.0.1): speedups only,
  no acceptance lengths: listed, not fitted.
* ``sglang-docs``: SGLang's speculative-decoding documentation (docs.sglang.io, "Speculative Decoding",
  Performance Highlights): Llama-3.1-8B-Instruct on one H100, MT-bench, tokens/s without speculation,
  with EAGLE-2 and with EAGLE-3: the ratio is recorded, but it gives no acceptance length, batch or
  settings, and SGLang is neither profile: listed, not fitted.
  The same three figures are the EAGLE-3 paper's Table 4 (measured by the SGLang team).
* ``eagle-papers``: the EAGLE authors' own measurements, read in the papers' text: EAGLE-2 (Li et al.,
  arXiv 2406.16858v2) Table 1 and EAGLE-3 (Li et al., arXiv 2503.01840, NeurIPS version) Table 1,
  temperature 0, the "Mean" columns (mean speedup and mean tau over MT-bench, HumanEval, GSM8K, Alpaca,
  CNN/DM and, in EAGLE-2, Natural Questions), batch 1. Medusa, Lookahead and EAGLE-1 run through
  Spec-Bench with their default settings (EAGLE-2 section 5 and Appendix A), so their settings are the
  Spec-Bench ones below; EAGLE-2 uses 60 draft tokens for 7B/8B and 50 for 13B, depth 6, 10 nodes
  expanded (EAGLE-2 Appendix A); EAGLE-3's settings are not stated, so the repository's evaluation
  defaults (SafeAILab/EAGLE eagle/evaluation/gen_ea_answer_*.py at commit cb7e084: total 60, depth 5,
  top-k 10) are assumed. The GPU: EAGLE-3 says "If not specified, we use the A100 GPU to test 70B
  models and the RTX 3090 for other models", and its Table 1 caption specifies "on A100 GPUs"; EAGLE-2
  states none, and its V 13B rows are EAGLE-3's. The rows follow the caption (one A100, taken as the
  80 GB SXM part as for Spec-Bench; every model here fits it in FP16); ``--gpu-for
  eagle-papers=rtx-3090`` prints the fit under the other reading (EAGLE-3's Table 5 caption, too,
  names an A100 where its text names an RTX 3090). The V 13B rows of EAGLE-3's Table 1 repeat
  EAGLE-2's, so both papers are one source (one measurement campaign), and EAGLE-3 contributes only
  its new rows. The 70B rows are listed, not fitted (the number of A100s is not stated). FP16: the
  evaluation scripts load the models in torch.float16.
* ``edge-llm-docs``: NVIDIA TensorRT Edge-LLM's "Performance Benchmarks" page
  (nvidia.github.io/TensorRT-Edge-LLM, user_guide/performance/performance-benchmarks, read in a copy
  of its Markdown source), "LLM - EAGLE Speculative Decoding" tables of its v0.4.0, v0.7.0 and v0.7.1
  sections: Jetson AGX Thor, EAGLE-3 drafters, INT4 AWQ or NVFP4 weights, batch 1 and 8, "Accept Rate"
  (average tokens accepted per verify step) and "Speedup" (generation tokens/s over vanilla at the
  same precision and batch): listed, not fitted.
* ``trtllm-ngram-blog``: TensorRT-LLM's tech blog 7 (NVIDIA/TensorRT-LLM,
  docs/source/blogs/tech_blog/blog7_NGram_performance_Analysis_And_Auto_Enablement.md, commit
  7274a59): N-gram drafting, Llama-4-Scout-17B-16E FP8, TP 8 on 8x B200, second conversation turn:
  the accepted length of its table (3000 sampled conversations) and the end-to-end runtime speed-ups
  of its text ("96.13% ... 63.99% ... 33.06%" at batch 1, 4, 32): listed, not fitted.

Settings (Spec-Bench eval.sh and evaluation/inference_*.py): EAGLE-1 with its default 25-node tree
(SafeAILab/EAGLE eagle/model/choices.py, depth 5), EAGLE-2 and EAGLE-3 with total_token 60, depth 5,
top_k 10, Medusa-1 with 5 heads and mc_sim_7b_63, Lookahead with level 5, window 7, guess 7.

The Vicuna-13B and -33B shapes are their published config.json values (LLaMA-13B / LLaMA-30B). The
RTX 3090's figures: NVIDIA Ampere GA102 GPU Architecture whitepaper, 936 GB/s, FP16 tensor with FP32
accumulate 71 TFLOPS dense. Spec-Bench's A100 80 GB is taken as the SXM part (2039 GB/s); the PCIe
part has 1935 GB/s.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import trees
from pipeline.costmodel import fit
from pipeline.costmodel.hardware import GpuPerf, gpu_perf
from pipeline.costmodel.profile import KERNEL_SIDE, PROFILES_FILE, Calibration, RuntimeProfile
from pipeline.costmodel.step import Deployment
from pipeline.methods.drafting import Drafting
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.spec import presets

DATA = Path(__file__).with_name("published_speedups.csv")
CONTEXT_LEN = 512  # Spec-Bench: prompts of a few hundred tokens plus up to 1024 generated

VICUNA_7B = presets.preset("vicuna-7b-v1.3")
VICUNA_13B = dataclasses.replace(
    VICUNA_7B,
    name="vicuna-13b-v1.3",
    hidden_size=5120,
    num_layers=40,
    num_heads=40,
    num_kv_heads=40,
    intermediate_size=13824,
)
VICUNA_33B = dataclasses.replace(
    VICUNA_7B,
    name="vicuna-33b-v1.3",
    hidden_size=6656,
    num_layers=60,
    num_heads=52,
    num_kv_heads=52,
    intermediate_size=17920,
)
EAGLE1_TREE: trees.Tree = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (2, 1),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (0, 2, 0),
    (0, 2, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 0, 2),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)
LLAMA2_7B = presets.preset("llama-2-7b")
LLAMA2_13B = dataclasses.replace(VICUNA_13B, name="llama-2-13b", max_position_embeddings=4096, norm_epsilon=1e-5)
LLAMA31_8B = presets.preset("llama-3.1-8b")
DSL_8B = dataclasses.replace(LLAMA31_8B, name="deepseek-r1-distill-llama-8b")  # Llama-3.1-8B's shape, its base
SHAPES = {m.name: m for m in (VICUNA_7B, VICUNA_13B, VICUNA_33B, LLAMA2_7B, LLAMA2_13B, LLAMA31_8B, DSL_8B)}
PUBLISHED_ONLY_GPUS = {
    "rtx-3090": GpuPerf(name="rtx-3090", memory_gbps=936, bf16_tflops=71, fp8_tflops=None, link_gbps=32.0, nvlink=False)
}
SETTINGS = {
    "eagle1-25": Drafting.eagle(EAGLE1_TREE),
    "eagle2-60-5-10": Drafting.eagle_dynamic(10, 5, 60),
    "eagle2-60-6-10": Drafting.eagle_dynamic(10, 6, 60),
    "eagle2-50-6-10": Drafting.eagle_dynamic(10, 6, 50),
    "eagle3-60-5-10": Drafting.eagle3_dynamic(10, 5, 60),  # EAGLE-3's drafter: fc over 3 captured layers
    "medusa1-63": Drafting.medusa(trees.MC_SIM_7B_63, 5),
    "lookahead-7-5-7": Drafting.lookahead(LookaheadConfig(7, 5, 7)),
}
PYTORCH_EAGER = RuntimeProfile(runtime="pytorch-eager", host_step_s=0.0, level_s=0.0)  # all five constants fitted
TRTLLM = RuntimeProfile(runtime="trtllm")  # the documented assumptions: nothing to fit them on


def read_rows(path: Path = DATA) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


NOT_FITTED = "not fitted:"  # a notes prefix: the row is listed with the reason that follows


def why_not(row: dict[str, str]) -> str | None:
    """Why a row is listed but not fitted (None: it is fitted).

    >>> why_not({"runtime": "sglang", "acceptance_length": "", "settings": "x", "notes": ""})
    'no acceptance length'
    """
    if not row["acceptance_length"]:
        return "no acceptance length"
    if row["notes"].startswith(NOT_FITTED):
        return row["notes"][len(NOT_FITTED) :].split(";")[0].strip()
    if row["runtime"] != "pytorch-eager":
        return f"runtime {row['runtime']}"
    if row["settings"] not in SETTINGS or row["model"] not in SHAPES:
        return f"settings {row['settings']} or model {row['model']} not priced"
    return None


def fittable(row: dict[str, str]) -> bool:
    return why_not(row) is None


def observation(row: dict[str, str]) -> fit.Observation:
    gpu = PUBLISHED_ONLY_GPUS.get(row["gpu"]) or gpu_perf(row["gpu"])
    dtype = "fp8" if row["dtype"] == "fp8" else "bfloat16"  # fp16 and bf16 move the same bytes
    deployment = Deployment(SHAPES[row["model"]], gpu, dtype=dtype, kv_dtype=dtype, context_len=CONTEXT_LEN)
    return fit.Observation(
        source=row["source"],
        method=row["method"],
        deployment=deployment,
        drafting=SETTINGS[row["settings"]],
        acceptance_length=float(row["acceptance_length"]),
        speedup=float(row["speedup"]),
        batch=int(row["batch"]),
        label=f"{row['model']} {row['gpu']} {row['settings']}",
    )


def observations(path: Path = DATA) -> list[fit.Observation]:
    return [observation(r) for r in read_rows(path) if fittable(r)]


def variant(rows: list[dict[str, str]], sources: list[str], gpu_for: list[str]) -> list[dict[str, str]]:
    """The rows of the sources named by a prefix in ``sources`` (all when empty), with the GPU of each
    ``SOURCE=GPU`` in ``gpu_for`` replaced: what-ifs for the docs, never the shipped fit.

    >>> [r["gpu"] for r in variant([{"source": "a", "gpu": "x"}, {"source": "b", "gpu": "y"}], [], ["a=z"])]
    ['z', 'y']
    """
    swap = dict(item.split("=", 1) for item in gpu_for)
    kept = [r for r in rows if not sources or r["source"].startswith(tuple(sources))]
    return [dict(r, gpu=swap.get(r["source"], r["gpu"])) for r in kept]


def calibrations(found: list[fit.Observation]) -> tuple[dict[str, Calibration], list[float]]:
    """The shipped calibrations (profiles.json's content) and each observation's held-out error."""
    held_out = fit.leave_one_source_out(found, PYTORCH_EAGER)
    bands = fit.bands(found, held_out)
    sources = sorted({o.source for o in found})
    fitted = fit.fit(found, PYTORCH_EAGER)
    eager = Calibration(
        fitted,
        bands,
        f"fitted on {len(found)} published results from {len(sources)} sources ({', '.join(sources)}); "
        "bands: leave-one-source-out errors",
    )
    borrowed = {m: dataclasses.replace(b, borrowed_from="pytorch-eager") for m, b in bands.items()}
    trtllm = Calibration(
        TRTLLM.with_constants({name: getattr(fitted, name) for name in KERNEL_SIDE}),
        borrowed,
        "not fitted (no published TensorRT-LLM result with an acceptance length is of a method and model "
        "the step model prices): host side assumed, kernel side and error bands from pytorch-eager",
    )
    return {"trtllm": trtllm, "pytorch-eager": eager}, held_out


def summary(groups: dict[str, list[float]]) -> list[tuple[str, int, float, float]]:
    """(name, n, mean error, mean absolute error) per group."""
    return [
        (name, len(e), statistics.fmean(e), statistics.fmean(abs(x) for x in e)) for name, e in sorted(groups.items())
    ]


BAND = 0.15  # the shaded band of the plot: the CPU cost model's target (bench/costmodel_cpu.py)


def plot(found: list[fit.Observation], held_out: list[float], bands: dict, path: Path) -> None:
    """Held-out predicted against published speedup per fitted row: colour the method, marker the source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    methods = sorted({o.method for o in found})
    sources = sorted({o.source for o in found})
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    marker = dict(zip(sources, "o^sDvP*X"))
    fig, ax = plt.subplots(figsize=(9.5, 6))
    top = max(max(o.speedup, o.speedup * (1 + e)) for o, e in zip(found, held_out)) * 1.08
    line = [1.0, top]
    ax.fill_between(line, [x * (1 - BAND) for x in line], [x * (1 + BAND) for x in line], color="0.9", lw=0)
    ax.plot(line, line, color="black", lw=0.8)
    for o, e in zip(found, held_out):
        predicted = o.speedup * (1 + e)
        style = {"color": colour[o.method], "marker": marker[o.source], "edgecolors": "black", "linewidths": 0.4}
        ax.scatter(o.speedup, predicted, s=36, zorder=3, **style)
    handles = []
    for m in methods:
        errors = [e for o, e in zip(found, held_out) if o.method == m]
        mae = statistics.fmean(abs(e) for e in errors)
        band = f"{bands[m].low_error:+.0%}..{bands[m].high_error:+.0%}"
        label = f"{m}: {len(errors)} rows, mean |error| {mae:.1%}, 10th-90th pct. {band}"
        handles.append(Line2D([], [], ls="", marker="o", color=colour[m], label=label))
    handles += [Line2D([], [], ls="", marker=marker[s], color="0.5", label=f"held out: {s}") for s in sources]
    handles += [
        Line2D([], [], color="black", lw=0.8, label="predicted = published"),
        Line2D([], [], color="0.9", lw=8, label=f"within ±{BAND:.0%}"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    ticks = [t for t in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8) if t <= top]
    ax.set_xscale("log")  # log axes: the band is as wide at 1.2x as at 5x
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{t:g}x" for t in ticks]))
        axis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(1.0, top)
    ax.set_ylim(1.0, top)
    ax.set_aspect("equal")
    ax.set_xlabel("published speedup over plain decoding")
    ax.set_ylabel("predicted, fitted without the row's source")
    mae = statistics.fmean(abs(e) for e in held_out)
    title = f"cost model vs {len(found)} published GPU speedups, leave-one-source-out: mean |error| {mae:.1%}"
    ax.set_title(title, fontsize=9.5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="tables as Markdown (the README's)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {PROFILES_FILE.name} with this fit")
    parser.add_argument(
        "--sources", nargs="+", default=[], metavar="PREFIX", help="what-if: only the sources with these prefixes"
    )
    parser.add_argument(
        "--gpu-for", nargs="+", default=[], metavar="SOURCE=GPU", help="what-if: another GPU for a source's rows"
    )
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw held-out predicted vs published to PNG")
    args = parser.parse_args()
    if args.write and (args.sources or args.gpu_for):
        parser.error("--write ships the fit on every row as published: drop --sources and --gpu-for")
    if any("=" not in item for item in args.gpu_for):
        parser.error("--gpu-for takes SOURCE=GPU, e.g. eagle-papers=a100-80gb")
    rows = variant(read_rows(), args.sources, args.gpu_for)
    found = [observation(r) for r in rows if fittable(r)]
    shipped, held_out = calibrations(found)
    eager = shipped["pytorch-eager"].profile
    in_sample = fit.relative_errors(found, eager)
    skipped = [r for r in rows if not fittable(r)]
    md = args.markdown

    def table(header: list[str], body: list[list[str]]) -> None:
        if md:
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
            for line in body:
                print("| " + " | ".join(line) + " |")
        else:
            widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
            print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
            for line in body:
                print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
        print()

    print(
        f"{len(rows)} published results from {len({r['source'] for r in rows})} sources; {len(found)} fitted "
        f"(pytorch-eager), {len(skipped)} listed only (no acceptance length, or not a profile's runtime)\n"
    )
    table(
        ["source", "result", "AL", "published", "held-out predicted", "held-out error", "fitted error"],
        [
            [
                o.source,
                o.label,
                f"{o.acceptance_length:.2f}",
                f"{o.speedup:.2f}x",
                f"{o.speedup * (1 + e):.2f}x",
                f"{e:+.0%}",
                f"{i:+.0%}",
            ]
            for o, e, i in zip(found, held_out, in_sample)
        ],
    )
    by_method: dict[str, list[float]] = {}
    by_source: dict[str, list[float]] = {}
    for o, e in zip(found, held_out):
        by_method.setdefault(o.method, []).append(e)
        by_source.setdefault(o.source, []).append(e)
    bands = shipped["pytorch-eager"].bands
    table(
        ["method", "results", "mean held-out error", "mean absolute", "10th-90th percentile (the interval)"],
        [
            [n, str(k), f"{m:+.1%}", f"{a:.1%}", f"{bands[n].low_error:+.1%} .. {bands[n].high_error:+.1%}"]
            for n, k, m, a in summary(by_method)
        ],
    )
    table(
        ["held-out source", "results", "mean error", "mean absolute"],
        [[n, str(k), f"{m:+.1%}", f"{a:.1%}"] for n, k, m, a in summary(by_source)],
    )
    if skipped:
        table(
            ["listed, not fitted", "result", "published", "why"],
            [
                [
                    r["source"],
                    f"{r['model']} {r['gpu']} {r['settings']}",
                    f"{float(r['speedup']):.2f}x",
                    why_not(r) or "",
                ]
                for r in skipped
            ],
        )
    constants = ", ".join(
        f"{k} {v:.3f}" if not k.endswith("_s") else f"{k} {v * 1e3:.4f} ms" for k, v in eager.constants().items()
    )
    print(f"pytorch-eager constants (fit on all {len(found)}): {constants}")
    everything = [abs(e) for e in held_out]
    print(
        f"held-out mean absolute error {statistics.fmean(everything):.1%} over {len(found)} results; "
        f"fitted {statistics.fmean(abs(e) for e in in_sample):.1%}"
    )
    if args.write:
        PROFILES_FILE.write_text(json.dumps({k: c.to_dict() for k, c in shipped.items()}, indent=2) + "\n")
        print(f"wrote {PROFILES_FILE}")
    if args.plot:
        plot(found, held_out, bands, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
