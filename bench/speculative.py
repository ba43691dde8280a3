"""Speculative decoding on SmolLM2 through the reference backend: plain vs Medusa, EAGLE, EAGLE-2, Lookahead, NGram.

    .venv/bin/python bench/speculative.py [--dtype bfloat16] [--medusa-tree PRESET] [--eagle-tree PRESET]
        [--lookahead W,N,G] [--ngram K,M]
        [--sets code chat] [--batch 1 4] [--prompts 10] [--new-tokens 64] [--methods ...]

In one process: builds the three SmolLM2 engines through the pipeline (``specs/smollm2-{medusa,eagle,
lookahead}.yaml``, or copies of them under bench/out/specs when --dtype / --tree / --lookahead change
a build-time setting; up-to-date stages are skipped), then for each prompt set
(pipeline/data/prompts/{code,chat}_eval.jsonl) and each batch size (requests in flight) decodes the
same prompts greedily with every method through the scheduler and reports tokens/s, speedup over
plain decoding, mean acceptance length and per-position acceptance (metrics.py has the
definitions). NGram (prompt lookup, TensorRT-LLM's NGramDecodingConfig: K draft tokens, patterns of up
to M tokens) needs no weights of its own: it runs on a view of the Lookahead engine's weights with an
NGram build config (pipeline/evaluation/candidates.py engine_as), beside Lookahead and plain decoding.
With --methods, only the engines those methods need are built. Writes bench/out/speculative.{json,md,png}.
Not a test: the numbers depend on the machine and its load; tokens per CPU-second (this thread's CPU
time, torch on 1 thread) is reported next to wall-clock tokens/s because it is what the rate would be
on an idle machine.

Every method's output is compared with plain decoding: identical, or (bfloat16 engines) different
only from a near-tie of plain decoding on (pipeline/runtime/spec_decode/exactness.py).

Heads: heads/smollm2-medusa and heads/smollm2-eagle (trained by ``specdeploy train-heads``) when they
exist; otherwise random heads of the right shapes are generated so the plumbing runs (their acceptance
is meaningless, and the report says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import trees
from pipeline.checkpoint import convert_checkpoint
from pipeline.checkpoint.heads import EagleOptions, MedusaOptions
from pipeline.evaluation.candidates import engine_as
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, VariantPlan
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest, StepOutput
from pipeline.runtime.serving.metrics import SpecDecodingStats, StepStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding
from pipeline.runtime.spec_decode.exactness import NEAR_TIE_BF16_STEPS, divergence
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from pipeline.trtllm.engine_config import predict_engine_config

OUT = REPO / "bench" / "out"
SPECS = {kind: REPO / "specs" / f"smollm2-{kind}.yaml" for kind in ("medusa", "eagle", "lookahead")}
TARGETS = {"eagle": 2.0, "medusa": 1.6, "lookahead": 1.3}  # batch 1, code prompts
FALLBACK_PROMPTS = {
    "code": [
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        'def is_palindrome(text):\n    """Return True if text reads the same backwards."""\n',
    ],
    "chat": ["What is the capital of France?", "Explain how a bicycle stays upright."],
}


@dataclasses.dataclass
class Built:
    variant: VariantPlan
    engine_dir: Path
    heads: str  # "trained (<path>)", "random (plumbing only)" or "none needed"


def say(text: str) -> None:
    print(f"  {text}", flush=True)


@dataclasses.dataclass(frozen=True)
class Overrides:
    """Settings that differ from the shipped specs (each needs its own engine: dtype, draft tree and
    Lookahead (W, N, G) are build-time settings)."""

    dtype: str = "float32"
    trees: tuple[tuple[str, str], ...] = ()  # (method, medusa_choices / eagle_choices preset)
    lookahead: LookaheadConfig | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Overrides:
        """From the --dtype, --medusa-tree, --eagle-tree and --lookahead options."""
        chosen = tuple(
            (kind, tree) for kind, tree in (("medusa", args.medusa_tree), ("eagle", args.eagle_tree)) if tree
        )
        lookahead = LookaheadConfig(*(int(v) for v in args.lookahead.split(","))) if args.lookahead else None
        return cls(args.dtype, chosen, lookahead)

    def tree(self, kind: str) -> str | None:
        return dict(self.trees).get(kind)

    def suffix(self, kind: str) -> str:
        parts = ["bf16" if self.dtype == "bfloat16" else ""]
        if self.tree(kind):
            parts.append(self.tree(kind).replace("_", "-"))
        if self.lookahead and kind == "lookahead":
            parts.append("w{}n{}g{}".format(*self.lookahead))
        return "".join(f"-{p}" for p in parts if p)


def spec_file(kind: str, overrides: Overrides) -> Path:
    """The shipped spec; with overrides, a copy under bench/out/specs whose variant name says what
    differs (its engine folders sit next to the shipped spec's instead of replacing them)."""
    suffix = overrides.suffix(kind)
    if not suffix:
        return SPECS[kind]
    text = SPECS[kind].read_text()
    edits = [
        (f"name: smollm2-{kind}\n", f"name: smollm2-{kind}{suffix}\n"),
        ("dtype: float32", f"dtype: {overrides.dtype}"),
    ]
    if overrides.tree(kind):
        text = re.sub(r"(\n    choices: )\S+", lambda m: m.group(1) + overrides.tree(kind), text)
    if overrides.lookahead and kind == "lookahead":
        w, n, g = overrides.lookahead
        edits += [
            ("window: 4", f"window: {w}"),
            ("ngram: 3", f"ngram: {n}"),
            ("verification_set: 4", f"verification_set: {g}"),
        ]
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"{SPECS[kind]}: expected {old!r} to make the {suffix} copy")
        text = text.replace(old, new)
    text = text.replace("path: ../heads/", f"path: {REPO}/heads/")
    copy = OUT / "specs" / f"smollm2-{kind}{suffix}.yaml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    return copy


