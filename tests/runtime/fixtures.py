"""Models and engines for the runtime tests: tiny random Llamas, heads in the real input formats.

* :func:`make_hf_model` saves a random ``LlamaForCausalLM``; :func:`write_engine` converts it with
  the project's converter into a reference engine folder (the layout trtllm-build writes).

* Medusa heads are written as FasterDecoding's ``medusa_lm_head.safetensors`` (``{h}.{l}.linear.*``,
  ``{h}.{L}.weight``), the EAGLE-1 drafter as ``config.json`` + ``model.safetensors`` (``fc.*``,
  ``layers.0.*`` without input_layernorm, no ``embed_tokens``: the base embedding is used), FP8
  bases as a ModelOpt-style export (``hf_quant_config.json``, float8 weights with ``weight_scale`` /
  ``input_scale``, ``k_scale`` / ``v_scale``); all go through the project's converter.
* The heads are random where it does not matter (ResBlock weights, the drafter's attention and MLP,
  kept small) and fitted by ridge regression on the model's own greedy outputs where it does
  (Medusa lm_heads, the drafter's fc), so drafts are right often enough to be accepted and wrong
  often enough to be rejected: a test that skipped verification would produce different text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from pipeline.checkpoint import convert_checkpoint
from pipeline.checkpoint.heads import EagleOptions, MedusaOptions
from pipeline.methods.eagle import EagleConfig
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.medusa import MedusaConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.runtime.model.engine import Engine, Logits, StepInput
from pipeline.runtime.request import GenerationRequest
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.registry import Measuring
from pipeline.trees import CPU_SMALL_10_DEPTH_3


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny matmuls lose to OpenMP start-up and to other processes on a 2-core runner (100x
    slower with 2 threads under load); restored after each module for the other test folders.
    A folder's conftest imports it to make it autouse there."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SPEC_MODE = {"ngram": 2, "medusa": 4, "lookahead": 8, "eagle": 32}  # build_config.speculative_decoding_mode (IntFlag)
MODEL = dict(
    vocab_size=96,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
MEDUSA_HEADS, EAGLE_LAYERS, EAGLE_MAX_DRAFT = 3, 3, 16
LOOKAHEAD = LookaheadConfig(4, 3, 4)
NGRAM = NGramConfig(max_draft_len=4)  # TensorRT-LLM's defaults otherwise: tails of up to 2 tokens
TREE = CPU_SMALL_10_DEPTH_3


def rehearsing(kind: str | None) -> Measuring:
    """What rehearsal lists a ``kind`` engine's candidates from: the server's (W, N, G) LOOKAHEAD, the
    plan's TREE for a Medusa or EAGLE engine, EAGLE-2 at top_k 3."""
    configs: dict[str, Any] = {"lookahead": LOOKAHEAD}
    if kind == "medusa":
        configs["medusa"] = MedusaConfig(MEDUSA_HEADS, 1, TREE, len(TREE))
    if kind == "eagle":
        configs["eagle"] = EagleConfig(TREE, EAGLE_LAYERS, 10, EAGLE_MAX_DRAFT, False, 10)
    return Measuring(configs, eagle_top_k=3)


# The speculative engines' limits: every method's drafts fit, 64 requests may be in flight.
SPEC_LIMITS = {"max_batch_size": 64, "max_seq_len": 160, "max_num_tokens": 4096}


TINY = dict(
    vocab_size=97,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)


def make_hf_model(folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained; weights scaled up so that logits are
    peaked and greedy decoding has no near-ties (fp32 round-off must not flip a token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, "initializer_range": 0.15, "tie_word_embeddings": False, **overrides})
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return folder


PROMPTS = [[1, 5, 9, 13, 2, 7], [3], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52], [8, 8, 8]]


def engine_greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    cache = engine.new_cache(len(prompt) + n)
    tokens = [int(engine.forward([StepInput(cache, prompt)])[0].logits[-1].argmax())]
    while len(tokens) < n:
        tokens.append(int(engine.forward([StepInput(cache, [tokens[-1]])])[0].logits[-1].argmax()))
    return tokens


def random_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_prompts(vocab: int) -> list[list[int]]:
    """The prompts the tests decode: random ones, a one-token prompt and a repetitive one."""
    return random_prompts(6, vocab, seed=5) + [[3 % vocab], [8 % vocab] * 3]


test_prompts.__test__ = False  # a helper, not a pytest test


