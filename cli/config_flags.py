"""The flags of every TrainConfig field, derived from the dataclass: its types, defaults and help texts."""

import functools
import inspect
import typing
from dataclasses import MISSING, fields

import typer

from ggpo_offline.train.config import PRESETS, WORDS, TrainConfig, flag_name

_HINTS = typing.get_type_hints(TrainConfig)


def _cli_type(name: str) -> type:
    """What the flag parses: the field's own scalar type; a list (a repeatable flag) for a tuple of strings;
    text for a tuple of numbers ("1,4,8") and for a count whose None is a word (`WORDS`), which the config
    converts with the same rules as a config file's values."""
    hint = _HINTS[name]
    if name in WORDS:
        return str
    if typing.get_origin(hint) is tuple:
        return list[str] if typing.get_args(hint)[0] is str else str
    kinds = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
    return kinds[0]


def _default_text(name: str) -> str:
    """`` [default: X; tiny: Y]`` from the dataclass and the presets (the default part only when the help does
    not say it already)."""
    field = TrainConfig.__dataclass_fields__[name]
    presets = [f"{preset}: {values[name]}" for preset, values in PRESETS.items() if name in values]
    said = "[default:" in field.metadata["help"] or field.default in (MISSING, None) or _HINTS[name] is bool
    if not said:
        value = field.default
        presets.insert(
            0, "default: " + (",".join(map(str, value)) if isinstance(value, tuple) else str(value))
        )
    return f" [{'; '.join(presets)}]" if presets else ""


def config_parameters(exclude: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per TrainConfig field (but ``exclude``), each a typer option defaulting to None
    (not given: the preset, config file or dataclass default applies)."""
    parameters = []
    for field in fields(TrainConfig):
        if field.name in exclude:
            continue
        flag = "--" + flag_name(field.name)
        help_text = field.metadata["help"] + _default_text(field.name)
        kind = _cli_type(field.name)
        option = typer.Option(None, flag, help=help_text, metavar="<str>" if kind == list[str] else None)
        parameters.append(
            inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
        )
    return parameters


def with_config_flags(exclude: tuple[str, ...] = ()):
    """Decorate ``command(own parameters..., **settings)``: typer sees its own parameters followed by a flag
    per TrainConfig field, and the command receives the given ones in ``settings``."""

    def decorate(command):
        own = [
            p
            for p in inspect.signature(command).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        config_names = {f.name for f in fields(TrainConfig)} - set(exclude)

        @functools.wraps(command)
        def wrapper(**values):
            given = {k: v for k, v in values.items() if k in config_names and v not in (None, [], ())}
            settings = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
            return command(**{k: v for k, v in values.items() if k not in config_names}, **settings)

        signature = inspect.Signature(own + config_parameters(exclude))
        wrapper.__signature__ = signature
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        del wrapper.__wrapped__  # typer must read the signature above, not the command's own
        return wrapper

    return decorate
