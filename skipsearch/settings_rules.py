"""Settings judged as a whole, before any work: what a command line or an API call cannot mean.

`options` checks each setting alone (its type and range); this module checks them together, as
one table (`RULES`): an option that does not apply to the strategy, sampler, objective or
temperature chosen with it (it would be silently ignored, yet stored in `run.yaml`), a list that
names one value twice, an empty or blank string where a name, shape, path or key is expected. The
command line (`cli.common.judge_command`) and the Python API (`api`) call the same `judge`; each
refusal is one `ConfigError` naming both settings as the caller typed them: `--warm-start` on the
command line, `warm_start=` in Python (`Names`).

`check_arguments` is the API's type check: each keyword against the function's annotation, so a
`None`, a number where a string is expected or a string where a list is expected is one
`SettingTypeError` naming the keyword, before anything loads.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skipsearch.errors import ConfigError, SettingTypeError
from skipsearch.options import BOUNDS, check_dtype

LEARNED = ("learned",)  # the strategies an Optuna sampler of `--sampler` drives
INFORMED = ("ranking", "knapsack", "knapsack+tpe")  # the strategies `--importance` ranks units for
# The list settings whose values name things (a repeat is a mistake); `--alphas` is not one: its
# values are acceptances by draft depth, and two depths may well have the same.
LISTS = ("strategies", "tree", "trees", "context_lengths", "table_alphas", "table_gammas")


@dataclass(frozen=True)
class Names:
    """How settings are shown: `--warm-start random` on the command line (`CLI`), `warm_start='random'`
    in Python (`API`); `spelled` gives the few whose option is not the dest's (`from_path`: `--from`)."""

    api: bool = False
    spelled: Mapping[str, str] | None = None

    def name(self, setting: str) -> str:
        if self.spelled and setting in self.spelled:
            return self.spelled[setting]
        return setting if self.api else "--" + setting.replace("_", "-")

    def show(self, setting: str, value: Any) -> str:
        if self.api:
            return f"{self.name(setting)}={value!r}"
        if isinstance(value, bool):
            return self.name(setting)
        if isinstance(value, list | tuple):
            value = ",".join(map(str, value))
        return f"{self.name(setting)} {value}"


CLI, API = Names(), Names(api=True)


@dataclass(frozen=True)
class Applies:
    """`option` means something only where `other` (the first of `others` the command has) holds
    `where` (`holds` of its value); given elsewhere it would be ignored."""

    option: str
    others: tuple[str, ...]
    holds: Callable[[Any], bool]
    where: str

    def judge(self, settings: Mapping[str, Any], given: Collection[str], names: Names) -> None:
        other = next((o for o in self.others if o in settings), None)
        if self.option not in given or other is None or self.holds(settings[other]):
            return
        value = settings[other]
        beside = (
            f"without {names.name(other)}"
            if value is None or value is False
            else f"with {names.show(other, value)}"
        )
        raise ConfigError(
            f"{names.show(self.option, settings[self.option])} does not apply {beside}: it applies only "
            f"where {names.name(other)} is "
            f"{self.where}; drop {names.name(self.option)}, or change {names.name(other)}"
        )


@dataclass(frozen=True)
class Distinct:
    """A list `option` names each value once: twice would run (or store) one thing two times."""

    option: str
    split: Callable[[str], list] | None = None  # how a string value lists its values

    def judge(self, settings: Mapping[str, Any], given: Collection[str], names: Names) -> None:
        values = settings.get(self.option)
        if isinstance(values, str) and self.split is not None:
            values = self.split(values)
        if not isinstance(values, list | tuple):
            return
        seen: set[str] = set()
        for value in values:
            key = str(value).strip()
            if key in seen:
                shown = names.show(self.option, settings[self.option])
                raise ConfigError(f"{shown} names {key} twice: give each value once")
            seen.add(key)


@dataclass(frozen=True)
class NotBlank:
    """Every string setting names something (a model, shape, path, key): empty or whitespace-only is
    refused, but for `may_be_empty` (`--skip ''` is the empty mask, as its help says). A draft string
    of separators alone (`|||`) is blank too."""

    may_be_empty: tuple[str, ...]

    def judge(self, settings: Mapping[str, Any], given: Collection[str], names: Names) -> None:
        for setting, value in settings.items():
            if setting in self.may_be_empty:
                continue
            for text in value if isinstance(value, list | tuple) else (value,):
                if isinstance(text, str) and not text.replace("|", "").strip():
                    raise ConfigError(
                        f"{names.name(setting)} {text!r} is empty: give a name, shape, path or key, "
                        f"or leave {names.name(setting)} out for its default"
                    )


@dataclass(frozen=True)
class NotADirectory:
    """`option` names a file to read (a space file, a profile, a best.json): a directory there is
    refused as one, not reported as a name that does not exist."""

    option: str
    what: str

    def judge(self, settings: Mapping[str, Any], given: Collection[str], names: Names) -> None:
        value = settings.get(self.option)
        if isinstance(value, str | Path) and str(value).strip() and Path(value).is_dir():
            raise ConfigError(f"{names.show(self.option, value)} is a directory: pass {self.what}")