def plan_variant(kind: str, overrides: Overrides) -> VariantPlan:
    plan = make_plan(
        load_spec(spec_file(kind, overrides)), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache")
    )
    return plan.variants[0]


def convert_body(variant: VariantPlan, heads_dir: Path):
    """Convert with heads from ``heads_dir`` (random ones, outside the planned stages)."""
    spec = variant.speculative
    medusa = eagle = None
    if spec.medusa is not None:
        medusa = MedusaOptions(heads_dir, max_draft_len=spec.medusa.max_draft_len)
    if spec.eagle is not None:
        eagle = EagleOptions(
            heads_dir,
            num_eagle_layers=spec.eagle.num_eagle_layers,
            max_non_leaves_per_layer=spec.eagle.max_non_leaves_per_layer,
            max_draft_len=spec.eagle.max_draft_len,
        )
    return lambda out: convert_checkpoint(
        variant.model_dir, out, tp=variant.tp, pp=variant.pp, dtype=variant.build.dtype, medusa=medusa, eagle=eagle
    )


def build_through_pipeline(spec: Path, variant: VariantPlan) -> Path:
    (outcome,) = execute_plan(
        make_plan(load_spec(spec), OutputRoots(REPO / "engines", REPO / "triton_repo", REPO / ".cache")),
        only={variant.name},
        say=say,
    )
    if outcome.exit_code != 0 or outcome.stopped_at not in (None, "package"):
        raise SystemExit(f"{variant.name} stopped at {outcome.stopped_at}: {outcome.reason}")
    return variant.stage("build").output


