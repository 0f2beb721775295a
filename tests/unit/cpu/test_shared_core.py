"""The products shared with helpers on busy cores (`cpu.shared_core`, `shared_core.h`), the bf16
kernels' and the int8/int4 ones': every output is the bits one thread computes, whichever thread
computed or took back each piece; the plan is chosen only where one thread is all the load leaves;
decodes engage it and leave the caller's affinity as it was."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from skipsearch.cpu import bf16_activations, fp32_linear, int_linear, products_choice, shared_core
from skipsearch.cpu import threads as threads_module
from skipsearch.cpu.bf16_activations import FLOAT32, ActivationChoice
from skipsearch.cpu.bf16_weights import KERNELS, TILES, Bf16WeightLinear, kernel_library, use_bf16_weights
from skipsearch.cpu.fp32_linear import BF16_KERNEL, Fp32Linear
from skipsearch.cpu.int_linear import Int4Linear, Int8Linear
from skipsearch.cpu.products_choice import ProductsChoice
from skipsearch.cpu.shared_core import SharedCores, choose_shared_cores, engaged, piece_counts
from skipsearch.cpu.threads import ThreadChoice
from skipsearch.engine.autoregressive import autoregressive_decode
from skipsearch.engine.ssd import speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.loading import load_model
from skipsearch.models.random_weights import RandomWeights
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import needs_tiles, tiny_model

# each product kernel, skipped where its library does not load on this CPU
KERNELS_HERE = [
    pytest.param(
        kernel,
        marks=pytest.mark.skipif(
            kernel_library(kernel).function is None, reason=f"{kernel}: {kernel_library(kernel).reason}"
        ),
    )
    for kernel in KERNELS
]


@pytest.fixture
def plan(monkeypatch: pytest.MonkeyPatch) -> Callable[[SharedCores | None], None]:
    """Sets the helpers planned for this test (the module's plan, reset after)."""

    def set_for_test(cores: SharedCores | None) -> None:
        monkeypatch.setattr(shared_core, "_plan", cores)

    return set_for_test


@pytest.mark.parametrize("kernel", KERNELS_HERE)
def test_helpers_only_where_one_thread_is_all_the_load_leaves(kernel: str) -> None:
    shared = choose_shared_cores(1, (0.9, 0.05), kernel, allowed={0, 1})
    assert shared == SharedCores(caller=1, helpers=(0,), kernel=kernel)  # the caller on the least busy core
    assert "busy core 0" in shared.describe() and "core 1" in shared.describe()
    # two threads: the load left both cores
    assert choose_shared_cores(2, (0.9, 0.05), kernel, allowed={0, 1}) is None
    assert choose_shared_cores(1, (0.05,), kernel, allowed={0, 1}) is None  # one core: nothing to share
    assert choose_shared_cores(1, (), kernel, allowed={0, 1}) is None  # the shares were not measured
    assert choose_shared_cores(1, (0.9, 0.05), None, allowed={0, 1}) is None  # products on torch's kernels
    # only the cores this process may run on: /proc/stat lists the host's
    assert choose_shared_cores(1, (0.0, 0.9, 0.05, 0.0), kernel, allowed={1, 2}) == SharedCores(
        2, (1,), kernel
    )
    assert choose_shared_cores(1, (0.0, 0.9), kernel, allowed={1}) is None


def test_without_a_plan_a_decode_engages_nothing(plan) -> None:
    plan(None)
    with engaged() as on:
        assert not on


def _products(generator: torch.Generator, kernel: str) -> list[tuple[Bf16WeightLinear, torch.Tensor]]:
    """Products on `kernel` of shapes whose outputs end mid-piece and mid-tile, at 1-16 rows."""
    shapes = [(64, 37), (200, 130), (576, 1536), (96, 4100)]
    return [
        (
            Bf16WeightLinear(
                torch.randn(out, inputs, generator=generator), torch.randn(out, generator=generator), kernel
            ),
            torch.randn(1, rows, inputs, generator=generator),
        )
        for inputs, out in shapes
        for rows in (1, 2, 5, 16)
    ]


@pytest.mark.parametrize("kernel", KERNELS_HERE)
@pytest.mark.parametrize("held", [0, 3000])
def test_shared_products_are_one_threads_bits(plan, held: int, kernel: str) -> None:
    """The helper on another core where there is one; `held`: it holds a piece as long as a
    descheduled helper would, so that the caller takes it back and the helper, late, drops its
    result. The outputs are the bits of the unshared products, every time."""
    cores = sorted(os.sched_getaffinity(0))
    caller = cores[0]
    plan(SharedCores(caller, (cores[-1],), kernel))
    products = _products(torch.Generator().manual_seed(3), kernel)
    expected = [product(x) for product, x in products]
    before = piece_counts(kernel)
    mask = os.sched_getaffinity(0)
    with engaged() as on:
        assert on and os.sched_getaffinity(0) == {caller}
        shared_core.hold_next_piece(kernel, held)
        for _ in range(20):
            for (product, x), want in zip(products, expected, strict=True):
                assert torch.equal(product(x), want)
    assert os.sched_getaffinity(0) == mask  # the caller's affinity is restored
    done, taken = (after - first for after, first in zip(piece_counts(kernel), before, strict=True))
    assert done > 0  # the helper computed pieces
    if held:
        assert taken >= 1  # the held piece was taken back


@needs_tiles
def test_a_nested_block_runs_as_the_enclosing_one(plan) -> None:
    cores = sorted(os.sched_getaffinity(0))
    plan(SharedCores(cores[0], (cores[-1],), TILES))
    with engaged() as outer:
        with engaged() as inner:
            assert outer and inner
        assert os.sched_getaffinity(0) == {cores[0]}  # the inner block did not disengage
    assert os.sched_getaffinity(0) == set(cores)


@pytest.mark.parametrize("kernel", KERNELS_HERE)
def test_decodes_engage_the_helpers_and_decode_the_same_tokens(plan, kernel: str) -> None:
    """Autoregressive and speculative decoding on shared products (one piece held, so taken back
    mid-decode) give the tokens they give without: the lossless check's bits do not move."""
    model = tiny_model("llama", layers=3, hidden_size=64, intermediate_size=2048, vocab_size=4096)
    use_bf16_weights(model, kernel)
    runner = LayerwiseRunner(model)
    prompt = [5, 9, 2, 7]
    plan(None)
    alone = autoregressive_decode(runner, prompt, 16).tokens
    speculated = speculative_decode(runner, prompt, SkipMask.from_layers(3, [1]), 16, gamma=3).tokens
    cores = sorted(os.sched_getaffinity(0))
    plan(SharedCores(cores[0], (cores[-1],), kernel))
    before = piece_counts(kernel)
    shared_core.hold_next_piece(kernel, 2000)
    assert autoregressive_decode(runner, prompt, 16).tokens == alone
    assert speculative_decode(runner, prompt, SkipMask.from_layers(3, [1]), 16, gamma=3).tokens == speculated
    done, taken = (after - first for after, first in zip(piece_counts(kernel), before, strict=True))
    assert done > 0 and taken >= 1


@needs_tiles
@pytest.mark.parametrize("busy", [True, False])
def test_the_load_plans_helpers_only_beside_a_busy_core(
    plan, monkeypatch: pytest.MonkeyPatch, busy: bool
) -> None:
    """`load_model` plans the helpers where the thread choice left one thread of two and the
    products run on the tiles, and its plan line says where each thread runs."""
    plan(None)
    monkeypatch.setattr(bf16_activations, "choose_activations", lambda: ActivationChoice(FLOAT32))
    monkeypatch.setattr(fp32_linear, "choose_fp32_linear", lambda: Fp32Linear(BF16_KERNEL))
    monkeypatch.setattr(
        products_choice, "choose_products", lambda model, build, runner: ProductsChoice(TILES)
    )
    threads = (
        ThreadChoice(1, "1 of 2 threads", 1.0, (0.97, 0.02))
        if busy
        else ThreadChoice(2, "2", 0.0, (0.0, 0.0))
    )
    monkeypatch.setattr(threads_module, "fit_threads_to_load", lambda: threads)
    loaded = load_model("smollm2-135m", "cpu", "auto", RandomWeights(num_layers=1))
    if busy:
        assert shared_core._plan == SharedCores(caller=1, helpers=(0,), kernel=TILES)
        assert (
            "shared with a helper on busy core 0" in loaded.plan.details
            and "on core 1" in loaded.plan.details
        )
    else:
        assert shared_core._plan is None and "helper" not in loaded.plan.details


# each int kernel's builds this CPU runs (the AVX2 one as well as the AVX-512 one)
INT_BUILDS = [
    pytest.param(kind, width, id=f"{kind}-{width}")
    for kind in (int_linear.INT8, int_linear.INT4)
    for width in int_linear.builds(kind)
]


@pytest.mark.parametrize(("kind", "width"), INT_BUILDS)
@pytest.mark.parametrize("held", [0, 3000])
def test_shared_int_products_are_one_threads_bits(plan, held: int, kind: str, width: int) -> None:
    """As the bf16 kernels': the int8/int4 products shared with a helper (one piece held, taken
    back) are the bits of the unshared ones, in each build."""
    generator = torch.Generator().manual_seed(5)
    # outputs ending mid-piece; the last shape long enough (64 pieces) that a helper on a loaded
    # machine gets some before the caller has claimed them all
    shapes = [(64, 37), (256, 130), (576, 1536), (128, 4100), (1536, 8192)]
    products = [
        (
            Int8Linear(w, b, width=width) if kind == int_linear.INT8 else Int4Linear(w, b, 64, width=width),
            torch.randn(1, rows, inputs, generator=generator),
        )
        for inputs, out in shapes
        for w, b in [(torch.randn(out, inputs, generator=generator), torch.randn(out, generator=generator))]
        for rows in (1, 3, 16)
    ]
    expected = [product(x) for product, x in products]
    library = int_linear.builds(kind)[width]
    cores = sorted(os.sched_getaffinity(0))
    plan(SharedCores(cores[0], (cores[-1],), next(k for k in KERNELS if kernel_library(k).function)))
    before = piece_counts(library)
    mask = os.sched_getaffinity(0)
    with engaged() as on:
        assert on and os.sched_getaffinity(0) == {cores[0]}
        shared_core.hold_next_piece(library, held)
        for _ in range(10):
            for (product, x), want in zip(products, expected, strict=True):
                assert torch.equal(product(x), want)
    assert os.sched_getaffinity(0) == mask
    done, taken = (after - first for after, first in zip(piece_counts(library), before, strict=True))
    assert done > 0
    if held:
        assert taken >= 1
