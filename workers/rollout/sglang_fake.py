"""FakeSGLangEngine: a CPU stand-in for ``sglang.Engine`` 0.5.23 that enforces its API rules.

A test double, used only when ``FP8RL_SGLANG_ENGINE=fake`` (tests and the labelled quickstart
run); it is **not** SGLang and says so in every result (``backend: sglang-fake``). SGLang cannot
be installed on the CPU machines or on the H200 of this workplace (docs/sglang.md), so the
backend is tested against this fake plus a signature check of every method it calls against
the real wheel's source (``tests/sglang_backend``): the methods below have exactly the real
signatures (names, order, defaults), which that test compares.

Rules it enforces, each as SGLang 0.5.23 does (file in the wheel, ``sglang/srt/``):

* ``update_weights_from_tensor`` outside ``begin_weight_update``/``end_weight_update`` returns
  ``(False, message)``; ``begin`` twice or ``end`` without ``begin`` likewise
  (``managers/scheduler_components/weight_updater.py``).
* Loading writes the live parameters in place, tensor by tensor: a shape mismatch fails the call
  after the earlier tensors were written ("partially updated"); an unknown name is skipped with a
  warning; a dtype mismatch is converted silently by ``copy_`` (``models/llama.py`` load_weights).
* ``end_weight_update`` re-runs ``process_weights_after_loading``: KV scales never loaded
  (still -1) become 1.0 (``layers/quantization/kv_cache.py``). KV scales exist only under the
  FP8 quantization config.
* Block FP8 needs an FP8-serialized config (``quant_method: fp8``), a 2-D block and dynamic
  activations; fused q/k/v and gate/up shards must share a precision and each FP8 shard's rows
  must be a multiple of the block (``layers/quantization/fp8.py``, ``quantization/utils.py``).
* ``load_format`` names a custom loader only if it was registered at start
  (``custom_weight_loader``); otherwise the scheduler raises (here: RuntimeError).
* Without ``enable_memory_saver`` release/resume are no-ops; weights released without a CPU
  backup come back with undefined contents; resuming what was not released raises.

What it cannot show: SGLang's kernels, scheduling, CUDA IPC and TP processes. Generation runs
fp8rl's own decoder (fast, non-exact kernels) on the weights loaded through these rules, and
raises ``FakeContractViolation`` where the real engine would silently serve a model that is
mid-update, half-updated, or released.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import QuantConfig, SamplingParams
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import config_from_hf
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.rollout.engine import NativeEngine
from fp8rl.workers.weight_sync.layout import engine_slots, engine_tensor

log = logging.getLogger(__name__)

SERVER_ARGS = frozenset(
    {
        "model_path", "load_format", "dtype", "context_length", "quantization", "kv_cache_dtype",
        "tp_size", "mem_fraction_static", "enable_memory_saver", "skip_tokenizer_init",
        "random_seed", "custom_weight_loader", "log_level",
    }
)  # fmt: skip
"""``ServerArgs`` fields this fake understands (each is a real field: checked by the tests)."""

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class FakeContractViolation(RuntimeError):
    """The caller did something the real SGLang would silently get wrong."""


class FakeSGLangEngine:
    """``sglang.Engine(**server_args)`` on CPU with fp8rl's decoder (see module docstring)."""

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - SERVER_ARGS)
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {unknown}")
        self.args = kwargs
        hf = json.loads((Path(kwargs["model_path"]) / "config.json").read_text())
        self.config = config_from_hf(hf)
        self.fp8 = _fp8_config(hf, kwargs.get("quantization"))
        ignored = (self.fp8 or {}).get("modules_to_not_convert") or []
        self.ignored = _check_fused(self.config, ignored, self.fp8, kwargs.get("tp_size", 1))
        self.kv_fp8 = kwargs.get("kv_cache_dtype", "auto") == "fp8_e4m3"
        precision = LayerPrecision(
            dtype=getattr(torch, kwargs.get("dtype", "bfloat16")),
            fp8=self.fp8 is not None,
            quant=QuantConfig(bf16_modules=["embed_tokens", "lm_head", *self.ignored])
            if self.fp8
            else None,
            trainable=False,
            kv_fp8=self.kv_fp8 and self.fp8 is not None,
        )
        self.model = build_decoder(
            self.config,
            precision,
            state_dict=None,
            max_positions=kwargs["context_length"],
            param_dtype=precision.dtype,
            seed=kwargs.get("random_seed") or 0,
        )  # fmt: skip  (load_format=dummy: random weights)
        self.slots = engine_slots(self.model)
        self.kv_params = {  # SGLang's attn.k_scale parameters (-1: not loaded), FP8 config only
            n.replace(".k_scale", ".attn.k_scale").replace(".v_scale", ".attn.v_scale"): -1.0
            for n, s in self.slots.items()
            if s.role == "kv_scale"
        }
        self.engine = NativeEngine(self.model, eos_token_ids=self.config.eos_token_id)
        self.session: str | None = None
        self.stale: set[str] = set()  # slots not rewritten since a failed load / weight resume
        self.released: set[str] = set()
        self.calls: list[str] = []  # method names, in order (tests read the refit order)
        self.dropped: list[str] = []  # names load_weights skipped with a warning
        self.fail_on: str | None = None  # tests: the next load of this name raises mid-call

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        image_data=None,
        audio_data=None,
        video_data=None,
        mm_hashes=None,
        mm_content_hashes=None,
        return_logprob=False,
        logprob_start_len=None,
        top_logprobs_num=None,
        token_ids_logprob=None,
        lora_path=None,
        custom_logit_processor=None,
        require_reasoning=False,
        return_hidden_states=False,
        return_routed_experts=False,
        routed_experts_start_len=0,
        stream=False,
        bootstrap_host=None,
        bootstrap_port=None,
        bootstrap_room=None,
        routed_dp_rank=None,
        disagg_prefill_dp_rank=None,
        kv_hints=None,
        data_parallel_rank=None,
        external_trace_header=None,
        rid=None,
        session_params=None,
        priority=None,
        session_id=None,
        *,
        cache_salt=None,
    ):
        """Batch generation from ``input_ids`` with per-request ``sampling_params`` dicts."""
        self.calls.append("generate")
        self._check_servable()
        if prompt is not None or input_ids is None or stream:
            raise NotImplementedError("the fake takes token ids only (skip_tokenizer_init)")
        return [
            self._one(ids, sp, bool(return_logprob))
            for ids, sp in zip(input_ids, sampling_params, strict=True)
        ]

    def _one(self, ids: list[int], sp: dict[str, Any], logprob: bool) -> dict[str, Any]:
        if sp.get("n", 1) != 1:
            raise NotImplementedError("the fake samples n=1 per request")
        params = SamplingParams(
            temperature=sp.get("temperature", 1.0),
            max_tokens=sp.get("max_new_tokens", 128),
            stop_token_ids=list(sp.get("stop_token_ids") or []),
            seed=sp.get("sampling_seed"),
        )
        g = self.engine.generate([ids], params)[0][0]
        last = g.token_ids[-1] if g.token_ids else None
        finish = (
            {"type": "stop", "matched": last}
            if g.finish_reason == "stop"
            else {"type": "length", "length": len(g.token_ids)}
        )
        meta: dict[str, Any] = {"finish_reason": finish, "completion_tokens": len(g.token_ids)}
        if logprob:
            meta["output_token_logprobs"] = [
                (lp, t, None) for lp, t in zip(g.logprobs, g.token_ids, strict=True)
            ]
        return {"output_ids": list(g.token_ids), "meta_info": meta}

    def _check_servable(self) -> None:
        if self.session is not None:
            raise FakeContractViolation("generate inside an open weight-update session")
        if self.released:
            raise FakeContractViolation(f"generate with {sorted(self.released)} released")
        if self.stale:
            raise FakeContractViolation(
                f"generate on partially updated or undefined weights ({len(self.stale)} tensors "
                "not rewritten since a failed load or a weight resume)"
            )

    # -- weight updates ---------------------------------------------------------------------

    def begin_weight_update(self, selector: str = "all"):
        """Open a weight-update session; close it with end_weight_update()."""
        self.calls.append("begin_weight_update")
        if self.session is not None:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = selector
        return True, "Success"

    def end_weight_update(self):
        """Close the session and finalize (process_weights_after_loading)."""
        self.calls.append("end_weight_update")
        if self.session is None:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session = None
        for name, value in self.kv_params.items():
            if value <= 0:  # never loaded: SGLang's default
                self.kv_params[name] = 1.0
        with torch.no_grad():
            for slot in self.slots.values():
                if slot.role == "kv_scale":
                    engine_tensor(self.model, slot.name).fill_(self.kv_params[_kv_param(slot.name)])
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        """Load ``named_tensors`` into the live model (custom ``load_format`` loaders too)."""
        self.calls.append(f"update_weights_from_tensor:{load_format or 'default'}")
        if self.session is None:
            return False, (
                "update_weights_from_tensor must run between begin_weight_update() and "
                "end_weight_update()"
            )
        if load_format is not None:
            if load_format not in (self.args.get("custom_weight_loader") or []):
                raise RuntimeError(f"scheduler died: Unknown load_format={load_format}")
            module, _, fn = load_format.rpartition(".")
            getattr(__import__(module, fromlist=[fn]), fn)(self, list(named_tensors))
            return True, "Success"
        try:
            for name, tensor in named_tensors:
                self._load(name, tensor)
        except Exception as exc:  # SGLang reports any loader error this way
            self.stale = {n for n, s in self.slots.items() if s.role != "kv_scale"}
            return False, (
                f"Failed to update parameter online: {exc}. The full weights of the ModelRunner "
                "are partially updated. Please discard the whole weights."
            )
        return True, "Success"

    def _load(self, name: str, tensor: Tensor) -> None:
        if self.fail_on == name:
            self.fail_on = None
            raise RuntimeError(f"injected failure while loading {name}")
        if self.config.tie_word_embeddings and "lm_head.weight" in name:
            return
        if name.endswith((".k_scale", ".v_scale")):
            param = _kv_param(name)
            if param not in self.kv_params:
                self.dropped.append(name)
                log.warning("Found %s in the checkpoint but not %s in the model", name, param)
                return
            self.kv_params[param] = float(tensor)
            return
        if name not in self.slots:
            self.dropped.append(name)
            log.warning("Parameter %s not found in params_dict", name)
            return
        target = engine_tensor(self.model, name)
        if tuple(target.shape) != tuple(tensor.shape):
            raise AssertionError(
                f"{name}: param shape {tuple(target.shape)} != loaded {tuple(tensor.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
        self.stale.discard(name)

    def get_parameter(self, name: str) -> Tensor:
        """``nn.Module.get_parameter`` of the SGLang model (for registered custom loaders)."""
        if name in self.kv_params:
            return torch.tensor(self.kv_params[name], dtype=torch.float32)
        raise AttributeError(f"no parameter {name}")

    # -- memory -----------------------------------------------------------------------------

    def release_memory_occupation(self, tags=None):
        self.calls.append("release_memory_occupation")
        if not self.args.get("enable_memory_saver"):
            return None  # the no-op adapter: nothing is freed
        self.released |= set(tags or ["weights", "kv_cache", "cuda_graph"])
        return None

    def resume_memory_occupation(self, tags=None):
        self.calls.append("resume_memory_occupation")
        if not self.args.get("enable_memory_saver"):
            return None
        tags = set(tags or ["weights", "kv_cache", "cuda_graph"])
        missing = tags - self.released
        if missing:
            raise KeyError(f"resume of {sorted(missing)} that was not released")
        self.released -= tags
        if "weights" in tags:  # no enable_weights_cpu_backup: contents are undefined
            self.stale = {n for n, s in self.slots.items() if s.role != "kv_scale"}
        return None

    def shutdown(self):
        self.calls.append("shutdown")


def _kv_param(name: str) -> str:
    if ".attn." in name:
        return name
    return name.replace(".k_scale", ".attn.k_scale").replace(".v_scale", ".attn.v_scale")


def _fp8_config(hf: dict[str, Any], quantization: str | None) -> dict[str, Any] | None:
    """The block-FP8 quantization config, validated as ``Fp8Config.__init__`` does."""
    quant = hf.get("quantization_config")
    if quantization is None and quant is None:
        return None
    if quantization not in (None, "fp8"):
        raise ValueError(f"the fake supports quantization=fp8 only, got {quantization}")
    quant = quant or {"quant_method": "fp8", "activation_scheme": "dynamic"}
    block = quant.get("weight_block_size")
    if block is not None:
        if "fp8" not in quant.get("quant_method", ""):
            raise ValueError(
                "The block-wise quantization only supports fp8-serialized checkpoint for now."
            )
        if len(block) != 2:
            raise ValueError(
                "The quantization block size of weight must have 2 dimensions, "
                f"but got {len(block)} dimensions."
            )
        if quant.get("activation_scheme") != "dynamic":
            raise ValueError(
                "The block-wise quantization only supports dynamic activation scheme for now, "
                f"but got {quant.get('activation_scheme')} activation scheme."
            )
    if block != [128, 128] or quant.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"the fake implements 128x128 E4M3 blocks only, got {block}")
    return quant


