"""Reading a tool call's parameters the way llama-server does: a required parameter that is
missing or of the wrong type is a malformed request (llama-server answers 400), while an
optional one of the wrong type falls back to its default (llama-server's `json_value`)."""
from __future__ import annotations

_JSON_TYPE_NAMES = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string",
                    list: "array", dict: "object"}


class ParamError(ValueError):
    """A required parameter is missing or not of its type: the request is malformed (400)."""


def _type_name(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def need(params: dict, key: str) -> object:
    """A required parameter of any type (llama-server's `params.at(key)`)."""
    if not isinstance(params, dict) or key not in params:
        raise ParamError(f"key '{key}' not found")
    return params[key]


def need_str(params: dict, key: str) -> str:
    """A required string parameter."""
    value = need(params, key)
    if not isinstance(value, str):
        raise ParamError(f"type must be string, but is {_type_name(value)}")
    return value


def opt_str(params: dict, key: str, default: str) -> str:
    """An optional string; anything but a string reads as the default."""
    value = params.get(key)
    return value if isinstance(value, str) else default


def opt_int(params: dict, key: str, default: int) -> int:
    """An optional integer; a float is truncated and a boolean counts as 0/1 (as nlohmann's
    `get<int>` does), anything else reads as the default."""
    value = params.get(key)
    if isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return int(value)
    return default


def opt_bool(params: dict, key: str, default: bool) -> bool:
    """An optional boolean; anything but a boolean reads as the default."""
    value = params.get(key)
    return value if isinstance(value, bool) else default

