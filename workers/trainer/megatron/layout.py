"""Rank layout of the Megatron trainer: TP × PP × DP, stage layers, vocab padding, FP8 alignment.

Pure arithmetic (no torch.distributed, no megatron import) so the spec checks, ``fp8rl validate``
and the actors agree on one layout.

Rank order is Megatron's default ``tp-dp-pp`` (TP fastest): global rank
``r = tp_rank + TP · (dp_rank + DP · pp_rank)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8rl.workers.model.config import DecoderConfig

GROUP = 128  # FP8 weight block edge (128×128), kernels.quant.GROUP


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of the three parallel dimensions; ``world = tp · pp · dp``."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp) < 1:
            raise ValueError(f"parallel sizes must be >= 1, got {self}")

    @classmethod
    def from_world(cls, world: int, *, tp: int, pp: int) -> ParallelLayout:
        """The layout of ``world`` ranks with the given TP and PP (DP = world / (TP·PP)).

        Raises ``ValueError`` when TP·PP does not divide ``world``."""
        if world % (tp * pp):
            raise ValueError(f"{world} ranks cannot be split into TP={tp} × PP={pp} × DP")
        return cls(tp=tp, pp=pp, dp=world // (tp * pp))

    @property
    def world(self) -> int:
        """Number of ranks (trainer actors)."""
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(tp_rank, dp_rank, pp_rank)`` of global ``rank`` (tp-dp-pp order)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside 0..{self.world - 1}")
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        """Global rank of the coordinates (inverse of ``coords``)."""
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def describe(self) -> str:
        """One line for ``fp8rl validate``: sizes and which ranks hold which stage."""
        stages = "; ".join(
            f"stage {p}: ranks {self.rank(0, 0, p)}-{self.rank(self.tp - 1, self.dp - 1, p)}"
            for p in range(self.pp)
        )
        return f"{self.world} ranks = TP {self.tp} × PP {self.pp} × DP {self.dp} ({stages})"


def stage_layers(num_layers: int, pp: int, pp_rank: int) -> range:
    """Global decoder layer indices held by pipeline stage ``pp_rank`` (equal split)."""
    if num_layers % pp:
        raise ValueError(f"{num_layers} layers cannot be split into {pp} equal pipeline stages")
    per = num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def padded_vocab(vocab_size: int, tp: int, *, fp8_head: bool) -> int:
    """Vocabulary rows Megatron holds: a multiple of ``tp`` (of ``128·tp`` when the output layer
    runs FP8, so each rank's shard is whole 128-row blocks). Padded rows are zero and their logits
    are masked to -inf before any softmax; ``vocab_size`` itself when no padding is needed."""
    unit = tp * (GROUP if fp8_head and tp > 1 else 1)
    return -(-vocab_size // unit) * unit


def model_fit_problems(config: DecoderConfig, *, tp: int, pp: int, fp8: bool) -> list[str]:
    """Why ``config`` cannot be split into TP × PP (empty when it can).

    With ``fp8`` every TP shard of every FP8 weight must be whole 128×128 blocks of the native
    tensor (q/k/v/o, gate/up/down), so the shipped codes equal the native trainer's quantization.
    """
    c, out = config, []
    if c.num_attention_heads % tp:
        out.append(f"num_attention_heads ({c.num_attention_heads}) is not divisible by TP {tp}")
    if c.num_key_value_heads % tp:
        out.append(f"num_key_value_heads ({c.num_key_value_heads}) is not divisible by TP {tp}")
    if c.intermediate_size % tp:
        out.append(f"intermediate_size ({c.intermediate_size}) is not divisible by TP {tp}")
    if c.num_hidden_layers % pp:
        out.append(f"num_hidden_layers ({c.num_hidden_layers}) is not divisible by PP {pp}")
    if out or not fp8 or tp == 1:
        return out
    shards = {
        "q_proj rows": c.num_attention_heads * c.head_dim // tp,
        "k_proj/v_proj rows": c.num_key_value_heads * c.head_dim // tp,
        "gate_proj/up_proj rows": c.intermediate_size // tp,
        "o_proj columns": c.num_attention_heads * c.head_dim // tp,
        "down_proj columns": c.intermediate_size // tp,
    }
    for what, size in shards.items():
        if size % GROUP:
            out.append(
                f"FP8 at TP {tp}: each rank's {what} ({size}) is not a multiple of {GROUP}, so the "
                "shard is not whole 128×128 blocks of the native weight"
            )
    return out
