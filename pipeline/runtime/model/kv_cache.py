"""Per-request KV cache: one contiguous [kv_heads, capacity, head_size] tensor per (rank, layer).

Why contiguous and not paged: on a CPU there is no allocator pressure to fight, and a contiguous
slice ``k[:, :length]`` goes straight into ``scaled_dot_product_attention`` without a gather.
Capacity grows by doubling (amortised O(1) per token) up to the request's own bound
(prompt + max_new_tokens + draft room), so a short request never holds max_seq_len of memory.
``tokens_per_block`` is used for accounting only: :attr:`KVCache.blocks` counts the blocks
TensorRT-LLM's paged cache allocates for the same request (one per ``tokens_per_block`` tokens
reserved, drafts included), which the ``kv_cache_alloc_*`` perf outputs report.

Beam search gives each beam its own cache: a beam that continues another beam's history takes a
:meth:`fork` (a copy of the committed tokens) when that history has several children.

Speculative methods write draft tokens past ``length`` and then keep only the accepted ones:
:meth:`keep` compacts the chosen slots and :meth:`truncate` drops the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

_MIN_CAPACITY = 64


@dataclass
class KVCache:
    kv_heads: list[int]  # per tp rank (KV heads are replicated when kv_heads < tp)
    num_layers: int
    head_size: int
    dtype: torch.dtype
    limit: int  # most tokens this request can ever hold
    length: int = 0  # tokens committed
    capacity: int = 0
    tokens_per_block: int = 32
    blocks: int = 0  # paged-cache blocks a GPU would have allocated so far (never freed mid-request)
    # keys[rank][layer] / values[rank][layer]: [kv_heads_r, capacity, head_size]
    keys: list[list[torch.Tensor]] = field(default_factory=list)
    values: list[list[torch.Tensor]] = field(default_factory=list)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` tokens after ``length`` (call once per step, before writing)."""
        need = self.length + extra
        self.blocks = max(self.blocks, -(-need // self.tokens_per_block))
        if need <= self.capacity:
            return
        if need > self.limit:
            raise ValueError(f"KV cache of {self.limit} tokens cannot hold {need}")
        capacity = min(max(need, 2 * self.capacity, _MIN_CAPACITY), self.limit)
        for store in (self.keys, self.values):
            if not store:
                store.extend([[] for _ in self.kv_heads])
            for rank, heads in enumerate(self.kv_heads):
                old = store[rank]
                new = [torch.empty(heads, capacity, self.head_size, dtype=self.dtype) for _ in range(self.num_layers)]
                for layer, tensor in enumerate(old):
                    new[layer][:, : self.length] = tensor[:, : self.length]
                store[rank] = new
        self.capacity = capacity

    def write(self, rank: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v ([kv_heads, n, head_size]) after ``length``; return all keys/values incl. them.

        ``length`` itself moves only in :meth:`advance`, once every layer has written.
        """
        end = self.length + k.shape[1]
        self.keys[rank][layer][:, self.length : end] = k
        self.values[rank][layer][:, self.length : end] = v
        return self.keys[rank][layer][:, :end], self.values[rank][layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget everything after ``length`` (rejected draft tokens)."""
        self.length = min(self.length, length)

    def keep(self, start: int, slots: list[int]) -> None:
        """Keep cache slots ``start + s`` for s in ``slots`` (in order) at ``start, start+1, ...``.

        Tree verification writes every draft node; the accepted path is a subset of them.
        """
        device = self.keys[0][0].device if self.keys and self.keys[0] else None
        index = torch.tensor([start + s for s in slots], dtype=torch.long, device=device)
        for store in (self.keys, self.values):
            for per_rank in store:
                for tensor in per_rank:
                    tensor[:, start : start + len(slots)] = tensor.index_select(1, index)
        self.length = start + len(slots)

    def fork(self) -> KVCache:
        """An independent copy of the committed tokens (another beam continuing this history)."""
        return replace(
            self,
            keys=[[t.clone() for t in per_rank] for per_rank in self.keys],
            values=[[t.clone() for t in per_rank] for per_rank in self.values],
        )