def _check_fused(config, ignored: list[str], fp8: dict[str, Any] | None, tp: int) -> list[str]:
    """``is_layer_skipped`` for fused layers and ``validate_block_quant_shapes``; returns the
    dense modules (unfused names)."""
    if fp8 is None:
        return []
    sizes = {
        "q_proj": config.num_attention_heads * config.head_dim,
        "k_proj": config.num_key_value_heads * config.head_dim,
        "v_proj": config.num_key_value_heads * config.head_dim,
        "gate_proj": config.intermediate_size,
        "up_proj": config.intermediate_size,
    }
    block_n = fp8["weight_block_size"][0]
    for i in range(config.num_hidden_layers):
        for fused, shards in FUSED.items():
            sub = "self_attn" if fused == "qkv_proj" else "mlp"
            prefix = f"model.layers.{i}.{sub}.{fused}"
            skipped = {
                any(_match(x, f"model.layers.{i}.{sub}.{s}") for x in ignored) for s in shards
            }
            if len(skipped) > 1:
                raise ValueError(
                    f"Detected some but not all shards of {prefix} are quantized. All shards of "
                    "fused layers to have the same precision."
                )
            if not skipped.pop():
                for s in shards:
                    if (sizes[s] // tp) % block_n:
                        raise ValueError(
                            f"Weight output_partition_size = {sizes[s] // tp} is not divisible by "
                            f"weight quantization block_n = {block_n}."
                        )
    return list(ignored)


def _match(ignored: str, prefix: str) -> bool:
    """SGLang's ``_module_path_match``: dotted-boundary match."""
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or f".{ignored}." in f".{prefix}."


__all__ = ["SERVER_ARGS", "FakeContractViolation", "FakeSGLangEngine"]