def _has(*allowed: str) -> Callable[[Any], bool]:
    def holds(value: Any) -> bool:
        chosen = value if isinstance(value, list | tuple) else (value,)
        return any(v in allowed for v in chosen)

    return holds


def _layers(text: str) -> list[int]:
    """The layers of a layer list (`4,14,20-23`), ranges expanded: `4-6,5` names 5 twice."""
    from skipsearch.masks import parse_layer_list

    return parse_layer_list(text, distinct=False)


def _sampling(temperature: Any) -> bool:
    return isinstance(temperature, int | float) and temperature > 0


RULES: tuple[Applies | Distinct | NotBlank | NotADirectory, ...] = (
    Applies("warm_start", ("strategies", "strategy"), _has(*LEARNED), "learned"),
    Applies("sampler", ("strategies", "strategy"), _has(*LEARNED), "learned"),
    Applies("importance", ("strategies", "strategy"), _has(*INFORMED), "ranking, knapsack or knapsack+tpe"),
    Applies("pareto", ("objective",), lambda objective: objective == "speedup", "speedup"),
    Applies("extrapolate_context", ("context",), lambda context: context is not None, "set"),
    Applies("round_gamma", ("mode",), lambda mode: mode == "rounds", "rounds"),
    Applies("top_k", ("temperature",), _sampling, "above 0 (sampling)"),
    Applies("top_p", ("temperature",), _sampling, "above 0 (sampling)"),
    Applies("require_graphs", ("tier_set",), bool, "a tier set's tiers.json"),
    Applies("table_gammas", ("table",), bool, "given"),
    Applies("table_alphas", ("table",), bool, "given"),
    *(Distinct(option) for option in LISTS),
    *(Distinct(option, _layers) for option in ("skip", "attn_skip", "mlp_skip")),
    NotADirectory("space", "a space name (search_spaces/) or a space YAML file"),
    NotADirectory("latency_profile", "a profile JSON file (`skipsearch profile --out`)"),
    NotADirectory("from_path", "a best.json or a tiers.json"),
    NotBlank(may_be_empty=("skip", "attn_skip", "mlp_skip")),
)


def judge(settings: Mapping[str, Any], given: Collection[str], names: Names = CLI) -> None:
    """Refuse, in one line, the first combination of `settings` (name -> value) that `RULES` says
    cannot mean what was typed; `given` are the settings the caller set (a default never refuses
    an option that does not apply)."""
    for rule in RULES:
        rule.judge(settings, given, names)


# -- the Python API's argument types -----------------------------------------------------------------
def check_call(function: Callable[..., Any], arguments: Mapping[str, Any]) -> None:
    """The arguments of a public `function` judged before any work, each named by its keyword: its
    type against the annotation, its range (`options.BOUNDS` under the same name), then the
    settings as a whole (`judge`: an empty name, a duplicate tree, a sampler with a strategy that
    has none). A keyword left at None was not given."""
    import inspect

    arguments = {name: arguments[name] for name in inspect.signature(function).parameters}
    check_arguments(typing.get_type_hints(function), arguments)
    given = {name for name, value in arguments.items() if value is not None}
    judge({name: value for name, value in arguments.items() if name in given}, given, API)
    if arguments.get("dtype") is not None:
        try:
            check_dtype(arguments["dtype"])
        except ConfigError as error:
            raise ConfigError(str(error).replace("--dtype", "dtype", 1)) from None


def check_arguments(hints: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Each keyword of `values` against its annotation in `hints` (`typing.get_type_hints` of the
    function), then its range where `options.BOUNDS` declares one under the same name: one
    `SettingTypeError` or `ConfigError` naming the keyword."""
    for keyword, value in values.items():
        hint = hints.get(keyword)
        if hint is not None and not _fits(value, hint):
            raise SettingTypeError(
                f"{keyword}={_short(value)} is {_kind(value)}, not {_describe(hint)}: pass {_describe(hint)}"
            )
        if keyword in BOUNDS and value is not None and not isinstance(value, str):  # a str: `full`, `8192`
            replace(BOUNDS[keyword], option=keyword).check(value)


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    if origin in (Sequence, list, tuple, Iterable):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return isinstance(value, list | tuple) and all(_fits(v, item) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a form this check does not read: the function's own checks judge it


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    if hint is None or hint is type(None):
        return "None"
    if origin in (Sequence, list, tuple, Iterable):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return f"a list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    words = {str: "a string", int: "an integer", float: "a number", bool: "True or False", Path: "a Path"}
    return words.get(hint, f"a {getattr(hint, '__name__', hint)}")


def _kind(value: Any) -> str:
    name = type(value).__name__
    return "None" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
