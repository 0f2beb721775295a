"""Every numeric setting's legal values, declared once: the command line (argparse `type=`), the
space files and the Python API (the configuration dataclasses' `__post_init__`) read them here.

A `Bound` gives a setting its type, its range and, for numbers, finiteness: nan and inf are never
legal. Upper bounds come from what the code can do (a seed in the samplers' range, a draft length
whose verify can be priced) and say why; they keep a typo like `--gamma-max 1000000000` from
running for hours. Every refusal is one `ConfigError` naming the value and a legal fix.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skipsearch.errors import ConfigError

GAMMA_CAP = 32
"""The longest draft scored or run without a LatencyProfile to say more: a verify of γ + 1
positions must be priced, and `skipsearch profile` measures verifies of up to 32 positions; past
32, E(γ) has stopped growing for any acceptance below 0.97 (α^33 < 0.37)."""
DEFAULT_GAMMA_MAX = 8  # a space file's `gamma_max` when it gives none (all shipped ones say 8)
SEED_LIMIT = 2**32  # numpy's and Optuna's samplers take seeds in [0, 2**32)
TOKENS_CAP = 2**20  # no model's context is longer than a million tokens
COUNT_CAP = 100_000  # evaluations, prompts, repeats: each costs model time; more runs for days


@dataclass(frozen=True)
class Bound:
    """One setting's legal values: `kind` (int or float), `low`..`high` (None: unbounded), with
    `low_open`/`high_open` for a strict inequality, and a legal `example` for the fix."""

    name: str  # the field or argparse dest it guards
    option: str  # how the user types it
    kind: type
    low: float | None = None
    high: float | None = None
    example: float = 1
    why: str = ""  # why the upper bound is where it is
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        """`an integer in 1..32`, `a number in (0, 1]`, `a number >= 0`."""
        what = "an integer" if self.kind is int else "a finite number"
        low, high = _show(self.low), _show(self.high)
        if self.low is not None and self.high is not None:
            if self.kind is int:
                return f"{what} in {low}..{high}"
            return f"{what} in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {low}"
        if self.high is not None:
            return f"{what} {'<' if self.high_open else '<='} {high}"
        return what

    def fix(self, value: float | None = None) -> str:
        """`pass --budget 1 or more`: the legal value nearest `value`, or the example where the
        nearest is not representable (an open bound, nan, a wrong type)."""
        if value is not None and not math.isnan(value):
            if self.low is not None and value <= self.low and not self.low_open:
                return f"pass {self.option} {_show(self.low)} or more"
            if self.high is not None and value >= self.high and not self.high_open:
                return f"pass {self.option} {_show(self.high)} or less"
        return f"pass {self.describe()}, e.g. {self.option} {_show(self.example)}"

    def check(self, value: Any) -> Any:
        """`value` when it is legal; else a one-line `ConfigError` naming it and the fix."""
        number = _number(value, self.kind)
        if number is None:
            kind = "an integer" if self.kind is int else "a number"
            raise ConfigError(f"{self.option} {value!r} is not {kind}: {self.fix()}")
        if not math.isfinite(number):
            raise ConfigError(f"{self.option} {value} is not a finite number: {self.fix()}")
        if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
            side = "must be above" if self.low_open else "is below"
            raise ConfigError(f"{self.option} {value} {side} {_show(self.low)}: {self.fix(number)}")
        if self.high is not None and (number > self.high or (self.high_open and number == self.high)):
            side = "must be below" if self.high_open else "is above"
            why = f" ({self.why})" if self.why else ""
            raise ConfigError(f"{self.option} {value} {side} {_show(self.high)}{why}: {self.fix(number)}")
        return value

    def parse(self, text: str) -> Any:
        """The command-line text read as this setting, checked."""
        try:
            value = int(text) if self.kind is int else float(text)
        except ValueError:
            kind = "an integer" if self.kind is int else "a number"
            raise ConfigError(f"{self.option} {text!r} is not {kind}: {self.fix()}") from None
        return self.check(value)

    def checker(self) -> Callable[[str], Any]:
        """The argparse `type=` of this setting: the same checks, as argparse reports them."""

        def parse(text: str) -> Any:
            try:
                return self.parse(text)
            except ConfigError as error:
                raise argparse.ArgumentTypeError(str(error)) from None

        parse.__name__ = "integer" if self.kind is int else "number"
        return parse


def _number(value: Any, kind: type) -> float | None:
    """`value` as a number of `kind`, or None for the wrong type (bools are not numbers; an int
    is a float, a float is not an int)."""
    if isinstance(value, bool):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    return float(value) if isinstance(value, int | float) else None


def _show(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _int(name: str, option: str, low: int, high: int, example: int, why: str) -> Bound:
    return Bound(name, option, int, low, high, example, why)


def _seed(name: str, option: str) -> Bound:
    return _int(name, option, 0, SEED_LIMIT - 1, 0, "numpy's and Optuna's samplers take seeds below 2**32")


_TOKENS = "no model's context is longer"
_COUNT = "each one costs model time"
_GAMMA = "past it a draft's expected tokens per round stop growing"

DECLARED = (
    # what a run searches (RunConfig)
    _int("budget", "--budget", 1, COUNT_CAP, 60, "each mask is one model evaluation"),
    _seed("seed", "--seed"),
    _int("gamma_max", "--gamma-max", 1, GAMMA_CAP, 8, _GAMMA),
    _int("gamma_min", "--gamma-min", 1, GAMMA_CAP, 1, _GAMMA),
    Bound("temperature", "--temperature", float, 0, 100, 1.0, "at 100 sampling is already uniform"),
    _int("context", "--context", 1, TOKENS_CAP, 512, _TOKENS),
    _int("seeds", "--seeds", 1, 1000, 3, "one study per strategy and seed"),
    _int("random_multiple", "--random-multiple", 0, 1000, 0, "random search at that multiple of the budget"),
    # what a measurement reads (MeasureConfig, PromptSpec)
    _int("n_prompts", "--n-prompts", 1, COUNT_CAP, 16, _COUNT),
    _int("max_prompt_tokens", "--max-prompt-tokens", 1, TOKENS_CAP, 256, _TOKENS),
    _int("new_tokens", "--new-tokens", 1, TOKENS_CAP, 64, _TOKENS),
    _seed("prompt_seed", "--prompt-seed"),
    _int("round_gamma", "--round-gamma", 1, GAMMA_CAP, 3, _GAMMA),
    Bound("round_stop", "--draft-stop", float, 0, 1, 0.0, high_open=True),
    _int("draft_vocab", "--draft-vocab", 1, 2**24, 16384, "no tokenizer has more ids"),
    _int("kv_sink", "--kv-sink", 0, TOKENS_CAP, 4, _TOKENS),
    _int("kv_window", "--kv-window", 1, TOKENS_CAP, 1024, _TOKENS),
    _int("kv_pillars", "--kv-pillars", 0, TOKENS_CAP, 64, _TOKENS),
    _int("num_layers", "--num-layers", 1, 1024, 4, "no shipped architecture is deeper"),
    # where masks are measured
    _int("workers", "--workers", 1, 4096, 2, "one actor per CPU or GPU share"),
    _int("cpus_per_worker", "--cpus-per-worker", 1, 4096, 1, "no machine has more"),
    Bound("gpus_per_worker", "--gpus-per-worker", float, 0, 64, 1.0, "no machine has more", low_open=True),
    # decode
    _int("gamma", "--gamma", 1, GAMMA_CAP, 3, _GAMMA),
    _int("tree_nodes", "--tree-nodes", 1, 31, 8, "a verify holds 31 nodes (tree_shapes.MAX_NODES)"),
    Bound("top_p", "--top-p", float, 0, 1, 1.0, low_open=True),
    _int("top_k", "--top-k", 1, 2**24, 50, "no tokenizer has more ids"),
    _int("repeats", "--repeats", 1, 1000, 3, _COUNT),
    _seed("decode_seed", "--seed"),
    # profile
    _int("profile_repeats", "--repeats", 1, COUNT_CAP, 40, _COUNT),
    _int("processes", "--processes", 1, 1000, 10, "one fresh process each"),
    _int("warmup", "--warmup", 0, 1000, 2, _COUNT),
    _int("context_length", "--context-lengths", 1, TOKENS_CAP, 512, _TOKENS),
    # speedup: the closed forms' inputs
    Bound("alpha", "--alpha", float, 0, 1, 0.8),
    Bound("alphas", "--alphas", float, 0, 1, 0.8),
    Bound("table_alphas", "--table-alphas", float, 0, 1, 0.8),
    _int("table_gammas", "--table-gammas", 1, GAMMA_CAP, 4, _GAMMA),
    Bound("c", "--c", float, 0, 100, 0.3, "a draft 100 times the target's cost never pays", low_open=True),
    Bound("r_draft", "--r-draft", float, 0, 1, 0.5, low_open=True),
    Bound("r_reuse", "--r-reuse", float, 0, 1, 0.5),
    Bound("epsilon", "--epsilon", float, 0, 100, 0.0, "a verify 100 times a step per draft token never pays"),
    Bound("head_share", "--head-share", float, 0, 1, 0.17, high_open=True),
    Bound("draft_vocab_share", "--draft-vocab-share", float, 0, 1, 0.5, low_open=True),
    Bound("kv_share", "--kv-share", float, 0, 1, 0.5),
    Bound("memory", "--memory", float, 0, 1e12, 80, "a memory in any unit below 1e12", low_open=True),
    Bound("weights", "--weights", float, 0, 1e12, 14, "a memory in any unit below 1e12", low_open=True),
    Bound(
        "draft_weights",
        "--draft-weights",
        float,
        0,
        1e12,
        1,
        "a memory in any unit below 1e12",
        low_open=True,
    ),
    Bound(
        "kv_per_sequence",
        "--kv-per-sequence",
        float,
        0,
        1e12,
        0.5,
        "a memory in any unit below 1e12",
        low_open=True,
    ),
)
BOUNDS: dict[str, Bound] = {bound.name: bound for bound in DECLARED}


def check(name: str, value: Any) -> Any:
    """`value` when it is a legal `name` (a key of `BOUNDS`); else one `ConfigError`. None is
    passed through: an unset optional setting."""
    return value if value is None else BOUNDS[name].check(value)


def option_type(name: str) -> Callable[[str], Any]:
    """The argparse `type=` of setting `name`."""
    return BOUNDS[name].checker()


def number_list(name: str, text: str) -> list:
    """Comma-separated values of setting `name` (`--context-lengths 128,512`), each checked."""
    bound = BOUNDS[name]
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ConfigError(
            f"{bound.option} {text!r} is empty: give comma-separated values, each {bound.describe()}, "
            f"e.g. {bound.option} {_show(bound.example)}"
        )
    return [bound.parse(part) for part in parts]


def list_type(name: str) -> Callable[[str], list]:
    """The argparse `type=` of a comma-separated list of setting `name`: checked when parsed, so a
    list an option only reads in some modes is never a silent accept in the others."""

    def parse(text: str) -> list:
        try:
            return number_list(name, text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = "list"
    return parse


# -- the dtype: a setting with a legal set, not a range ---------------------------------------------
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_dtype(dtype: Any) -> str:
    """`--dtype`: auto or a floating-point torch dtype the models run in (`torch.` prefix allowed)."""
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPES:
        raise ConfigError(
            f"--dtype {dtype!r} is not a dtype a model runs in: pass one of {', '.join(DTYPES)}"
        )
    return dtype


def dtype_type(text: str) -> str:
    try:
        return check_dtype(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
