"""`skipsearch speedup`: numbers, gamma selection, the grid, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from skipsearch import cli


@pytest.fixture(autouse=True)
def only_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register only this command, so the test does not depend on the model-loading ones."""
    monkeypatch.setattr(cli, "COMMANDS", ("speedup",))


def speedup_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert cli.main(["speedup", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_separate_draft_at_fixed_gamma(capsys) -> None:
    sd = speedup_json(capsys, "--alpha", "0.8", "--gamma", "3", "--c", "0.3")["forms"]["sd"]
    assert round(sd["speedup"], 2) == 1.55
    assert sd["speedup"] == pytest.approx(2.952 / 1.9)
    assert (sd["gamma"], sd["tokens_per_round"], sd["best_gamma"]) == (3, pytest.approx(2.952), 3)
    assert sd["params"] == {"c": 0.3, "epsilon": 0.0}


def test_best_gamma_is_the_argmax(capsys) -> None:
    sd = speedup_json(capsys, "--alpha", "0.9", "--c", "0.3")["forms"]["sd"]
    curve = sd["speedup_by_gamma"]
    assert sd["gamma"] == sd["best_gamma"] == 5
    assert sd["speedup"] == max(curve.values()) == curve["5"]
    assert list(curve) == [str(g) for g in range(1, 9)]


def test_self_speculative_forms(capsys) -> None:
    forms = speedup_json(capsys, "--alpha", "0.8", "--gamma", "3", "--r-draft", "0.5")["forms"]
    assert forms["ssd_contiguous"]["speedup"] == pytest.approx(2.952 / 2.0)
    forms = speedup_json(capsys, "--alpha", "0.8", "--gamma", "3", "--r-draft", "0.5", "--r-reuse", "0.25")[
        "forms"
    ]
    assert forms["ssd"]["speedup"] == pytest.approx(2.952 / 2.25)
    forms = speedup_json(
        capsys, "--alpha", "0.8", "--gamma", "3", "--c", "0.5", "--r-draft", "0.5", "--r-reuse", "0"
    )
    assert forms["forms"]["ssd"]["speedup"] == pytest.approx(forms["forms"]["sd"]["speedup"])


def test_head_share_prices_a_smaller_draft_head(capsys) -> None:
    args = ["--alpha", "0.8", "--gamma", "2", "--r-draft", "0.5", "--head-share", "0.2"]
    forms = speedup_json(capsys, *args, "--draft-vocab-share", "0.25")["forms"]
    # Each draft step saves 0.2 x (1 - 0.25) = 0.15: round cost 1 + 0.5 - 2 x 0.15 = 1.2.
    assert forms["ssd_contiguous"]["params"]["head_saving"] == pytest.approx(0.15)
    assert forms["ssd_contiguous"]["speedup"] == pytest.approx(2.44 / 1.2)
    forms = speedup_json(capsys, *args, "--draft-vocab-share", "0.25", "--r-reuse", "0.25")["forms"]
    assert forms["ssd"]["speedup"] == pytest.approx(2.44 / (2 * 0.35 + 0.75))
    full = speedup_json(capsys, *args, "--draft-vocab-share", "1")["forms"]["ssd_contiguous"]
    assert full["speedup"] == pytest.approx(2.44 / 1.5)


KV_WHAT_IF = ("--kv-window", "1020", "--context", "8192", "--kv-share", "0.5", "--kv-sink", "4")


def test_a_kv_pattern_what_if_saves_the_unread_keys_share_and_reuses_nothing(capsys) -> None:
    forms = speedup_json(capsys, "--alpha", "0.9", "--gamma", "3", "--r-draft", "1", *KV_WHAT_IF)["forms"]
    assert list(forms) == ["ssd"]
    saving = 0.5 * 1.0 * (1 - 1024 / 8192)
    assert forms["ssd"]["params"] == pytest.approx(
        {"r_draft": 1.0, "r_reuse": 0.0, "epsilon": 0.0, "head_saving": 0.0, "kv_saving": saving}
    )
    assert forms["ssd"]["speedup"] == pytest.approx((1 - 0.9**4) / 0.1 / (3 * (1 - saving) + 1))


def test_epsilon(capsys) -> None:
    sd = speedup_json(capsys, "--alpha", "0.8", "--gamma", "3", "--c", "0.3", "--epsilon", "0.1")["forms"][
        "sd"
    ]
    assert sd["speedup"] == pytest.approx(2.952 / (0.9 + 1.3))


def test_position_dependent_alphas_cap_gamma_max(capsys) -> None:
    result = speedup_json(capsys, "--alphas", "0.9,0.8,0.5", "--c", "0.3")
    assert result["gamma_max"] == 3
    sd = result["forms"]["sd"]
    assert sd["speedup_by_gamma"]["3"] == pytest.approx(2.98 / 1.9)


def test_table_reproduces_reference_001_grid(capsys) -> None:
    grid = speedup_json(capsys, "--table", "--c", "0.3")["table"]["sd"]
    assert grid["alphas"] == [0.6, 0.7, 0.8, 0.9]
    assert grid["gammas"] == [1, 2, 3, 4, 6, 8]
    assert round(grid["speedup"][3][3], 2) == 1.86
    assert [round(v, 2) for v in grid["speedup"][0]] == [1.23, 1.31, 1.38, 1.46]
    custom = speedup_json(capsys, "--table", "--c", "0.3", "--table-alphas", "0.5", "--table-gammas", "2")
    assert custom["table"]["sd"]["speedup"] == [[pytest.approx(1.75 / 1.6)]]


def test_human_output(capsys) -> None:
    assert cli.main(["speedup", "--alpha", "0.8", "--gamma", "3", "--c", "0.3", "--table"]) == 0
    out = capsys.readouterr().out
    assert "c=0.3 epsilon=0" in out
    assert "1.55" in out
    assert "2.952" in out
    assert "1.86" in out  # the grid


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "1.5", "--c", "0.3"], "--alpha 1.5 is above 1: pass --alpha 1 or less"),
        (["--alpha", "0.8", "--gamma", "0", "--c", "0.3"], "--gamma 0 is below 1: pass --gamma 1 or more"),
        (
            ["--alpha", "0.8", "--gamma", "three", "--c", "0.3"],
            "--gamma 'three' is not an integer: pass an integer in 1..32, e.g. --gamma 3 (or 'best')",
        ),
        (["--alpha", "0.8", "--gamma-max", "0", "--c", "0.3"], "pass --gamma-max 1 or more"),
        (["--alpha", "0.8", "--gamma-max", "1000000000", "--c", "0.3"], "pass --gamma-max 32 or less"),
        (["--alpha", "0.8", "--c", "0"], "--c 0.0 must be above 0"),
        (["--alpha", "0.8", "--r-draft", "0.3", "--r-reuse", "0.5"], "r_reuse must be in [0, r_draft=0.3]"),
        (["--alpha", "0.8", "--r-reuse", "0.5"], "--r-reuse needs --r-draft"),
        (["--alpha", "0.8"], "give a draft cost"),
        (["--c", "0.3"], "give the acceptance"),
        (["--alpha", "0.8", "--c", "0.3", "--epsilon", "-1"], "pass --epsilon 0 or more"),
        (["--alphas", "0.9,x", "--c", "0.3"], "--alphas 'x' is not a number"),
        (["--alphas", "0.9,nan", "--c", "0.3"], "--alphas nan is not a finite number"),
        (["--alphas", "0.9,0.8", "--gamma-max", "4", "--c", "0.3"], "alpha_1..alpha_"),
        (["--alpha", "0.8", "--r-draft", "0.5", "--head-share", "0.2"], "go together"),
        (["--alpha", "0.8", "--r-draft", "0.5", "--draft-vocab-share", "0.2"], "go together"),
        (
            ["--alpha", "0.8", "--c", "0.5", "--head-share", "0.2", "--draft-vocab-share", "0.2"],
            "give --r-draft",
        ),
        (
            ["--alpha", "0.8", "--r-draft", "0.5", "--head-share", "1", "--draft-vocab-share", "0.2"],
            "--head-share 1.0 must be below 1",
        ),
        (
            ["--alpha", "0.8", "--r-draft", "0.5", "--head-share", "0.2", "--draft-vocab-share", "0"],
            "must be above 0",
        ),
        (
            ["--alpha", "0.8", "--r-draft", "0.5", "--head-share", "0.2", "--draft-vocab-share", "1.5"],
            "is above 1",
        ),
        (
            ["--alpha", "0.8", "--r-draft", "1", "--kv-window", "512"],
            "needs --r-draft, --context and --kv-share",
        ),
        (["--alpha", "0.8", "--r-draft", "1", "--context", "8192"], "give --kv-window too"),
        (
            ["--alpha", "0.8", "--r-draft", "1", *KV_WHAT_IF[:4], "--kv-share", "2"],
            "pass --kv-share 1 or less",
        ),
        (
            ["--alpha", "0.8", "--r-draft", "1", "--kv-window", "0", *KV_WHAT_IF[2:]],
            "pass --kv-window 1 or more",
        ),
        (["--alpha", "0.8", "--r-draft", "1", "--r-reuse", "0.5", *KV_WHAT_IF], "verify reuses nothing"),
    ],
)
def test_invalid_arguments_exit_2_with_one_line(capsys, args: list[str], message: str) -> None:
    assert cli.main(["speedup", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("skipsearch: error: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1


SERVING = ("--memory", "80", "--weights", "37.5", "--draft-weights", "3.75", "--kv-per-sequence", "1")


def test_serving_a_batch_shows_what_holding_one_set_of_weights_buys(capsys) -> None:
    result = speedup_json(capsys, "--alpha", "0.8", "--c", "0.1", "--r-draft", "0.5", *SERVING)
    serving, forms = result["serving"], result["forms"]
    assert (serving["batch_ssd"], serving["batch_sd"]) == (42, 38)
    assert serving["beta"] == pytest.approx(42 / 38)
    ssd, sd = forms["ssd_contiguous"]["best_speedup"], forms["sd"]["best_speedup"]
    assert sd > ssd  # per sequence a cheap separate draft wins; beta narrows the gap at full batch
    assert serving["throughput_ssd_over_sd"] == pytest.approx(42 / 38 * ssd / sd)


def test_serving_needs_all_four_budgets_and_both_drafts(capsys) -> None:
    assert cli.main(["speedup", "--alpha", "0.8", "--r-draft", "0.5", *SERVING]) == 2
    assert "with --c (SD) and --r-draft (SSD)" in capsys.readouterr().err
    assert cli.main(["speedup", "--alpha", "0.8", "--c", "0.1", "--r-draft", "0.5", "--memory", "80"]) == 2
    assert (
        "give --memory, --weights, --draft-weights and --kv-per-sequence together" in capsys.readouterr().err
    )
