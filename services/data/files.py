"""Prompt rows from ``.jsonl``, ``.parquet``, ``datasets.save_to_disk`` directories or hub names.

Field mapping comes from the spec (``prompt_key``/``answer_key``); a missing field fails with
the available field names. ``limit`` keeps the first rows in file order (before any shuffling,
so a CI slice is the same slice everywhere). Answers are kept raw: GSM8K's ``answer`` is the
whole solution and the reward parses the text after ``####``. ``pyarrow`` and ``datasets`` are
imported only for the formats that need them.

``probe_file_dataset`` reads only the first ``PROBE_ROWS`` records through the same path as the
loader, so preflight (``fp8rl validate``/``run``) refuses a wrong file or field in a second
whatever the dataset's size. Errors are ``DatasetError`` naming the spec field to change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from fp8rl.protocol.data_spec import FileDataset
from fp8rl.services.data.records import PromptRecord

PROBE_ROWS = 8
"""Records ``probe_file_dataset`` reads: enough to catch a wrong file or key, cheap at any size."""


class DatasetError(ValueError):
    """A dataset that cannot be used; ``field`` is the ``FileDataset`` field to change
    (``path``, ``split``, ``prompt_key`` or ``answer_key``)."""

    def __init__(self, message: str, *, field: str = "path") -> None:
        super().__init__(message)
        self.field = field


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    """Rows of a JSON-lines file. Raises ``DatasetError`` naming ``path:line`` for a line that is
    not UTF-8, not JSON or not a JSON object."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DatasetError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                    f"{error.start + 1})"
                ) from None
            if line.strip():
                yield _json_object(line, where=f"{path}:{number}")


def _json_object(line: str, *, where: str) -> dict[str, Any]:
    """One JSON-lines row. Raises ``DatasetError`` naming ``where`` when it is not an object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: not a JSON object ({type(row).__name__}); a row is {{...}}")
    return row


def _read_parquet(path: Path) -> Iterable[dict[str, Any]]:
    """Rows of a Parquet file, one record batch at a time (a probe reads only the first)."""
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise DatasetError(f"{path}: not a readable Parquet file ({error})") from None
    for batch in batches:
        yield from batch.to_pylist()


def _read_hf(spec: FileDataset) -> Iterable[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise DatasetError(
            f"data path {spec.path!r} needs the `datasets` package (pip install datasets)"
        ) from error
    if spec.hub:
        return datasets.load_dataset(spec.path, split=spec.split)
    try:
        loaded = datasets.load_from_disk(str(Path(spec.path).expanduser()))
    except FileNotFoundError:
        raise DatasetError(
            f"{spec.path} is a directory but not a datasets.save_to_disk directory (no "
            "dataset_dict.json or state.json in it); give a .jsonl or .parquet file or a "
            "directory written by save_to_disk"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise DatasetError(
                f"split {spec.split!r} not in {spec.path} (splits: {', '.join(loaded)})",
                field="split",
            )
        return loaded[spec.split]
    return loaded


def _rows(spec: FileDataset) -> Iterable[dict[str, Any]]:
    if spec.hub:
        return _read_hf(spec)
    path = Path(spec.path).expanduser()
    if not path.exists():
        raise DatasetError(
            f"data path {spec.path!r} does not exist (set hub: true for a hub dataset name)"
        )
    if path.is_dir():
        return _read_hf(spec)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    raise DatasetError(
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

    Raises ``DatasetError`` (a ``ValueError``) for a missing or unreadable path, an unknown
    format, invalid JSON (with the line number), no rows, or a row without
    ``prompt_key``/``answer_key`` (naming the available fields).
    """
    return _first_records(spec, spec.limit)


def probe_file_dataset(spec: FileDataset, *, num_rows: int = PROBE_ROWS) -> None:
    """Read the first ``num_rows`` records of a local dataset as ``load_file_dataset`` would:
    a cheap check that the path, format and keys are right (a bad row further down is found
    only by the run). Raises ``DatasetError`` like ``load_file_dataset``."""
    _first_records(spec, min(num_rows, spec.limit or num_rows))


def _first_records(spec: FileDataset, count: int | None) -> list[PromptRecord]:
    """The first ``count`` records (all for None). Raises ``DatasetError`` when there are none."""
    try:
        records = list(islice(_records(spec), count))
    except OSError as error:  # a file that cannot be opened or read
        raise DatasetError(f"{spec.path}: cannot be read ({error.strerror or error})") from None
    if not records:
        raise DatasetError(f"{spec.path} has no rows (an empty file?)")
    return records


def _records(spec: FileDataset) -> Iterator[PromptRecord]:
    """Records in source order, checking each row has ``prompt_key`` and ``answer_key``."""
    name = file_dataset_name(spec)
    for index, row in enumerate(_rows(spec)):
        for role, key in (("prompt_key", spec.prompt_key), ("answer_key", spec.answer_key)):
            if key not in row:
                raise DatasetError(
                    f"{spec.path} row {index} has no field {key!r} ({role}); fields: "
                    f"{', '.join(map(str, row))}",
                    field=role,
                )
        yield PromptRecord(
            prompt_id=f"{name}-{index}",
            question=str(row[spec.prompt_key]),
            answer=str(row[spec.answer_key]),
            row=dict(row),
        )
