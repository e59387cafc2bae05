"""CUDA-graph decode steps for the native engine (GPU only).

A decode step of a small batch is launch-bound: dozens of kernels per layer, each tiny. The
engine captures one graph per KV-length bucket (attention reads ``kv_limit`` cache positions, a
multiple of 128) over static token/position buffers and the chunk's KV cache, then replays it.
Rows stay in place for the whole chunk (no compaction): finished rows keep computing and are
ignored, which keeps shapes static. All graphs of a chunk share one memory pool.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.workers.model.decoder import Decoder, KVCache


class GraphDecoder:
    """Replays captured decode steps: ``(tokens [B], pos [B], kv_limit) → logits [B, V]``."""

    def __init__(self, model: Decoder, cache: KVCache, batch: int) -> None:
        dev = cache.k[0].device
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _step(self, limit: int) -> Tensor:
        hidden = self.model(
            self.tokens[:, None], self.pos[:, None], self.pos + 1, self.cache, kv_limit=limit
        )
        return self.model.logits(hidden[:, 0])

    def _capture(self, limit: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(
            side
        ):  # warm-up: compiles kernels; rewrites this step's K/V identically
            self._step(limit)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._step(limit)
        return graph, out

    def __call__(self, tokens: Tensor, pos: Tensor, limit: int) -> Tensor:
        """Logits of the next token for every row (the graph's static output: copy to keep)."""
        self.tokens.copy_(tokens)
        self.pos.copy_(pos)
        if limit not in self.graphs:
            self.graphs[limit] = self._capture(limit)
        graph, out = self.graphs[limit]
        graph.replay()
        return out