def random_heads(variant: VariantPlan, folder: Path) -> Path:
    """Heads of the right shapes for the plumbing: Medusa ResBlocks ~ 0 with the base lm_head (each
    head repeats the base model's next-token guess), an EAGLE drafter that passes the feature through."""
    from safetensors.torch import load_file, save_file

    from pipeline.geometry import ModelGeometry
    from pipeline.heads.eagle import drafter_llama_config

    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((variant.model_dir / "config.json").read_text())
    weights = load_file(str(variant.model_dir / "model.safetensors"))
    lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    H, gen = base["hidden_size"], torch.Generator().manual_seed(0)
    if variant.speculative.medusa is not None:
        n = variant.speculative.medusa.num_heads
        state = {}
        for h in range(n):
            state.update(
                {
                    f"{h}.0.linear.weight": torch.randn(H, H, generator=gen) * 1e-3,
                    f"{h}.0.linear.bias": torch.zeros(H),
                    f"{h}.1.weight": lm_head.float().clone(),
                }
            )
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
        (folder / "config.json").write_text(json.dumps({"medusa_num_heads": n, "medusa_num_layers": 1}))
    else:
        config = ModelGeometry.from_hf(base, str(variant.model_dir / "config.json"), require_architecture=False)
        inter, d = config.intermediate_size, config.head_dim
        q, kv = config.num_heads * d, config.num_kv_heads * d

        def small(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen) * 1e-3

        state = {
            "fc.weight": torch.cat((torch.zeros(H, H), torch.eye(H)), dim=1),
            "fc.bias": torch.zeros(H),
            "layers.0.self_attn.q_proj.weight": small(q, H),
            "layers.0.self_attn.k_proj.weight": small(kv, H),
            "layers.0.self_attn.v_proj.weight": small(kv, H),
            "layers.0.self_attn.o_proj.weight": small(H, q),
            "layers.0.mlp.gate_proj.weight": small(inter, H),
            "layers.0.mlp.up_proj.weight": small(inter, H),
            "layers.0.mlp.down_proj.weight": small(H, inter),
            "layers.0.post_attention_layernorm.weight": torch.ones(H),
        }
        save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(drafter_llama_config(config, "float32")))
    return folder


def build_with_random_heads(variant: VariantPlan) -> Path:
    """Outside engines/ (the planned engine must never hold random heads): bench/out/engines/<variant>."""
    from pipeline.embedded import prepare_embedded_model

    root = OUT / "engines" / variant.name
    engine_dir = root / "engine"
    if (engine_dir / "config.json").exists():
        return engine_dir
    if variant.builtin:
        prepare_embedded_model(variant.model_dir.parent)
    heads = random_heads(variant, root / "random-heads")
    checkpoint = root / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    if not (checkpoint / "config.json").exists():
        convert_body(variant, heads)(checkpoint)
    config = predict_engine_config(variant, json.loads((checkpoint / "config.json").read_text()), output_dir=engine_dir)
    engine_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(variant.world_size):
        target = engine_dir / f"rank{rank}.safetensors"
        if not target.exists():
            target.hardlink_to(checkpoint / f"rank{rank}.safetensors")
    (engine_dir / "config.json").write_text(json.dumps(config, indent=2))
    return engine_dir


def build(kind: str, overrides: Overrides) -> Built:
    variant = plan_variant(kind, overrides)
    heads_dir = variant.stage("convert").inputs.get("heads")
    print(f"[{variant.name}] {variant.method} ({variant.speculative.reason})", flush=True)
    if kind == "lookahead":
        return Built(variant, build_through_pipeline(spec_file(kind, overrides), variant), "none needed")
    if heads_dir is not None and Path(heads_dir).exists():
        return Built(variant, build_through_pipeline(spec_file(kind, overrides), variant), f"trained ({heads_dir})")
    say(f"{heads_dir} not found: random heads for the plumbing (acceptance is meaningless)")
    return Built(variant, build_with_random_heads(variant), "random (plumbing only)")


def load_prompts(kind: str, count: int, model_dir: Path) -> tuple[list[list[int]], str]:
    from transformers import AutoTokenizer

    from pipeline.heads.data import encode_prompt
    from pipeline.heads.prompts import PROMPTS_DIR, read_jsonl

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    path = PROMPTS_DIR / f"{kind}_eval.jsonl"
    if path.exists():
        texts, source = [r["prompt"] for r in read_jsonl(path)][:count], str(path.relative_to(REPO))
    else:
        texts, source = FALLBACK_PROMPTS[kind][:count], f"built-in list ({path} not found)"
    return [encode_prompt(tokenizer, kind, text) for text in texts], source