def generate(engine: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Plain greedy continuations, all requests in flight at once."""
    out: dict[str, list[int]] = {}
    sched = Scheduler(engine)
    for i, prompt in enumerate(prompts):
        sched.submit(
            GenerationRequest(str(i), tuple(prompt), n, exclude_input_in_output=True),
            lambda o, i=i: out.__setitem__(str(i), o.tokens) if o.finished else None,
        )
    sched.run_until_idle()
    return [out[str(i)] for i in range(len(prompts))]


def features(engine: Engine, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Final-normed hidden states [T, H] of each whole sequence."""
    items = [StepInput(engine.new_cache(len(s)), s, Logits.ALL) for s in sequences]
    return [rows.hidden for rows in engine.forward(items)]


def ridge(x: torch.Tensor, y: torch.Tensor, lam: float = 1e-2) -> torch.Tensor:
    """argmin_A |x A - y|^2 + lam |A|^2, [in, out]."""
    return torch.linalg.solve(x.T @ x + lam * torch.eye(x.shape[1]), x.T @ y)


@dataclass
class Corpus:
    """Greedy text of the base model and its features, for fitting heads."""

    sequences: list[torch.Tensor]  # token ids [T]
    hidden: list[torch.Tensor]  # [T, H]
    embedding: torch.Tensor  # [V, H]


def make_corpus(engine: Engine, prompts: list[list[int]], n: int) -> Corpus:
    seqs = [p + g for p, g in zip(prompts, generate(engine, prompts, n))]
    return Corpus([torch.tensor(s) for s in seqs], features(engine, seqs), engine.embedding)


def write_medusa_heads(folder: Path, corpus: Corpus, heads: int = MEDUSA_HEADS, seed: int = 0) -> Path:
    """FasterDecoding layout; head i's lm_head fitted to predict token t+2+i from its ResBlock output."""
    gen = torch.Generator().manual_seed(seed)
    H, V = corpus.embedding.shape[1], corpus.embedding.shape[0]
    state: dict[str, torch.Tensor] = {}
    for h in range(heads):
        w, b = torch.randn(H, H, generator=gen) * 0.05, torch.randn(H, generator=gen) * 0.05
        xs, ys = [], []
        for tokens, hid in zip(corpus.sequences, corpus.hidden):
            t = len(tokens) - 2 - h
            x = hid[:t]
            xs.append(x + torch.nn.functional.silu(x @ w.T + b))
            ys.append(torch.nn.functional.one_hot(tokens[2 + h :], V).float())
        lm = ridge(torch.cat(xs), torch.cat(ys)).T * 8.0  # [V, H], scaled so the logits are peaked
        state.update({f"{h}.0.linear.weight": w, f"{h}.0.linear.bias": b, f"{h}.1.weight": lm.contiguous()})
    folder.mkdir(parents=True)
    save_file(state, str(folder / "medusa_lm_head.safetensors"))
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1}))
    return folder


