"""Stacked projections against separate ones, in one process, paired (issue 19: the kernel plan).

`load_model` stacks each layer's q/k/v and gate/up projections into one matrix product each
(`models.stacked`): 2 products a layer instead of 5, the same bytes. This experiment loads the
model once without stacking, copies it and stacks the copy, then times one-position steps (a decode
or draft step) and four-position passes (a verify of 3 drafts) of both, alternating the order, at
each context, and checks that both give the same logits. Then, per dtype (`--dtypes`), it times
whole autoregressive decodes of HumanEval prompts with both, alternating prompt by prompt. Writes
`results/kernels/stacked_projections.md`.

    python experiments/stacked_projections.py      # ~3 min on two idle cores

Run it alone on an idle machine; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from _load import load_line

from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.engine import autoregressive_decode
from skipsearch.models import stacked
from skipsearch.models.loading import load_model
from skipsearch.models.registry import REGISTRY, available_offline
from skipsearch.models.runner import LayerwiseRunner

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kernels"
POSITIONS = (1, 4)


def runners(model: str, dtype: str = "auto") -> tuple[LayerwiseRunner, LayerwiseRunner, Any]:
    """(separate, stacked) runners of one model on the plan of `dtype`, and the loaded model."""
    with mock.patch.object(stacked, "stack_projections", lambda model: 0):
        loaded = load_model(model, dtype=dtype, announce=False)
    separate = loaded.model
    stacked_model = copy.deepcopy(separate)
    stacked.stack_projections(stacked_model)
    return LayerwiseRunner(separate), LayerwiseRunner(stacked_model), loaded


def decode_speeds(
    model: str, dtype: str, prompts: int, new_tokens: int, repeats: int
) -> dict[str, list[float]]:
    """Autoregressive tok/s (prefill included) per prompt and repeat, separate and stacked alternating."""
    separate, stacked_runner, loaded = runners(model, dtype)
    spec = PromptSpec(n_prompts=prompts, max_prompt_tokens=256, new_tokens=new_tokens)
    encoded = [p.ids for p in encode_prompts(spec, loaded.tokenizer)]
    pair = {"separate": separate, "stacked": stacked_runner}
    for runner in pair.values():  # warm-up
        autoregressive_decode(runner, encoded[0], 4)
    speeds: dict[str, list[float]] = {name: [] for name in pair}
    for repeat in range(repeats):
        for index, prompt in enumerate(encoded):
            order = list(pair) if (repeat + index) % 2 == 0 else list(reversed(pair))
            for name in order:
                result = autoregressive_decode(pair[name], prompt, new_tokens)
                speeds[name].append(len(result.tokens) / result.seconds)
    return speeds


def timings(
    pair: dict[str, LayerwiseRunner], context: int, repeats: int
) -> dict[tuple[str, int], list[float]]:
    """ms per pass, by (variant, positions), the variants alternating in order every repeat."""
    ids = torch.randint(
        0, pair["separate"].config.vocab_size, (1, context + 8), generator=torch.Generator().manual_seed(0)
    )
    caches = {}
    with torch.no_grad():
        for name, runner in pair.items():
            caches[name] = runner.new_cache()
            runner.forward(ids[:, :context], cache=caches[name])

        def one(name: str, positions: int) -> float:
            began = time.perf_counter()
            pair[name].forward(ids[:, context : context + positions], cache=caches[name])
            elapsed = time.perf_counter() - began
            for layer in caches[name].layers:
                layer.crop(-positions)
            return 1e3 * elapsed

        for _ in range(3):  # warm-up
            for name in pair:
                one(name, 1)
        times: dict[tuple[str, int], list[float]] = {(n, p): [] for n in pair for p in POSITIONS}
        for repeat in range(repeats):
            for positions in POSITIONS:
                for name in list(pair) if repeat % 2 == 0 else reversed(list(pair)):
                    times[name, positions].append(one(name, positions))
    return times


def same_logits(pair: dict[str, LayerwiseRunner]) -> float:
    ids = torch.randint(
        0, pair["separate"].config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        a, b = (runner.forward(ids).float() for runner in pair.values())
    return float((a - b).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--contexts", default="128,512,2048")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtypes", default="auto,float32", help="plans whose decodes are compared")
    parser.add_argument("--decode-prompts", type=int, default=4)
    parser.add_argument("--decode-repeats", type=int, default=2)
    args = parser.parse_args()
    load_before = os.getloadavg()
    lines = [
        "# Stacked q/k/v and gate/up projections against separate ones (issue 19)",
        "",
        f"`python experiments/stacked_projections.py --contexts {args.contexts} --repeats {args.repeats}`: "
        "one process per model, the unstacked model and its stacked copy timed alternately, median ms per "
        "pass (interquartile range in brackets).",
        "",
        "| model | context | positions | separate ms | stacked ms | stacked ÷ separate |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for model in args.models.split(","):
        if not available_offline(REGISTRY[model]):
            print(f"skipping {model}: not installed")
            continue
        separate, stacked_runner, loaded = runners(model)
        pair = {"separate": separate, "stacked": stacked_runner}
        notes.append(
            f"- {model}: largest logit difference between the two {same_logits(pair):.3g}; "
            f"plan: {loaded.plan}"
        )
        for context in (int(c) for c in args.contexts.split(",")):
            times = timings(pair, context, args.repeats)
            for positions in POSITIONS:
                cells = []
                for name in pair:
                    quartiles = statistics.quantiles(times[name, positions], n=4)
                    cells.append(f"{quartiles[1]:.2f} ({quartiles[0]:.2f}–{quartiles[2]:.2f})")
                ratio = statistics.median(times["stacked", positions]) / statistics.median(
                    times["separate", positions]
                )
                lines.append(f"| {model} | {context} | {positions} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
                print(lines[-1], flush=True)
    lines += [
        "",
        f"Autoregressive decodes, {args.decode_prompts} HumanEval prompts × 48 new tokens × "
        f"{args.decode_repeats} repeats, separate and stacked alternating prompt by prompt (tok/s with the "
        "prefill; median and range of the per-prompt ratios):",
        "",
        "| model | dtype | separate tok/s | stacked tok/s | stacked ÷ separate (per prompt) |",
        "|---|---|---|---|---|",
    ]
    for model in args.models.split(","):
        if not available_offline(REGISTRY[model]):
            continue
        for dtype in args.dtypes.split(","):
            speeds = decode_speeds(model, dtype, args.decode_prompts, 48, args.decode_repeats)
            ratios = [b / a for a, b in zip(speeds["separate"], speeds["stacked"], strict=True)]
            lines.append(
                f"| {model} | {dtype} | {statistics.mean(speeds['separate']):.1f} | "
                f"{statistics.mean(speeds['stacked']):.1f} | {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}–{max(ratios):.3f}) |"
            )
            print(lines[-1], flush=True)
    load_after = os.getloadavg()
    lines += [
        "",
        *notes,
        "",
        f"{torch.get_num_threads()} torch threads. {load_line(load_before, load_after)}.",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stacked_projections.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
