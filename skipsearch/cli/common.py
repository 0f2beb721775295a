"""Options shared by the commands that touch a model: which model, which prompts, which mask."""

from __future__ import annotations

import argparse
from typing import Any

from skipsearch.acceptance.measure_config import ESTIMATOR_MODES, MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec, resolve_source
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask, parse_draft_vocab, parse_layer_list, split_draft
from skipsearch.models.random_weights import RandomWeights
from skipsearch.models.registry import DEFAULT_MODEL
from skipsearch.options import dtype_type, option_type


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="alias (`skipsearch models`), HF id, local dir or .gguf file (default %(default)s)",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda (default %(default)s)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        type=dtype_type,
        help="auto (bfloat16 on a GPU and on a CPU that multiplies bf16 natively, unless float32 "
        "activations on bf16 weights measure faster there; else float32; the choice and its reason "
        "are printed) or a torch dtype (default %(default)s)",
    )


def add_weight_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("weight-free models (latency only: docs/gpu.md)")
    group.add_argument(
        "--random-weights",
        action="store_true",
        help="build the architecture from its shipped config with seeded random weights (no download)",
    )
    group.add_argument(
        "--num-layers",
        type=option_type("num_layers"),
        help="with --random-weights: keep the width, cut the depth to N layers",
    )


def random_weights(args: argparse.Namespace) -> RandomWeights | None:
    """The weight-free model `--random-weights` / `--num-layers` ask for, or None for real weights."""
    if not args.random_weights:
        if args.num_layers is not None:
            raise ConfigError("--num-layers only applies with --random-weights: add it, or drop --num-layers")
        return None
    return RandomWeights(num_layers=args.num_layers)


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prompts",
        nargs="+",
        default=[PromptSpec.source],
        metavar="SOURCE",
        help=f"humaneval | stdlib | stdlib-long | spec-bench PATH | PATH.jsonl (default {PromptSpec.source})",
    )
    parser.add_argument(
        "--n-prompts",
        type=option_type("n_prompts"),
        default=PromptSpec.n_prompts,
        help="prompts to measure on (default %(default)s)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=option_type("max_prompt_tokens"),
        default=PromptSpec.max_prompt_tokens,
        help="keep the last N prompt tokens (default %(default)s)",
    )
    parser.add_argument(
        "--new-tokens",
        type=option_type("new_tokens"),
        default=PromptSpec.new_tokens,
        help="continuation length per prompt (default %(default)s)",
    )
    parser.add_argument(
        "--prompt-seed",
        type=option_type("prompt_seed"),
        default=PromptSpec.seed,
        help="which prompts are drawn (default %(default)s); apart from --seed, so searches with "
        "different seeds measure the same prompts",
    )
    parser.add_argument(
        "--mode",
        choices=ESTIMATOR_MODES,
        default="shared-kv",
        help="estimator: the draft reads the full model's K/V for earlier positions (shared-kv), "
        "its own within each round simulated at --round-gamma (rounds: exact for the engine at that "
        "gamma, 2-4 passes per mask), or its own everywhere (self) (default %(default)s)",
    )
    parser.add_argument(
        "--round-gamma",
        type=option_type("round_gamma"),
        help="the draft length whose rounds --mode rounds simulates (default 3; decode: its --gamma)",
    )


def add_draft_vocab_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--draft-vocab",
        metavar="K|full",
        help=f"{help_text}: the K most frequent token ids (counted on text disjoint from the prompts), "
        "or full",
    )


def draft_vocab_from_args(args: argparse.Namespace) -> int | None:
    """`--draft-vocab`, or the `|v:K` of a draft string given to `--mask` (as a run's tables print
    drafts): None (full) or the size, a one-line error for anything else or for two that differ."""
    given = parse_draft_vocab(getattr(args, "draft_vocab", None))
    return _flags_or_mask(args, given, 1, "draft vocabularies", "v", "--draft-vocab says")


def _flags_or_mask(args: argparse.Namespace, given: Any, part: int, what: str, key: str, flags: str) -> Any:
    """`given` (read from flags) or part `part` of the draft string given to `--mask`
    (`split_draft`), whichever is set; a one-line error when both are and differ."""
    mask_text = getattr(args, "mask", None)
    in_mask = split_draft(mask_text)[part] if mask_text else None
    if given is not None and in_mask is not None and given != in_mask:
        raise ConfigError(f"two {what}: --mask says {key}:{in_mask}, {flags} {given}; give one")
    return given if given is not None else in_mask


