"""CUDA-graph decode steps for the native engine (GPU only).

A decode step of a small batch is launch-bound: dozens of kernels per layer, each tiny. The
engine captures one graph per KV-length bucket (attention reads ``kv_limit`` cache positions, a
multiple of 128) over static token/position/uniform buffers and the chunk's KV cache, then
replays it. A step's graph holds the whole step: the forward of the last tokens, the lm_head,
the seeded draw (``sampling.draw``) and the drawn token's logprob (``token_logprobs``), the same
functions the eager step runs, so both give the same tokens and logprobs. Before (to
2026-12-04) they ran eagerly after each replay, ~60 kernels and a host sync per step: 1.0-1.4 ms
per step at batch 64 on the H200 against a 5.5 ms FP8 graph step (``benchmarks/decode_overhead.py``).
Inside the graph, with the one-kernel draw (``kernels.sample_triton``), they add ~0.24 ms.

Rows stay in place for the whole chunk (no compaction): finished rows keep computing and are
ignored, which keeps shapes static. All graphs of a chunk share one memory pool. The engine keeps
its ``GraphDecoder`` across ``generate`` calls of the same shape and sampling (``serves``),
loading each chunk's prefill rows into the same KV cache: the captures (0.2-0.3 s per call on
the H200, 7-10 % of a gen-512 decode) happen once. Weight updates copy into the weights in place
(``weight_sync.receiver``), so a kept graph reads the new weights.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import SamplingParams
from fp8rl.workers.model.decoder import Decoder, KVCache
from fp8rl.workers.rollout.sampling import draw


def kernel_switches() -> tuple:
    """The process-wide kernel choices a captured step bakes in (``invariant.set_fast_attention``,
    ``set_fast_logprobs``, ``decode_attention.set_enabled``, ``gemm_decode_triton.set_enabled``/``set_parity_safe``,
    ``rope_kv.set_fused``): kept graphs serve a chunk only while these are unchanged. The
    decode GEMM's are read only once its module is loaded (it imports Triton; not loaded, its
    switches are unset)."""
    from fp8rl.kernels import decode_attention, invariant, rope_kv

    gemm = sys.modules.get("fp8rl.kernels.gemm_decode_triton")
    return (
        invariant._FAST_ATTENTION[0],
        invariant._FAST_LOGPROBS[0],
        decode_attention._ENABLED[0],
        rope_kv._FUSED[0],
        None if gemm is None else (gemm._ENABLED[0], gemm._PARITY_SAFE[0]),
    )


class GraphDecoder:
    """Replays captured decode steps: ``(tokens [B], pos [B], uniforms [B], kv_limit) →
    (next tokens [B] int64, their logprobs [B] float32)``.

    Args:
        model: the inference decoder. cache: the chunk's KV cache (rows fixed for the chunk).
        batch: B, the rows of ``cache``. sampling: the chunk's temperature / top-k / top-p.
    """

    def __init__(self, model: Decoder, cache: KVCache, batch: int, sampling: SamplingParams):
        dev = cache.k[0].device
        self.model, self.cache, self.sampling = model, cache, sampling
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.uniforms = torch.full((batch,), 0.5, dtype=torch.float64, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[Tensor, Tensor]]] = {}
        self.switches = kernel_switches()
        self.pool = torch.cuda.graph_pool_handle()

    def serves(self, rows: int, capacity: int, sampling: SamplingParams) -> bool:
        """Whether these graphs can decode a chunk of ``rows`` rows in a cache of ``capacity``
        positions with ``sampling`` (its temperature, top-k and top-p are captured), under the
        kernel choices they were captured with (``kernel_switches``)."""
        mine, sp = self.sampling, sampling
        return (
            self.switches == kernel_switches()
            and self.tokens.shape[0] == rows
            and self.cache.capacity == capacity
            and (mine.temperature, mine.top_k, mine.top_p) == (sp.temperature, sp.top_k, sp.top_p)
        )

    def _step(self, limit: int) -> tuple[Tensor, Tensor]:
        sp, model = self.sampling, self.model
        hidden = model(
            self.tokens[:, None], self.pos[:, None], self.pos + 1, self.cache, kv_limit=limit
        )
        logits = model.logits(hidden[:, 0])
        tokens = draw(
            logits, self.uniforms, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p
        )
        logps = token_logprobs(
            logits, tokens, temperature=sp.temperature, exact=model.precision.exact
        )
        return tokens, logps

    def _capture(self, limit: int) -> tuple[torch.cuda.CUDAGraph, tuple[Tensor, Tensor]]:
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

    def __call__(
        self, tokens: Tensor, pos: Tensor, uniforms: Tensor, limit: int
    ) -> tuple[Tensor, Tensor]:
        """The next token and its logprob for every row: the graph's static outputs, valid until
        the next call (copy to keep). Launches only; no host sync.

        tokens, pos: [B] int64 on the device (the last token of each row and its position);
        uniforms: [B] float64, each row's draw (``sampling.uniform_table``'s column for this
        step); limit: the KV bucket, above every position."""
        self.tokens.copy_(tokens)
        self.pos.copy_(pos)
        self.uniforms.copy_(uniforms)
        if limit not in self.graphs:
            self.graphs[limit] = self._capture(limit)
        graph, out = self.graphs[limit]
        graph.replay()
        return out
