"""The vLLM worker extension that writes a validated WeightUpdate payload into the engine.

vLLM mixes ``FP8RLWorkerExtension`` into its worker class (``LLM(worker_extension_cls=...)``) and
the rollout actor calls its methods through ``LLM.collective_rpc``; with tensor parallelism every
rank runs the same call and keeps its own shard.

Design notes
------------
* **Validation happens before this runs** (``VLLMRolloutWorker.apply_weights``: all or nothing,
  against the native engine's slot list). This module only writes.
* **Writes go through the model's own ``load_weights``** with the Hugging Face names of the
  update: vLLM maps ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` onto the fused
  parameters with their shard ids, narrows each tensor to this rank's part and copies it in
  place; the fp8rl scale loader places the block scales (``vllm_plugin``). This is the same path
  as the first load, so loading the same update twice gives the same engine.
* **Derived copies are refreshed.** Every linear/embedding module gets
  ``process_weights_after_loading`` again after a write. For a module on vLLM's own method this
  rebuilds its repacked private copy (vLLM's CPU path computes from that copy; a tied lm_head
  reads it, not the embedding, so without this its logits stay those of the old weights); for
  fp8rl's methods it drops the float64 weight cache of the CPU emulation, which cannot see writes
  made through ``param.data``.
* **Payload transport into the engine**: in-process engines (``uni`` executor) receive the tensor
  dict itself; multi-process engines receive the path of a safetensors file (tensors do not
  survive vLLM's RPC pickling), written by the caller to ``/dev/shm``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def _payload(payload: dict[str, Tensor] | str) -> dict[str, Tensor]:
    if isinstance(payload, str):
        from safetensors.torch import load_file

        return load_file(payload)
    return payload


def refresh_derived(model: nn.Module) -> list[str]:
    """Re-run ``process_weights_after_loading`` on every linear/embedding module after a write:
    vLLM's own methods rebuild their repacked copies, fp8rl's drop their weight caches. Returns
    the names of the modules that run vLLM's own methods (those that hold repacked copies)."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from fp8rl.workers.rollout import vllm_plugin

    ours = (
        vllm_plugin.FP8RLLinearMethod,
        vllm_plugin.DenseLinearMethod,
        vllm_plugin.DenseEmbeddingMethod,
    )
    stock = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if not isinstance(module, LinearBase | VocabParallelEmbedding) or method is None:
            continue
        if getattr(module, "weight", None) is None:
            continue
        method.process_weights_after_loading(module)
        if not isinstance(method, ours):
            stock.append(name)
    return stock


class FP8RLWorkerExtension:
    """Methods added to vLLM's worker (``self.model_runner`` is vLLM's)."""

    def _fp8rl_model(self) -> nn.Module:
        return self.model_runner.get_model()

    @torch.no_grad()
    def fp8rl_load_weights(self, payload: dict[str, Tensor] | str) -> dict[str, Any]:
        """Copy a validated payload (HF names → tensors, or a safetensors path) into the model.

        Returns ``{"loaded": sorted vLLM parameter names written, "refreshed": modules whose
        repacked copies were rebuilt}``.
        """
        model = self._fp8rl_model()
        tensors = _payload(payload)
        loaded = model.load_weights(iter(tensors.items()))
        refreshed = refresh_derived(model)
        return {"loaded": sorted(loaded or []), "refreshed": refreshed}

    def fp8rl_parameters(self) -> dict[str, tuple[list[int], str]]:
        """Every model parameter on this rank: name → (shape, dtype name)."""
        return {
            name: (list(p.shape), str(p.dtype).removeprefix("torch."))
            for name, p in self._fp8rl_model().named_parameters()
        }

    def fp8rl_checksums(self) -> dict[str, str]:
        """``wsum64`` of every model parameter on this rank (tests: bitwise-equal weights)."""
        from fp8rl.workers.weight_sync.checksum import wsum64

        return {name: wsum64(p) for name, p in self._fp8rl_model().named_parameters()}
