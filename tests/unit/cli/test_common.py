"""The options every command shares (`cli/common.py`): each help text states its default; a draft
string's vocabulary; weight-free models (`--random-weights`, `--num-layers`): refusals, and a profile
and decode of the Mistral-7B shape on this CPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from skipsearch import cli
from skipsearch.bench.latency_profiler import DEFAULT_POSITIONS
from skipsearch.cli import build_parser
from skipsearch.cli.common import draft_vocab_from_args, mask_from_args
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_help_states_every_default() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [
        f"{name} {action.option_strings[0]}"
        for name, command in commands.items()
        for action in command._actions
        if action.option_strings
        and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["measure", "--random-weights", "--skip", "4"], "meaningless on random weights"),
        (["profile", "--num-layers", "2"], "--num-layers only applies with --random-weights"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.slow
def test_profile_of_the_mistral_7b_shape_on_this_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The acceptance criterion of issue 14: a 2-layer cut of the 7B architecture, scaled to 32."""
    out = tmp_path / "mistral.json"
    args = (
        "--model mistral-7b --random-weights --num-layers 2 --context-lengths 128 --processes 1 --repeats 2 "
        "--warmup 0"
    )
    assert cli.main(["profile", *args.split(), "--out", str(out)]) == 0
    assert "depth scaled" in out.with_suffix(".txt").read_text()  # the tables beside the profile
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert (meta["num_layers"], meta["measured_layers"], meta["hidden_size"]) == (32, 2, 4096)
    assert meta["random_weights"] is True
    assert np.asarray(data["attn"]).shape == (32, 1, len(DEFAULT_POSITIONS))
    profile = LatencyProfile.load(out)
    assert profile.weights(128).attn[0] == profile.weights(128).attn[31] > 0


@pytest.mark.slow
def test_decode_of_the_mistral_7b_shape_on_this_cpu(tmp_path: Path) -> None:
    """GQA, a 32k vocabulary and 4,096-wide layers through every decoder, without a tokenizer."""
    out = tmp_path / "decode.json"
    args = (
        "decode --model mistral-7b --random-weights --num-layers 2 --skip 1 --gamma 2 --n-prompts 1 "
        "--max-prompt-tokens 8 --new-tokens 4 --repeats 1"
    )
    assert cli.main([*args.split(), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["random_weights"] is True and result["estimators"] == []
    assert result["lossless"] is True and result["hf_matches_autoregressive"] is True
    assert set(result["summaries"]) == {"autoregressive", "hf-generate", "ssd", "hf-early-exit"}


# -- the mask and draft-vocabulary options of measure and decode ----------------------------------
def options(**given: str | None) -> argparse.Namespace:
    fields = {"skip": None, "attn_skip": None, "mlp_skip": None, "mask": None, "draft_vocab": None}
    return argparse.Namespace(**(fields | given))


def test_a_draft_string_printed_by_a_run_is_a_mask_and_a_vocabulary() -> None:
    args = options(mask="a:2,7|m:2,7|v:32768")
    assert mask_from_args(args, 24) == SkipMask(24, [2, 7], [2, 7])
    assert draft_vocab_from_args(args) == 32768


def test_the_vocabulary_may_come_from_either_option_but_not_two_that_differ() -> None:
    assert draft_vocab_from_args(options(mask="a:2|m:2", draft_vocab="4096")) == 4096
    assert draft_vocab_from_args(options(mask="a:2|m:2|v:4096", draft_vocab="4096")) == 4096
    assert draft_vocab_from_args(options(skip="2")) is None
    with pytest.raises(ConfigError, match="two draft vocabularies"):
        draft_vocab_from_args(options(mask="a:2|m:2|v:4096", draft_vocab="8192"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "--strategies", "random,random"], "--strategies random,random names random twice"),
        (
            ["run", "--strategy", "random", "--warm-start"],
            "--warm-start does not apply with --strategy random",
        ),
        (["run", "--strategy", "random", "--sampler", "cmaes"], "--sampler cmaes does not apply"),
        (["run", "--importance", "measured"], "--importance measured does not apply with --strategy learned"),
        (
            ["run", "--pareto", "--objective", "acceptance"],
            "--pareto does not apply with --objective acceptance",
        ),
        (["decode", "--skip", "1", "--top-k", "5"], "--top-k 5 does not apply with --temperature 0.0"),
        (["decode", "--skip", "1", "--require-graphs"], "--require-graphs does not apply without --from"),
        (["decode", "--skip", "1", "--tree", ""], "--tree '' is empty"),
        (["run", "--out", " "], "--out ' ' is empty"),
        (["measure", "--mask", "|||"], "--mask '|||' is empty"),
        (["models", "--assemble", ""], "--assemble '' is empty"),
        (["export", "run", "--export-key", "\n"], "--export-key '\\n' is empty"),
    ],
)
def test_the_command_line_judges_its_settings_as_a_whole_before_any_work(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, *(["--out", "o"] if argv[0] == "compare" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written: refused before any work
