"""Weight matmuls of the reference engine, prepared once at load for the engine's dtype.

* float32 engines (and FP8 engines, whose weights are dequantized to float32 at load): exact
  float32 math. The weight is stored column-major: MKL multiplies by it ~1.8x faster for a batch of
  8 decode rows and no slower for one.
* bfloat16 engines: what a bf16 GEMM does on the GPU: inputs rounded to bf16, products summed in
  fp32, the output rounded to bf16 (then widened; norms, rope, attention, the KV cache and the
  residual stream stay float32 here). The weight is pre-packed for oneDNN, which uses AMX tiles on
  CPUs that have them. Why it matters: there a GEMM over up to 16 rows costs about what one row
  costs (bench/gemm_rows.py: at most ~1.3x; 32 rows ~1.6x, 64 rows ~3.3x), so verifying a draft
  tree of up to 15 nodes costs little more than one decoding step, as on a GPU; in float32 an
  11-row pass costs ~2.2 single-row steps on a 2-core Xeon. oneDNN's result for a row does not
  depend on the other rows of the call as long as a call has at most 32 rows (measured on AMX:
  from 48 rows on it blocks differently and the last bf16 bit moves), so calls are cut into chunks
  of 32: a token's logits are then the same whether it is decoded alone, in a batch or in a draft
  tree, which keeps greedy speculation token-exact.

On a CUDA device (``Engine.load(folder, device="cuda")``) the same weights run as plain torch
matmuls (cuBLAS; bf16 inputs with fp32 accumulation for bfloat16 engines), without oneDNN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN's packed layouts are tuned for a batch-size hint; 16 rows is within a few percent of the
# best for 1..64 rows on SmolLM2 shapes (decode, trees, in-flight batches).
_PACK_ROWS_HINT = 16
BF16_ROWS_PER_CALL = 32  # row-invariant results up to here (see the module docstring)


def onednn_bf16() -> bool:
    """Whether torch can run bf16 GEMMs through oneDNN here (AVX512-BF16 or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Gemm:
    """y = x @ W.T (+ b) for float32 x [rows, in] and W [out, in]; returns float32 [rows, out]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, bf16: bool = False):
        self.out_features = weight.shape[0]
        self.bf16 = bf16
        self.packed = bf16 and weight.device.type == "cpu" and onednn_bf16()  # CUDA: plain torch matmuls
        if not bf16:
            self.weight, self.bias = weight.float().T.contiguous().T, bias
        elif self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), _PACK_ROWS_HINT)
            self.bias = None if bias is None else bias.to(torch.bfloat16)
        else:
            self.weight = weight.to(torch.bfloat16)
            self.bias = None if bias is None else bias.to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.bf16:
            y = x @ self.weight.T
            return y if self.bias is None else y + self.bias
        if x.shape[0] == 0:
            return x.new_zeros(0, self.out_features)
        x = x.to(torch.bfloat16)
        if x.shape[0] <= BF16_ROWS_PER_CALL:  # the usual case: no split and cat (each copies the rows)
            return self._bf16(x).float()
        return torch.cat([self._bf16(chunk) for chunk in x.split(BF16_ROWS_PER_CALL)]).float()

    def _bf16(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
