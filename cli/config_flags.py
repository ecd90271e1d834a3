"""A command's flags, derived from its settings dataclass: each field's name, type, default and help text."""

import functools
import inspect
import typing
from dataclasses import MISSING
from typing import Literal

import typer

from ggpo_offline.core.settings import (
    alternatives,
    element_type,
    field_of,
    flag_name,
    leaves,
    none_word,
    repeated,
    type_of,
)


def _cli_type(cls: type, name: str) -> type:
    """What the flag parses: the field's own scalar type; a list (a repeatable flag) for a repeated tuple;
    text for a comma-separated tuple ("1,4,8"), a choice (`Literal`) and a count whose None is a word
    (``never``), which `core.settings` converts and checks with the same rules as a config file's values."""
    if none_word(cls, name) is not None:
        return str
    if element_type(cls, name) is not None:
        return list[str] if repeated(cls, name) else str
    kind = alternatives(type_of(cls, name))[0]
    return str if typing.get_origin(kind) is Literal else kind


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _default_text(cls: type, name: str, presets: dict[str, dict]) -> str:
    """`` [default: X; tiny: Y]`` from the dataclass and the presets (the default part only when the help does
    not say it already)."""
    field = field_of(cls, name)
    shown = [f"{preset}: {_shown(values[name])}" for preset, values in presets.items() if name in values]
    said = (
        "[default:" in field.metadata["help"]
        or field.default in (MISSING, None)
        or type_of(cls, name) is bool
    )
    if not said:
        shown.insert(0, "default: " + _shown(field.default))
    return f" [{'; '.join(shown)}]" if shown else ""


def _option(cls: type, name: str, presets: dict[str, dict]):
    """The typer option of one setting: None when not given (the dataclass, a preset or a config file
    decides), required when the field has no default; a switch whose default is on also gets --no-X."""
    field, flag = field_of(cls, name), flag_name(cls, name)
    names = [f"--{flag}/--no-{flag}" if field.default is True else f"--{flag}"]
    if field.metadata.get("short"):
        names.append("-" + field.metadata["short"])
    required = field.default is MISSING and field.default_factory is MISSING
    metavar = "<str>" if _cli_type(cls, name) == list[str] else None
    help_text = field.metadata["help"] + _default_text(cls, name, presets)
    return typer.Option(... if required else None, *names, help=help_text, metavar=metavar)


def config_parameters(
    cls: type, exclude: tuple[str, ...] = (), presets: dict[str, dict] | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per setting of ``cls`` (but ``exclude``), each a typer option."""
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=_option(cls, name, presets or {}),
            annotation=_cli_type(cls, name),
        )
        for name in leaves(cls)
        if name not in exclude
    ]


def with_config_flags(
    cls: type, exclude: tuple[str, ...] = (), into: str = "settings", presets: dict[str, dict] | None = None
):
    """Decorate ``command(..., settings: dict)``: typer sees the command's other parameters followed by a flag
    per setting of ``cls`` (but ``exclude``), and the command receives the given ones, by field name, in its
    ``into`` parameter (build the config with `core.settings.config_from`). Stacks: the decorator nearest the
    command puts its flags first. ``presets`` adds each preset's value to a flag's help."""

    def decorate(command):
        own = [p for p in inspect.signature(command).parameters.values() if p.name != into]
        names = [name for name in leaves(cls) if name not in exclude]

        @functools.wraps(command)
        def wrapper(**values):
            given = {name: values.pop(name) for name in names}
            given = {
                k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v not in (None, [])
            }
            return command(**values, **{into: given})

        signature = inspect.Signature(own + config_parameters(cls, exclude, presets))
        wrapper.__signature__ = signature
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        del wrapper.__wrapped__  # typer must read the signature above, not the command's own
        return wrapper

    return decorate