@dataclasses.dataclass
class Tally:
    """One method's totals over the prompt groups of a (set, batch) cell."""

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    # Decode phase only: the steps without prompt tokens (after every request's first token), the
    # time per output token that speculation changes; prefill costs every method the same.
    decode_tokens: int = 0
    decode_cpu_s: float = 0.0
    stats: SpecDecodingStats = dataclasses.field(default_factory=SpecDecodingStats)
    outputs: list[list[int]] = dataclasses.field(default_factory=list)

    def row(self, method: DecodingMethod) -> dict:
        s = self.stats
        return {
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "tokens_per_s": self.tokens / self.wall_s,
            "tokens_per_cpu_s": self.tokens / self.cpu_s,
            "decode_tokens_per_cpu_s": self.decode_tokens / max(self.decode_cpu_s, 1e-9),
            "steps": s.verification_steps,
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "mean_acceptance_length": s.mean_acceptance_length,
            "acceptance_rate": s.acceptance_rate,
            "acceptance_per_position": s.acceptance_per_position(getattr(method, "draft_positions", 0)),
        }


def run(
    engine: Engine,
    method: DecodingMethod,
    prompts: list[list[int]],
    new_tokens: int,
    end_id: int,
    tally: Tally,
    lookahead: LookaheadConfig | None = None,
    on_step: Callable[[StepStats], None] | None = None,
) -> None:
    """Decode ``prompts`` all in flight at once; add the results to ``tally``. ``on_step`` is called
    after every scheduler step (bench/step_cost.py attributes its timers per step)."""
    limits = dataclasses.replace(engine.config.limits, max_batch_size=len(prompts))
    clock = [0.0]  # CPU time when the previous step ended (the run's start before the first)

    def count(step: StepStats) -> None:  # this step's CPU time: since the previous step ended
        now = time.thread_time()
        if step.prefill_tokens == 0:
            tally.decode_tokens += step.generated_tokens
            tally.decode_cpu_s += now - clock[0]
        if on_step is not None:
            on_step(step)
        clock[0] = now

    sched, outputs = Scheduler(engine, method, limits=limits, on_step=count), {}
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(
            str(i), tuple(prompt), new_tokens, end_id=end_id, exclude_input_in_output=True, lookahead=lookahead
        )
        sched.submit(request, lambda o: outputs.__setitem__(o.request_id, o) if o.finished else None)
    wall, cpu = time.perf_counter(), time.thread_time()
    clock[0] = cpu
    sched.run_until_idle()
    tally.wall_s += time.perf_counter() - wall
    tally.cpu_s += time.thread_time() - cpu
    results: list[StepOutput] = [outputs[str(i)] for i in range(len(prompts))]
    for out in results:
        tally.stats.merge(out.metrics.spec)
        tally.tokens += len(out.tokens)
        tally.outputs.append(out.tokens)


def load_methods(
    built: dict[str, Built], eagle2_top_k: int, ngram: NGramConfig
) -> dict[str, tuple[Engine, DecodingMethod]]:
    """Plain decoding and each method with the settings its engine was built for (plain decoding runs
    on the Lookahead engine, which holds no heads), EAGLE-2 on the EAGLE engine, NGram on a view of the
    Lookahead engine's weights built for external draft tokens with max_draft_len K (engine_as)."""
    engines = {kind: Engine.load(b.engine_dir) for kind, b in built.items()}
    engines["ngram"] = engine_as(engines["lookahead"], "ngram", ngram.max_draft_len)
    spec = {kind: b.variant.speculative for kind, b in built.items()}
    settings = {"lookahead": MethodSettings("lookahead", lookahead=spec["lookahead"].lookahead)}
    if "medusa" in built:
        settings["medusa"] = MethodSettings("medusa", medusa_choices=spec["medusa"].medusa.tree)
    if "eagle" in built:
        settings["eagle"] = MethodSettings("eagle", eagle_choices=spec["eagle"].eagle.tree)
        settings["eagle2"] = MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=eagle2_top_k)
    settings["ngram"] = MethodSettings(ngram=ngram)
    methods: dict[str, tuple[Engine, DecodingMethod]] = {"plain": (engines["lookahead"], PlainDecoding())}
    for name, setting in settings.items():
        engine = engines[setting.decoding_mode or name]
        methods[name] = (engine, make_method(engine, setting)[0])
    return methods


