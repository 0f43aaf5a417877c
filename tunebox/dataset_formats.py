"""The record schemas tunebox trains on, each read into one conversation shape (pure Python).

A conversation is ``{"messages": [...], "tools": [...]}`` (``tools`` only where the record declares
some). Each message is ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``; an assistant
message may carry ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments": {...}}}]``,
the shape Hugging Face chat templates take) and ``"weight": 0`` when it is context only. Every
assistant message without ``weight: 0`` is trained; nothing else is.

What tunebox does not train (preference data, images, audio, video) is refused by
:func:`refuse_untrainable` with the field that says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

__all__ = [
    "FORMATS",
    "PARSERS",
    "Conversation",
    "Format",
    "FormatError",
    "Message",
    "detect_format",
    "refuse_untrainable",
]

Format = Literal["alpaca", "sharegpt", "openai", "text"]
FORMATS: tuple[Format, ...] = ("alpaca", "sharegpt", "openai", "text")
Message = dict[str, Any]
Conversation = dict[str, Any]


class FormatError(ValueError):
    """A record that does not fit its schema: ``field`` is the key inside the record."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# --------------------------------------------------------------------------- what is not trained

_PREFERENCE_KEYS = {
    "chosen": "preference pairs (DPO/ORPO: chosen/rejected)",
    "rejected": "preference pairs (DPO/ORPO: chosen/rejected)",
    "preferred_output": "preference pairs (OpenAI DPO: preferred_output/non_preferred_output)",
    "non_preferred_output": "preference pairs (OpenAI DPO: preferred_output/non_preferred_output)",
}
_KTO_KEYS = ("label", "kto_tag")
_MEDIA_KEYS = {
    "images": "images",
    "image": "images",
    "videos": "video",
    "video": "video",
    "audios": "audio",
    "audio": "audio",
}
_MEDIA_PART_TYPES = {
    "image_url": "images",
    "image": "images",
    "input_image": "images",
    "input_audio": "audio",
    "audio": "audio",
    "video": "video",
    "video_url": "video",
    "file": "files",
    "input_file": "files",
}
_NOT_TRAINED = "tunebox trains supervised chat and text only"


def refuse_untrainable(record: dict[str, Any]) -> None:
    """Raise FormatError naming the field of a record that holds preference data or media."""
    for key, what in _PREFERENCE_KEYS.items():
        if key in record:
            raise FormatError(key, f"{what} is not trained: {_NOT_TRAINED}; remove the field or the rows")
    for key in _KTO_KEYS:
        if isinstance(record.get(key), bool):
            raise FormatError(
                key,
                "KTO data (a desirable/undesirable label per row) is not trained: "
                f"{_NOT_TRAINED}; remove the field or the rows",
            )
    for key, what in _MEDIA_KEYS.items():
        if record.get(key):
            raise FormatError(
                key,
                f"{what} are not trained (text models only): {_NOT_TRAINED}; remove the field or the rows",
            )


# --------------------------------------------------------------------------- small readers


