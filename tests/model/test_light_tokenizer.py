"""The driver loads a plain ``tokenizer.json`` tokenizer without AutoTokenizer's imports
(torch._dynamo, sympy, accelerate: ~0.15 GB of the quickstart driver, issue 18), and gets the
same tokenizer: same class, same ids for the quickstart's chat prompts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp8rl.workers.model.loading import load_tokenizer, resolve_model

MESSAGES = [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 12 + 7? Reply with just the number."},
]


@pytest.fixture(scope="module")
def smollm2_tokenizer_dir():
    try:
        return resolve_model("builtin:smollm2-135m-instruct", load_weights=False).tokenizer_dir
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_plain_fast_tokenizer_is_the_one_autotokenizer_gives(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    ours, auto = (
        load_tokenizer(smollm2_tokenizer_dir),
        AutoTokenizer.from_pretrained(smollm2_tokenizer_dir),
    )
    assert type(ours) is type(auto)
    for kwargs in ({"tokenize": True}, {"tokenize": False}):
        assert ours.apply_chat_template(
            MESSAGES, add_generation_prompt=True, **kwargs
        ) == auto.apply_chat_template(MESSAGES, add_generation_prompt=True, **kwargs)
    text = "12 + 7 = 19 <|im_end|>"
    assert ours(text)["input_ids"] == auto(text)["input_ids"]
    assert ours.decode([1, 2, 3, 400], skip_special_tokens=True) == auto.decode(
        [1, 2, 3, 400], skip_special_tokens=True
    )


def test_loading_the_quickstart_tokenizer_skips_autotokenizer_imports(smollm2_tokenizer_dir):
    code = (
        "import sys\n"
        "from fp8rl.workers.model.loading import load_tokenizer\n"
        f"load_tokenizer({str(smollm2_tokenizer_dir)!r})\n"
        "print('sympy' in sys.modules, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