def compare_with_plain(
    engine: Engine, prompts: list[list[int]], plain: list[list[int]], outputs: list[list[int]]
) -> dict:
    """Token-identical prompts, and for the others plain decoding's logit gap at the first difference
    (pipeline/runtime/spec_decode/exactness.py: on bf16 engines a near-tie is round-off, anything else a bug)."""
    found = [divergence(engine, p, want, got) for p, want, got in zip(prompts, plain, outputs)]
    gaps = [d.gap_bf16_steps for d in found if d is not None]
    return {
        "identical": sum(d is None for d in found),
        "prompts": len(found),
        "max_gap_bf16_steps": max(gaps, default=0.0),
        "lossless": all(g <= NEAR_TIE_BF16_STEPS for g in gaps) and (not gaps or engine.bf16),
    }


def same_as_plain(row: dict) -> str:
    if row["identical"] == row["prompts"]:
        return "yes"
    verdict = "near-ties only" if row["lossless"] else "NO"
    gap = row["max_gap_bf16_steps"]
    return f"{row['identical']}/{row['prompts']} identical, {verdict} (max gap {gap:.1f} bf16 steps)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["code", "chat"], choices=["code", "chat"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 4], help="requests in flight")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set (the eval sets have 25)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--eagle2-top-k", type=int, default=4, help="EAGLE-2 expansion top_k")
    parser.add_argument(
        "--extra-trees",
        nargs="*",
        default=["chain_3"],
        help="more medusa_choices/eagle_choices presets to run on the same engines",
    )
    parser.add_argument(
        "--extra-lookahead",
        nargs="*",
        default=["2,3,2"],
        help="per-request lookahead (w,n,g) to run on the same server (W,N,G)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="engine dtype (bfloat16: bf16 GEMMs through oneDNN, see pipeline/runtime/model/gemm.py)",
    )
    parser.add_argument(
        "--medusa-tree",
        choices=sorted(trees.TREE_PRESETS),
        help="build the Medusa engine for this tree preset instead of the spec's own",
    )
    parser.add_argument(
        "--eagle-tree",
        choices=sorted(trees.TREE_PRESETS),
        help="build the EAGLE engine for this tree preset instead of the spec's own",
    )
    parser.add_argument("--lookahead", metavar="W,N,G", help="build the Lookahead engine for this (W, N, G)")
    parser.add_argument(
        "--ngram",
        metavar="K,M",
        default="4,2",
        help="NGram max_draft_len K and max_matching_ngram_size M (on the Lookahead engine's weights)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=["medusa", "eagle", "eagle2", "lookahead", "ngram"],
        help="only these (and plain decoding; the engines they need are built); default: all",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the backend default here: 1)")
    parser.add_argument("--replot", action="store_true", help="only rewrite the .md/.png from speculative.json")
    args = parser.parse_args()
    if args.replot:
        write_reports(json.loads((OUT / "speculative.json").read_text()))
        return 0
    torch.set_num_threads(args.threads)
    overrides = Overrides.from_args(args)
    k, m = (int(v) for v in args.ngram.split(","))
    ngram = NGramConfig(k, m)
    wanted = set(args.methods or ("medusa", "eagle", "eagle2", "lookahead", "ngram"))
    kinds = [kind for kind in ("medusa", "eagle") if kind in {w.rstrip("2") for w in wanted}] + ["lookahead"]
    built = {kind: build(kind, overrides) for kind in kinds}
    spec = {kind: b.variant.speculative for kind, b in built.items()}
    methods = load_methods(built, args.eagle2_top_k, ngram)
    engines = {kind: methods[kind][0] for kind in built}
    described: dict[str, str] = {}
    for tree in args.extra_trees:  # medusa_choices / eagle_choices are runtime knobs: same engines
        for kind in ("medusa", "eagle"):
            if kind in built:
                setting = MethodSettings(kind, **{f"{kind}_choices": trees.resolve_tree(tree)})
                methods[f"{kind}[{tree}]"] = (engines[kind], make_method(engines[kind], setting)[0])
                described[f"{kind}[{tree}]"] = f"{kind}_choices {tree}"
    per_request: dict[str, LookaheadConfig] = {}
    for text in args.extra_lookahead:  # Triton's per-request lookahead_* inputs, same engine and server
        w, n, g = (int(v) for v in text.split(","))
        methods[f"lookahead({w},{n},{g})"] = methods["lookahead"]
        per_request[f"lookahead({w},{n},{g})"] = LookaheadConfig(w, n, g)
        described[f"lookahead({w},{n},{g})"] = f"per-request (w, n, g) = ({w}, {n}, {g}) on the same server"
    model_dir = built["lookahead"].variant.model_dir
    look = spec["lookahead"].lookahead
    described |= {
        "plain": "PlainDecoding",
        "lookahead": f"(W, N, G) = ({look.window}, {look.ngram}, {look.verification_set})",
        "ngram": f"(K, M) = ({k}, {m}), keep_all, use_oldest, public pool, on the Lookahead engine's weights",
    }
    if "medusa" in built:
        described["medusa"] = f"medusa_choices {trees.tree_name(spec['medusa'].medusa.tree)}"
    if "eagle" in built:
        described["eagle"] = f"eagle_choices {trees.tree_name(spec['eagle'].eagle.tree)}"
        top_k, nodes = args.eagle2_top_k, methods["eagle2"][1].max_draft_len
        described["eagle2"] = f"dynamic tree, top_k {top_k}, at most {nodes} nodes"
    results: dict = {
        "settings": vars(args),
        "heads": {k: b.heads for k, b in built.items()},
        "engines": {k: str(b.engine_dir) for k, b in built.items()},
        "methods": {name: described.get(name, name) for name in methods},
        "runs": [],
    }
    if args.methods:
        methods = {
            name: m
            for name, m in methods.items()
            if name == "plain" or name.split("[")[0].split("(")[0] in args.methods
        }
    for engine, method in methods.values():  # warm-up: first-call allocations, thread pools
        run(engine, method, [[1, 2, 3, 4]], 4, -1, Tally())
    for kind in args.sets:
        prompts, source = load_prompts(kind, args.prompts, model_dir)
        results.setdefault("prompt_sets", {})[kind] = source
        for batch in args.batch:
            # Interleaved: each group of `batch` prompts runs with every method before the next group,
            # so a change in the host's speed during the run hits every method alike.
            tallies = {name: Tally() for name in methods}
            if "ngram" in methods:  # its public pool starts empty in every cell: the cells repeat the same
                # prompts, and a pool that had seen their outputs would draft them whole
                view = methods["ngram"][0]
                methods["ngram"] = (view, make_method(view, MethodSettings(ngram=ngram))[0])
            for first in range(0, len(prompts), batch):
                for name, (engine, method) in methods.items():
                    run(
                        engine,
                        method,
                        prompts[first : first + batch],
                        args.new_tokens,
                        end_id=2,
                        tally=tallies[name],
                        lookahead=per_request.get(name),
                    )
            plain = tallies["plain"]
            for name, (engine, method) in methods.items():
                row = {**tallies[name].row(method), "set": kind, "batch": batch, "method": name}
                row.update(
                    speedup_wall=row["tokens_per_s"] / (plain.tokens / plain.wall_s),
                    speedup_cpu=row["tokens_per_cpu_s"] / (plain.tokens / plain.cpu_s),
                    speedup_decode=row["decode_tokens_per_cpu_s"] / (plain.decode_tokens / plain.decode_cpu_s),
                    **compare_with_plain(engine, prompts, plain.outputs, tallies[name].outputs),
                )
                results["runs"].append(row)
                print(
                    f"{kind:4s} batch {batch} {name:9s} {row['tokens_per_s']:6.1f} tok/s "
                    f"({row['tokens_per_cpu_s']:6.1f} /CPU-s) x{row['speedup_cpu']:.2f} "
                    f"decode x{row['speedup_decode']:.2f} "
                    f"AL {row['mean_acceptance_length']:.2f} = plain: {same_as_plain(row)}",
                    flush=True,
                )
    write_reports(results)
    return 0


