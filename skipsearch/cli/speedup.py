"""`skipsearch speedup`: closed-form speedup of speculative decoding for given acceptance and cost.

A calculator over `skipsearch.cost` (docs/theory.md, "Speedup" and "Choosing γ"): the separate-draft form
with `--c`, self-speculative with `--r-draft` (`--r-reuse` defaults to it: contiguous prefix).
`--head-share H --draft-vocab-share S` price a self-speculative draft whose head keeps the share
`S = k/V` of the LM head's rows (`skipsearch.cost.closed_forms.draft_head_saving`).
`--kv-sink S --kv-window W --context N --kv-share A` price one whose attention reads only a sink
and a window of the N cached keys, where reading the K/V cache is the share A of a step
(`skipsearch.cost.closed_forms.kv_pattern_saving`); verify then reuses nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from skipsearch.cli.common import add_kv_options, kv_pattern_from_args
from skipsearch.config import check_context
from skipsearch.cost.closed_forms import (
    Acceptance,
    Contiguous,
    CostForm,
    SelfSpeculative,
    SeparateDraft,
    draft_head_saving,
    expected_tokens,
    keys_share,
    kv_pattern_saving,
    optimal_gamma,
    speedup,
    speedup_curve,
)
from skipsearch.cost.memory import MemoryBudget, throughput_ratio
from skipsearch.errors import ConfigError
from skipsearch.options import BOUNDS, list_type, option_type

FORM_LABELS = {"sd": "SD", "ssd": "SSD general", "ssd_contiguous": "SSD contiguous"}
DEFAULT_GAMMA_MAX = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "speedup",
        help="closed-form speedup for an acceptance rate and a draft cost",
        description="Speedup of speculative decoding, E(gamma) / round cost, for each cost form given.",
    )
    acceptance = parser.add_mutually_exclusive_group()
    acceptance.add_argument(
        "--alpha", type=option_type("alpha"), help="i.i.d. per-token acceptance rate in [0, 1]"
    )
    acceptance.add_argument(
        "--alphas",
        type=list_type("alphas"),
        help="acceptance by draft depth, alpha_1,alpha_2,... (comma-separated)",
    )
    parser.add_argument("--gamma", default="best", help="draft length, or 'best' for the optimum (default)")
    parser.add_argument(
        "--gamma-max",
        type=option_type("gamma_max"),
        help="largest gamma searched (default 8, or the number of --alphas if fewer)",
    )
    parser.add_argument(
        "--c", type=option_type("c"), help="separate draft: draft cost / target cost per token"
    )
    parser.add_argument(
        "--r-draft", type=option_type("r_draft"), help="self-speculative: share of the forward the draft runs"
    )
    parser.add_argument(
        "--r-reuse",
        type=option_type("r_reuse"),
        help="self-speculative: share verify reuses (default: r-draft, contiguous)",
    )
    parser.add_argument(
        "--epsilon",
        type=option_type("epsilon"),
        default=0.0,
        help="verify overhead f(gamma) = 1 + epsilon gamma",
    )
    parser.add_argument(
        "--head-share",
        type=option_type("head_share"),
        help="self-speculative: the LM head's share of one step, in [0, 1) (e.g. 0.17 on SmolLM2)",
    )
    parser.add_argument(
        "--draft-vocab-share",
        type=option_type("draft_vocab_share"),
        help="self-speculative: share k/V of the head's rows the draft keeps, in (0, 1] (needs --head-share)",
    )
    add_kv_options(parser)
    what_if = parser.add_argument_group(
        "KV-pattern what-if (with --kv-window and --r-draft): the draft runs the share r-draft of "
        "every attention sub-layer, each reading sink + window (+ pillars) of the cached keys"
    )
    what_if.add_argument(
        "--context", type=option_type("context"), help="cached positions when the draft runs"
    )
    what_if.add_argument(
        "--kv-share",
        type=option_type("kv_share"),
        help="the K/V cache's share of one step at --context, in [0, 1] (e.g. the profile's "
        "K/V bytes over weight + K/V bytes)",
    )
    serving = parser.add_argument_group(
        "serving a batch (docs/theory.md, 'Serving memory'): SSD holds one set of weights, SD two, "
        "so SSD's largest batch is beta times SD's; give all four, in one unit (e.g. GiB), with --c "
        "and --r-draft"
    )
    serving.add_argument(
        "--memory", type=option_type("memory"), help="memory the weights and KV caches share"
    )
    serving.add_argument("--weights", type=option_type("weights"), help="the target model's weights")
    serving.add_argument(
        "--draft-weights", type=option_type("draft_weights"), help="SD's separate draft model's weights"
    )
    serving.add_argument(
        "--kv-per-sequence",
        type=option_type("kv_per_sequence"),
        help="one sequence's KV cache at its full length",
    )
    parser.add_argument("--json", action="store_true", help="print JSON to stdout")
    parser.add_argument(
        "--table", action="store_true", help="print an alpha x gamma grid (docs/theory.md, Speedup)"
    )
    parser.add_argument(
        "--table-alphas",
        type=list_type("table_alphas"),
        default="0.6,0.7,0.8,0.9",
        help="grid columns (default %(default)s)",
    )
    parser.add_argument(
        "--table-gammas",
        type=list_type("table_gammas"),
        default="1,2,3,4,6,8",
        help="grid rows (default %(default)s)",
    )
    parser.set_defaults(handler=run)


def _gamma(text: str) -> int | None:
    """`None` for 'best', else the draft length, checked as `--gamma` is everywhere."""
    if text == "best":
        return None
    try:
        return BOUNDS["gamma"].parse(text)
    except ConfigError as error:
        raise ConfigError(f"{error} (or 'best')") from None


def _head_saving(args: argparse.Namespace) -> float:
    """What the draft's smaller head saves per draft step, 0 without the head options."""
    if args.head_share is None and args.draft_vocab_share is None:
        return 0.0
    if args.head_share is None or args.draft_vocab_share is None:
        raise ConfigError("--head-share and --draft-vocab-share go together: give both, e.g. 0.17 and 0.17")
    if args.r_draft is None:
        raise ConfigError("--head-share prices a self-speculative draft: give --r-draft too")
    return draft_head_saving(args.r_draft, args.head_share, args.draft_vocab_share)


