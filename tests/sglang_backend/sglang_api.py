"""The SGLang 0.5.23 API fp8rl relies on, read from the real wheel's source with ``ast``.

Never imports SGLang (it cannot be installed here). ``extract_api(root)`` parses an unpacked
wheel; ``python tests/sglang_backend/sglang_api.py [WHEEL]`` downloads the pinned wheel
(``pip download --no-deps``) unless one is given and rewrites the committed snapshot
``sglang-0.5.23-api.json``. The tests compare the fake engine and the worker's call sites with
the snapshot, and the snapshot with the real wheel when it can be downloaded.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

VERSION = "0.5.23"
SNAPSHOT = Path(__file__).with_name(f"sglang-{VERSION}-api.json")

ENGINE_METHODS = (
    "__init__",
    "generate",
    "begin_weight_update",
    "end_weight_update",
    "update_weights_from_tensor",
    "release_memory_occupation",
    "resume_memory_occupation",
    "shutdown",
)
"""``sglang.Engine`` methods fp8rl calls (the fake implements exactly these)."""

RULES = {
    # file (under sglang/srt/) → source fragments the fake's rules are copied from
    "managers/scheduler_components/weight_updater.py": [
        "update_weights_from_tensor must run between ",
        "if self._session is None:",
        "a weight-update session is already open",
        "no weight-update session is open",
        "self.memory_saver_adapter.pause(GPU_MEMORY_TYPE_WEIGHTS)",
        "self.offload_tags.remove(tag)",
    ],
    "model_executor/model_runner_components/weight_updater.py": [
        "The full weights of the ModelRunner are partially updated",
        "elif load_format in self.custom_weight_loaders:",
        "post_load_weights(self.get_model())",
    ],
    "layers/quantization/kv_cache.py": [
        "torch.tensor(-1.0, dtype=torch.float32)",
        "k_scale = 1.0",
        "layer.k_scale._skip_weight_check = True",
    ],
    "layers/quantization/fp8.py": [
        "The block-wise quantization only supports fp8-serialized checkpoint for now.",
        "The block-wise quantization only supports dynamic activation scheme for now",
        "is not divisible by ",
    ],
    "layers/quantization/utils.py": [
        '"qkv_proj": ["q_proj", "k_proj", "v_proj"]',
        "Detected some but not all shards of",
    ],
    "models/llama.py": [
        'logger.warning(f"Parameter {name} not found in params_dict")',
        "name = maybe_remap_kv_scale_name(name, params_dict)",
        "return weight.cpu().to(torch.float32).numpy().tolist()[:truncate_size]",
    ],
    "model_loader/weight_utils.py": [
        'remapped_name = name.replace(scale_name, f".attn{scale_name}")'
    ],
    "layers/sampler.py": ["torch.log(probs)"],
    "managers/schedule_batch.py": ['"type": "stop"', '"type": "length"'],
}
"""Source facts behind the fake's rules; a fragment that disappears fails the wheel test."""


def _params(fn: ast.FunctionDef) -> list[list[str | None]]:
    """[name, kind, default source] per parameter (``self`` dropped)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [[p.arg, "positional", d] for p, d in zip(pos, defaults, strict=True)]
    if a.vararg:
        out.append([a.vararg.arg, "var_positional", None])
    out += [
        [p.arg, "keyword_only", None if d is None else ast.unparse(d)]
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    if a.kwarg:
        out.append([a.kwarg.arg, "var_keyword", None])
    return [p for p in out if p[0] != "self"]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef) -> list[str]:
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def extract_api(root: Path) -> dict[str, Any]:
    """The API snapshot of an unpacked wheel (``root`` holds ``sglang/``)."""
    srt = root / "sglang" / "srt"
    engine = _class(ast.parse((srt / "entrypoints" / "engine.py").read_text()), "Engine")
    methods = {n.name: n for n in engine.body if isinstance(n, ast.FunctionDef)}
    server_args = sorted(
        f
        for path in sorted((srt / "arg_groups" / "fields").glob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef)
        for f in _fields(node)
    )
    sampling = _fields(
        _class(ast.parse((srt / "sampling" / "sampling_params.py").read_text()), "SamplingParams")
    )
    choices = ast.parse((srt / "arg_groups" / "choices.py").read_text())
    lists = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in choices.body
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id in ("LOAD_FORMAT_CHOICES", "QUANTIZATION_CHOICES")
    }
    rules = {
        path: [frag for frag in frags if frag in (srt / path).read_text()]
        for path, frags in RULES.items()
    }
    return {
        "version": VERSION,
        "engine": {m: _params(methods[m]) if m in methods else None for m in ENGINE_METHODS},
        "server_args": server_args,
        "sampling_params": sampling,
        "load_formats": lists["LOAD_FORMAT_CHOICES"],
        "quantizations": lists["QUANTIZATION_CHOICES"],
        "rules": rules,
    }


def python_params(fn: Any) -> list[list[str | None]]:
    """The ``_params`` form of a Python callable (for the fake engine's methods)."""
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "var_positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword_only",
        inspect.Parameter.VAR_KEYWORD: "var_keyword",
    }
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, kinds[p.kind], default])
    return out


