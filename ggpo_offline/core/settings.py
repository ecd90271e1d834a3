"""Settings declared once: a frozen dataclass field's type, default and help give its flag and file key."""

import dataclasses
import functools
import json
import tomllib
import typing
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Literal

from ggpo_offline.core.errors import UserError

FLAG_SOURCE = "flags"
"""The ``where`` of values given as flags (a file's is ``--config PATH``)."""
_LIST_WORDS = {int: "whole numbers", float: "numbers", str: "names"}


@dataclasses.dataclass(frozen=True)
class Range:
    """The valid values of a number setting (of each item of a tuple setting): from ``low`` to ``high``
    (None: unbounded), an end left out where it is open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        low, high = self.low, self.high
        above = low is None or (value > low if self.low_open else value >= low)
        return above and (high is None or (value < high if self.high_open else value <= high))

    def outside(self, whole: bool) -> list[float]:
        """The values just outside it: an open end itself, else one step past it (1 for a whole number,
        1e-9 otherwise)."""
        step = 1 if whole else 1e-9
        values = []
        if self.low is not None:
            values.append(self.low if self.low_open else self.low - step)
        if self.high is not None:
            values.append(self.high if self.high_open else self.high + step)
        return values

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {opening}{self.low:g}, {self.high:g}{closing}"


def at_least(low: float) -> Range:
    return Range(low)


def above(low: float) -> Range:
    return Range(low, low_open=True)


FRACTION = Range(0, 1, low_open=True)
"""A share: in (0, 1]."""


def setting(
    default=MISSING,
    help: str = "",
    flag: str | None = None,
    short: str | None = None,
    none_word: str | None = None,
    repeat: bool = False,
    valid: Range | None = None,
    default_factory=MISSING,
):
    """A settings-dataclass field with its help text, the one description its flag, config-file key and
    reproduce command share. ``flag``: the flag's name when it is not the field's (``eval-dataset`` for
    ``eval_datasets``); ``short``: a one-letter alias (``m``); ``none_word``: how None is spelled in flags
    and files (``never``, ``full``); ``repeat``: a tuple setting's flag is given once per item (``--dataset
    a --dataset b``) instead of once with comma-separated items; ``valid``: a number setting's range
    (`check_settings`; every number setting declares one). A field without a default is a required flag."""
    metadata = {
        "help": help, "flag": flag, "short": short, "none_word": none_word, "repeat": repeat, "valid": valid,
    }  # fmt: skip
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _is_settings(hint) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def leaves(cls: type) -> dict[str, tuple[type, Field]]:
    """Every setting of ``cls`` by name, with the dataclass that declares it: a field whose type is itself a
    settings dataclass (`GenerateConfig.sampling`) contributes its own fields, not one of its own."""
    found = {}
    for field in dataclasses.fields(cls):
        hint = _hints(cls)[field.name]
        found.update(leaves(hint) if _is_settings(hint) else {field.name: (cls, field)})
    return found


def field_of(cls: type, name: str) -> Field:
    """The dataclass field of a setting (nested settings included)."""
    return leaves(cls)[name][1]


def type_of(cls: type, name: str):
    """The declared type of a setting (``int | None``, ``tuple[str, ...]``, ``Literal[...]``)."""
    owner, field = leaves(cls)[name]
    return _hints(owner)[field.name]


def _required(cls: type, name: str) -> bool:
    field = field_of(cls, name)
    return field.default is MISSING and field.default_factory is MISSING


def flag_name(cls: type, name: str) -> str:
    """The flag of a setting, without dashes: the one its metadata gives, else its name with dashes."""
    return field_of(cls, name).metadata.get("flag") or name.replace("_", "-")


def none_word(cls: type, name: str) -> str | None:
    """How the setting spells None in flags and files (``never``), or None when None is not a value."""
    return field_of(cls, name).metadata.get("none_word")


def alternatives(hint) -> list:
    """The types a value of ``hint`` may have, None left out (``int | None`` → ``[int]``)."""
    if typing.get_origin(hint) in (tuple, Literal):
        return [hint]
    return [kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None)]


def choices(cls: type, name: str) -> tuple:
    """The values of the setting's ``Literal`` type(s); empty when it has none."""
    found = []
    for kind in alternatives(type_of(cls, name)):
        found += typing.get_args(kind) if typing.get_origin(kind) is Literal else []
    return tuple(found)


def repeated(cls: type, name: str) -> bool:
    """Whether the tuple setting's flag is given once per item rather than once, comma-separated."""
    return bool(field_of(cls, name).metadata.get("repeat"))


def element_type(cls: type, name: str) -> type | None:
    """The element type of a tuple setting (``tuple[int, ...]`` → int), or None for any other setting."""
    hint = type_of(cls, name)
    return typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None


