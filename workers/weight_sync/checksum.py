"""``wsum64``: a position-weighted checksum of a tensor's bytes, computed on its own device.

Sum over the tensor's bytes viewed as int32 words of ``word * (i mod 65521 + 1)`` in wrapping
int64 arithmetic. Integer addition modulo 2^64 is associative, so the value does not depend on
the reduction order, device or chunking; the position weight catches swapped blocks, which a
plain sum would not. It guards against corrupted or mismatched payloads, not against an attacker.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MODULUS = 65521
_CHUNK = 1 << 22  # words per step: bounds the temporary index tensor to 32 MiB


def wsum64(tensor: Tensor) -> str:
    """Checksum of ``tensor``'s contents (any dtype/device) as ``"wsum64:<16 hex>"``."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-flat.numel()) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    words = flat.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _CHUNK):
        chunk = words[start : start + _CHUNK].to(torch.int64)
        weight = (torch.arange(start, start + chunk.numel(), device=words.device) % _MODULUS) + 1
        total += (chunk * weight).sum()
    return f"wsum64:{int(total.item()) & 0xFFFFFFFFFFFFFFFF:016x}"