def signature_problems(cls: type, snapshot: dict[str, Any]) -> list[str]:
    """Each method of ``snapshot["engine"]`` whose signature on ``cls`` differs (empty: equal)."""
    problems = []
    for name, real in snapshot["engine"].items():
        if real is None:
            problems.append(f"Engine.{name} does not exist in sglang {snapshot['version']}")
            continue
        mine = python_params(getattr(cls, name)) if hasattr(cls, name) else None
        if mine != real:
            problems.append(f"{cls.__name__}.{name}{mine} != sglang Engine.{name}{real}")
    return problems


def engine_calls(source: str, receiver: str = "engine") -> list[tuple[str, int, list[str]]]:
    """(method, positional count, keyword names) of each ``self.<receiver>.<method>(...)`` call."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if (
            isinstance(owner, ast.Attribute)
            and owner.attr == receiver
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            calls.append((node.func.attr, len(node.args), [k.arg for k in node.keywords]))
    return calls


def call_problems(calls: list[tuple[str, int, list[str]]], snapshot: dict[str, Any]) -> list[str]:
    """Calls to methods SGLang lacks, with unknown keywords, or too many positional arguments."""
    problems = []
    for method, npos, keywords in calls:
        params = snapshot["engine"].get(method)
        if params is None:
            problems.append(
                f"engine.{method}: not an Engine method fp8rl checks ({ENGINE_METHODS})"
            )
            continue
        names = {p[0] for p in params if p[1] in ("positional", "keyword_only")}
        positional = [p for p in params if p[1] == "positional"]
        problems += [f"engine.{method}: no parameter {k!r}" for k in keywords if k not in names]
        if npos > len(positional):
            problems.append(
                f"engine.{method}: {npos} positional arguments, takes {len(positional)}"
            )
    return problems


def unpack(wheel: Path, target: Path) -> Path:
    """Unpack the ``sglang/srt`` sources of ``wheel`` into ``target``; return ``target``."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("sglang/srt/") and name.endswith(".py"):
                z.extract(name, target)
    return target


def download(target: Path, timeout: float = 300) -> Path:
    """``pip download --no-deps sglang==VERSION`` into ``target``; the wheel path.

    Raises:
        RuntimeError: pip failed (offline, index unreachable).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={VERSION}", "-d", str(target)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    wheels = sorted(target.glob(f"sglang-{VERSION}-*.whl"))
    if proc.returncode or not wheels:
        raise RuntimeError(f"pip download sglang=={VERSION} failed: {proc.stderr[-500:]}")
    return wheels[0]


def main(argv: list[str]) -> None:
    """Rewrite the snapshot from a wheel (argument) or a fresh download."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(argv[0]) if argv else download(Path(tmp))
        api = extract_api(unpack(wheel, Path(tmp) / "src"))
        api["wheel"] = {
            "name": wheel.name,
            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        }
    SNAPSHOT.write_text(json.dumps(api, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT} from {api['wheel']['name']}")


if __name__ == "__main__":
    main(sys.argv[1:])