def _kv_saving(args: argparse.Namespace) -> float | None:
    """What the draft's KV pattern saves per draft step; None without `--kv-window`."""
    kv = kv_pattern_from_args(args)
    if kv is None:
        if args.context is not None or args.kv_share is not None:
            raise ConfigError("--context and --kv-share price a KV pattern: give --kv-window too")
        return None
    if args.r_draft is None or args.context is None or args.kv_share is None:
        raise ConfigError(
            "a KV-pattern what-if needs --r-draft, --context and --kv-share, e.g. --r-draft 1 "
            "--context 8192 --kv-share 0.58"
        )
    check_context(args.context)
    return kv_pattern_saving(args.kv_share, args.r_draft, keys_share(kv, args.context))


def _forms(args: argparse.Namespace) -> list[CostForm]:
    forms: list[CostForm] = []
    head_saving = _head_saving(args)
    kv_saving = _kv_saving(args)
    if args.c is not None:
        forms.append(SeparateDraft(args.c, args.epsilon))
    if kv_saving is not None:
        r_reuse = 0.0 if args.r_reuse is None else args.r_reuse
        forms.append(SelfSpeculative(args.r_draft, r_reuse, args.epsilon, head_saving, kv_saving))
    elif args.r_draft is not None:
        r_reuse = args.r_draft if args.r_reuse is None else args.r_reuse
        if r_reuse == args.r_draft:
            forms.append(Contiguous(args.r_draft, args.epsilon, head_saving))
        else:
            forms.append(SelfSpeculative(args.r_draft, r_reuse, args.epsilon, head_saving))
    elif args.r_reuse is not None:
        raise ConfigError("--r-reuse needs --r-draft: give the share the draft runs too")
    if not forms:
        raise ConfigError(
            "give a draft cost: --c C (separate draft) and/or --r-draft R [--r-reuse R2] (self-spec)"
        )
    return forms


SERVING_OPTIONS = ("memory", "weights", "draft_weights", "kv_per_sequence")


def _memory(args: argparse.Namespace) -> MemoryBudget | None:
    """The serving budget when the four options are given (none: None; some: a one-line error)."""
    given = [name for name in SERVING_OPTIONS if getattr(args, name) is not None]
    if not given:
        return None
    if len(given) < len(SERVING_OPTIONS) or args.c is None or args.r_draft is None:
        raise ConfigError(
            "serving a batch compares SSD with SD: give --memory, --weights, --draft-weights and "
            "--kv-per-sequence together, with --c (SD) and --r-draft (SSD)"
        )
    return MemoryBudget(args.memory, args.weights, args.draft_weights, args.kv_per_sequence)