def add_kv_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "KV pattern (the draft attends to a sink, a recent window and pillars the last verify chose)"
    )
    group.add_argument(
        "--kv-sink",
        type=option_type("kv_sink"),
        metavar="S",
        help="the first S positions (default 0 with --kv-window)",
    )
    group.add_argument(
        "--kv-window",
        type=option_type("kv_window"),
        metavar="W",
        help="the last W positions, the draft's own included",
    )
    group.add_argument(
        "--kv-pillars",
        type=option_type("kv_pillars"),
        metavar="K",
        help="K more keys per layer and K/V head, those the previous verify attended to most (default 0)",
    )


def kv_pattern_from_args(args: argparse.Namespace) -> KVPattern | None:
    """`--kv-sink/--kv-window/--kv-pillars`, or the `|kv:sSwW[kK]` of a draft string given to
    `--mask`: None (every key) or the pattern; a one-line error for a bad pattern or for two that
    differ."""
    sink, window = getattr(args, "kv_sink", None), getattr(args, "kv_window", None)
    pillars = getattr(args, "kv_pillars", None)
    for flag, value in (("--kv-sink", sink), ("--kv-pillars", pillars)):
        if value is not None and window is None:
            raise ConfigError(
                f"{flag} needs --kv-window: the draft attends to a recent window, e.g. --kv-window 1024"
            )
    given = None
    if window is not None:
        given = KVPattern(0 if sink is None else sink, window, 0 if pillars is None else pillars)
    return _flags_or_mask(args, given, 2, "KV patterns", "kv", "--kv-sink/--kv-window/--kv-pillars say")


def add_mask_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("mask (layer indices from 0; ranges like 20-23 allowed)")
    group.add_argument("--skip", help="layers to skip entirely, e.g. 4,14 ('' = empty mask)")
    group.add_argument("--attn-skip", help="attention sub-layers to skip")
    group.add_argument("--mlp-skip", help="MLP sub-layers to skip")
    group.add_argument(
        "--mask", help="stable mask string, e.g. a:4,14|m:4,14,20, or a draft's a:4,14|m:4,14,20|v:8192"
    )


def prompt_spec(args: argparse.Namespace) -> PromptSpec:
    value, *rest = args.prompts
    if len(rest) > 1:
        raise ConfigError(f"--prompts takes a source and at most one path, got {' '.join(args.prompts)}")
    return PromptSpec(
        source=resolve_source(value, rest[0] if rest else None),
        n_prompts=args.n_prompts,
        max_prompt_tokens=args.max_prompt_tokens,
        new_tokens=args.new_tokens,
        seed=args.prompt_seed,
    )


def measure_config(args: argparse.Namespace) -> MeasureConfig:
    """The measurement the command asks for; with `--draft-vocab K`, K is measured too, and with a
    KV pattern (`--kv-window`, or `|kv:` in `--mask`) the pattern too."""
    size, kv = draft_vocab_from_args(args), kv_pattern_from_args(args)
    return MeasureConfig(
        model=args.model,
        prompts=prompt_spec(args),
        mode=args.mode,
        round_gamma=MeasureConfig.round_gamma if args.round_gamma is None else args.round_gamma,
        device=args.device,
        dtype=args.dtype,
        draft_vocabs=() if size is None else (size,),
        kv_patterns=() if kv is None else (kv,),
    )


def check_mask_args(args: argparse.Namespace, num_layers: int | None) -> None:
    """The mask options, checked before the model loads: the whole mask when the depth is known
    without loading (`known_depth`), else their syntax (a backwards range, a typo)."""
    if num_layers is not None:
        mask_from_args(args, num_layers)
        return
    _check_given_once(args)
    for text in (args.skip, args.attn_skip, args.mlp_skip):
        if text is not None:
            parse_layer_list(text)


def _check_given_once(args: argparse.Namespace) -> None:
    sublayer = args.attn_skip is not None or args.mlp_skip is not None
    given = sum([args.skip is not None, args.mask is not None, sublayer])
    if given != 1:
        raise ConfigError("give the mask once: --skip, --mask, or --attn-skip/--mlp-skip")


def mask_from_args(args: argparse.Namespace, num_layers: int) -> SkipMask:
    """Build the mask from exactly one of --skip, --mask, or --attn-skip/--mlp-skip."""
    _check_given_once(args)
    if args.skip is not None:
        return SkipMask.from_layers(num_layers, parse_layer_list(args.skip))
    if args.mask is not None:
        return SkipMask.parse(split_draft(args.mask)[0], num_layers)
    return SkipMask(num_layers, parse_layer_list(args.attn_skip or ""), parse_layer_list(args.mlp_skip or ""))
