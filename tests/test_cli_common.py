"""The mask and vocabulary options shared by `measure` and `decode`."""

from __future__ import annotations

import argparse

import pytest

from skipsearch.cli.common import draft_vocab_from_args, mask_from_args
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask


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