def _type(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _str(
    record: dict[str, Any],
    key: str,
    field: str | None = None,
    *,
    optional: bool = False,
    non_empty: bool = False,
) -> str:
    name = field or key
    value = record.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        got = "missing" if key not in record else _type(value)
        raise FormatError(name, f"must be a string ({got})")
    if non_empty and not value.strip():
        raise FormatError(name, "must not be empty")
    return value


def _json_value(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise FormatError(field, f"must be JSON ({exc.msg} at column {exc.colno})") from None


def _tool_call(raw: Any, field: str) -> dict[str, Any]:
    """One tool call in the chat-template shape; ``arguments`` parsed from its JSON string."""
    if not isinstance(raw, dict):
        raise FormatError(field, f"must be an object ({_type(raw)})")
    fn = raw.get("function", raw)
    if not isinstance(fn, dict):
        raise FormatError(f"{field}.function", f"must be an object ({_type(fn)})")
    prefix = f"{field}.function" if "function" in raw else field
    name = _str(fn, "name", f"{prefix}.name", non_empty=True)
    arguments = _json_value(fn.get("arguments", {}), f"{prefix}.arguments")
    if not isinstance(arguments, dict):
        raise FormatError(f"{prefix}.arguments", f"must be a JSON object ({_type(arguments)})")
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if isinstance(raw.get("id"), str):
        call["id"] = raw["id"]
    return call


def _tools(raw: Any, field: str) -> list[dict[str, Any]]:
    """Tool declarations as ``[{"type": "function", "function": {...}}]``."""
    value = _json_value(raw, field)
    if not isinstance(value, list):
        raise FormatError(field, f"must be a list of tools ({_type(value)})")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise FormatError(f"{field}[{i}]", f"must be an object ({_type(tool)})")
        fn = tool.get("function", tool)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FormatError(f"{field}[{i}]", "a tool needs a function name")
        out.append({"type": "function", "function": fn})
    return out


def _conversation(messages: list[Message], tools: list[dict[str, Any]] | None, field: str) -> Conversation:
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise FormatError(field, "needs at least one assistant turn to learn from (with weight 1)")
    out: Conversation = {"messages": messages}
    if tools:
        out["tools"] = tools
    return out


# --------------------------------------------------------------------------- openai

_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def _openai_content(turn: dict[str, Any], field: str, *, may_be_empty: bool) -> str:
    content = turn.get("content")
    if content is None and may_be_empty:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        got = "missing" if "content" not in turn else _type(content)
        raise FormatError(field, f"must be a string or a list of text parts ({got})")
    texts = []
    for j, part in enumerate(content):
        where = f"{field}[{j}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise FormatError(where, f"must be a text part ({_type(part)})")
        kind = part.get("type")
        if kind in _MEDIA_PART_TYPES:
            raise FormatError(
                f"{where}.type",
                f"{_MEDIA_PART_TYPES[kind]} are not trained (text models only): {_NOT_TRAINED}",
            )
        if kind not in ("text", "input_text", "output_text"):
            raise FormatError(f"{where}.type", f"must be text, got {kind!r}")
        texts.append(_str(part, "text", f"{where}.text"))
    return "".join(texts)


def _openai_turn(turn: Any, field: str) -> Message:
    if not isinstance(turn, dict):
        raise FormatError(field, f"each message must be an object ({_type(turn)})")
    who = turn.get("role")
    if who not in _OPENAI_ROLES:
        raise FormatError(f"{field}.role", f"must be one of {', '.join(_OPENAI_ROLES)}, got {who!r}")
    role = _OPENAI_ROLES[who]
    calls = turn.get("tool_calls") if role == "assistant" else None
    if calls is not None and not isinstance(calls, list):
        raise FormatError(f"{field}.tool_calls", f"must be a list ({_type(calls)})")
    message: Message = {
        "role": role,
        "content": _openai_content(turn, f"{field}.content", may_be_empty=bool(calls)),
    }
    if calls:
        message["tool_calls"] = [_tool_call(c, f"{field}.tool_calls[{k}]") for k, c in enumerate(calls)]
    if role == "tool" and isinstance(turn.get("tool_call_id"), str):
        message["tool_call_id"] = turn["tool_call_id"]
    if "weight" in turn:
        weight = turn["weight"]
        if role != "assistant":
            raise FormatError(f"{field}.weight", "only assistant messages take a weight")
        if weight not in (0, 1) or isinstance(weight, bool):
            raise FormatError(f"{field}.weight", f"must be 0 or 1, got {weight!r}")
        if weight == 0:
            message["weight"] = 0
    return message


def parse_openai(record: dict[str, Any], mapping: dict[str, str] | None = None) -> Conversation:
    """OpenAI chat fine-tuning JSONL: ``{"messages": [...], "tools"?: [...]}``."""
    turns = record.get("messages")
    if not isinstance(turns, list) or not turns:
        raise FormatError("messages", "must be a non-empty list of messages")
    messages = [_openai_turn(t, f"messages[{i}]") for i, t in enumerate(turns)]
    tools = _tools(record["tools"], "tools") if record.get("tools") else None
    if tools is None and record.get("functions"):
        tools = _tools(record["functions"], "functions")
    return _conversation(messages, tools, "messages")


# --------------------------------------------------------------------------- sharegpt

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def _function_call(value: str, field: str) -> list[dict[str, Any]]:
    parsed = _json_value(value, field)
    calls = parsed if isinstance(parsed, list) else [parsed]
    return [_tool_call(c, field) for c in calls]


def parse_sharegpt(record: dict[str, Any], mapping: dict[str, str] | None = None) -> Conversation:
    """ShareGPT: ``{"conversations": [{"from", "value"}...], "system"?, "tools"?}``.

    ``mapping`` renames this file's keys and role names (LLaMA-Factory's ``columns`` and ``tags``).
    """
    t = mapping or {}
    key, role_key, text_key = (
        t.get("messages", "conversations"),
        t.get("role_tag", "from"),
        t.get("content_tag", "value"),
    )
    roles = dict(_SHAREGPT_ROLES)
    for tag, role in (
        ("user_tag", "user"),
        ("assistant_tag", "assistant"),
        ("system_tag", "system"),
        ("observation_tag", "tool"),
        ("function_tag", "function_call"),
    ):
        if tag in t:
            roles[t[tag]] = _SHAREGPT_ROLES.get(role, role)
    turns = record.get(key)
    if not isinstance(turns, list) or not turns:
        raise FormatError(key, "must be a non-empty list of turns")
    messages: list[Message] = []
    system = _str(record, t.get("system", "system"), optional=True)
    if system:
        messages.append({"role": "system", "content": system})
    function_names = {t.get("function_tag", "function_call"), "function_call"}
    for i, turn in enumerate(turns):
        field = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise FormatError(field, "each turn must be an object")
        who = turn.get(role_key)
        if who not in roles:
            raise FormatError(f"{field}.{role_key}", f"must be one of {sorted(roles)}, got {who!r}")
        text = _str(turn, text_key, f"{field}.{text_key}")
        if who in function_names:
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": _function_call(text, f"{field}.{text_key}"),
                }
            )
        else:
            messages.append({"role": roles[who], "content": text})
    tools_key = t.get("tools", "tools")
    tools = _tools(record[tools_key], tools_key) if record.get(tools_key) else None
    return _conversation(messages, tools, key)


