"""`skipsearch decode --from tiers.json`: decode with a tier set, against autoregressive decoding
and the set's best single mask, on CUDA graphs where there is a GPU and eagerly otherwise.

Reports tokens/s and speedup over autoregressive decoding, acceptance and tokens per round next
to the tier simulation's prediction, how often each tier drafted, the lossless check (greedy tier
decoding == autoregressive, exit 1 otherwise) and the round-time breakdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.errors import ConfigError
from skipsearch.store import write_text_atomic

if TYPE_CHECKING:
    from skipsearch.bench.decode_report import TiersReport


def run_tiers(args: argparse.Namespace) -> int:
    from skipsearch.bench.decode import DecodeSettings, decode_tiers
    from skipsearch.cli.common import measure_config
    from skipsearch.engine import Sampling
    from skipsearch.tiers.manifest import TierManifest

    manifest = TierManifest.load(Path(args.from_path))
    if args.dynamic_gamma or any(
        v is not None for v in (args.skip, args.mask, args.attn_skip, args.mlp_skip)
    ):
        raise ConfigError(
            f"{args.from_path} is a tier set: it fixes masks and draft lengths, so drop --dynamic-gamma "
            "and the mask options"
        )
    gammas = manifest.gammas if args.gamma is None else (args.gamma,) * len(manifest.masks)
    if min(gammas) < 1:
        raise ConfigError(f"--gamma must be >= 1, got {args.gamma}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    settings = DecodeSettings(
        Sampling(args.temperature, args.top_k, args.top_p),
        args.new_tokens,
        args.repeats,
        args.seed,
        args.breakdown,
    )
    config = measure_config(args)
    result = decode_tiers(config, manifest, gammas, settings, args.require_graphs, str(args.from_path))
    print_tiers(result)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(result.to_json(), indent=2))
    return 0 if result.lossless else 1


def print_tiers(result: TiersReport) -> None:
    from rich.console import Console

    from skipsearch.cli.decode_tables import fmt, print_breakdown, print_caveats, summary_table, verdict

    console = Console()
    console.print(
        f"[bold]{result.model}[/]  {len(result.tiers)} tiers  "
        f"policy window {result.window} thresholds "
        f"{[round(t, 3) for t in result.thresholds]}\n"
        f"tier steps: {result.mode}"
        + (f" (no CUDA graphs: {result.eager_reason})" if result.eager_reason else "")
    )
    tiers = zip(result.tiers, result.gammas, result.tier_share, strict=True)
    for index, (mask, gamma, share) in enumerate(tiers):
        console.print(f"  tier {index}: {mask}  gamma {gamma}  drafted {share:.0%} of rounds")
    console.print(summary_table(result.summaries, result.baseline))
    print_caveats(console, result.conditions.timing_caveats)
    predicted = result.predicted
    if predicted:
        console.print(
            f"simulated on the calibration prompts ({predicted.get('cost')}): tokens/round "
            f"{fmt(predicted.get('tokens_per_round'))}, speedup {fmt(predicted.get('speedup'))} vs best "
            f"single {fmt(result.best_single.get('speedup'))}"
        )
    console.print(
        f"lossless (greedy tier decoding == autoregressive, every prompt): {verdict(result.lossless_check)}"
    )
    print_breakdown(console, result.breakdown)