def valid_range(cls: type, name: str) -> Range | None:
    """The declared range of a number setting (None for any other)."""
    return field_of(cls, name).metadata.get("valid")


def number_kind(cls: type, name: str) -> type | None:
    """int or float for a number setting (of its items, for a tuple of numbers); None for any other."""
    kinds = [element_type(cls, name)] if element_type(cls, name) else alternatives(type_of(cls, name))
    numbers = [kind for kind in kinds if kind in (int, float)]
    return numbers[0] if numbers else None


def value_problem(cls: type, name: str, value) -> str | None:
    """What is wrong with ``value`` for setting ``name``, as the one line the CLI prints: a choice that is
    not one, a number of the wrong kind or outside the declared range; None when nothing is."""
    flag, allowed = flag_name(cls, name), choices(cls, name)
    if value is None or (isinstance(value, str) and value in allowed):
        return None
    if allowed and isinstance(value, str):
        return f"unknown --{flag} {value!r}; choose one of {', '.join(str(choice) for choice in allowed)}"
    kind, valid = number_kind(cls, name), valid_range(cls, name)
    if kind is None:
        return None
    many = element_type(cls, name) is not None
    items, what = (value, " values") if many else ((value,), "")
    for item in items:
        wrong_kind = isinstance(item, bool) or not isinstance(item, int if kind is int else (int, float))
        if wrong_kind:
            noun = _LIST_WORDS[kind] if many else {int: "a whole number", float: "a number"}[kind]
            return f"--{flag}{what} must be {noun}, got {item!r}"
        if valid is not None and not valid.admits(item):
            word = none_word(cls, name)
            return f"--{flag}{what} must be {valid}{f' or {word!r}' if word else ''}, got {item}"
    return None


def check_settings(config, skip: tuple[str, ...] = ()) -> None:
    """Refuse, with one line, the first setting of ``config`` (in declaration order) whose value is not
    one of its choices, not of its number kind or outside its declared range (`value_problem`); ``skip``:
    settings left unchecked (a learner's that the method does not read). Each settings dataclass calls
    this from ``__post_init__``, before its own relations between settings."""
    cls = type(config)
    for name, (owner, _) in leaves(cls).items():
        if owner is not cls or name in skip:
            continue  # a nested settings dataclass checks its own
        problem = value_problem(cls, name, getattr(config, name))
        if problem is not None:
            raise UserError(problem)


def check_relations(checks: list[tuple[bool, str]]) -> None:
    """Refuse with the message of the first relation between settings that does not hold."""
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def normalize(cls: type, values: dict, where: str) -> dict:
    """Values by setting name, each of its field's type: keys may be field or flag names (``ref-refresh``,
    ``eval-dataset``), values what a file format or a flag parsed (``ref_refresh: never``, ``"1,4"``).
    Refuses unknown keys and mistyped values with one line."""
    by_flag = {flag_name(cls, name).replace("-", "_"): name for name in leaves(cls)}
    normalized = {}
    for key, value in values.items():
        name = by_flag.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in leaves(cls):
            raise UserError(f"{where}: unknown setting {key!r}")
        normalized[name] = coerce(cls, name, value, where)
    return normalized


def coerce(cls: type, name: str, value, where: str):
    """One value of setting ``name`` converted to its field's type, or a UserError naming ``where``."""
    word = none_word(cls, name)
    if value is None or (word is not None and value in (word, "none")):
        return None
    if element_type(cls, name) is not None:
        return _coerce_tuple(cls, name, value, where)
    kinds = alternatives(type_of(cls, name))
    if isinstance(value, str) and value in choices(cls, name):
        return value
    if word is not None and isinstance(value, str):  # a flag's text: a count or the word
        if not value.strip().isdigit():
            raise UserError(f"{where}: {name} must be a number or '{word}', got {value!r}")
        return int(value)
    if Path in kinds and isinstance(value, (str, Path)):
        return Path(value)
    numbers = [k for k in kinds if k in (int, float, bool)]
    if not numbers:
        return value  # text; a Literal's choice is checked when the dataclass is built
    if isinstance(value, bool) == (bool in numbers) and isinstance(value, tuple(numbers)):
        return value
    if float in numbers and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise UserError(f"{where}: {name} must be {numbers[0].__name__}, got {value!r}")


