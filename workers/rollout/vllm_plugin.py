"""fp8rl's vLLM quantization method ``fp8rl``: vLLM's linear layers compute with fp8rl's kernels.

Design notes
------------
* **Registered through an entry point.** ``register`` is the ``vllm.general_plugins`` entry point
  (pyproject), which vLLM calls in every process it starts; it only registers the config class
  with ``register_quantization_config``. The classes live at module level because vLLM pickles the
  config into its engine/worker processes.
* **Same FProp as the trainer.** An FP8 linear's ``apply`` calls ``fp8rl.kernels.fp8_linear`` —
  the function ``FP8Linear.forward`` (the trainer) and the native engine use: X quantized 1×128
  with the QuantConfig's scale rule, one blockwise GEMM against the 128×128 weight blocks (exact
  emulation on CPU; Triton / ``scaled_mm`` on CUDA, chosen inside ``fp8rl.kernels``). Layers the
  QuantConfig keeps in BF16 (``bf16_modules``, first/last blocks) and the embedding / lm_head use
  ``fp8rl.kernels.invariant.dense_linear`` — again the trainer's function, with its ``exact`` path.
* **Weights in the WeightUpdate layout.** Each FP8 linear holds ``weight`` (float8_e4m3fn
  ``[N, K]`` codes) and ``weight_scale_inv`` (float32 block scales). Nothing is transformed after
  loading (``process_weights_after_loading`` is a no-op), so loading the same tensors twice gives
  the same engine — reloads are idempotent and a refit is a plain in-place copy.
* **Fused layers.** vLLM fuses q/k/v and gate/up. Their codes are stacked rows; their scales are
  stacked *per shard* (``ceil(N_i/128)`` rows each), because a shard whose size is not a multiple
  of 128 (SmolLM2's q_proj: 576 rows) has a partial last block that must not merge with the next
  shard's first rows. vLLM's block-scale loader rounds shard offsets up to the block and would
  overlap them, so the scale has its own loader (``_load_block_scale``), and ``apply`` runs one
  ``fp8_linear`` per shard — bitwise what the trainer's separate q/k/v projections compute.
* **Tensor parallel.** Column-parallel shards and row-parallel inputs must split on 128-block
  boundaries (checked when the layer is built, with a message naming it); each rank then loads
  its own rows/columns of the block scales.
* **No repacked copies.** vLLM's CPU path repacks unquantized weights into private buffers (and
  drops ``weight`` for float32 models); the fp8rl methods never do, so the tied lm_head reads the
  live embedding. The only derived state is the CPU emulation's float64 weight cache, dropped by
  ``process_weights_after_loading``, which the refit runs after every write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QUANT_METHOD = "fp8rl"
"""Name of the quantization method in vLLM (``quantization="fp8rl"``)."""

BLOCK = 128
"""Weight block edge (128×128) and activation group (1×128) of every fp8rl FP8 GEMM."""

_QKV_SHARDS = {"q": 0, "k": 1, "v": 2}


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register ``FP8RLConfig`` as ``fp8rl`` (idempotent)."""
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        register_quantization_config,
    )

    if QUANT_METHOD not in QUANTIZATION_METHODS or not is_registered():
        register_quantization_config(QUANT_METHOD)(FP8RLConfig)
    from fp8rl.workers.rollout.vllm_exact import register_ops

    register_ops()


def _registered() -> type | None:
    # The registry dict itself: ``get_quantization_config`` would import every built-in method,
    # which vLLM avoids while plugins load (vLLM 0.32; see tests/vllm_backend/test_vllm_plugin.py).
    from vllm.model_executor.layers import quantization

    return quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(QUANT_METHOD)


def is_registered() -> bool:
    """Whether this process's vLLM maps ``quantization="fp8rl"`` to ``FP8RLConfig``."""
    return _registered() is FP8RLConfig


def hf_quantization_config(
    *, quant: dict[str, Any] | None, fp8: bool, exact: bool, num_hidden_layers: int
) -> dict[str, Any]:
    """The ``quantization_config`` entry (passed through ``hf_overrides``) that selects fp8rl.

    Args:
        quant: ``QuantConfig.model_dump(mode="json")`` (None when no layer runs FP8).
        fp8: whether linear layers run FP8 (the rollout's precision mode).
        exact: ``precision.exact`` (batch-invariant kernels).
        num_hidden_layers: decoder blocks (for ``bf16_first_blocks`` / ``bf16_last_blocks``).
    """
    return {
        "quant_method": QUANT_METHOD,
        "fp8": fp8,
        "exact": exact,
        "quant": quant,
        "num_hidden_layers": num_hidden_layers,
    }


