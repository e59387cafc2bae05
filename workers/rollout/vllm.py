"""VLLMRolloutWorker: the rollout engine on vLLM, with fp8rl's numerics plugged in.

Design notes
------------
* **Same protocol as the native engine** (``worker.RolloutWorker``): token ids, per-token
  logprobs, finish reason, policy version and quant fingerprint per sample; ``apply_weights``
  validates a WeightUpdate completely before writing anything.
* **Same numerics as the trainer.** The engine runs the ``fp8rl`` quantization method
  (``vllm_plugin``: FP8 GEMMs and dense layers through ``fp8rl.kernels``) and fp8rl's RMSNorm,
  SwiGLU, RoPE and — in exact mode on CPU — attention (``vllm_exact``), in every precision mode.
* **Logprob definition.** vLLM runs with ``logprobs_mode="processed_logprobs"``: the float32
  log-softmax of logits/T (T=1 for greedy), which is the trainer's definition as long as no
  top-k/top-p filter renormalises it — so filters are refused with a message. The one remaining
  difference from an exact-mode trainer is that reduction's dtype: vLLM's log-softmax is float32,
  the trainer's exact path float64 (≤ ~1e-6 per token, measured in docs/results/vllm-parity.md).
* **Expected weights** come from the shared decoder: a meta-device ``Decoder`` of the same config
  and rollout precision gives ``engine_slots`` — exactly the slot list the native engine checks —
  so both backends accept and refuse the same updates (the contract is defined over the shared
  decoder, not over vLLM's fused parameter names; at start-up the worker also checks that
  writing those slots covers every vLLM parameter).
* **Version-0 weights**: vLLM starts from a config-only directory with dummy weights, then
  receives the native engine's version-0 codes (``load_model`` for the rollout role: the same
  quantization the native engine makes) through the refit path — one loading path for all.
* **Processes.** With ``tensor_parallel_size == 1`` the engine runs inside this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor) and payloads reach the worker
  extension as tensors; with more ranks vLLM starts one process per rank and the payload goes
  through a safetensors file in /dev/shm. On CPU the model always runs eagerly (no
  ``torch.compile``: its fusions would re-round fp8rl's ops).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import (
    Handshake,
    ModelSpec,
    PrecisionSpec,
    RolloutRequest,
    RolloutResult,
    RolloutSample,
    VLLMRollout,
    WeightUpdate,
)
from fp8rl.workers.common import handshake, load_model
from fp8rl.workers.model.build import cast_dense, layer_precision
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import resolve_model
from fp8rl.workers.rollout.backend import RolloutBackend
from fp8rl.workers.rollout.sampling import sequence_seed
from fp8rl.workers.weight_sync.layout import SlotSpec, engine_slots, engine_tensor
from fp8rl.workers.weight_sync.receiver import WeightReceiver

EXTENSION = "fp8rl.workers.rollout.vllm_refit.FP8RLWorkerExtension"
"""vLLM worker extension class (``LLM(worker_extension_cls=...)``) that writes refits."""

CPU_KV_SEQUENCES = 64
"""On CPU the KV cache holds this many full-length (``model.max_model_len``) sequences."""


def expected_slots(config: DecoderConfig, precision: LayerPrecision) -> dict[str, SlotSpec]:
    """The WeightUpdate slots an engine of ``config`` at ``precision`` accepts (name → role,
    shape, dtype): ``engine_slots`` of a meta-device shared decoder, dense tensors in
    ``precision.dtype`` — the native engine's list, computed without allocating weights."""
    from dataclasses import replace

    from fp8rl.workers.model.decoder import Decoder

    with torch.device("meta"):
        model = Decoder(config, replace(precision, trainable=True), max_positions=16)
    cast_dense(model, precision.dtype)
    return engine_slots(model)


