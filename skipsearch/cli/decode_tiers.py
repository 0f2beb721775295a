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
from typing import Any

from skipsearch.errors import ConfigError
from skipsearch.store import write_text_atomic

AR, TIERS, SINGLE = "autoregressive", "ssd-tiers", "ssd-best-single"


def run_tiers(args: argparse.Namespace) -> int:
    from skipsearch.acceptance.prompts import encode_prompts
    from skipsearch.bench.interleaved import benchmark
    from skipsearch.bench.lossless import check_runs
    from skipsearch.cli.common import measure_config
    from skipsearch.cli.decode_tables import run_settings
    from skipsearch.engine import (
        GREEDY,
        Sampling,
        Summary,
        autoregressive_decode,
        breakdown,
        speculative_decode,
    )
    from skipsearch.engine.graphs import make_steps
    from skipsearch.engine.tiered import TieredResult, tiered_decode
    from skipsearch.masks import SkipMask
    from skipsearch.models.loading import eos_ids, load_model
    from skipsearch.models.runner import LayerwiseRunner
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
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    config = measure_config(args)
    loaded = load_model(config.model, config.device, config.dtype)
    runner = LayerwiseRunner(loaded.model)
    if runner.num_layers != manifest.num_layers:
        raise ConfigError(
            f"the tiers are for a {manifest.num_layers}-layer model but {config.model} has "
            f"{runner.num_layers}: pass --model {manifest.model}"
        )
    prompts = [
        p.ids
        for p in encode_prompts(
            config.prompts, loaded.tokenizer, getattr(loaded.model.config, "max_position_embeddings", None)
        )
    ]
    model: Any = loaded.model
    stop = eos_ids(model)
    max_len = max(len(p) for p in prompts) + args.new_tokens + max(gammas) + 2
    steps, eager_reason = make_steps(
        runner, manifest.masks, gammas, max_len, manifest.buckets[0], args.require_graphs
    )
    predicted = manifest.predicted
    single = (
        predicted.get("pool_best_single") or predicted.get("best_single") or {"mask": str(manifest.masks[0])}
    )
    single_mask = SkipMask.parse(single["mask"], runner.num_layers)
    tiered: list[TieredResult] = []

    def decoders(sampling: Sampling) -> dict[str, Any]:
        def tiers(prompt: tuple[int, ...], generator: Any) -> Any:
            out = tiered_decode(
                runner,
                prompt,
                manifest.masks,
                gammas,
                manifest.policy,
                args.new_tokens,
                sampling,
                generator,
                stop,
                steps,
            )
            tiered.append(out)
            return out.result

        return {
            AR: lambda p, g: autoregressive_decode(runner, p, args.new_tokens, sampling, g, stop),
            TIERS: tiers,
            SINGLE: lambda p, g: speculative_decode(
                runner,
                p,
                single_mask,
                args.new_tokens,
                int(single.get("gamma", gammas[0])),
                sampling,
                g,
                stop,
            ),
        }

    runs = benchmark(decoders(sampling), prompts, args.repeats, args.seed, runner.device)
    timed_tiers = tiered[1:]  # the first call was benchmark's warm-up
    if sampling.greedy:
        checked = runs
    else:  # sampled runs differ by chance: check losslessness on greedy reruns
        greedy = decoders(GREEDY)
        checked = {name: [greedy[name](p, None) for p in prompts] for name in (AR, TIERS)}
    lossless = check_runs(runner, prompts, checked[AR], checked[TIERS], max(gammas) + 1)
    summaries = {name: Summary.of(results) for name, results in runs.items()}
    rounds = [t for r in timed_tiers for t in r.tiers]
    result = {
        "model": config.model,
        "manifest": str(args.from_path),
        "tiers": [str(m) for m in manifest.masks],
        "policy": {"window": manifest.policy.window, "thresholds": list(manifest.policy.thresholds)},
        "gammas": list(gammas),
        "best_single": single,
        "mode": steps.mode,
        "eager_reason": eager_reason,
        **run_settings(args, len(prompts)),
        "summaries": {name: s.to_dict(summaries[AR], "autoregressive") for name, s in summaries.items()},
        "tier_share": [rounds.count(t) / len(rounds) if rounds else 0.0 for t in range(len(manifest.masks))],
        "predicted": dict(manifest.predicted),
        "lossless": lossless.passed,
        "lossless_check": lossless.to_dict(),
        "breakdown": [b.to_dict() for b in breakdown([t for r in runs[TIERS] for t in r.timings])],
        "runs": {name: [r.to_dict() for r in results] for name, results in runs.items()},
        "tier_runs": [list(r.tiers) for r in timed_tiers],
    }
    print_tiers(result)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(result, indent=2))
    return 0 if lossless.passed else 1


def print_tiers(result: dict[str, Any]) -> None:
    from rich.console import Console

    from skipsearch.cli.decode_tables import fmt, print_breakdown, print_caveats, summary_table, verdict

    console = Console()
    console.print(
        f"[bold]{result['model']}[/]  {len(result['tiers'])} tiers  "
        f"policy window {result['policy']['window']} thresholds "
        f"{[round(t, 3) for t in result['policy']['thresholds']]}\n"
        f"tier steps: {result['mode']}"
        + (f" (no CUDA graphs: {result['eager_reason']})" if result["eager_reason"] else "")
    )
    tiers = zip(result["tiers"], result["gammas"], result["tier_share"], strict=True)
    for index, (mask, gamma, share) in enumerate(tiers):
        console.print(f"  tier {index}: {mask}  gamma {gamma}  drafted {share:.0%} of rounds")
    console.print(summary_table(result["summaries"], "autoregressive", "AR"))
    print_caveats(console, result)
    predicted = result["predicted"]
    if predicted:
        console.print(
            f"simulated on the calibration prompts ({predicted.get('cost')}): tokens/round "
            f"{fmt(predicted.get('tokens_per_round'))}, speedup {fmt(predicted.get('speedup'))} vs best "
            f"single {fmt(result['best_single'].get('speedup'))}"
        )
    console.print(f"lossless (greedy tier decoding == autoregressive, every prompt): {verdict(result)}")
    print_breakdown(console, result["breakdown"])
