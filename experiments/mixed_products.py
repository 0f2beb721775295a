"""What a verify would cost if its products ran on AMX tiles while the decode steps stay on the
vector kernel, and what it would cost in exactness (issue 19: f(γ) ≤ 1.10 on SmolLM2).

`cpu.products_choice` keeps SmolLM2's products on the vector kernel: its extra rows cost one
FMA per weight and row (a pass over 5 positions adds ~1.2x a step's products), and the tiles',
nearly free, stream one row 1-3% slower on SmolLM2's small matrices. The autoregressive baseline
must run the fastest one-row kernel and a verify the steps' kernel, which keeps greedy SSD equal to
autoregressive decoding bit for bit. A *mixed* plan would give that up: one-position passes
(steps, draft steps) on the vector kernel, passes of γ + 1 positions on the tiles, which round
their inputs to bf16, so a verify's logits would differ from the steps' in their last bits and
greedy SSD could part from autoregressive decoding where two tokens are nearly tied.

This measures both sides on the model loaded twice, its products forced to each kernel:
- **cost**: at each `--contexts` length, a one-position step and a pass over 2-5 positions on each
  kernel, all interleaved (`--repeats` rounds in alternating order, `--passes` passes a sample),
  and f(γ) three ways: the vector kernel for both (today's plan), the tiles for both, and the
  mixed plan (the tiles' pass over the vector kernel's step). The spread is the min-max of the
  rounds' medians.
- **exactness**: on HumanEval prompts, greedy autoregressive decoding on the mixed plan (the
  prompt on the tiles, as a prefill of many rows would run, then one-position steps on the vector
  kernel) against passes of 5 positions over the same tokens on the tiles: the largest logit
  difference at the same positions (the verify gap `bench.lossless` would measure), and the share
  of the decode's positions whose top-two margin is within twice that gap (where a mixed-plan
  verify could flip the greedy token).

    python experiments/mixed_products.py   # ~4 min -> results/kernels/mixed_products-{model}{--suffix}.md

Run it alone on a CPU with AMX; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch
from _common import markdown_table, write_report
from _load import load_line

from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.cpu import products_choice
from skipsearch.cpu.bf16_weights import TILES, VECTOR, load_tile_kernel
from skipsearch.cpu.choices import pass_samples
from skipsearch.models.loading import LoadedModel, load_model
from skipsearch.models.runner import LayerwiseRunner

OUT = Path(__file__).resolve().parents[1] / "results" / "kernels"
POSITIONS = (1, 2, 3, 4, 5)  # a step, and verifies of γ = 1 .. 4


def load_on(model: str, kernel: str) -> LoadedModel:
    """`model` on the default plan with its products forced onto `kernel`."""
    forced = products_choice.ProductsChoice(kernel)
    with mock.patch.object(products_choice, "choose_products", lambda *_: forced):
        return load_model(model)


def exactness(runners: dict[str, LayerwiseRunner], prompts: list[tuple[int, ...]], new_tokens: int) -> dict:
    """The mixed plan's verify gap and the decode's near-tie margins (module docstring)."""
    vector, tiles = runners[VECTOR], runners[TILES]
    gap, margins = 0.0, []
    width = max(POSITIONS)
    with torch.no_grad():
        for prompt in prompts:
            prefix = torch.tensor([list(prompt[:-1])])
            step_cache, block_cache = tiles.new_cache(), tiles.new_cache()
            tiles.forward(prefix, cache=step_cache)  # a prefill runs many rows: the tiles
            tiles.forward(prefix, cache=block_cache)
            tokens, step_logits = [prompt[-1]], []
            for _ in range(new_tokens):
                logits = vector.forward(torch.tensor([[tokens[-1]]]), cache=step_cache)[0, -1]
                step_logits.append(logits)
                top = torch.topk(logits.float(), 2).values
                margins.append(float(top[0] - top[1]))
                tokens.append(int(logits.argmax()))
            fed = torch.tensor([tokens[:-1]])
            for start in range(0, new_tokens, width):
                block = tiles.forward(fed[:, start : start + width], cache=block_cache)[0]
                for offset, logits in enumerate(block):
                    gap = max(gap, float((logits - step_logits[start + offset]).abs().max()))
    return {"gap": gap, "margins": margins}


def f_cells(samples: dict, step_kernel: str, pass_kernel: str) -> list[str]:
    """f(γ) for γ = 1..4 with passes on `pass_kernel` over steps on `step_kernel`: the median of
    the rounds' ratios, with their min-max."""
    steps = samples[step_kernel, 1]
    cells = []
    for p in POSITIONS[1:]:
        ratios = [a / b for a, b in zip(samples[pass_kernel, p], steps, strict=True)]
        cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f})")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--contexts", default="128,512", help="cached positions before each pass")
    parser.add_argument("--passes", type=int, default=15, help="passes a sample")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved rounds of samples")
    parser.add_argument("--prompts", type=int, default=6, help="HumanEval prompts for the exactness check")
    parser.add_argument("--new-tokens", type=int, default=40, help="greedy tokens a prompt")
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    parser.add_argument("--out", type=Path, default=OUT, help="the report's folder")
    args = parser.parse_args()
    if load_tile_kernel().function is None:
        parser.error(f"the AMX kernel does not load here ({load_tile_kernel().reason}): this needs AMX")
    before = os.getloadavg()
    loaded = {kernel: load_on(args.model, kernel) for kernel in (VECTOR, TILES)}
    runners = {kernel: LayerwiseRunner(model.model) for kernel, model in loaded.items()}
    spec = PromptSpec(n_prompts=args.prompts, new_tokens=args.new_tokens)
    prompts = [p.ids for p in encode_prompts(spec, loaded[VECTOR].tokenizer)]
    rows, steps = [], []
    for context in (int(c) for c in args.contexts.split(",")):
        samples = pass_samples(runners, context, POSITIONS, args.repeats, args.passes)
        for kernel in (VECTOR, TILES):
            steps.append(
                f"{context} tokens, {kernel}: step {statistics.median(samples[kernel, 1]):.2f} ms "
                f"({min(samples[kernel, 1]):.2f}–{max(samples[kernel, 1]):.2f}), pass of 5 positions "
                f"{statistics.median(samples[kernel, 5]):.2f} ms"
            )
        for label, step_kernel, pass_kernel in (
            ("vector kernel (today's plan)", VECTOR, VECTOR),
            ("tiles for both", TILES, TILES),
            ("mixed: tiles' pass / vector step", VECTOR, TILES),
        ):
            rows.append([str(context), label, *f_cells(samples, step_kernel, pass_kernel)])
    checked = exactness(runners, prompts, args.new_tokens)
    after = os.getloadavg()
    margins = checked["margins"]
    within = sum(m <= 2 * checked["gap"] for m in margins)
    report = [
        f"# Verifies on AMX tiles, steps on the vector kernel: {args.model}",
        "",
        f"`{' '.join(['python', 'experiments/mixed_products.py', *sys.argv[1:]])}` (see its docstring). "
        f"Plan, vector side: {loaded[VECTOR].plan}.",
        "",
        "f(γ) = a pass over γ + 1 positions ÷ a one-position step, median of "
        f"{args.repeats} interleaved rounds of {args.passes} passes (min–max of the rounds):",
        "",
        *markdown_table(["context", "passes / steps", "f(1)", "f(2)", "f(3)", "f(4)"], rows),
        "",
        *(f"- {line}." for line in steps),
        "",
        f"Exactness on {len(prompts)} HumanEval prompts × {args.new_tokens} greedy tokens: the largest "
        f"logit difference between the vector kernel's one-position steps and the tiles' passes of "
        f"{max(POSITIONS)} positions at the same positions is **{checked['gap']:.4f}**; "
        f"{within} of {len(margins)} positions ({within / len(margins):.1%}) have a top-two margin "
        f"within twice that (smallest margin {min(margins):.4f}). On today's plan the gap is 0 (the "
        "same bits).",
        "",
        load_line(before, after) + ".",
        "",
    ]
    write_report(args.out / f"mixed_products-{args.model}{args.suffix}.md", report)


if __name__ == "__main__":
    main()