def _serving(memory: MemoryBudget, forms: dict[str, dict]) -> dict[str, float]:
    """Largest batches, β and SSD's throughput over SD's, each at its best γ."""
    ssd = next(row for name, row in forms.items() if name != SeparateDraft.name)
    return {
        "batch_sd": memory.batch_sd,
        "batch_ssd": memory.batch_ssd,
        "beta": memory.beta,
        "throughput_ssd_over_sd": throughput_ratio(
            memory, ssd["best_speedup"], forms[SeparateDraft.name]["best_speedup"]
        ),
    }


def _params(form: CostForm) -> dict[str, float]:
    return {f.name: getattr(form, f.name) for f in fields(form) if f.init}


def _evaluate(acceptance: Acceptance, form: CostForm, gamma: int | None, gamma_max: int) -> dict:
    best = optimal_gamma(acceptance, form, gamma_max)
    used = best.gamma if gamma is None else gamma
    return {
        "params": _params(form),
        "gamma": used,
        "tokens_per_round": expected_tokens(acceptance, used),
        "speedup": speedup(acceptance, form, used),
        "best_gamma": best.gamma,
        "best_speedup": best.speedup,
        "speedup_by_gamma": dict(enumerate(speedup_curve(acceptance, form, gamma_max), start=1)),
    }


def _grid(form: CostForm, alphas: list[float], gammas: list[int]) -> dict:
    return {
        "params": _params(form),
        "alphas": alphas,
        "gammas": gammas,
        "speedup": [[speedup(alpha, form, gamma) for alpha in alphas] for gamma in gammas],
    }


def run(args: argparse.Namespace) -> int:
    forms = _forms(args)
    memory = _memory(args)
    result: dict = {}
    acceptance: Acceptance | None = None
    if args.alpha is not None:
        acceptance, result["alpha"] = args.alpha, args.alpha
    elif args.alphas is not None:
        acceptance = result["alphas"] = args.alphas
    elif not args.table:
        raise ConfigError("give the acceptance: --alpha A or --alphas a1,a2,... (or --table for a grid)")
    if acceptance is not None:
        default_max = min(DEFAULT_GAMMA_MAX, len(acceptance)) if args.alphas else DEFAULT_GAMMA_MAX
        gamma_max = default_max if args.gamma_max is None else args.gamma_max
        gamma = _gamma(args.gamma)
        result["gamma_max"] = gamma_max
        result["forms"] = {form.name: _evaluate(acceptance, form, gamma, gamma_max) for form in forms}
        if memory is not None:
            result["serving"] = _serving(memory, result["forms"])
    if args.table:
        alphas, gammas = args.table_alphas, args.table_gammas
        result["table"] = {form.name: _grid(form, alphas, gammas) for form in forms}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _render(result)
    return 0


def _describe(params: dict[str, float]) -> str:
    return " ".join(f"{key}={value:g}" for key, value in params.items())


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if "forms" in result:
        acceptance = f"α={result['alpha']:g}" if "alpha" in result else f"α_j={result['alphas']}"
        table = Table(title=f"Speedup for {acceptance}, γ* searched in 1..{result['gamma_max']}")
        for column in ("form", "parameters", "γ", "E(γ)", "speedup", "γ*", "S(γ*)"):
            table.add_column(column, justify="left" if column in ("form", "parameters") else "right")
        for name, row in result["forms"].items():
            table.add_row(
                FORM_LABELS[name],
                _describe(row["params"]),
                str(row["gamma"]),
                f"{row['tokens_per_round']:.3f}",
                f"{row['speedup']:.2f}",
                str(row["best_gamma"]),
                f"{row['best_speedup']:.2f}",
            )
        console.print(table)
    if "serving" in result:
        serving = result["serving"]
        console.print(
            f"serving: the largest batch is {serving['batch_ssd']} sequences for SSD and "
            f"{serving['batch_sd']} for SD (beta = {serving['beta']:.2f}); at their best gamma SSD's "
            f"throughput is {serving['throughput_ssd_over_sd']:.2f}x SD's"
        )
    for name, grid in result.get("table", {}).items():
        table = Table(title=f"{FORM_LABELS[name]} speedup, {_describe(grid['params'])}: rows γ, columns α")
        table.add_column("γ", justify="right")
        for alpha in grid["alphas"]:
            table.add_column(f"α={alpha:g}", justify="right")
        for gamma, row in zip(grid["gammas"], grid["speedup"], strict=True):
            table.add_row(str(gamma), *(f"{value:.2f}" for value in row))
        console.print(table)
