"""Convert a GGUF ``model.path`` to its cached Hugging Face directory in a child process.

The first run of the README's quickstart converts the built-in SmolLM2 GGUF (``workers/model/
loading.py``, once, then cached). Done in the driver, the conversion leaves it holding ~0.5 GB
for the rest of the run (transformers' model classes imported, the dequantized tensors' freed
heap): measured 0.98 GB RSS after converting, 0.55 GB after a heap trim, 0.31 GB for the driver
that never converted. Converting in a short-lived child keeps the driver at the latter.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

__all__ = ["convert_gguf_in_child"]

log = logging.getLogger(__name__)

_CONVERT = (
    "import sys; from fp8rl.workers.model.loading import resolve_model; "
    "resolve_model(sys.argv[1], load_weights=False)"
)


def convert_gguf_in_child(model_path: str) -> bool:
    """Run the GGUF conversion of ``model_path`` in a child process when it is not cached yet.

    Only for ``builtin:smollm2-135m-instruct`` and local ``*.gguf`` files; anything else, or a
    GGUF with a converted directory of its name in the cache, returns False at once. A failed
    child is not an error here: the caller's own ``resolve_model`` then converts (or reports the
    problem) as before.

    Returns:
        True when a child ran and succeeded.
    """
    gguf = _gguf_file(model_path)
    if gguf is None:
        return False
    from fp8rl.workers.model.loading import gguf_cache_target

    if (gguf_cache_target(gguf) / "config.json").exists():
        return False  # this very file is converted (another install's copy does not count)
    # -P: not the working directory first on sys.path (a checkout's top-level ``kernels/`` would
    # hide the PyPI ``kernels`` package transformers imports, and the child would fail)
    done = subprocess.run([sys.executable, "-P", "-c", _CONVERT, model_path], check=False)
    if done.returncode != 0:
        log.warning("converting %s in a child process failed; converting here", gguf.name)
    return done.returncode == 0


def _gguf_file(model_path: str) -> Path | None:
    if model_path == "builtin:smollm2-135m-instruct":
        from fp8rl.workers.model.loading import smollm2_gguf_path

        try:
            return smollm2_gguf_path()
        except FileNotFoundError:
            return None  # reported by preflight
    local = Path(model_path).expanduser()
    return local if local.suffix == ".gguf" and local.is_file() else None