def _base_classes():
    from vllm.model_executor.layers.linear import LinearMethodBase
    from vllm.model_executor.layers.quantization.base_config import (
        QuantizationConfig,
        QuantizeMethodBase,
    )

    return QuantizationConfig, LinearMethodBase, QuantizeMethodBase


_QuantizationConfig, _LinearMethodBase, _QuantizeMethodBase = _base_classes()


class FP8RLConfig(_QuantizationConfig):
    """vLLM ``QuantizationConfig`` for fp8rl's precision flow (see the module notes).

    Args:
        fp8: linear layers run FP8 GEMMs (those the QuantConfig does not keep in BF16).
        exact: batch-invariant kernels (``precision.exact``).
        quant: the fp8rl ``QuantConfig`` as a JSON dict (required when ``fp8``).
        num_hidden_layers: decoder blocks of the model.
    Raises:
        ValueError: ``fp8`` without a QuantConfig.
    """

    def __init__(
        self, *, fp8: bool, exact: bool, quant: dict[str, Any] | None, num_hidden_layers: int
    ) -> None:
        super().__init__()
        if fp8 and quant is None:
            raise ValueError("quantization_config.quant is required when fp8 is true")
        self.fp8, self.exact, self.quant, self.num_hidden_layers = (
            fp8,
            exact,
            quant,
            num_hidden_layers,
        )

    def get_name(self) -> str:
        """``fp8rl``."""
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        """BF16 and FP32 activations (the model dtypes fp8rl supports)."""
        return [torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        """0: the CPU emulation runs anywhere; on CUDA the kernels choose their own path."""
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        """None: the config comes from ``hf_overrides`` (``hf_quantization_config``)."""
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FP8RLConfig:
        """Build from the ``quantization_config`` dict written by ``hf_quantization_config``."""
        return cls(
            fp8=bool(config["fp8"]),
            exact=bool(config["exact"]),
            quant=config.get("quant"),
            num_hidden_layers=int(config["num_hidden_layers"]),
        )

    def layer_precision(self):
        """The fp8rl ``LayerPrecision`` of this engine (which linears are FP8, scale rule)."""
        from fp8rl.protocol import QuantConfig
        from fp8rl.workers.model.linear import LayerPrecision

        quant = QuantConfig(**self.quant) if self.quant is not None else None
        return LayerPrecision(fp8=self.fp8, quant=quant, exact=self.exact, trainable=False)

    @property
    def scale_format(self) -> str:
        """The activation/weight scale rule (``fp32`` | ``pow2``)."""
        return (self.quant or {}).get("scale_format", "fp32")

    def hf_module_names(self, prefix: str) -> list[str]:
        """Checkpoint (Hugging Face) module names behind vLLM module ``prefix`` (fused layers
        expand through ``packed_modules_mapping``: ``qkv_proj`` → ``q_proj, k_proj, v_proj``)."""
        parent, _, leaf = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(leaf)
        if not parts:
            return [prefix]
        return [f"{parent}.{p}" if parent else p for p in parts]

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Any:
        """FP8 or dense fp8rl method for linear layers, the dense fp8rl method for embeddings and
        lm_head; None (vLLM's default) for everything else (attention keeps the model dtype).

        Raises:
            ValueError: a fused layer mixes FP8 and BF16 parts, or the QuantConfig asks for an
                FP8 lm_head (not supported by the vLLM backend).
        """
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            VocabParallelEmbedding,
        )

        precision = self.layer_precision()
        if isinstance(layer, ParallelLMHead) and precision.linear_is_fp8(
            "lm_head", self.num_hidden_layers
        ):
            raise ValueError(
                "precision.quant.bf16_modules must keep 'lm_head': the vLLM backend runs the "
                "lm_head in the model dtype only"
            )
        if isinstance(layer, VocabParallelEmbedding):
            return DenseEmbeddingMethod(self)
        if not isinstance(layer, LinearBase):
            return None
        names = self.hf_module_names(prefix)
        fp8 = [precision.linear_is_fp8(n, self.num_hidden_layers) for n in names]
        if any(fp8) and not all(fp8):
            mixed = ", ".join(
                f"{n}={'fp8' if f else 'bf16'}" for n, f in zip(names, fp8, strict=True)
            )
            raise ValueError(
                f"vLLM fuses {prefix} from {mixed}; precision.quant.bf16_modules must keep all "
                "of them in BF16 or none"
            )
        return FP8RLLinearMethod(self) if all(fp8) else DenseLinearMethod(self)


@dataclass(frozen=True)
class _Shards:
    """Row layout of a (possibly fused) linear on this rank: codes rows and block-scale rows."""

    rows: tuple[int, ...]  # codes rows of each logical shard on this rank
    scale_rows: tuple[int, ...]  # ceil(rows_i / 128)
    cols: int  # input features on this rank (K)

    def starts(self, sizes: tuple[int, ...]) -> list[int]:
        out, at = [], 0
        for s in sizes:
            out.append(at)
            at += s
        return out


