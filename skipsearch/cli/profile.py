"""`skipsearch profile`: measure the device's LatencyProfile for a model, for the calibrated cost model.

Writes profile.json (by default where `measure` looks for it) and prints what it found: the
per-sub-layer medians, the real draft cost `c` of a contiguous draft next to the naive `E / L`
(docs/theory.md, Calibrated cost), the verify cost `f(γ)`, the draft head by row count next to
the `k / V` it would cost if time were proportional to rows, and the draft steps at int8 and int4
beside the model's own step, each against the floor of the bytes it reads. `--choose-space` reads
the profile only and names the search space a run should use: one with the precision axis where a
draft at lower precision could pay on this device.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from skipsearch.bench.latency_profiler import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_REPEATS,
    DEFAULT_WARMUP,
    save_profile,
)
from skipsearch.bench.processes import DEFAULT_PROCESSES, profile_processes
from skipsearch.cli.common import add_model_options, add_weight_options, random_weights
from skipsearch.config import check_graphs
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profile_summary import ProfileSummary, precision_ceilings, summary
from skipsearch.cost.verdict import PAYS_OFF
from skipsearch.errors import ConfigError
from skipsearch.models.random_weights import RandomWeights
from skipsearch.options import list_type, option_type
from skipsearch.store import check_cache_dir, check_output_file, default_profile_path

MS = 1e3
PRECISION_SPACE = "precision"  # the shipped space with a precision axis (search_spaces/precision.yaml)
CEILING_CONTEXT = 512  # the context a run scores at unless told (`search.objective.DEFAULT_CONTEXT`)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure per-sub-layer latency on this device (for calibrated speedups)",
        description="Time embedding, every attention and MLP sub-layer, norm + head and the per-round "
        "overhead, for 1..9, 12, 16, 24 and 32 new positions (a chain's or a token tree's verify) at "
        "each context length, and every sub-layer with its weights at int8 and int4 at 1 and 8 "
        "positions (a draft's passes); write a LatencyProfile.",
    )
    add_model_options(parser)
    add_weight_options(parser)
    parser.add_argument(
        "--context-lengths",
        type=list_type("context_length"),
        default=",".join(map(str, DEFAULT_CONTEXT_LENGTHS)),
        help="KV-cache lengths to measure at, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=option_type("profile_repeats"),
        default=DEFAULT_REPEATS,
        help="timed samples per entry (default %(default)s)",
    )
    parser.add_argument(
        "--processes",
        type=option_type("processes"),
        help="fresh processes sharing the repeats, one after another: a CPU process's speed is partly "
        f"a draw, the profile keeps their mean (default {DEFAULT_PROCESSES} on a CPU, 1 on a GPU)",
    )
    parser.add_argument(
        "--warmup",
        type=option_type("warmup"),
        default=DEFAULT_WARMUP,
        help="discarded rounds per process (default %(default)s)",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="time CUDA-graph replays of each part, as a graphed engine runs them, instead of launched "
        "kernels (--device cuda, one process); written to a profile of its own (NAME-graphs.json)",
    )
    parser.add_argument("--out", help="profile.json to write (default: the cache `measure` reads)")
    parser.add_argument(
        "--tables",
        action="store_true",
        help="print the profile's tables too (they are always written beside it, NAME.txt)",
    )
    parser.add_argument(
        "--skip-existing",
        action="store_true",
        help="measure nothing when the output already holds a profile (scripts that calibrate once)",
    )
    parser.add_argument(
        "--choose-space",
        metavar="SPACE",
        help="measure nothing: print only the search space a run should use, from the profile already "
        f"written: {PRECISION_SPACE!r} (search_spaces/{PRECISION_SPACE}.yaml) where a draft at int8 or "
        "int4 could pay on this device (at full acceptance), else SPACE",
    )
    parser.set_defaults(handler=run)


def output_path(args: argparse.Namespace) -> Path:
    from skipsearch.models.loading import dtype_name

    name = f"{args.model}-random" if args.random_weights else args.model
    path = (
        Path(args.out)
        if args.out
        else default_profile_path(name, args.device, dtype_name(args.device, args.dtype), args.graphs)
    )
    check_output_file(path.with_suffix(".txt"), "--out (its tables, beside it)")
    return check_output_file(path, "--out")


def same_plan(
    existing: LatencyProfile, args: argparse.Namespace, weights: RandomWeights | None, out: Path
) -> bool:
    """Whether the profile in `out` (loaded: a damaged file fails here, not in the run that reads
    it) timed the kernels this machine's plan runs now; one of another plan (a kernel added or
    chosen since) is measured again, and `--skip-existing` skips only a profile of this plan."""
    from skipsearch.models.kernels import plan_kernels
    from skipsearch.models.loading import load_model

    loaded = load_model(args.model, args.device, args.dtype, weights, announce=False)
    if existing.warn_other_plan(plan_kernels(loaded.model), out):
        Console().print(f"latency profile in {out} is another kernel plan's: measuring it again")
        return False
    return True


def check_graphs_options(args: argparse.Namespace) -> None:
    """Refuse `--graphs` where it cannot run as asked: off a GPU, or over several processes."""
    check_graphs(args.device)
    if args.processes not in (None, 1):
        raise ConfigError(f"--graphs profiles in one process on a GPU: drop --processes {args.processes}")


def run(args: argparse.Namespace) -> int:
    from skipsearch.models.device import check_device

    contexts = tuple(args.context_lengths)
    weights = random_weights(args)
    if args.graphs:
        check_graphs_options(args)
    check_cache_dir()
    out = output_path(args)
    if args.choose_space:
        print(choose_space(LatencyProfile.load(out, args.model), args.choose_space))
        return 0
    check_device(args.device)
    existing = LatencyProfile.load(out) if args.skip_existing and out.is_file() else None
    if existing is not None and same_plan(existing, args, weights, out):
        print(f"latency profile already in {out}: not measured again (drop --skip-existing to)")
        if not existing.precisions:
            print(
                "it predates the int8/int4 timings: drafts at lower precision are priced by their bytes; "
                f"`skipsearch profile --model {args.model}` without --skip-existing times them"
            )
        return 0
    if args.graphs:
        from skipsearch.bench.graphed_profile import profile_graphed

        profile = profile_graphed(
            args.model, args.device, args.dtype, contexts, args.repeats, args.warmup, weights
        )
    else:
        profile = profile_processes(
            args.model,
            args.device,
            args.dtype,
            contexts,
            repeats=args.repeats,
            warmup=args.warmup,
            processes=args.processes,
            random_weights=weights,
        )
    save_profile(profile, out)
    tables = out.with_suffix(".txt")
    with tables.open("w") as handle:  # the tables beside the profile: a command's output stays short
        render(profile, summary(profile), Console(file=handle, width=TABLE_WIDTH))
    if args.tables:
        render(profile, summary(profile), Console())
    print(headline(profile, summary(profile)))
    if profile.precisions:
        Console().print(precision_table(profile, summary(profile)))
    print(f"wrote {out} and its tables, {tables}")
    return 0


def choose_space(profile: LatencyProfile, base: str) -> str:
    """`PRECISION_SPACE` where some lower precision's all-layer draft could pay on this device
    (`precision_ceilings`: its speedup were every token accepted, at `CEILING_CONTEXT`, with the
    model's own head: a draft vocabulary's smaller head costs less, and the demo's found 1.57x past
    int4's 1.49x ceiling), else `base`; why, on stderr (stdout holds the space alone, for a script)."""
    ceilings = precision_ceilings(profile, CEILING_CONTEXT)
    if not ceilings:
        reason = "the profile has no int8/int4 timings (re-run `skipsearch profile` without --skip-existing)"
    else:
        reason = "at full acceptance with the model's head, " + ", ".join(
            f"int{bits} {'could pay' if v.pays else 'cannot pay'} (<= {v.speedup:.2f}x)"
            for bits, v in ceilings.items()
        )
    chosen = PRECISION_SPACE if any(v.pays for v in ceilings.values()) else base
    further = " (a smaller draft head goes further)" if ceilings else ""
    print(f"space {chosen}: {reason}; pays from {PAYS_OFF}x{further}", file=sys.stderr)
    return chosen


def headline(profile: LatencyProfile, digest: ProfileSummary) -> str:
    """The profile in one line: a step's time and its distance from the bytes it must read, and
    what a verify of 4 positions costs in steps, at the shortest context profiled."""
    context = profile.context_lengths[0]
    step = profile.weights(context, 1).total
    floor = profile.floor_time(context)
    against_floor = f" ({step / floor:.2f}x the floor of the bytes it reads)" if floor else ""
    verify = dict(zip(digest.gammas, digest.verify_cost[0], strict=True))
    cost = f"; a verify of γ+1 = 4 positions costs {verify[3]:.2f} steps" if 3 in verify else ""
    return f"profile at {context} tokens: a step takes {_ms(step)} ms{against_floor}{cost}"


# -- rendering -----------------------------------------------------------------------------------


TABLE_WIDTH = 120  # the tables file's width: wide enough that no column folds


def render(profile: LatencyProfile, digest: ProfileSummary, console: Console) -> None:
    console.print(sublayer_table(profile))
    console.print(draft_cost_table(digest))
    console.print(verify_cost_table(digest))
    if digest.head_rows:
        console.print(draft_head_table(profile, digest))
    if profile.precisions:
        console.print(precision_table(profile, digest))
    if profile.pillar_choice:
        times = " / ".join(_ms(t) for t in profile.pillar_choice)
        contexts = " / ".join(str(c) for c in profile.context_lengths)
        console.print(
            f"pillar choice and gather a round ({profile.meta.get('pillar_pattern')}): {times} ms "
            f"at {contexts} tokens"
        )
    if "depth_scaled" in profile.meta:
        console.print(f"depth scaled: {profile.meta['depth_scaled']}")
    if profile.meta.get("graphs"):
        gaps = [gap for row in profile.meta["launch_gap_s"] for gap in row]
        console.print(
            f"CUDA-graph replays: {_ms(min(gaps))}..{_ms(max(gaps))} ms of launch gap taken off each part, "
            "so the parts sum to the pass captured as one graph; pillar choice not timed"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * MS:.3f}"


def _per_layer(times: Sequence[float]) -> str:
    """Mean over layers, in ms: the layers of one model cost about the same (profile.json has each)."""
    return _ms(sum(times) / len(times))


def sublayer_table(profile: LatencyProfile) -> Table:
    meta = profile.meta
    table = Table(title=f"Median ms on {meta.get('device')} ({meta.get('dtype')}), {meta.get('model')}")
    columns = (
        "context",
        "positions",
        "embed",
        "attn / layer",
        "mlp / layer",
        "head",
        "step",
        "floor",
        "÷ floor",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for context in profile.context_lengths:
        for positions in sorted({profile.positions[0], profile.positions[-1]}):
            weights = profile.weights(context, positions)
            floor = profile.floor_time(context) if positions == 1 else None
            table.add_row(
                str(context),
                str(positions),
                _ms(weights.embed),
                _per_layer(weights.attn),
                _per_layer(weights.mlp),
                _ms(weights.head),
                _ms(weights.total),
                "" if floor is None else _ms(floor),
                "" if floor is None else f"{weights.total / floor:.2f}",
            )
    if profile.floor_time(profile.context_lengths[0]) is not None:
        table.caption = (
            f"floor: the bytes a step reads (weights {meta['weight_bytes'] / 1e6:.0f} MB + K/V "
            f"{meta['kv_bytes_per_position'] / 1e3:.1f} kB per position) over the measured copy bandwidth "
            f"{meta['copy_bandwidth'] / 1e9:.1f} GB/s; attention path {meta.get('attention', '?')}"
        )
    return table


def shown_exits(num_layers: int) -> list[int]:
    """A few exit layers: the first, the quarters and the full model."""
    return sorted({1, *(round(num_layers * q / 4) or 1 for q in (1, 2, 3)), num_layers})


def draft_cost_table(digest: ProfileSummary) -> Table:
    table = Table(title="Draft cost c = step of [0, E) / full step")
    table.add_column("E", justify="right")
    table.add_column("E/L", justify="right")
    for context in digest.context_lengths:
        table.add_column(f"c @ {context}", justify="right")
    for exit_layer in shown_exits(digest.num_layers):
        costs = (f"{row[exit_layer - 1]:.3f}" for row in digest.draft_cost)
        table.add_row(str(exit_layer), f"{digest.naive(exit_layer):.3f}", *costs)
    return table


def verify_cost_table(digest: ProfileSummary) -> Table:
    table = Table(title="f(γ) = pass of γ+1 positions / step")
    table.add_column("γ", justify="right")
    for context in digest.context_lengths:
        table.add_column(f"f @ {context}", justify="right")
    for index, gamma in enumerate(digest.gammas):
        table.add_row(str(gamma), *(f"{row[index]:.3f}" for row in digest.verify_cost))
    return table


def draft_head_table(profile: LatencyProfile, digest: ProfileSummary) -> Table:
    table = Table(title="Draft head of k rows (1 position): time ∝ rows would give ratio = k/V")
    for column in ("k", "k/V", "ms", "ratio to full"):
        table.add_column(column, justify="right")
    vocab = digest.head_rows[-1]
    for rows, seconds, ratio in zip(digest.head_rows, profile.head_by_rows, digest.head_ratio, strict=True):
        table.add_row(str(rows), f"{rows / vocab:.3f}", _ms(seconds), f"{ratio:.3f}")
    return table


def precision_table(profile: LatencyProfile, digest: ProfileSummary) -> Table:
    """The one-position step with every layer at int8 and int4 beside the model's own, each timed
    as a whole and held against the floor of the bytes it reads (`LatencyProfile.precision_floor`)."""
    dtype = profile.meta.get("dtype", "model")
    table = Table(title="Draft step, every layer at each precision (1 position): time against its bytes")
    for column in ("context", "weights", "ms", "c", "MB read", "floor ms", "÷ floor", "GB/s"):
        table.add_column(column, justify="right")
    for index, context in enumerate(digest.context_lengths):
        for bits in sorted(digest.precision_floor, reverse=True):  # the model's own first
            floor = digest.precision_floor[bits][index]
            cost = 1.0 if bits == 16 else digest.precision_cost[bits][index]
            table.add_row(
                str(context),
                dtype if bits == 16 else f"int{bits}",
                "" if floor.seconds is None else _ms(floor.seconds),
                f"{cost:.3f}",
                "" if floor.read_bytes is None else f"{floor.read_bytes / 1e6:.1f}",
                "" if floor.floor is None else _ms(floor.floor),
                "" if floor.over_floor is None else f"{floor.over_floor:.2f}",
                "" if floor.bandwidth is None else f"{floor.bandwidth / 1e9:.1f}",
            )
    ceilings = precision_ceilings(profile, CEILING_CONTEXT)
    table.caption = (
        f"c: a draft step over the model's own ({dtype}), by its sub-layers; "
        + ", ".join(f"int{bits} <= {v.speedup:.2f}x" for bits, v in sorted(ceilings.items(), reverse=True))
        + f" with every token accepted at {CEILING_CONTEXT} tokens (pays from {PAYS_OFF}x)"
    )
    return table
