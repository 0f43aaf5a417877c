"""Each record schema read into one conversation shape, rendered with the chat template, and trained only
on assistant turns of weight 1; what is not trained is refused naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tunebox.datasets import DatasetError, inspect_dataset, load_records
from worker._trainlib.data import IGNORE, encode, read_eval_split, render_prompt, write_eval_split

LIMITS = {"max_rows": 1000, "max_bytes": 1 << 20}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
OPENAI_ROW = {
    "messages": [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "assistant", "content": "wrong answer", "weight": 0},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "It rains in Oslo.", "weight": 1},
    ],
    "tools": [WEATHER_TOOL],
}
# renders tools and tool calls, as Qwen's and Llama 3.1's templates do
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\n{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
    "</s>\n{% endif %}{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['content'] %}{{ m['content'] }}"
    "{% endif %}{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}call {{ c['function']['name'] }}"
    " {{ c['function']['arguments'] | tojson }}{% endfor %}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _jsonl(tmp_path: Path, rows: list, name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _conversation(tmp_path: Path, row: dict, declared: str = "auto") -> tuple[str, dict]:
    fmt, rows = load_records(_jsonl(tmp_path, [row]), declared)
    return fmt, rows[0]


def _error(tmp_path: Path, row: dict) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        inspect_dataset(_jsonl(tmp_path, [row]), **LIMITS)
    assert info.value.row == 1
    return info.value


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)


@pytest.fixture(scope="module")
def tool_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def _learned(tok, example) -> str:
    return tok.decode([t for t in example.labels if t != IGNORE])


# --------------------------------------------------------------------------- reading


def test_openai_rows_read_roles_parts_tool_calls_tools_and_weights(tmp_path: Path) -> None:
    fmt, conv = _conversation(tmp_path, OPENAI_ROW)
    assert fmt == "openai" and conv["tools"] == [WEATHER_TOOL]
    messages = conv["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert messages[1]["content"] == "Weather in Oslo?"
    assert messages[2]["tool_calls"] == [
        {
            "type": "function",
            "id": "call_1",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
        }
    ]
    assert messages[2]["content"] == "" and messages[3]["tool_call_id"] == "call_1"
    assert messages[4]["weight"] == 0 and "weight" not in messages[6]
    assert inspect_dataset(_jsonl(tmp_path, [OPENAI_ROW]), "openai", **LIMITS).format == "openai"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                    {"role": "assistant", "content": "a cat"},
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "weight": 2},
                ]
            },
            "messages[1].weight",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q", "weight": 1},
                    {"role": "assistant", "content": "a"},
                ]
            },
            "messages[0].weight",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "weight": 0},
                ]
            },
            "messages",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "bot", "content": "q"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
            "messages[1].content",
        ),
        (
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "tools": [{"type": "function", "function": {"description": "no name"}}],
            },
            "tools[0]",
        ),
    ],
)
def test_bad_openai_rows_name_the_field(tmp_path: Path, row: dict, field: str) -> None:
    assert _error(tmp_path, row).field == field


def test_sharegpt_reads_every_role_system_and_tools(tmp_path: Path) -> None:
    row = {
        "system": "You call tools.",
        "tools": json.dumps([WEATHER_TOOL["function"]]),
        "conversations": [
            {"from": "user", "value": "Weather in Oslo?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}),
            },
            {"from": "observation", "value": "rain"},
            {"from": "assistant", "value": "It rains."},
            {"from": "human", "value": "thanks"},
            {"from": "gpt", "value": "You are welcome."},
        ],
    }
    fmt, conv = _conversation(tmp_path, row)
    assert fmt == "sharegpt" and conv["tools"] == [WEATHER_TOOL]
    roles = [m["role"] for m in conv["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert conv["messages"][0]["content"] == "You call tools."
    assert conv["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    bad = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "not json"}]}
    assert _error(tmp_path, bad).field == "conversations[1].value"


def test_alpaca_reads_system_and_history(tmp_path: Path) -> None:
    row = {
        "system": "Be kind.",
        "instruction": "And 3?",
        "input": "",
        "output": "9",
        "history": [["Square 1", "1"], ["And 2?", "4"]],
    }
    fmt, conv = _conversation(tmp_path, row)
    assert fmt == "alpaca"
    assert [(m["role"], m["content"]) for m in conv["messages"]] == [
        ("system", "Be kind."),
        ("user", "Square 1"),
        ("assistant", "1"),
        ("user", "And 2?"),
        ("assistant", "4"),
        ("user", "And 3?"),
        ("assistant", "9"),
    ]
    assert _error(tmp_path, {**row, "history": [["only one"]]}).field == "history[0]"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"instruction": "q", "chosen": "good", "rejected": "bad"}, "chosen"),
        (
            {
                "conversations": [{"from": "human", "value": "q"}],
                "chosen": {"from": "gpt", "value": "a"},
                "rejected": {"from": "gpt", "value": "b"},
            },
            "chosen",
        ),
        (
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "label": False,
            },
            "label",
        ),
        (
            {
                "input": {"messages": [{"role": "user", "content": "q"}]},
                "preferred_output": [],
                "non_preferred_output": [],
            },
            "preferred_output",
        ),
        ({"instruction": "q", "output": ["good", "bad"]}, "output"),
        (
            {
                "messages": [
                    {"role": "user", "content": "<image>What is it?"},
                    {"role": "assistant", "content": "a cat"},
                ],
                "images": ["cat.png"],
            },
            "images",
        ),
        (
            {
                "conversations": [{"from": "human", "value": "<video>?"}, {"from": "gpt", "value": "a"}],
                "videos": ["v.mp4"],
            },
            "videos",
        ),
    ],
)
def test_untrained_data_is_refused_naming_the_field(tmp_path: Path, row: dict, field: str) -> None:
    err = _error(tmp_path, row)
    assert err.field == field and "not trained" in err.message


def test_a_label_that_is_not_kto_is_an_ignored_extra_key(tmp_path: Path) -> None:
    row = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "label": "billing",
    }
    assert inspect_dataset(_jsonl(tmp_path, [row]), **LIMITS).num_rows == 1


# --------------------------------------------------------------------------- rendering and labels


def test_only_assistant_turns_of_weight_one_are_trained(tool_tokenizer) -> None:
    from tunebox.dataset_formats import parse_openai

    conv = parse_openai(OPENAI_ROW)
    example = encode(tool_tokenizer, conv, "openai", 512)
    assert example is not None
    learned = _learned(tool_tokenizer, example)
    assert "It rains in Oslo." in learned and 'call get_weather {"city": "Oslo"}' in learned
    assert "wrong answer" not in learned and "rain</s>" not in learned.replace("rains", "")
    text = tool_tokenizer.decode(example.input_ids)
    assert "get_weather;" in text and "wrong answer" in text and "Weather in Oslo?" in text


def test_a_template_without_tools_gets_them_as_text(tokenizer) -> None:
    from tunebox.dataset_formats import parse_openai

    conv = parse_openai(OPENAI_ROW)
    example = encode(tokenizer, conv, "openai", 1024)
    assert example is not None
    text = tokenizer.decode(example.input_ids)
    assert text.startswith('<s><|system|>\nBe brief.\n\nTools you may call:\n{"name": "get_weather"')
    learned = _learned(tokenizer, example)
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in learned
    assert "It rains in Oslo." in learned and "wrong answer" not in learned


def test_plain_rendering_keeps_weights_and_tool_calls(tokenizer) -> None:
    from tunebox.dataset_formats import parse_openai

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    conv = parse_openai(OPENAI_ROW)
    example = encode(plain, conv, "openai", 1024)
    assert example is not None
    text, learned = plain.decode(example.input_ids), _learned(plain, example)
    assert "### Tools:" in text and "### Tool result:\nrain" in text
    assert "get_weather" in learned and "It rains in Oslo." in learned and "wrong answer" not in learned
    prompt, reference = render_prompt(plain, conv, "openai")
    assert reference == "It rains in Oslo." and prompt.endswith("again\n\n### Response:\n")


def test_eval_split_keeps_tools(tmp_path: Path) -> None:
    from tunebox.dataset_formats import parse_openai

    conv = parse_openai(OPENAI_ROW)
    write_eval_split(tmp_path / "e.jsonl", [conv], "openai")
    assert read_eval_split(tmp_path / "e.jsonl") == [("openai", conv)]


# --------------------------------------------------------------------------- LLaMA-Factory dataset_info.json

SHAREGPT_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "system_tag": "system",
}


def _info_folder(tmp_path: Path) -> Path:
    def write(name: str, rows: list) -> None:
        (tmp_path / name).write_text(json.dumps(rows), encoding="utf-8")

    write("alpaca.json", [{"instruction": "Say hi", "input": "", "output": "hi"}] * 3)
    write("custom.json", [{"q": "Say hi", "a": "hi", "sys": "Be kind."}] * 2)
    write(
        "chat.json",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}],
    )
    write(
        "glaive.json",
        [
            {
                "conversations": [
                    {"from": "human", "value": "Weather?"},
                    {
                        "from": "function_call",
                        "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                    },
                    {"from": "observation", "value": "rain"},
                    {"from": "gpt", "value": "Rain."},
                ],
                "tools": json.dumps([WEATHER_TOOL["function"]]),
            }
        ],
    )
    write("c4.json", [{"text": "once upon a time"}])
    info = {
        "alpaca_demo": {"file_name": "alpaca.json"},
        "custom": {"file_name": "custom.json", "columns": {"prompt": "q", "response": "a", "system": "sys"}},
        "chat": {
            "file_name": "chat.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": SHAREGPT_TAGS,
        },
        "glaive": {
            "file_name": "glaive.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "tools": "tools"},
        },
        "c4_demo": {"file_name": "c4.json", "columns": {"prompt": "text"}},
        "kto_demo": {
            "file_name": "chat.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": SHAREGPT_TAGS,
        },
        "dpo_demo": {
            "file_name": "alpaca.json",
            "ranking": True,
            "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"},
        },
        "mllm_demo": {
            "file_name": "chat.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": SHAREGPT_TAGS,
        },
        "hub_only": {"hf_hub_url": "someone/data"},
        "missing": {"file_name": "absent.json"},
    }
    path = tmp_path / "dataset_info.json"
    path.write_text(json.dumps(info, indent=2), encoding="utf-8")
    return path


def test_dataset_info_entries_are_read_with_their_columns_and_tags(tmp_path: Path) -> None:
    info = _info_folder(tmp_path)
    fmt, rows = load_records(info, name="alpaca_demo")
    assert (
        fmt == "alpaca"
        and len(rows) == 3
        and rows[0]["messages"][-1] == {"role": "assistant", "content": "hi"}
    )
    fmt, rows = load_records(info, name="custom")
    assert fmt == "alpaca" and [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert rows[0]["messages"][0]["content"] == "Be kind."
    fmt, rows = load_records(info, name="chat")
    assert fmt == "sharegpt" and rows[0]["messages"][1] == {"role": "assistant", "content": "yo"}
    fmt, rows = load_records(info, name="glaive")
    assert rows[0]["tools"] == [WEATHER_TOOL]
    assert rows[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    fmt, rows = load_records(info, name="c4_demo")
    assert fmt == "text" and rows[0]["messages"][0]["content"] == "once upon a time"
    described = inspect_dataset(info, name="alpaca_demo", **LIMITS)
    assert described.num_rows == 3 and described.size_bytes == (tmp_path / "alpaca.json").stat().st_size


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (None, "needs dataset.name"),
        ("nope", "no entry 'nope'"),
        ("kto_demo", "columns.kto_tag"),
        ("dpo_demo", "ranking"),
        ("mllm_demo", "columns.images"),
        ("hub_only", "not downloaded"),
        ("missing", "absent.json is not a file"),
    ],
)
def test_dataset_info_refusals_name_the_entry_and_reason(
    tmp_path: Path, name: str | None, words: str
) -> None:
    with pytest.raises(DatasetError) as info:
        load_records(_info_folder(tmp_path), name=name)
    assert info.value.field == "dataset.name" and words in info.value.message
    if name is None:
        assert "alpaca_demo" in info.value.message


def test_a_name_on_a_data_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        load_records(_jsonl(tmp_path, [OPENAI_ROW]), name="x")
    assert info.value.field == "dataset.name"
