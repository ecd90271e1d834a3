"""Typed access to a record's fields: one error line naming the record, the field and what was found."""

import math
from typing import Any

from ggpo_offline.core.errors import UserError

MISSING = object()


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def get(record: dict, key: str, where: str, kind: str, required: bool = False) -> Any:
    """``record[key]`` checked to be of ``kind`` — ``str``, ``number``, ``ids`` (list of ints), ``floats``
    (list of numbers), ``key`` (str or int) or ``any``; None when absent (or null) and not ``required``."""
    value = record.get(key)
    if value is None:
        if required:
            raise UserError(f"{where}: field '{key}' is missing")
        return None
    ok = {
        "str": lambda v: isinstance(v, str),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "ids": lambda v: (
            isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        ),
        "floats": lambda v: (
            isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        ),
        "key": lambda v: isinstance(v, (str, int)) and not isinstance(v, bool),
        "any": lambda v: True,
    }[kind]
    if not ok(value):
        expected = {
            "str": "a string",
            "number": "a number",
            "ids": "a list of integer token ids",
            "floats": "a list of numbers",
            "key": "a string or an integer",
        }[kind]
        raise UserError(f"{where}: field '{key}' is {_kind(value)}, expected {expected}")
    return value


def finite(values: list[float] | None, key: str, where: str) -> list[float] | None:
    """``values`` unchanged, after refusing a NaN or an infinity (NeMo-RL's JSON writer emits them)."""
    if values is not None:
        for position, value in enumerate(values):
            if not math.isfinite(value):
                raise UserError(f"{where}: field '{key}' holds {value} at position {position}")
    return values
