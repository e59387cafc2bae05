"""Prompt sources: the arithmetic generator and dataset files (jsonl, parquet, save_to_disk)."""

from __future__ import annotations

import json
import re

import pytest
from fp8rl_testing import shared_path

from fp8rl.protocol import ArithmeticDataset, FileDataset
from fp8rl.services.data import build_dataset, dataset_name, evaluate_expression
from fp8rl.workers.reward.functions import arithmetic_reward, gsm8k_strict_reward


def test_evaluate_expression_applies_precedence_by_hand():
    assert evaluate_expression([2, 3, 4], ["+", "*"]) == 14
    assert evaluate_expression([10, 2, 3], ["-", "*"]) == 4
    assert evaluate_expression([5, 3, 2], ["-", "-"]) == 0
    assert evaluate_expression([7], []) == 7


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_arithmetic_answers_are_exact_and_levels_grow(difficulty):
    records = build_dataset(ArithmeticDataset(difficulty=difficulty, num_problems=64, seed=3))
    num_ops = {1: 1, 2: 1, 3: 1, 4: 2, 5: 3}[difficulty]
    width = {1: 1, 2: 2, 3: 2, 4: 2, 5: 3}[difficulty]
    for record in records:
        expression = record.row["expression"]
        assert re.fullmatch(r"\d+( [-+*] \d+)*", expression)
        assert len(re.findall(r"[-+*]", expression)) == num_ops
        assert all(len(number) == width for number in re.findall(r"\d+", expression))
        assert record.answer == str(eval(expression))  # independent oracle: Python's precedence
        assert (
            arithmetic_reward(response=f"{expression} = {record.answer}", answer=record.answer)
            == 1.0
        )
    assert len({r.row["expression"] for r in records}) == len(records)


def test_arithmetic_is_deterministic_from_its_seed_only():
    spec = ArithmeticDataset(difficulty=3, num_problems=50, seed=7)
    assert build_dataset(spec) == build_dataset(spec)
    assert build_dataset(spec) != build_dataset(spec.model_copy(update={"seed": 8}))
    assert len({r.prompt_id for r in build_dataset(spec)}) == 50


def test_arithmetic_level_one_yields_only_its_distinct_problems():
    records = build_dataset(ArithmeticDataset(difficulty=1, num_problems=1024))
    assert len(records) == 100  # a + b with one-digit operands


def test_gsm8k_jsonl_keeps_raw_answer_for_the_reward():
    path = shared_path("data", "gsm8k", "test.jsonl")
    spec = FileDataset(path=str(path), limit=5)
    records = build_dataset(spec)
    assert len(records) == 5 and dataset_name(spec) == "gsm8k_test"
    first = json.loads(path.read_text().splitlines()[0])
    assert records[0].question == first["question"] and records[0].answer == first["answer"]
    assert records[0].prompt_id == "gsm8k_test-0"
    assert gsm8k_strict_reward(response="#### 18", answer=records[0].answer) == 1.0


def test_math500_field_mapping():
    records = build_dataset(
        FileDataset(
            path=str(shared_path("data", "math500", "test.jsonl")), prompt_key="problem", limit=3
        )
    )
    assert records[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert records[0].question.startswith("Convert the point")
    assert records[0].row["subject"] == "Precalculus"


def test_parquet_and_save_to_disk_give_the_same_records_as_jsonl(tmp_path):
    rows = [{"q": f"question {i}", "a": str(i)} for i in range(4)]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "rows")
    )

    def load(path: str):
        records = build_dataset(FileDataset(path=path, prompt_key="q", answer_key="a", limit=3))
        return [(r.question, r.answer) for r in records]

    expected = [(f"question {i}", str(i)) for i in range(3)]
    assert load(str(jsonl)) == expected
    assert load(str(tmp_path / "rows.parquet")) == expected
    assert load(str(tmp_path / "rows")) == expected
    with pytest.raises(ValueError, match="split 'test'"):
        build_dataset(
            FileDataset(path=str(tmp_path / "rows"), split="test", prompt_key="q", answer_key="a")
        )


def test_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        build_dataset(FileDataset(path=str(bad)))
    good = tmp_path / "good.jsonl"
    good.write_text('{"problem": "x", "answer": "1"}\n')
    with pytest.raises(
        ValueError, match=r"no field 'question' \(prompt_key\); fields: problem, answer"
    ):
        build_dataset(FileDataset(path=str(good)))
    with pytest.raises(ValueError, match="does not exist"):
        build_dataset(FileDataset(path=str(tmp_path / "missing.jsonl")))
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"expected a \.jsonl or \.parquet"):
        build_dataset(FileDataset(path=str(tmp_path / "rows.csv")))


def test_non_utf8_byte_names_the_file_and_the_line(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"question": "x", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl:2: not UTF-8 text \(byte 0xe9 at column"):
        build_dataset(FileDataset(path=str(bad)))


def test_an_empty_file_is_refused_naming_the_file_not_the_sampler(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl has no rows"):
        build_dataset(FileDataset(path=str(empty)))


def test_a_json_line_that_is_not_an_object_names_the_line(tmp_path):
    bad = tmp_path / "list.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\n["x", "1"]\n')
    with pytest.raises(ValueError, match=r"list\.jsonl:2: not a JSON object \(list\)"):
        build_dataset(FileDataset(path=str(bad)))
