"""The measured part of the tiny model's card, written from a `measure-styles` report."""

from pathlib import Path

from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError
from ggpo_offline.organism.styles import prompt_class

BEGIN = "<!-- measured by `ggpo measure-styles --card`: begin -->"
END = "<!-- measured by `ggpo measure-styles --card`: end -->"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def measured_section(report: dict, command: str) -> str:
    """Markdown: the three numbers, each style's shares and accuracies (free and forced) overall and per
    prompt class and level, and the forced responses' lengths per class."""
    m = report["m"]
    lines = [
        f"Measured by `{command}` ({report['n_problems']} arith {report['split']} problems × {m}, "
        f"temperature 1, up to {report['max_new_tokens']} new tokens, sampling seed {report['seed']}):",
        "",
        *_ceiling_rows(report),
        "",
        "Per prompt class (share / accuracy of each style in free sampling; accuracy when forced):",
        "",
        *_class_rows(report),
        "",
        "Per level (free sampling: share / accuracy of each style):",
        "",
        *_level_rows(report),
        "",
        "Response length in tokens when the style is forced (without `<eos>`; one token per character):",
        "",
        *_length_rows(report),
    ]
    return "\n".join(lines) + "\n"


def _ceiling_rows(report: dict) -> list[str]:
    blind, aware = report["prompt_blind_ceiling"], report["prompt_aware_ceiling"]
    m = report["m"]
    aware_styles = ", ".join(f"{style} on {name}" for name, style in aware["styles"].items())
    rows = [
        (
            f"base model, mean@{m} (pass@{m} {_percent(report['pass_at_m'])})",
            f"**{_percent(report['accuracy'])}**",
        ),
        (f"prompt-blind ceiling ({blind['style']} everywhere, forced)", f"**{_percent(blind['accuracy'])}**"),
        (f"prompt-aware ceiling ({aware_styles}, forced)", f"**{_percent(aware['accuracy'])}**"),
        ("gap", f"{100 * (aware['accuracy'] - blind['accuracy']):.1f} points"),
    ]
    return markdown.table(None, rows, "lr")


def _class_rows(report: dict) -> list[str]:
    styles = list(report["forced"])
    rows = []
    parts = [(name, scores, report["forced_by_class"]) for name, scores in report["by_class"].items()]
    for name, scores, forced in parts + [
        ("all", report["styles"] | {"problems": report["n_problems"]}, None)
    ]:
        accuracy = report["accuracy"] if forced is None else scores["accuracy"]
        cells = [
            f"{_percent(scores[style]['share'])} / {_percent(scores[style]['accuracy'])} / "
            f"**{_percent(report['forced'][style] if forced is None else forced[style][name])}**"
            for style in styles
        ]
        rows.append([name, scores["problems"], _percent(accuracy), *cells])
    header = ["class", "problems", "accuracy", *(f"{name}: share / acc. / forced" for name in styles)]
    return markdown.table(header, rows, "lrr" + "r" * len(styles))


def _level_rows(report: dict) -> list[str]:
    styles = list(report["forced"])
    rows = []
    for level, scores in report["by_level"].items():
        cells = [
            f"{_percent(scores[style]['share'])} / {_percent(scores[style]['accuracy'])}" for style in styles
        ]
        part = prompt_class(int(level))
        rows.append([level, part, _percent(scores["accuracy"]), *cells])
    return markdown.table(["level", "class", "accuracy", *styles], rows, "llr" + "r" * len(styles))


def _length_rows(report: dict) -> list[str]:
    rows = [
        [style, name, f"{summary['mean']:.0f}", summary["median"], summary["p90"], summary["max"]]
        for style, per_class in report["lengths"].items()
        for name, summary in per_class.items()
    ]
    return markdown.table(["style", "class", "mean", "median", "p90", "max"], rows, "llrrrr")


def check_card(card: Path, forced: bool) -> str:
    """The card's text, or one error line when it has no measured section or the measure would not fill it."""
    if not forced:
        raise UserError("--card needs the forced measurements: drop --no-forced")
    text = card.read_text() if card.is_file() else ""
    if BEGIN not in text or END not in text:
        raise UserError(
            f"--card {card}: no measured section to replace (it needs the lines {BEGIN} and {END})"
        )
    return text


def write_card_section(card: Path, report: dict, command: str) -> None:
    """Replace the measured section of ``card`` (between its BEGIN and END markers) with this report's."""
    head, rest = check_card(card, bool(report["forced"])).split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    card.write_text(f"{head}{BEGIN}\n{measured_section(report, command)}{END}{tail}")