# --------------------------------------------------------------------------- alpaca and text


def parse_alpaca(record: dict[str, Any], mapping: dict[str, str] | None = None) -> Conversation:
    """Alpaca: ``{"instruction", "input"?, "output", "system"?, "history"?: [[q, a], ...]}``.

    ``mapping`` renames the keys (LLaMA-Factory's ``columns``: prompt, query, response, history, system).
    """
    c = mapping or {}
    prompt_key, query_key, response_key = (
        c.get("prompt", "instruction"),
        c.get("query", "input"),
        c.get("response", "output"),
    )
    history_key, system_key = c.get("history", "history"), c.get("system", "system")
    if isinstance(record.get(response_key), list):
        raise FormatError(
            response_key, f"a list of answers is preference ranking data, not trained: {_NOT_TRAINED}"
        )
    instruction = _str(record, prompt_key)
    extra = _str(record, query_key, optional=True)
    output = _str(record, response_key)
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    if not prompt.strip():
        raise FormatError(prompt_key, "must not be empty")
    messages: list[Message] = []
    system = _str(record, system_key, optional=True)
    if system:
        messages.append({"role": "system", "content": system})
    history = record.get(history_key) or []
    if not isinstance(history, list):
        raise FormatError(history_key, f"must be a list of [instruction, answer] pairs ({_type(history)})")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise FormatError(f"{history_key}[{i}]", "must be an [instruction, answer] pair of strings")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return {"messages": messages}


def parse_text(record: dict[str, Any], mapping: dict[str, str] | None = None) -> Conversation:
    """Plain text: ``{"text": str}``, trained whole (one assistant turn); ``mapping["prompt"]`` renames it."""
    key = (mapping or {}).get("prompt", "text")
    return {"messages": [{"role": "assistant", "content": _str(record, key, non_empty=True)}]}


PARSERS: dict[Format, Callable[[dict[str, Any], dict[str, str] | None], Conversation]] = {
    "alpaca": parse_alpaca,
    "sharegpt": parse_sharegpt,
    "openai": parse_openai,
    "text": parse_text,
}


def detect_format(record: dict[str, Any]) -> Format | None:
    """The schema a record's keys say, or None."""
    if "messages" in record:
        return "openai"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record or "output" in record:
        return "alpaca"
    if "text" in record:
        return "text"
    return None
