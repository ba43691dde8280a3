"""Stand-ins for what cannot exist on this machine: TensorRT-LLM's trtllm-build (no GPU, no wheel)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

# A stand-in for trtllm-build 1.2 that applies its build rules (tensorrt_llm/commands/build.py and
# builder.py _init_max_seq_len/build()): max_num_tokens is first clamped to
# max_batch_size * max_seq_len (as requested) and raised to tokens_per_block; spec modes then add
# max_draft_len to max_seq_len (EAGLE also num_eagle_layers) and raise max_num_tokens to
# max_batch_size * (max_draft_len + 1); one rank{r}.engine per checkpoint rank.
FAKE_TRTLLM_BUILD = textwrap.dedent("""\
    #!{python}
    import argparse, json, os, sys
    from pathlib import Path
    MODES = {{None: 1, "medusa": 4, "lookahead_decoding": 8, "eagle": 32}}
    p = argparse.ArgumentParser()
    for name in ("checkpoint_dir", "output_dir", "kv_cache_type", "gpt_attention_plugin", "gemm_plugin",
                 "remove_input_padding", "use_paged_context_fmha", "use_fp8_context_fmha", "multiple_profiles",
                 "speculative_decoding_mode", "output_timing_cache", "use_fused_mlp"):
        p.add_argument("--" + name)
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
                 "tokens_per_block", "max_draft_len", "workers"):
        p.add_argument("--" + name, type=int, default=0)
    a = p.parse_args()
    out = Path(a.output_dir)
    (out / "fake-call.json").write_text(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}))
    print("[TRT-LLM] [I] Set dtype to float32.", flush=True)
    if os.environ.get("FAKE_TRTLLM_FAIL"):
        (out / "rank0.engine").write_bytes(b"partial")
        print("[TRT-LLM] [E] Requested amount of GPU memory could not be allocated", flush=True)
        sys.exit(1)
    ckpt = json.loads((Path(a.checkpoint_dir) / "config.json").read_text())
    draft = a.max_draft_len if a.speculative_decoding_mode else 0
    extra = ckpt.get("num_eagle_layers", 0) if a.speculative_decoding_mode == "eagle" else 0
    if os.environ.get("FAKE_TRTLLM_NO_DRAFT"):
        draft, a.speculative_decoding_mode = 0, None
    on = lambda v: v == "enable"
    tokens = max(min(a.max_num_tokens, a.max_seq_len * a.max_batch_size), a.tokens_per_block)
    build = {{
        "max_batch_size": a.max_batch_size, "max_input_len": a.max_input_len, "max_beam_width": a.max_beam_width,
        "max_seq_len": a.max_seq_len + draft + extra, "max_draft_len": draft,
        "max_num_tokens": max(tokens, a.max_batch_size * (draft + 1)),
        "speculative_decoding_mode": MODES[a.speculative_decoding_mode], "kv_cache_type": a.kv_cache_type.upper(),
        "gather_context_logits": False,
        "plugin_config": {{"gpt_attention_plugin": "float32", "gemm_plugin": a.gemm_plugin,
                           "remove_input_padding": on(a.remove_input_padding), "paged_kv_cache": True,
                           "tokens_per_block": a.tokens_per_block,
                           "use_paged_context_fmha": on(a.use_paged_context_fmha),
                           "use_fp8_context_fmha": on(a.use_fp8_context_fmha)}},
    }}
    ckpt["mapping"].pop("rank", None)
    engine = {{"version": "1.2.1", "pretrained_config": ckpt, "build_config": build}}
    (out / "config.json").write_text(json.dumps(engine))
    for rank in range(ckpt["mapping"]["world_size"]):
        (out / f"rank{{rank}}.engine").write_bytes(b"engine")
    Path(a.output_timing_cache).write_bytes(b"cache")
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:01", flush=True)
""")


def fake_tensorrt_llm(root: Path, version: str = "1.2.1") -> tuple[Path, Path]:
    """A bin dir with the fake trtllm-build and a site dir where `tensorrt_llm` is importable."""
    bin_dir, site = root / "bin", root / "site"
    bin_dir.mkdir(parents=True)
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    dist = site / f"tensorrt_llm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    script = bin_dir / "trtllm-build"
    script.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    script.chmod(0o755)
    return bin_dir, site