def _coerce_tuple(cls: type, name: str, value, where: str) -> tuple:
    """A list, or one comma-separated string, of the field's element type."""
    kind = element_type(cls, name)
    items = [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise UserError(f"{where}: {name} must be a non-empty list, got {value!r}")
    try:
        return tuple(kind(item) for item in items)
    except (TypeError, ValueError):
        if where == FLAG_SOURCE and isinstance(value, str):
            words = _LIST_WORDS.get(kind, kind.__name__)
            raise UserError(
                f"--{flag_name(cls, name)} must be comma-separated {words}, got {value!r}"
            ) from None
        raise UserError(f"{where}: {name} must be a list of {kind.__name__}, got {value!r}") from None


def config_from(cls: type, values: dict, where: str = FLAG_SOURCE):
    """A ``cls`` from settings by name (flags or a file's keys); settings not given keep their defaults."""
    return construct(cls, normalize(cls, values, where))


def construct(cls: type, values: dict):
    """A ``cls`` from settings by name, each already of its field's type (nested settings built from their
    own); settings not given keep their defaults."""
    unknown = [name for name in values if name not in leaves(cls)]
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting {unknown[0]!r}")
    kwargs = {}
    for field in dataclasses.fields(cls):
        hint = _hints(cls)[field.name]
        if _is_settings(hint):
            inner = {name: value for name, value in values.items() if name in leaves(hint)}
            if inner:
                kwargs[field.name] = construct(hint, inner)
        elif field.name in values:
            kwargs[field.name] = values[field.name]
    return cls(**kwargs)


def load_config_file(cls: type, path: Path) -> dict:
    """Settings of ``cls`` from a TOML, YAML or JSON file (keys as field or flag names), normalized."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    parsers = {".toml": tomllib.loads, ".yaml": yaml.safe_load, ".yml": yaml.safe_load, ".json": json.loads}
    if path.suffix not in parsers:
        raise UserError(f"--config {path}: use a .toml, .yaml or .json file")
    try:
        values = parsers[path.suffix](path.read_text())
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise UserError(f"--config {path}: cannot parse ({_parse_problem(exc)})") from None
    if values is None and path.suffix != ".json":
        values = {}  # an empty TOML or YAML file gives no settings
    if not isinstance(values, dict):
        raise UserError(f"--config {path}: expected a mapping of settings")
    return normalize(cls, values, f"--config {path}")


def _parse_problem(exc: Exception) -> str:
    """What a parser found wrong, in one line (a YAML error's first line says only what it was parsing)."""
    mark = getattr(exc, "problem_mark", None)
    if getattr(exc, "problem", None) and mark is not None:
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(exc).splitlines()[0]


def leaf_values(config) -> dict:
    """Every setting of a settings dataclass instance by name (nested settings flattened)."""
    values = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        values.update(leaf_values(value) if _is_settings(type(value)) else {field.name: value})
    return values


def replace_settings(config, **changes):
    """``dataclasses.replace`` by setting name: ``config`` with ``changes`` (nested settings included), built
    and so checked again."""
    return construct(type(config), {**leaf_values(config), **changes})


def to_flags(values, cls: type, only: tuple[str, ...] | None = None) -> list[str]:
    """The argv words that give these settings: ``values`` is a dict of settings by name (each written as
    given) or a ``cls`` instance. Of an instance, ``only`` names the settings to write (defaults included);
    without it, the settings that differ from the defaults are written, each compared with a ``cls`` built
    from the ones before it (a default that follows another setting, such as ``ref_refresh`` from
    ``method``, is not written)."""
    if isinstance(values, dict):
        chosen = {name: value for name, value in values.items() if only is None or name in only}
    elif only is not None:
        chosen = {name: value for name, value in leaf_values(values).items() if name in only}
    else:
        chosen = _changed(values, cls)
    words = []
    for name, value in chosen.items():
        words += _words(cls, name, value)
    return words


def _changed(config, cls: type) -> dict:
    values = leaf_values(config)
    changed = {name: values[name] for name in values if _required(cls, name)}
    for name, value in values.items():
        if name not in changed and value != _default_after(cls, changed, name):
            changed[name] = value
    return changed


def _default_after(cls: type, chosen: dict, name: str):
    """The value setting ``name`` takes in a ``cls`` built from ``chosen``; its declared default where
    ``chosen`` alone is refused (a later setting makes it valid: ``--allow-test-eval`` after
    ``--eval-dataset arith:test``)."""
    try:
        return leaf_values(construct(cls, chosen))[name]
    except UserError:
        field = field_of(cls, name)
        return field.default if field.default_factory is MISSING else field.default_factory()


def _words(cls: type, name: str, value) -> list[str]:
    flag = "--" + flag_name(cls, name)
    if value is None:
        word = none_word(cls, name)
        return [flag, word] if word is not None else []
    if isinstance(value, bool):
        if value:
            return [flag]
        return ["--no-" + flag_name(cls, name)] if field_of(cls, name).default is True else []
    if isinstance(value, (tuple, list)):
        if repeated(cls, name):
            return [word for item in value for word in (flag, str(item))]
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]
