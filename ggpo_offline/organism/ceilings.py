"""The two ceilings of selection: what choosing one forced style everywhere, or the best one per prompt class,
reaches."""


def selection_ceilings(forced_by_class: dict[str, dict[str, float]], problems: dict[str, float]) -> dict:
    """The **prompt-blind ceiling** (the best single style forced everywhere: what one choice of style
    reaches) and the **prompt-aware ceiling** (the best forced style of each prompt class: what selection
    conditioned on the prompt reaches), as accuracies over problems with these counts per class, from each
    style's forced accuracy per class (``measure-styles``)."""
    total = sum(problems.values())

    def everywhere(style: str) -> float:
        return sum(count * forced_by_class[style][name] for name, count in problems.items()) / total

    blind = max(forced_by_class, key=everywhere)
    best = {
        name: max(forced_by_class, key=lambda style, name=name: forced_by_class[style][name])
        for name in problems
    }
    aware = sum(count * forced_by_class[best[name]][name] for name, count in problems.items()) / total
    return {
        "prompt_blind_ceiling": {"accuracy": everywhere(blind), "style": blind},
        "prompt_aware_ceiling": {"accuracy": aware, "styles": best},
    }
