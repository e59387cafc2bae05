"""File modes of what fp8rl writes for people to share: the umask's, not a temp file's 0600.

Some writers create private files: ``safetensors.torch.save_file`` (0600) and
``tempfile.mkdtemp`` (a 0700 directory, kept when it is renamed into place). An export or a
model-cache directory written that way cannot be read by another user or a service account
(a vLLM server, a CI job), although everything else fp8rl writes follows the umask
(0644 / 0755 under the usual 022). ``apply_umask`` sets a written tree to those modes.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["apply_umask", "current_umask"]


def current_umask() -> int:
    """This process's umask (read without changing it where ``/proc`` has it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic read-and-restore
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """chmod ``root`` and everything below it to ``0o666 & ~umask`` (files) and
    ``0o777 & ~umask`` (directories), as ``open``/``mkdir`` would have created them."""
    mask = current_umask()
    file_mode, dir_mode = 0o666 & ~mask, 0o777 & ~mask
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod(dir_mode if path.is_dir() else file_mode)
