"""Which kernel multiplies a model's bf16 weights on a CPU with AMX: the vector kernel
(`linear_rows.c`) or the tile kernel (`linear_rows_amx.c`), measured on the model's own steps
(docs/cpu-backend.md).

On a CPU with AMX a verify of 4 drafts costs 1.25 steps on the vector kernel, and the products'
arithmetic is most of what each extra position adds: the vector kernel does one FMA per weight and
row. On AMX tiles the extra rows are nearly free (a pass of 5 positions costs 1.06-1.09 steps), but
whether one row streams as fast depends on the matrices and on what runs between them. The
autoregressive baseline, which every speedup divides by, must run the fastest one-row kernel, and a
verify must run the decode steps' kernel (the same bits), so the tile kernel runs a model only where
the model's one-position step is no slower on it and its pass over `PROBE_ROWS[-1]` positions is
faster. "No slower" allows `STEP_TIE` (2%), the probe's run-to-run spread: SmolLM2's step read
0.7-0.8% apart on the two kernels in three processes, faster on either (tiles / vector: 11.19 /
11.27 ms, 11.20 / 11.11, one thread 20.42 / 20.21), while its 5-position pass was 14-17% faster
on the tiles, so an exact rule chose by chance, and the plan and every figure taken on it with it.
Both are timed on the whole model, each kernel on its own copy with the rest of the plan around it
(`build`), interleaved: the model's products timed alone misjudged SmolLM2, whose products read 1%
slower on the tiles while its whole step ran 2% faster
(docs/cpu-backend.md, "Products on AMX tiles"). The tile kernel rounds the inputs to bf16 as
well, so the plan's numbers change with it, not only its speed; greedy SSD still equals
autoregressive decoding token for token, each row's bits being independent of the rows beside it.

The measurement is taken once per machine and set of matrix shapes, cached as the other choices
of the plan are (`cpu.choices.keep_choice`: not kept while other processes keep a core busy).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from skipsearch.cpu.bf16_weights import TILES, VECTOR, fits, load_kernel, load_tile_kernel
from skipsearch.cpu.choices import choice_path, keep_choice, pass_samples, read_choice

PROBE_ROWS = (1, 5)  # a decode or draft step, and a verify of 4 drafts
PROBE_REPEATS = 7  # passes a sample
PROBE_ROUNDS = 3  # interleaved samples per kernel and row count; the fastest counts
PROBE_CONTEXT = 128  # cached positions before each timed pass
STEP_TIE = 0.02  # steps this close are a tie (module docstring)
KERNEL_NAMES = {VECTOR: "skipsearch's vector kernel", TILES: "skipsearch's AMX kernel"}
SHORT_NAMES = {VECTOR: "vector", TILES: "AMX"}
# (owner, projections) of a decoder layer's products as the fused layers call them
FUSED_GROUPS = (
    ("self_attn", ("q_proj", "k_proj", "v_proj")),
    ("self_attn", ("o_proj",)),
    ("mlp", ("gate_proj", "up_proj")),
    ("mlp", ("down_proj",)),
)

# Choices measured in this process but not kept (a busy machine), by path: one answer per process.
_UNKEPT: dict[Path, ProductsChoice] = {}


@dataclass(frozen=True)
class ProductsChoice:
    """The kernel a model's products run on (`VECTOR` or `TILES`), and the measurement: ms per pass
    of the whole model by kernel and positions (`PROBE_ROWS`); the builds measured (a changed
    kernel is measured again), or why the tile kernel could not be."""

    kernel: str
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    kernel_builds: str = ""
    unavailable: str = ""

    def describe(self) -> str:
        name = f"products on {KERNEL_NAMES[self.kernel]}"
        if not self.timings:
            return f"{name} (AMX kernel not used: {self.unavailable})" if self.unavailable else name
        cells = "; ".join(
            f"{SHORT_NAMES[kernel]} " + ", ".join(f"{ms:.2f}" for ms in by_rows.values())
            for kernel, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values())))
        return f"{name} (ms per pass of the model over {rows} positions: {cells})"


def _multiplied(module: object) -> bool:
    """Whether `use_bf16_weights` puts `module` on the products kernel."""
    return type(module) is nn.Linear and fits(module.weight)


def step_products(model: nn.Module) -> list[list[nn.Linear]]:
    """The linear layers a decode step multiplies on the kernel (`use_bf16_weights`' candidates):
    each decoder layer's grouped as the fused layers call them, then every other one (the LM head)
    alone."""
    groups: list[list[nn.Linear]] = []
    grouped: set[int] = set()
    for block in getattr(getattr(model, "model", None), "layers", []):
        for owner, names in FUSED_GROUPS:
            parts = [getattr(getattr(block, owner, None), name, None) for name in names]
            if all(_multiplied(part) for part in parts):
                groups.append(parts)
                grouped.update(id(part) for part in parts)
    singles = [[m] for m in model.modules() if _multiplied(m) and id(m) not in grouped]
    return groups + singles


def measure_steps(
    model: nn.Module,
    build: Callable[[nn.Module, str], object],
    runner: Callable[[nn.Module], Any],
    kernels: tuple[str, ...] = (VECTOR, TILES),
) -> dict[str, dict[str, float]]:
    """Median ms of a pass of `model` over each of `PROBE_ROWS` positions after `PROBE_CONTEXT`
    cached ones, on each of `kernels`: each on a copy of `model` that `build(copy, kernel)` puts on
    the kernel with the rest of the plan, the kernels and row counts interleaved in alternating
    order, the fastest of `PROBE_ROUNDS` samples, each copy run by `runner(copy)` (the layer-wise
    runner, which `models` passes in: the backend runs no model of its own). `model` itself is not
    changed."""

    runners = {}
    for kernel in kernels:
        candidate = copy.deepcopy(model)
        build(candidate, kernel)
        runners[kernel] = runner(candidate)
    samples = pass_samples(runners, PROBE_CONTEXT, PROBE_ROWS, PROBE_ROUNDS, PROBE_REPEATS)
    return {kernel: {str(rows): min(samples[kernel, rows]) for rows in PROBE_ROWS} for kernel in kernels}


def decide(timings: dict[str, dict[str, float]]) -> str:
    """`TILES` where the model's step is no slower on the tile kernel (within `STEP_TIE`) and its
    pass over the most positions probed is faster."""
    one, most = (str(PROBE_ROWS[0]), str(PROBE_ROWS[-1]))
    tiles, vector = timings[TILES], timings[VECTOR]
    return TILES if tiles[one] <= vector[one] * (1 + STEP_TIE) and tiles[most] < vector[most] else VECTOR


def _path(groups: list[list[nn.Linear]]) -> Path:
    """One measurement per machine, torch version and set of product shapes (`steps-`: whole-model
    passes, not the products alone that earlier choices timed)."""
    shapes = sorted((group[0].in_features, sum(part.out_features for part in group)) for group in groups)
    return choice_path(f"products-steps-{hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]}")


def choose_products(
    model: nn.Module, build: Callable[[nn.Module, str], object], runner: Callable[[nn.Module], Any]
) -> ProductsChoice:
    """The kernel for the products of `model`'s linear layers (module docstring; before
    `use_bf16_weights` packs them for it), measured on copies of `model` that `build(copy,
    kernel)` puts on each kernel with the rest of the plan and `runner` runs, once per machine and
    set of shapes, and cached; the vector kernel where the tile kernel does not load."""
    tiles, vector = load_tile_kernel(), load_kernel()
    groups = step_products(model)
    if tiles.function is None or vector.function is None or not groups:
        return ProductsChoice(VECTOR, unavailable=tiles.reason if tiles.function is None else vector.reason)
    builds = f"{vector.build}+{tiles.build}"
    path = _path(groups)
    cached = read_choice(path, ProductsChoice) or _UNKEPT.get(path)
    if cached is not None and cached.kernel in KERNEL_NAMES and cached.kernel_builds == builds:
        return cached
    timings = measure_steps(model, build, runner)
    choice = ProductsChoice(decide(timings), timings, builds)
    if not keep_choice(path, choice, "the products' kernels"):
        _UNKEPT[path] = choice
    return choice
