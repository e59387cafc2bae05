"""fp8rl's native rollout engine: batched prefill + KV-cache decode on the shared decoder.

Prompts are prefilled once and their caches replicated for the n samples. Decode feeds each
sequence's last token at its own position (keys live at index = position, so a sequence's
arithmetic never depends on its neighbours), samples with the request's filters and records the
logprob of the drawn token under the full softmax of logits/temperature — computed by the same
``Decoder.logits`` + ``token_logprobs`` composition the trainer uses. Finished sequences are
dropped from the decode batch; a response cut at ``max_tokens`` keeps its last token and finishes
with reason ``length``. Sample j of a prompt with seed s draws from its own stream
``sequence_seed(s, j)`` (``sampling``), so its tokens do not depend on its batch neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import SamplingParams
from fp8rl.workers.model.decoder import Decoder, KVCache
from fp8rl.workers.rollout.cuda_graphs import GraphDecoder
from fp8rl.workers.rollout.sampling import (
    SEED_BITS,
    draw,
    sample_tokens,
    sequence_seed,
    uniform_table,
)

KV_BUCKET = 128
"""Decode attends over the KV cache up to the next multiple of this many positions."""


@dataclass
class Generation:
    """One sampled response."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


class NativeEngine:
    """Generate with a Decoder (inference precision) and a KV cache.

    Args:
        model: the shared decoder built for inference.
        eos_token_ids: ids that always end a response.
        max_batch_size: most sequences decoded at once (prompts are chunked to fit).
        cuda_graphs: replay captured decode steps on CUDA (ignored on CPU).
    """

    def __init__(
        self,
        model: Decoder,
        *,
        eos_token_ids: Sequence[int],
        max_batch_size: int = 256,
        cuda_graphs: bool = False,
    ) -> None:
        self.model = model
        self.eos = set(eos_token_ids)
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters(), model.rope_cos).device
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphs: GraphDecoder | None = None  # kept across generate calls (``_graphs_for``)
        if self.device.type == "cuda":  # no per-GEMM NaN check (a host sync each) while decoding
            for module in model.modules():
                if hasattr(module, "check_finite"):
                    module.check_finite = False

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int | None] | None = None,
    ) -> list[list[Generation]]:
        """``sampling.n`` generations for each prompt, grouped per prompt in input order.

        ``seeds``: one per prompt (its sampling stream); a missing one is
        ``sequence_seed(sampling.seed, i)`` for prompt i, or random when ``sampling.seed`` is None.

        Raises:
            ValueError: an empty prompt, or prompt + max_tokens beyond the model's positions.
        """
        limit = self.model.rope_cos.shape[0]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) + sampling.max_tokens > limit:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens; with max_tokens={sampling.max_tokens} it exceeds "
                    f"the model's {limit} positions (model.max_model_len)"
                )
        base = sampling.seed if sampling.seed is not None else torch.seed() % 2**SEED_BITS
        given = list(seeds) if seeds is not None else [None] * len(prompts)
        prompt_seeds = [sequence_seed(base, i) if s is None else s for i, s in enumerate(given)]
        per_chunk = max(1, self.max_batch_size // sampling.n)
        out: list[list[Generation]] = []
        for start in range(0, len(prompts), per_chunk):
            chunk = slice(start, start + per_chunk)
            out += self._generate_chunk(prompts[chunk], sampling, prompt_seeds[chunk])
        return out

    def _generate_chunk(
        self, prompts: Sequence[Sequence[int]], sp: SamplingParams, prompt_seeds: Sequence[int]
    ) -> list[list[Generation]]:
        model, dev = self.model, self.device
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lens.max())
        ids = torch.zeros((len(prompts), width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(list(p), device=dev)
        capacity = width + sp.max_tokens
        if self.cuda_graphs:  # a bucketed capacity: the kept graphs serve the next calls too
            capacity = -(-capacity // KV_BUCKET) * KV_BUCKET
        cache = KVCache.allocate(
            model.config,
            batch=len(prompts),
            capacity=capacity,
            dtype=model.compute_dtype,
            device=dev,
            kv_fp8=model.precision.kv_fp8,
        )
        positions = torch.arange(width, device=dev).expand(len(prompts), width)
        hidden = model(ids, positions, lens, cache)
        last = hidden[torch.arange(len(prompts), device=dev), lens - 1]

        rows = torch.arange(len(prompts), device=dev).repeat_interleave(sp.n)
        seeds = torch.tensor(
            [sequence_seed(s, j) for s in prompt_seeds for j in range(sp.n)], device=dev
        )
        logits, pos = model.logits(last[rows]), lens[rows]
        gens = [Generation() for _ in range(len(rows))]
        pos_host = [len(prompts[i // sp.n]) for i in range(len(rows))]
        stop = self.eos | set(sp.stop_token_ids)
        if self.cuda_graphs:
            graphs = self._graphs_for(cache, rows, sp)
            del cache  # its rows are in the graphs' cache now
            self._decode_graphs(graphs, logits, pos, pos_host, seeds, sp, gens, stop)
        else:
            self._decode_eager(cache.select(rows), logits, pos, pos_host, seeds, sp, gens, stop)
        return [gens[i * sp.n : (i + 1) * sp.n] for i in range(len(prompts))]

    def _graphs_for(self, prefill: KVCache, rows: Tensor, sp: SamplingParams) -> GraphDecoder:
        """The decode graphs for a chunk, with the prefill's ``rows`` copied into their KV cache:
        the kept ones when they serve its shape and sampling, else new ones (which replace them).
        """
        held = self._graphs
        if held is not None and held.serves(len(rows), prefill.capacity, sp):
            prefill.select(rows, out=held.cache)
            return held
        self._graphs = None  # free the old graphs' cache before allocating the new one
        self._graphs = GraphDecoder(self.model, prefill.select(rows), len(rows), sp)
        return self._graphs

    def drop_graphs(self) -> None:
        """Free the kept decode graphs and their KV cache (before giving memory away, or when
        the model's tensors move: a graph holds their addresses)."""
        self._graphs = None

    def _decode_eager(self, cache, logits, pos, pos_host, seeds, sp, gens, stop) -> None:
        """Draw, record, drop the finished rows (compaction), step the model; one host sync per
        step (the drawn tokens, for the stop check)."""
        model, dev = self.model, self.device
        active = list(range(len(gens)))  # gens index of each decode row
        for step in range(sp.max_tokens):
            tokens = sample_tokens(
                logits,
                temperature=sp.temperature,
                top_k=sp.top_k,
                top_p=sp.top_p,
                seeds=seeds,
                step=step,
            )
            logps = token_logprobs(
                logits, tokens, temperature=sp.temperature, exact=model.precision.exact
            )
            final = step == sp.max_tokens - 1
            keep = self._record(gens, active, tokens.tolist(), logps.tolist(), stop, final=final)
            if not any(keep):
                break
            if not all(keep):
                index = torch.tensor([i for i, k in enumerate(keep) if k], device=dev)
                cache, tokens, pos = cache.select(index), tokens[index], pos[index]
                seeds = seeds[index]
                active = [active[i] for i in index.tolist()]
                pos_host = [pos_host[i] for i in index.tolist()]
            limit = min(cache.capacity, -(-(max(pos_host) + 1) // KV_BUCKET) * KV_BUCKET)
            hidden = model(tokens[:, None], pos[:, None], pos + 1, cache, kv_limit=limit)
            logits = model.logits(hidden[:, 0])
            pos, pos_host = pos + 1, [p + 1 for p in pos_host]

    def _decode_graphs(self, graphs, logits, pos, pos_host, seeds, sp, gens, stop) -> None:
        """Graph-mode decode: rows stay in place (finished ones marked -1 and ignored), each step
        is one graph replay (forward, lm_head, draw, logprob), and the host reads step t's tokens
        while the GPU runs step t + 1: the stop check lags one step, so the GPU never waits for
        the host; a step launched after every row finished is discarded."""
        model, batch, capacity = self.model, len(gens), graphs.cache.capacity
        uniforms = uniform_table(seeds, sp.max_tokens)
        tokens = draw(
            logits, uniforms[:, 0], temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p
        )
        logps = token_logprobs(
            logits, tokens, temperature=sp.temperature, exact=model.precision.exact
        )
        cuda = self.device.type == "cuda"
        host_tokens = torch.empty(sp.max_tokens, batch, dtype=torch.long, pin_memory=cuda)
        host_logps = torch.empty(sp.max_tokens, batch, dtype=torch.float32, pin_memory=cuda)
        done = [None] * sp.max_tokens  # an event per step: its tokens are on the host

        def to_host(step: int, tok: Tensor, lp: Tensor) -> None:
            host_tokens[step].copy_(tok, non_blocking=cuda)
            host_logps[step].copy_(lp, non_blocking=cuda)
            if cuda:
                done[step] = torch.cuda.Event()
                done[step].record()

        to_host(0, tokens, logps)
        active = list(range(batch))  # gens index of each row, -1 once finished
        for step in range(sp.max_tokens):
            if step + 1 < sp.max_tokens:  # launch the next step before reading this one
                limit = min(capacity, -(-(max(pos_host) + 1) // KV_BUCKET) * KV_BUCKET)
                tokens, logps = graphs(tokens, pos, uniforms[:, step + 1], limit)
                to_host(step + 1, tokens, logps)
                pos, pos_host = pos + 1, [p + 1 for p in pos_host]
            if done[step] is not None:
                done[step].synchronize()
            final = step == sp.max_tokens - 1
            keep = self._record(
                gens, active, host_tokens[step].tolist(), host_logps[step].tolist(), stop,
                final=final,
            )  # fmt: skip
            if not any(keep):
                break
            active = [g if k else -1 for g, k in zip(active, keep, strict=True)]

    @staticmethod
    def _record(
        gens: list[Generation],
        active: list[int],
        tokens: list[int],
        logps: list[float],
        stop: set[int],
        *,
        final: bool,
    ) -> list[bool]:
        """Append each live row's token; return which rows continue (finished rows: False)."""
        keep = []
        for g, tok, lp in zip(active, tokens, logps, strict=True):
            if g < 0:
                keep.append(False)
                continue
            gens[g].token_ids.append(tok)
            gens[g].logprobs.append(lp)
            if tok in stop:
                gens[g].finish_reason = "stop"
            keep.append(tok not in stop and not final)
        return keep
