"""The kernel plan's record (`models.plan.KernelPlan`, `models.backend`): one short line for every
command, the whole record with its timings for `skipsearch plan` and the JSON outputs."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from skipsearch.cpu.threads import ThreadChoice
from skipsearch.models.backend import ATTENTION_WORDS, PRODUCT_WORDS, plan_words
from skipsearch.models.loading import load_model
from skipsearch.models.plan import LINE_LIMIT, KernelPlan, PlanPart
from skipsearch.models.random_weights import RandomWeights
from tests.conftest import tiny_model


def test_the_line_names_the_choices_and_points_to_the_details() -> None:
    plan = KernelPlan(("bf16 weights", "fp32 activations", "vector products"), (PlanPart("dtype", "x"),))
    assert plan.line == "kernel plan: bf16 weights, fp32 activations, vector products (skipsearch plan)"
    assert str(plan) == plan.line
    assert plan.to_record() == {"kernel_plan_line": plan.line, "kernel_plan": "x"}


def test_the_longest_plan_of_any_cpu_fits_in_one_line() -> None:
    """Every combination of the words a plan can have, with helpers on the most busy cores a
    2-socket machine could name, stays within the limit without being cut."""
    helpers = "1 thread + 8 helpers on busy cores"  # `cpu.shared_core.MAX_HELPERS`
    for products, attention in itertools.product(PRODUCT_WORDS.values(), ATTENTION_WORDS.values()):
        words = ("bf16 weights", "fp32 activations", products, attention, "fused layers", helpers)
        line = KernelPlan(words).line
        assert len(line) <= LINE_LIMIT and "…" not in line, line


def test_a_line_past_the_limit_is_cut_and_still_points_to_the_details() -> None:
    line = KernelPlan(("word " * 60,)).line
    assert len(line) <= LINE_LIMIT and line.endswith("… (skipsearch plan)")


def test_the_table_gives_each_choice_a_row_with_its_measurement() -> None:
    plan = KernelPlan(("a",), (PlanPart("dtype", "float32 (why)"), PlanPart("attention", "SDPA (0.1 ms)")))
    assert plan.table().splitlines() == ["dtype      float32 (why)", "attention  SDPA (0.1 ms)"]
    assert plan.details == "float32 (why); SDPA (0.1 ms)"


def test_words_read_the_model_as_the_plan_left_it() -> None:
    model = tiny_model("llama", layers=1)
    words = plan_words(model, "float32", "cpu", ThreadChoice(2, "2 threads"), None)
    assert words == (
        "fp32 weights",
        "fp32 activations",
        "torch products",
        model.config._attn_implementation,
        "2 threads",
    )
    assert plan_words(model, "bfloat16", "cuda", None, None)[-1] == "cuda"


@pytest.mark.slow
def test_a_loaded_model_prints_its_short_line_and_records_the_whole_plan(capsys) -> None:
    loaded = load_model("smollm2-135m", random_weights=RandomWeights(num_layers=1))
    printed = capsys.readouterr().out
    assert loaded.plan.line in printed and len(loaded.plan.line) <= LINE_LIMIT
    assert loaded.plan.details not in printed  # the whole record is `skipsearch plan`'s
    assert [part.what for part in loaded.plan.parts][:2] == ["dtype", "attention"]
    assert loaded.plan.parts[-1].what in ("threads", "shared cores")


def test_helpers_on_busy_cores_are_counted_in_the_line() -> None:
    model = tiny_model("llama", layers=1)
    threads = ThreadChoice(1, "1 of 2 threads")
    one = plan_words(model, "float32", "cpu", threads, SimpleNamespace(helpers=(0,)))
    assert one[-1] == "1 thread + a helper on a busy core"
    three = plan_words(model, "float32", "cpu", threads, SimpleNamespace(helpers=(0, 2, 3)))
    assert three[-1] == "1 thread + 3 helpers on busy cores"
