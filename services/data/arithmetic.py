"""fp8rl's procedural arithmetic task: exact integer answers, difficulty 1..5, no download.

Why a generated task: the quickstart must show a reward that rises within minutes on 2 CPU
cores with a 135M model, with no dataset to fetch and an exact answer check. Difficulty grows
by operand size and number of operations; expressions use standard precedence (``*`` before
``+``/``-``) and are evaluated exactly with integers (never ``eval``). The generator is seeded
from ``ArithmeticDataset.seed`` and the difficulty only, so splits are stable across runs and
independent of the run seed.

| level | expression | operands |
|---|---|---|
| 1 | a + b | 0..9 |
| 2 | a ± b | 10..99 |
| 3 | a op b, op in + - * | 10..99 |
| 4 | a op b op c | 10..99 |
| 5 | a op b op c op d | 100..999 |
"""

from __future__ import annotations

import random

from fp8rl.protocol.data_spec import ArithmeticDataset
from fp8rl.services.data.records import PromptRecord

_LEVELS: dict[int, tuple[int, str, tuple[int, int]]] = {
    1: (1, "+", (0, 9)),
    2: (1, "+-", (10, 99)),
    3: (1, "+-*", (10, 99)),
    4: (2, "+-*", (10, 99)),
    5: (3, "+-*", (100, 999)),
}
"""difficulty -> (number of operations, allowed operators, operand range inclusive)."""

MAX_ATTEMPTS_PER_PROBLEM = 20
"""Draws per requested problem before giving up on finding more distinct ones (small levels)."""


def evaluate_expression(operands: list[int], operators: list[str]) -> int:
    """Exact integer value of ``o0 op0 o1 op1 ...`` with ``*`` binding tighter than ``+``/``-``."""
    assert len(operands) == len(operators) + 1
    terms, signs = [operands[0]], [1]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        else:
            terms.append(value)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


def generate_arithmetic(spec: ArithmeticDataset) -> list[PromptRecord]:
    """Up to ``spec.num_problems`` distinct problems (fewer when the level has fewer).

    Records: ``question`` = ``"What is 12 + 7 * 3?"``, ``answer`` = the exact integer as text,
    ``row`` = ``{"question", "answer", "expression", "difficulty"}``; ids ``arith-L{d}-{seed}-{i}``.
    """
    num_ops, operators, (low, high) = _LEVELS[spec.difficulty]
    rng = random.Random(f"fp8rl-arithmetic:{spec.seed}:{spec.difficulty}")
    seen: set[str] = set()
    records: list[PromptRecord] = []
    for _ in range(spec.num_problems * MAX_ATTEMPTS_PER_PROBLEM):
        if len(records) == spec.num_problems:
            break
        operands = [rng.randint(low, high) for _ in range(num_ops + 1)]
        ops = [rng.choice(operators) for _ in range(num_ops)]
        expression = " ".join(
            [str(operands[0])]
            + [f"{op} {value}" for op, value in zip(ops, operands[1:], strict=True)]
        )
        if expression in seen:
            continue
        seen.add(expression)
        answer = str(evaluate_expression(operands, ops))
        question = f"What is {expression}?"
        records.append(
            PromptRecord(
                prompt_id=f"arith-L{spec.difficulty}-{spec.seed}-{len(records)}",
                question=question,
                answer=answer,
                row={
                    "question": question,
                    "answer": answer,
                    "expression": expression,
                    "difficulty": spec.difficulty,
                },
            )
        )
    return records