def refuse_filters(top_k: int, top_p: float) -> None:
    """Raise ValueError for top-k/top-p sampling (vLLM would report renormalised logprobs)."""
    if top_k > 0 or top_p < 1.0:
        raise ValueError(
            f"rollout.top_k={top_k} / rollout.top_p={top_p}: the vLLM backend reports "
            "log-probabilities renormalised over the kept tokens, not the full-vocabulary "
            "softmax of logits/T that the trainer scores (on-policy ratios would be biased); "
            "set top_k: 0 and top_p: 1.0, or use rollout.backend: native, which samples with "
            "filters and still records the full-softmax logprob"
        )


def prompt_seed(seed: int | None, request_seed: int | None, index: int) -> int | None:
    """vLLM's seed for a prompt: its own (from its global index, set by the driver), else
    ``sequence_seed(request_seed, index)``, or None (unseeded) when neither is set."""
    if seed is not None:
        return seed
    return None if request_seed is None else sequence_seed(request_seed, index)


class VLLMRolloutWorker(RolloutBackend):
    """Rollout actor on vLLM's offline ``LLM`` (same interface as ``RolloutWorker``).

    Args:
        model, rollout, precision: its sub-specs (``rollout.backend`` must be ``vllm``).
        device: ``auto`` | ``cpu`` | ``cuda`` (vLLM's platform decides where it runs; a
            mismatch raises ValueError).
        rank: index among rollout workers. seed: weight-init seed for random presets and
            vLLM's seed.
    Raises:
        ValueError: wrong backend, FP8 KV cache (not supported by this backend yet), top-k/top-p
            filters, a device vLLM's build cannot use, or the fp8rl plugin is not installed.
    """

    def __init__(
        self,
        model: ModelSpec,
        rollout: VLLMRollout,
        precision: PrecisionSpec,
        *,
        device: str = "auto",
        rank: int = 0,
        seed: int = 0,
    ) -> None:
        if rollout.backend != "vllm":
            raise ValueError(
                f"VLLMRolloutWorker is the vllm backend; got rollout.backend={rollout.backend}"
            )
        refuse_filters(rollout.top_k, rollout.top_p)
        if precision.rollout_fp8 and precision.quant.kv_cache_dtype != "auto":
            raise ValueError(
                "precision.quant.kv_cache_dtype=fp8_e4m3 is not supported by the vLLM backend "
                "yet; use kv_cache_dtype: auto or rollout.backend: native"
            )
        self.spec, self.precision, self.rank, self.model_spec = rollout, precision, rank, model
        self.layer_precision = layer_precision(model, precision, role="rollout", trainable=False)
        source = resolve_model(model.path)
        self.config = source.config
        self.eos = list(source.config.eos_token_id)
        self.slots = expected_slots(source.config, self.layer_precision)
        self.fingerprint = precision.quant.fingerprint() if self.layer_precision.fp8 else None
        self.receiver = WeightReceiver(self.layer_precision, self.fingerprint)
        self._dir = Path(tempfile.mkdtemp(prefix="fp8rl-vllm-"))
        self.llm = self._start_engine(device, seed)
        self.device = torch.device("cpu" if self._platform_is_cpu() else "cuda")
        initial, _ = load_model(
            model, precision, role="rollout", trainable=False,
            device=torch.device("cpu"), seed=seed, source=source,
        )  # fmt: skip
        written = self._write({name: engine_tensor(initial, name) for name in self.slots})
        missing = sorted(set(self._call("fp8rl_parameters")) - set(written))
        if missing:
            raise RuntimeError(f"the WeightUpdate layout does not cover vLLM parameters {missing}")

    # -- engine ---------------------------------------------------------------------------

    def _start_engine(self, device: str, seed: int):
        from fp8rl.workers.rollout.vllm_plugin import hf_quantization_config, is_registered

        tp = self.spec.tensor_parallel_size
        if tp == 1:  # the engine lives in this process: payloads pass as tensors
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # vLLM's own processes do the same at start
        if not is_registered():
            raise ValueError(
                "the fp8rl vLLM plugin is not registered: its `vllm.general_plugins` entry point "
                "is missing from the installed fp8rl metadata; reinstall fp8rl (pip install .)"
            )
        if device == "cuda" and self._platform_is_cpu():
            raise ValueError(f"resources.device=cuda but vLLM {vllm.__version__} is a CPU build")
        if device == "cpu" and not self._platform_is_cpu():
            raise ValueError("resources.device=cpu but this vLLM build runs on CUDA")
        if self.spec.enable_sleep_mode and self._platform_is_cpu():
            raise ValueError("rollout.enable_sleep_mode needs vLLM on CUDA (this build is CPU)")
        (self._dir / "config.json").write_text(json.dumps(self.config.hf_config()))
        lp = self.layer_precision
        quant = hf_quantization_config(
            quant=self.precision.quant.model_dump(mode="json") if lp.fp8 else None,
            fp8=lp.fp8,
            exact=lp.exact,
            num_hidden_layers=self.config.num_hidden_layers,
        )
        cpu = self._platform_is_cpu()
        extra = {"kv_cache_memory_bytes": self._cpu_kv_bytes()} if cpu else {}
        return vllm.LLM(
            model=str(self._dir),
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=self.model_spec.dtype,
            quantization="fp8rl",
            hf_overrides={"quantization_config": quant},
            max_model_len=self.model_spec.max_model_len,
            tensor_parallel_size=tp,
            distributed_executor_backend="uni" if tp == 1 else "mp",
            gpu_memory_utilization=self.spec.gpu_memory_utilization,
            enforce_eager=self.spec.enforce_eager or lp.exact or cpu,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enable_sleep_mode=self.spec.enable_sleep_mode,
            seed=seed,
            **extra,
        )

    def _cpu_kv_bytes(self) -> int:
        """KV cache for ``CPU_KV_SEQUENCES`` full-length sequences (vLLM's CPU default,
        ``gpu_memory_utilization`` × RAM, would take GiBs from the trainer beside it)."""
        c = self.config
        itemsize = torch.empty((), dtype=self.layer_precision.dtype).element_size()
        per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * itemsize
        return per_token * self.model_spec.max_model_len * CPU_KV_SEQUENCES

    @staticmethod
    def _platform_is_cpu() -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    def _call(self, method: str, *args: Any) -> Any:
        return self.llm.collective_rpc(method, args=args)[0]

    def _write(self, payload: dict[str, Tensor]) -> list[str]:
        """Write a validated payload into every rank; return the vLLM parameters written."""
        if self.spec.tensor_parallel_size == 1:
            result = self._call("fp8rl_load_weights", payload)
        else:
            from safetensors.torch import save_file

            shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else self._dir
            path = shm / f"fp8rl-update-{os.getpid()}.safetensors"
            save_file({k: v.contiguous().cpu() for k, v in payload.items()}, str(path))
            try:
                result = self._call("fp8rl_load_weights", str(path))
            finally:
                path.unlink(missing_ok=True)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        return result["loaded"]

    # -- the RolloutWorker interface --------------------------------------------------------

    def current_version(self) -> int:
        """Policy version of the weights held (0 until the first update)."""
        return self.receiver.version or 0

    def handshake(self) -> Handshake:
        """Quant contract report for the driver (kernels: fp8rl's, on vLLM's device)."""
        return handshake(
            "rollout",
            self.precision,
            self.layer_precision,
            device=self.device,
            rank=self.rank,
            backend="vllm",
        )

    def generate(self, request: RolloutRequest) -> RolloutResult:
        """n samples per prompt with token ids, logprobs, finish reasons, version and fingerprint.

        Raises:
            ValueError: top-k/top-p filters, an empty prompt, or prompt + max_tokens beyond
                ``model.max_model_len``.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = request.sampling
        refuse_filters(sp.top_k, sp.top_p)
        limit = self.model_spec.max_model_len
        for i, p in enumerate(request.prompts):
            if len(p.token_ids) + sp.max_tokens > limit:
                raise ValueError(
                    f"prompt {i} has {len(p.token_ids)} tokens; with max_tokens={sp.max_tokens} it "
                    f"exceeds model.max_model_len={limit}"
                )
        stop = sorted(set(self.eos) | set(sp.stop_token_ids))
        greedy = sp.temperature == 0  # vLLM refuses n > 1 when greedy: sample once, repeat
        params = [
            SamplingParams(
                n=1 if greedy else sp.n,
                temperature=sp.temperature,
                max_tokens=sp.max_tokens,
                seed=prompt_seed(p.seed, sp.seed, i),  # child j gets seed + j
                logprobs=0,
                stop_token_ids=stop,
                detokenize=False,
            )
            for i, p in enumerate(request.prompts)
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p.token_ids) for p in request.prompts],
            params,
            use_tqdm=False,
        )
        samples = []
        for prompt, output in zip(request.prompts, outputs, strict=True):
            completions = sorted(output.outputs, key=lambda c: c.index)
            if greedy:
                completions = completions * sp.n
            for i, c in enumerate(completions):
                tokens = list(c.token_ids)
                logprobs = [float(lp[t].logprob) for t, lp in zip(tokens, c.logprobs, strict=True)]
                samples.append(
                    RolloutSample(
                        prompt_id=prompt.prompt_id,
                        sample_index=i,
                        prompt_token_ids=prompt.token_ids,
                        token_ids=tokens,
                        logprobs=logprobs,
                        finish_reason="stop" if tokens and tokens[-1] in stop else "length",
                        policy_version=self.current_version(),
                        quant_fingerprint=self.fingerprint,
                    )
                )
        return RolloutResult(
            request_id=request.request_id,
            samples=samples,
            policy_version=self.current_version(),
            quant_fingerprint=self.fingerprint,
            backend="vllm",
            generation_s=time.perf_counter() - start,
        )

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Receive weight updates through transport ``name`` (``nccl`` joins its process group)."""
        self.receiver.join(name, **kwargs)

    def apply_weights(self, update: WeightUpdate, handle: Any) -> int:
        """Validate the whole update, then write it into vLLM and reset its prefix cache.

        Raises:
            WeightUpdateRefused: naming each bad tensor; the engine keeps weights and version.
            ValueError: the update came over a transport this worker has not joined.
        """
        payload = self.receiver.accept(update, handle, slots=self.slots, device=torch.device("cpu"))
        self._write(payload)
        self.receiver.version = update.version
        return update.version

    # -- diagnostics ----------------------------------------------------------------------

    def score(self, prompt: list[int], response: list[int]) -> list[float]:
        """vLLM's logprobs (T=1, float32) of ``response`` after ``prompt`` (one prefill)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = list(prompt) + list(response)
        out = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids)],
            SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
            use_tqdm=False,
        )[0]
        rows = out.prompt_logprobs[len(prompt) :]
        return [float(row[t].logprob) for t, row in zip(response, rows, strict=True)]

    def weight_checksums(self) -> dict[str, str]:
        """``wsum64`` of every vLLM parameter (rank 0): equal maps = bit-identical weights."""
        return self._call("fp8rl_checksums")

    def release_memory(self) -> None:
        """With ``rollout.enable_sleep_mode``: ``LLM.sleep(level=1)`` (weights to host memory,
        KV cache dropped) while colocated trainer ranks train; otherwise nothing."""
        if self.spec.enable_sleep_mode:
            self.llm.sleep(level=1)

    def resume_memory(self) -> None:
        """``LLM.wake_up()``: the weights back from host memory (then the refit writes the new
        ones), a fresh KV cache."""
        if self.spec.enable_sleep_mode:
            self.llm.wake_up()

    def close(self) -> None:
        """Release the engine and remove its config directory.

        An in-process engine is dropped, not shut down: vLLM keeps its (TP=1) distributed state
        per process, and shutting one engine down would tear it down under any other in-process
        engine. Multi-process engines (TP > 1) are shut down.
        """
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None and self.spec.tensor_parallel_size > 1:
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        shutil.rmtree(self._dir, ignore_errors=True)


__all__ = ["VLLMRolloutWorker", "expected_slots", "refuse_filters"]
