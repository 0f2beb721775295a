"""The decoders a benchmark compares, each as `decode(prompt, generator) -> DecodeTrace`.

`make_decoders` builds the standard set — the layer-wise autoregressive baseline, HF `generate`,
our SSD engine and, for a contiguous prefix, HF's `assistant_early_exit` — with one stopping rule;
`bench.interleaved.benchmark` times them side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from skipsearch.engine.autoregressive import autoregressive_decode
from skipsearch.engine.gamma import GammaPolicy
from skipsearch.engine.graphed_decode import graphed_autoregressive_decode, graphed_speculative_decode
from skipsearch.engine.graphed_tree import TreeGraphSteps, graphed_tree_decode
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.sampling import Sampling
from skipsearch.engine.ssd import speculative_decode
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.kernels import new_cache
from skipsearch.models.loading import LoadedModel, eos_ids
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import Tree

AR, HF, SSD, EARLY_EXIT = "autoregressive", "hf-generate", "ssd", "hf-early-exit"
SSD_CHAIN = "ssd-chain"  # a tree's draft as a chain, beside the tree
AR_GRAPHS, SSD_GRAPHS = "autoregressive-graphs", "ssd-graphs"
SSD_CHAIN_GRAPHS = "ssd-chain-graphs"  # a graphed tree's draft as a graphed chain, beside the tree

# -- the decoders ---------------------------------------------------------------------------------
Decoder = Callable[[tuple[int, ...], torch.Generator | None], DecodeTrace]


def make_decoders(
    runner: LayerwiseRunner,
    loaded: LoadedModel,
    mask: SkipMask,
    policy: GammaPolicy,
    sampling: Sampling,
    max_new_tokens: int,
    head: DraftHead | None = None,
    kv: KVPattern | None = None,
    timed: bool = True,
    tree: Tree | None = None,
) -> dict[str, Decoder]:
    """Each configuration as `decode(prompt, generator) -> DecodeTrace`, same stopping rule.

    `head`: the SSD draft's head over a draft vocabulary; `kv`: its KV pattern (HF's early exit
    has neither, so it runs only for a plain contiguous prefix); `timed`: SSD records its rounds'
    phase breakdown, at a device sync per phase boundary (`engine.timing.RoundClock`); `tree`: SSD
    drafts token trees of that shape (`engine.tree_rounds`), and the same draft as a chain of `policy`'s
    γ runs beside it (`SSD_CHAIN`)."""
    model: Any = loaded.model
    tokenizer: Any = loaded.tokenizer
    stop = eos_ids(model)
    pad = getattr(tokenizer, "pad_token_id", None)  # a weight-free model has no tokenizer
    pad = min(stop, default=0) if pad is None else pad

    def generate(prompt: tuple[int, ...], generator: torch.Generator | None, **assist: Any) -> DecodeTrace:
        return hf_generate(model, prompt, max_new_tokens, sampling, generator, pad, **assist)

    decoders: dict[str, Decoder] = {
        AR: lambda prompt, generator: autoregressive_decode(
            runner, prompt, max_new_tokens, sampling, generator, stop
        ),
        HF: generate,
        SSD: lambda prompt, generator: speculative_decode(
            runner, prompt, mask, max_new_tokens, policy, sampling, generator, stop, head, kv, timed
        ),
    }
    if tree is not None:
        decoders[SSD_CHAIN] = decoders[SSD]
        decoders[SSD] = lambda prompt, generator: tree_decode(
            runner, prompt, mask, tree, max_new_tokens, sampling, generator, stop, head, timed, kv
        )
        return decoders
    if mask.exit_layer is not None and kv is None:

        def early_exit(prompt: tuple[int, ...], generator: torch.Generator | None) -> DecodeTrace:
            with assistant_settings(model, policy):
                return generate(prompt, generator, assistant_early_exit=mask.exit_layer)

        decoders[EARLY_EXIT] = early_exit
    return decoders


def graphed_decoders(
    steps: GraphSteps,
    policy: GammaPolicy,
    sampling: Sampling,
    max_new_tokens: int,
    stop: Collection[int],
    timed: bool = False,
    tree: TreeGraphSteps | None = None,
) -> dict[str, Decoder]:
    """The autoregressive baseline and mask 0's SSD replayed from the graphs of `steps`: a graphed
    engine is compared with a graphed baseline, never with an eager one. `timed` as in
    `make_decoders`: its syncs stall the replays, so it is off unless asked for. `tree`: SSD drafts
    token trees on its graphs (`engine.graphed_tree`), the graphed chain beside (`SSD_CHAIN_GRAPHS`)."""
    decoders: dict[str, Decoder] = {
        AR_GRAPHS: lambda prompt, generator: graphed_autoregressive_decode(
            steps, prompt, max_new_tokens, sampling, generator, stop
        ),
        SSD_GRAPHS: lambda prompt, generator: graphed_speculative_decode(
            steps, prompt, max_new_tokens, policy, sampling, generator, stop, timed
        ),
    }
    if tree is not None:
        decoders[SSD_CHAIN_GRAPHS] = decoders[SSD_GRAPHS]
        decoders[SSD_GRAPHS] = lambda prompt, generator: graphed_tree_decode(
            tree, prompt, max_new_tokens, sampling, generator, stop, timed
        )
    return decoders


def hf_generate(
    model: Any,
    prompt: tuple[int, ...],
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator | None,
    pad: int,
    cache: Any = None,
    **extra: Any,
) -> DecodeTrace:
    """`model.generate` timed end to end, its sampling seeded from `generator` (`_seeded_global_rng`).

    `cache`: the cache to generate into (None: a fresh one of our kernel plan). A static cache on a
    GPU makes `generate` compile its forward with `torch.compile` (transformers' auto-compile); it
    is reset here first, so one cache — and one compiled graph — serves every prompt."""
    ids = torch.tensor([prompt], device=model.device)
    options = (
        {"do_sample": False}
        if sampling.greedy
        else {
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or 0,  # None would leave generate's default of 50
        }
    )
    if cache is not None:
        cache.reset()
    with _seeded_global_rng(generator, model.device):
        began = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            cache=new_cache(model.config) if cache is None else cache,  # default: our kernel plan's
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **options,
            **extra,
        )
        elapsed = time.perf_counter() - began
    tokens = tuple(out[0, len(prompt) :].tolist())
    return DecodeTrace(len(prompt), tokens, elapsed)


@contextmanager
def _seeded_global_rng(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """The global RNG seeded from `generator` for the block, and the caller's state back after it.

    HF's `generate` samples from the global RNG and takes no generator, so this is the one place the
    global RNG is seeded; `fork_rng` keeps that from leaking into anything else the process draws.
    """
    if generator is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(generator.initial_seed())
        yield


@contextmanager
def assistant_settings(model: Any, policy: GammaPolicy) -> Iterator[None]:
    """Make HF's early-exit drafts γ long and stop where ours stop (`stop_below`).

    In transformers 5.24 the assistant — here the model itself — reads `num_assistant_tokens`,
    its schedule and `assistant_confidence_threshold` from its own `generation_config`; the same
    keywords passed to `generate()` are ignored (default 20 tokens, and a 0.4 confidence cut that
    ends most drafts after one token). They are set there for the call and restored after.
    """
    config = model.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {name: getattr(config, name, None) for name in names}
    config.num_assistant_tokens = policy.initial
    config.num_assistant_tokens_schedule = "constant" if policy.is_fixed else "heuristic_transient"
    config.assistant_confidence_threshold = policy.stop_below
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)