def write_reports(results: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "speculative.json").write_text(json.dumps(results, indent=2))
    lines = [
        "# Speculative decoding on SmolLM2-135M (reference backend, CPU)",
        "",
        f"Settings: {json.dumps(results['settings'])}. Heads: "
        + ", ".join(f"{k}: {v}" for k, v in results["heads"].items())
        + ".",
        "Prompt sets: " + ", ".join(f"{k}: {v}" for k, v in results.get("prompt_sets", {}).items()) + ".",
        "Methods: " + "; ".join(f"{k}: {v}" for k, v in results["methods"].items()) + ".",
        "Speedup is tokens per CPU-second over plain decoding on the same prompts and batch (wall-clock "
        "speedup in brackets; the host is shared, so wall time carries other processes' load), end to end "
        "(prompt prefill included: it costs every method the same and weighs more the fewer tokens are "
        "generated). Decode speedup: the same over the decode steps only (output tokens after the first, "
        "their CPU time), i.e. the time per output token that speculation changes.",
        "Mean acceptance length = 1 + accepted / verification steps; per-position = steps accepting "
        "depth k / steps. Step cost = what one speculative step (drafting + verification pass) costs in plain "
        "steps, mean acceptance length / decode speedup: speculation pays only where the acceptance length "
        "beats it.",
        "",
        "| set | batch | method | tok/s (wall) | tok/CPU-s | speedup | decode speedup | mean acc. len | step cost "
        "| acc. rate | per-position acceptance | = plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        per_pos = ", ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-"
        target = (
            TARGETS.get(r["method"].split("[")[0].split("(")[0].rstrip("2"))
            if r["set"] == "code" and r["batch"] == 1
            else None
        )
        verdict = f" (target {target:.1f}x)" if target else ""
        lines.append(
            f"| {r['set']} | {r['batch']} | {r['method']} | {r['tokens_per_s']:.1f} | "
            f"{r['tokens_per_cpu_s']:.1f} | {r['speedup_cpu']:.2f}x [{r['speedup_wall']:.2f}x]{verdict} | "
            f"{r.get('speedup_decode', float('nan')):.2f}x | {r['mean_acceptance_length']:.2f} | "
            f"{r['mean_acceptance_length'] / r.get('speedup_decode', r['speedup_cpu']):.2f} | "
            f"{r['acceptance_rate']:.3f} | {per_pos} | "
            f"{same_as_plain(r)} |"
        )
    (OUT / "speculative.md").write_text("\n".join(lines) + "\n")
    plot(results["runs"], OUT / "speculative.png")
    print(f"wrote {OUT / 'speculative.json'}, {OUT / 'speculative.md'}, {OUT / 'speculative.png'}")


def plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    groups = sorted({(r["set"], r["batch"]) for r in runs})
    methods = list(dict.fromkeys(r["method"] for r in runs))
    colour = {method: f"C{i}" for i, method in enumerate(methods)}  # one colour per method in every panel
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [
            next((r["speedup_cpu"] for r in runs if (r["set"], r["batch"]) == g and r["method"] == method), 0)
            for g in groups
        ]
        left.bar([x + i * width for x in range(len(groups))], values, width, label=method, color=colour[method])
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], [f"{s} b{b}" for s, b in groups])
    left.set_ylabel("speedup over plain (tokens / CPU-s)")
    left.set_ylim(0, max(max(r["speedup_cpu"] for r in runs), 1.0) * 1.45)
    left.legend(ncol=3, fontsize=8, loc="upper left")
    shown = ("code", 1) if ("code", 1) in groups else groups[0]
    for r in runs:
        if r["acceptance_per_position"] and (r["set"], r["batch"]) == shown:
            right.plot(
                range(1, len(r["acceptance_per_position"]) + 1),
                r["acceptance_per_position"],
                marker="o",
                color=colour[r["method"]],
                label=f"{r['method']} (AL {r['mean_acceptance_length']:.2f})",
            )
    right.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    right.set_xlabel("draft position (depth)")
    right.set_ylabel("acceptance per verification step")
    right.set_title(f"per-position acceptance, {shown[0]} batch {shown[1]}")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