def write_eagle_drafter(folder: Path, base_config: dict, corpus: Corpus, seed: int = 0) -> Path:
    """EAGLE-1 layout; the attention/MLP are random and small, fc is fitted so that
    fc([embed(x_{t+1}); f_t]) ~ f_{t+1}, which makes lm_head(f') predict x_{t+2}."""
    gen = torch.Generator().manual_seed(seed)
    H = base_config["hidden_size"]
    heads, kv = base_config["num_attention_heads"], base_config["num_key_value_heads"]
    d, inter = H // heads, base_config["intermediate_size"]
    xs, ys = [], []
    for tokens, hid in zip(corpus.sequences, corpus.hidden):
        xs.append(torch.cat((corpus.embedding[tokens[1:]], hid[:-1], torch.ones(len(tokens) - 1, 1)), dim=-1))
        ys.append(hid[1:])
    a = ridge(torch.cat(xs), torch.cat(ys))  # [2H + 1, H]

    def small(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    state = {
        "fc.weight": a[: 2 * H].T.contiguous(),
        "fc.bias": a[2 * H].contiguous(),
        "layers.0.self_attn.q_proj.weight": small(heads * d, H) * 10,
        "layers.0.self_attn.k_proj.weight": small(kv * d, H) * 10,
        "layers.0.self_attn.v_proj.weight": small(kv * d, H),
        "layers.0.self_attn.o_proj.weight": small(H, heads * d),
        "layers.0.mlp.gate_proj.weight": small(inter, H),
        "layers.0.mlp.up_proj.weight": small(inter, H),
        "layers.0.mlp.down_proj.weight": small(H, inter),
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
    }
    folder.mkdir(parents=True)
    save_file(state, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d,
        "num_hidden_layers": 1,
        "vocab_size": base_config["vocab_size"],
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": base_config["max_position_embeddings"],
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_fp8_export(hf_dir: Path, out: Path, calibration: list[list[int]]) -> Path:
    """A ModelOpt-style per-tensor FP8 (W8A8 + FP8 KV) HF export of ``hf_dir``: amax calibration on
    ``calibration`` with forward hooks, float8_e4m3fn weights with weight_scale / input_scale."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:

            def hook(mod, args, output, name=name):
                amax[name + ".input"] = max(amax.get(name + ".input", 0.0), float(args[0].abs().max()))
                amax[name + ".output"] = max(amax.get(name + ".output", 0.0), float(output.abs().max()))

            hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        for prompt in calibration:
            model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        module = name[: -len(".weight")]
        if name.endswith(".weight") and module + ".input" in amax:
            scale = tensor.abs().max() / 448.0
            state[name] = (tensor / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            state[module + ".weight_scale"] = scale.float().reshape(())
            state[module + ".input_scale"] = torch.tensor(amax[module + ".input"] / 448.0)
            if module.endswith(("k_proj", "v_proj")):
                state[f"{module}.{module[-6]}_scale"] = torch.tensor(amax[module + ".output"] / 448.0)
        else:
            state[name] = tensor.float().contiguous()
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"))
    config = json.loads((hf_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config))
    (out / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.47.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
            }
        )
    )
    return out


def write_engine(
    src: Path,
    out: Path,
    method: str | None = None,
    *,
    tp: int = 1,
    pp: int = 1,
    medusa_dir: Path | None = None,
    eagle_dir: Path | None = None,
    kv_cache_fp8: bool = False,
    dtype: str = "float32",
    **build: Any,
) -> Path:
    """A reference engine folder: the converter's checkpoint + the build_config trtllm-build would write
    (``build`` overrides its limits)."""
    draft = {
        "medusa": len(TREE),
        "eagle": EAGLE_MAX_DRAFT,
        "lookahead": LOOKAHEAD.max_draft_len,
        "ngram": NGRAM.max_draft_len,
        None: 0,
    }[method]
    out.mkdir(parents=True)
    convert_checkpoint(
        src,
        out,
        tp=tp,
        pp=pp,
        dtype=dtype,
        kv_cache_fp8=kv_cache_fp8,
        medusa=MedusaOptions(medusa_dir, max_draft_len=draft) if method == "medusa" else None,
        eagle=EagleOptions(eagle_dir, num_eagle_layers=EAGLE_LAYERS, max_draft_len=draft)
        if method == "eagle"
        else None,
    )
    pretrained = json.loads((out / "config.json").read_text())
    build_config = {
        "max_batch_size": 8,
        "max_input_len": 64,
        "max_seq_len": 128,
        "max_num_tokens": 256,
        "max_draft_len": draft,
        "speculative_decoding_mode": SPEC_MODE.get(method),
        "max_beam_width": 1,
        "plugin_config": {"tokens_per_block": 32, "paged_kv_cache": True},
        **build,
    }
    (out / "config.json").write_text(
        json.dumps({"version": "1.2.1", "pretrained_config": pretrained, "build_config": build_config})
    )
    return out


class EngineFactory:
    """Engines by (method, tp, fp8, dtype), built on first use and kept for the session."""

    def __init__(self, root: Path, hf_dir: Path, fp8_dir: Path, medusa_dir: Path, eagle_dir: Path):
        self.root, self.hf_dir, self.fp8_dir = root, hf_dir, fp8_dir
        self.medusa_dir, self.eagle_dir = medusa_dir, eagle_dir
        self.engines: dict[tuple[str | None, int, bool, str], Engine] = {}

    def __call__(self, method: str | None, tp: int = 1, fp8: bool = False, dtype: str = "float32") -> Engine:
        key = (method, tp, fp8, dtype)
        if key not in self.engines:
            folder = self.root / f"{method or 'plain'}-tp{tp}{'-fp8' if fp8 else ''}-{dtype}"
            src = self.fp8_dir if fp8 else self.hf_dir
            # EAGLE's drafter shares nothing with the KV cache scales: the converter refuses FP8 KV with EAGLE.
            kv_fp8 = fp8 and method != "eagle"
            write_engine(
                src,
                folder,
                method,
                tp=tp,
                medusa_dir=self.medusa_dir,
                eagle_dir=self.eagle_dir,
                kv_cache_fp8=kv_fp8,
                dtype=dtype,
                **SPEC_LIMITS,
            )
            self.engines[key] = Engine.load(folder)
        return self.engines[key]