def _check_tp_blocks(layer: nn.Module, rows: list[int], cols: int, input_size: int) -> None:
    tp = getattr(layer, "tp_size", 1)
    if tp == 1:
        return
    prefix = getattr(layer, "prefix", type(layer).__name__)
    if cols != input_size and cols % BLOCK:
        raise ValueError(
            f"{prefix}: tensor parallel splits its {input_size} input features into {cols} per "
            f"rank, not a multiple of {BLOCK}; FP8 128x128 blocks cannot be split — lower "
            "rollout.tensor_parallel_size"
        )
    if any(r % BLOCK for r in rows) and sum(rows) != getattr(layer, "output_size", sum(rows)):
        raise ValueError(
            f"{prefix}: tensor parallel gives per-rank output shards {rows}, not multiples of "
            f"{BLOCK}; FP8 128x128 blocks cannot be split — lower rollout.tensor_parallel_size"
        )


class FP8RLLinearMethod(_LinearMethodBase):
    """FP8 linear: ``weight`` E4M3 codes [N, K] + ``weight_scale_inv`` float32 block scales;
    ``apply`` = ``fp8rl.kernels.fp8_linear`` per logical shard (Jet-RL FProp, DESIGN.md §2)."""

    def __init__(self, config: FP8RLConfig) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Allocate codes + per-shard block scales (the WeightUpdate layout) on ``layer``."""
        from vllm.model_executor.utils import set_weight_attrs

        weight_loader = extra_weight_attrs.pop("weight_loader")
        rows = list(output_partition_sizes)
        _check_tp_blocks(layer, rows, input_size_per_partition, input_size)
        shards = _Shards(
            rows=tuple(rows),
            scale_rows=tuple(-(-r // BLOCK) for r in rows),
            cols=input_size_per_partition,
        )
        layer.fp8rl_shards = shards
        codes = nn.Parameter(
            torch.empty(sum(rows), input_size_per_partition, dtype=torch.float8_e4m3fn),
            requires_grad=False,
        )
        set_weight_attrs(codes, {"input_dim": 1, "output_dim": 0, "weight_loader": weight_loader})
        set_weight_attrs(codes, extra_weight_attrs)
        layer.register_parameter("weight", codes)
        scale = nn.Parameter(
            torch.empty(
                sum(shards.scale_rows), -(-input_size_per_partition // BLOCK), dtype=torch.float32
            ),
            requires_grad=False,
        )
        set_weight_attrs(scale, {"weight_loader": _BlockScaleLoader(layer)})
        layer.register_parameter("weight_scale_inv", scale)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """No transformation (the layer computes from the loaded layout, so reloads stay
        idempotent); drops the shard views, whose float64 weight copies in ``fp8rl.kernels``
        cannot see writes made through ``param.data`` (vLLM's loaders write that way)."""
        layer.__dict__.pop("_fp8rl_views", None)

    def apply(self, layer: nn.Module, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``y [T, N] = fp8_linear(x [T, K], shard) (+ bias)`` for each logical shard, concatenated."""
        from fp8rl.kernels import fp8_linear

        outs = [
            fp8_linear(
                x,
                weight,
                None if bias is None else bias[rows],
                exact=self.config.exact,
                scale_format=self.config.scale_format,
            )
            for rows, weight in _shard_weights(layer)
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _shard_weights(layer: nn.Module) -> list[tuple[slice, Any]]:
    """(output rows, QuantizedTensor view) per logical shard of ``layer``, built once per storage.

    fp8rl's CPU emulation caches a float64 copy of each weight keyed on the codes tensor and its
    version counter; vLLM's loaders write through ``param.data`` (a separate version counter), so
    ``process_weights_after_loading`` drops these views after every (re)load.
    """
    from fp8rl.kernels import QuantizedTensor

    key = (layer.weight.data_ptr(), layer.weight_scale_inv.data_ptr())
    cached = layer.__dict__.get("_fp8rl_views")
    if cached is not None and cached[0] == key:
        return cached[1]
    shards: _Shards = layer.fp8rl_shards
    views = []
    starts, scale_starts = shards.starts(shards.rows), shards.starts(shards.scale_rows)
    for r0, n, s0, s in zip(starts, shards.rows, scale_starts, shards.scale_rows, strict=True):
        codes = layer.weight.data if len(shards.rows) == 1 else layer.weight.data[r0 : r0 + n]
        scale = layer.weight_scale_inv.data
        scale = scale if len(shards.rows) == 1 else scale[s0 : s0 + s]
        views.append((slice(r0, r0 + n), QuantizedTensor(codes, scale, (BLOCK, BLOCK))))
    layer.__dict__["_fp8rl_views"] = (key, views)
    return views


class _BlockScaleLoader:
    """``weight_loader`` of a ``weight_scale_inv``: copies a checkpoint/update scale grid
    ``[ceil(N_i/128), ceil(K/128)]`` into this rank's rows of shard ``i`` (see module notes)."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer

    def __call__(self, param: Tensor, loaded: Tensor, shard_id: str | int | None = None) -> None:
        from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear

        layer, shards = self.layer, self.layer.fp8rl_shards
        if shard_id is None and len(shards.rows) > 1:
            raise ValueError(
                f"{getattr(layer, 'prefix', '?')}: block scales of a fused checkpoint tensor "
                "are not supported; ship q/k/v and gate/up scales separately"
            )
        index = 0 if shard_id is None else _QKV_SHARDS.get(shard_id, shard_id)
        tp_rank = getattr(layer, "tp_rank", 0)
        shard_rank = tp_rank
        if isinstance(layer, QKVParallelLinear) and index > 0:
            shard_rank = tp_rank // layer.num_kv_head_replicas
        src = loaded
        if isinstance(layer, RowParallelLinear):
            cols = -(-shards.cols // BLOCK)
            if src.shape[1] != cols:
                src = src.narrow(1, tp_rank * shards.cols // BLOCK, cols)
        else:
            rows = shards.scale_rows[index]
            if src.shape[0] != rows:
                src = src.narrow(0, shard_rank * shards.rows[index] // BLOCK, rows)
        start = sum(shards.scale_rows[:index])
        dst = param.data.narrow(0, start, shards.scale_rows[index])
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(
                f"{getattr(layer, 'prefix', '?')}.weight_scale_inv shard {shard_id}: got "
                f"{tuple(loaded.shape)}, this rank holds {tuple(dst.shape)}"
            )
        dst.copy_(src)


class DenseLinearMethod(_LinearMethodBase):
    """A linear kept in the model dtype: ``fp8rl.kernels.invariant.dense_linear`` (the trainer's
    DenseLinear), weight ``[N, K]`` used as loaded (no repacking)."""

    def __init__(self, config: FP8RLConfig) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Allocate ``weight`` [N, K] in ``params_dtype``."""
        _dense_weight(
            layer,
            output_partition_sizes,
            input_size_per_partition,
            params_dtype,
            extra_weight_attrs,
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing (no repacked copy to go stale)."""

    def apply(self, layer: nn.Module, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``dense_linear(x, weight, bias, exact)``: [T, K] → [T, N] in x.dtype."""
        from fp8rl.kernels.invariant import dense_linear

        return dense_linear(x, layer.weight, bias, exact=self.config.exact)


def _dense_weight(
    layer: nn.Module,
    output_partition_sizes: list[int],
    input_size_per_partition: int,
    params_dtype: torch.dtype,
    extra_weight_attrs: dict[str, Any],
) -> None:
    """Register a dense ``weight`` [sum(output shards), K_rank] the way vLLM's loaders expect."""
    from vllm.model_executor.utils import set_weight_attrs

    weight = nn.Parameter(
        torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
        requires_grad=False,
    )
    set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
    set_weight_attrs(weight, extra_weight_attrs)
    layer.register_parameter("weight", weight)


class DenseEmbeddingMethod(_QuantizeMethodBase):
    """Embedding and lm_head in the model dtype: ``F.embedding`` for lookups and ``dense_linear``
    for logits (the trainer's ``Decoder.logits``); a tied lm_head shares the embedding tensor."""

    def __init__(self, config: FP8RLConfig) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Allocate ``weight`` [V_rank, H] in ``params_dtype``."""
        _dense_weight(
            layer,
            output_partition_sizes,
            input_size_per_partition,
            params_dtype,
            extra_weight_attrs,
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing (the lm_head reads the live weight)."""

    def embedding(self, layer: nn.Module, input_: Tensor) -> Tensor:
        """Rows of the embedding table for token ids ``input_``."""
        return F.embedding(input_, layer.weight)

    def apply(self, layer: nn.Module, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """Logits ``[T, V] = dense_linear(hidden [T, H], weight)`` in the hidden dtype."""
        from fp8rl.kernels.invariant import dense_linear

        return dense_linear(x, layer.weight, bias, exact=self.config.exact)

    def tie_weights(self, layer: nn.Module, embed_tokens: nn.Module) -> nn.Module:
        """Share the embedding tensor (one storage: a refit of the embedding is the lm_head's)."""
        layer.weight = embed_tokens.weight
        return layer
