"""Give the heap's free pages back to the OS after each phase of a worker (glibc ``malloc_trim``).

On CPU the tensors of a forward/backward pass are mostly below glibc's mmap threshold (a
SmolLM2-135M weight or activation is 0.4–3.5 MB), so they live in malloc's arenas; freed, they
stay mapped (fragmentation keeps the arena top from shrinking), and a worker's RSS grows to its
highest phase plus whatever the other phases left behind. Measured on the quickstart trainer:
2.9 GB resident between steps for 1.95 GB of live data; after ``malloc_trim(0)`` 1.95 GB; the
rollout engine 0.94 GB after loading, 0.41 GB after the trim. The phases of a step do not run
at the same time in different actors (generate, then score, then train), so an idle actor that
holds only its live data lowers the machine's peak.

``malloc_trim`` walks the arenas and ``madvise``s their free pages away: milliseconds here, no
effect on values. A no-op where glibc is absent (macOS, musl).

Within a phase the same happens on a smaller scale: the trainer's forward and backward of one
micro-batch free hundreds of MB of float64 temporaries (exact mode) between the layers, and the
heap kept them resident: at the quickstart trainer's peak (the last micro-batch's backward,
with the workers' malloc settings of ``services/runtime.py``) RSS was 3.43 GB for 2.63 GB of
live tensors. ``release_between_blocks`` trims after each block's forward and when its output's
gradient arrives in the backward: peak 3.15 GB, the values unchanged (hooks only observe; no
tensor is touched), ~3 s more CPU time a step (the trimmed pages fault back in).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = [
    "release_between_blocks",
    "release_free_memory",
    "release_storage",
    "restore_storage",
    "returns_free_memory",
]

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_free_memory() -> bool:
    """``malloc_trim(0)``: return free heap pages to the OS. True when glibc released memory."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def returns_free_memory(method: F) -> F:
    """Decorate a worker method so the heap's free pages go back to the OS when it returns."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        finally:
            release_free_memory()

    return wrapper  # type: ignore[return-value]


def release_between_blocks(blocks: Iterable[nn.Module]) -> list[Any]:
    """Trim the heap after each of ``blocks``' forwards and as each one's output gradient arrives.

    Hooks only (a forward hook, and a gradient hook on the block's output that returns None), so
    the forward, the backward and their values are unchanged; each trim costs milliseconds.

    Args:
        blocks: modules whose forward returns a Tensor or a tuple whose first item is one (the
            decoder's blocks).
    Returns:
        The forward-hook handles (``handle.remove()`` undoes it).
    """
    return [block.register_forward_hook(_trim_after) for block in blocks]


def _trim_after(module: nn.Module, inputs: Any, output: Any) -> None:
    release_free_memory()
    out = output[0] if isinstance(output, tuple) else output
    if isinstance(out, torch.Tensor) and out.requires_grad:
        out.register_hook(_trim_on_grad)


def _trim_on_grad(grad: torch.Tensor) -> None:
    release_free_memory()


def release_storage(tensors: Iterable[torch.Tensor]) -> list[tuple[Any, int]]:
    """Free the storage behind ``tensors`` (each shared storage once); their shapes stay.

    Returns ``(storage, bytes)`` pairs for ``restore_storage``. The tensors must not be read
    until restored and overwritten (FSDP frees unsharded parameters the same way).
    """
    freed: dict[int, tuple[Any, int]] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in freed:
            freed[storage.data_ptr()] = (storage, storage.nbytes())
    for storage, _ in freed.values():
        storage.resize_(0)
    release_free_memory()
    return list(freed.values())


def restore_storage(freed: list[tuple[Any, int]]) -> None:
    """Re-allocate storage freed by ``release_storage`` (contents undefined)."""
    for storage, nbytes in freed:
        if storage.nbytes() != nbytes:
            storage.resize_(nbytes)
