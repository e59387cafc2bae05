"""Prompt rows from ``.jsonl``, ``.parquet``, ``datasets.save_to_disk`` directories or hub names.

Field mapping comes from the spec (``prompt_key``/``answer_key``); a missing field fails with
the available field names. ``limit`` keeps the first rows in file order (before any shuffling,
so a CI slice is the same slice everywhere). Answers are kept raw: GSM8K's ``answer`` is the
whole solution and the reward parses the text after ``####``. ``pyarrow`` and ``datasets`` are
imported only for the formats that need them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fp8rl.protocol.data_spec import FileDataset
from fp8rl.services.data.records import PromptRecord


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    """Rows of a JSON-lines file. Raises ``ValueError`` naming ``path:line`` for a line that is
    not UTF-8 or not JSON."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                    f"{error.start + 1})"
                ) from None
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _read_hf(spec: FileDataset) -> Iterable[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ValueError(
            f"data path {spec.path!r} needs the `datasets` package (pip install datasets)"
        ) from error
    if spec.hub:
        return datasets.load_dataset(spec.path, split=spec.split)
    loaded = datasets.load_from_disk(spec.path)
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise ValueError(
                f"split {spec.split!r} not in {spec.path} (splits: {', '.join(loaded)})"
            )
        return loaded[spec.split]
    return loaded


def _rows(spec: FileDataset) -> Iterable[dict[str, Any]]:
    if spec.hub:
        return _read_hf(spec)
    path = Path(spec.path)
    if not path.exists():
        raise ValueError(
            f"data path {spec.path!r} does not exist (set hub: true for a hub dataset name)"
        )
    if path.is_dir():
        return _read_hf(spec)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    raise ValueError(
        f"data path {spec.path!r}: expected a .jsonl or .parquet file or a save_to_disk directory"
    )


def file_dataset_name(spec: FileDataset) -> str:
    """Short dataset name: ``../shared/data/gsm8k/test.jsonl`` -> ``gsm8k_test``; a directory ->
    its name; a hub name ``openai/gsm8k`` -> ``gsm8k``."""
    if spec.hub:
        return spec.path.rstrip("/").rsplit("/", 1)[-1]
    path = Path(spec.path)
    if path.is_dir() or not path.suffix:
        return path.name
    return f"{path.parent.name}_{path.stem}" if path.parent.name else path.stem


def load_file_dataset(spec: FileDataset) -> list[PromptRecord]:
    """Records of a file/directory/hub dataset; ids ``{file_dataset_name}-{row index}``.

    Raises ``ValueError`` for a missing path, an unknown format, invalid JSON (with the line
    number) or a row without ``prompt_key``/``answer_key`` (naming the available fields).
    """
    name = file_dataset_name(spec)
    records: list[PromptRecord] = []
    for index, row in enumerate(_rows(spec)):
        if spec.limit is not None and index >= spec.limit:
            break
        for role, key in (("prompt_key", spec.prompt_key), ("answer_key", spec.answer_key)):
            if key not in row:
                raise ValueError(
                    f"{spec.path} row {index} has no field {key!r} ({role}); fields: {', '.join(map(str, row))}"
                )
        records.append(
            PromptRecord(
                prompt_id=f"{name}-{index}",
                question=str(row[spec.prompt_key]),
                answer=str(row[spec.answer_key]),
                row=dict(row),
            )
        )
    return records
