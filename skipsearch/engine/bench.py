"""The decode benchmark harness: every decoder on the same prompts, interleaved and paired.

`skipsearch decode`, `decode --from tiers.json` and the engine experiments all time decoders
through `benchmark`, so a ratio between two decoders is always measured side by side in one run
(drift hits both alike). `make_decoders` builds the standard set — the layer-wise autoregressive
baseline, HF `generate`, our SSD engine and, for a contiguous prefix, HF's `assistant_early_exit` —
with one stopping rule; `estimators` and `estimator_dict` put the estimator's prediction next to
what the engine measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.acceptance.worker import Measurement
from skipsearch.cost.closed_forms import tokens_per_round_iid
from skipsearch.engine.autoregressive import autoregressive_decode
from skipsearch.engine.gamma import GammaPolicy
from skipsearch.engine.result import DecodeResult, Summary
from skipsearch.engine.sampling import Sampling
from skipsearch.engine.ssd import speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.kernels import new_cache
from skipsearch.models.loading import LoadedModel, eos_ids
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.progress import progress_bar

AR, HF, SSD, EARLY_EXIT = "autoregressive", "hf-generate", "ssd", "hf-early-exit"

# -- the decoders ---------------------------------------------------------------------------------
Decoder = Callable[[tuple[int, ...], torch.Generator | None], DecodeResult]


def make_decoders(
    runner: LayerwiseRunner,
    loaded: LoadedModel,
    mask: SkipMask,
    policy: GammaPolicy,
    sampling: Sampling,
    max_new_tokens: int,
    head: DraftHead | None = None,
) -> dict[str, Decoder]:
    """Each configuration as `decode(prompt, generator) -> DecodeResult`, same stopping rule.

    `head`: the SSD draft's head over a draft vocabulary (HF's early exit has no such option)."""
    model: Any = loaded.model
    tokenizer: Any = loaded.tokenizer
    stop = eos_ids(model)
    pad = getattr(tokenizer, "pad_token_id", None)  # a weight-free model has no tokenizer
    pad = min(stop, default=0) if pad is None else pad

    def generate(prompt: tuple[int, ...], generator: torch.Generator | None, **assist: Any) -> DecodeResult:
        return hf_generate(model, prompt, max_new_tokens, sampling, generator, pad, **assist)

    decoders: dict[str, Decoder] = {
        AR: lambda prompt, generator: autoregressive_decode(
            runner, prompt, max_new_tokens, sampling, generator, stop
        ),
        HF: generate,
        SSD: lambda prompt, generator: speculative_decode(
            runner, prompt, mask, max_new_tokens, policy, sampling, generator, stop, head
        ),
    }
    if mask.exit_layer is not None:

        def early_exit(prompt: tuple[int, ...], generator: torch.Generator | None) -> DecodeResult:
            with assistant_settings(model, policy):
                return generate(prompt, generator, assistant_early_exit=mask.exit_layer)

        decoders[EARLY_EXIT] = early_exit
    return decoders


def hf_generate(
    model: Any,
    prompt: tuple[int, ...],
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator | None,
    pad: int,
    **extra: Any,
) -> DecodeResult:
    """`model.generate` timed end to end, its sampling seeded from `generator` (`_seeded_global_rng`)."""
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
    with _seeded_global_rng(generator, model.device):
        began = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            cache=new_cache(model.config),  # the same kernel plan as ours (fp32 K/V beside fp32 attention)
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **options,
            **extra,
        )
        elapsed = time.perf_counter() - began
    tokens = tuple(out[0, len(prompt) :].tolist())
    return DecodeResult(len(prompt), tokens, elapsed)


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
    """Make HF's early-exit drafts γ long, as ours are.

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
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def benchmark(
    decoders: dict[str, Decoder],
    prompts: list[tuple[int, ...]],
    repeats: int,
    seed: int,
    device: torch.device,
) -> dict[str, list[DecodeResult]]:
    """Every decoder on every prompt, `repeats` times, interleaved so drift hits all alike.

    One untimed warm-up per decoder first; the decoder order rotates from prompt to prompt.
    Results are in (repeat, prompt) order, so index `k` is the same prompt for every decoder.
    """
    names = list(decoders)
    for name in names:
        decoders[name](prompts[0], torch.Generator(device=device).manual_seed(seed))
    runs: dict[str, list[DecodeResult]] = {name: [] for name in names}
    with progress_bar("decode: interleaved runs", repeats * len(prompts)) as bar:
        for repeat in range(repeats):
            for index, prompt in enumerate(prompts):
                turn = repeat * len(prompts) + index
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + turn)
                    runs[name].append(decoders[name](prompt, generator))
                bar.advance(bar.task_ids[0])
    return runs


# -- reporting ------------------------------------------------------------------------------------
def estimators(measurement: Measurement) -> list[Estimator]:
    """The configured estimator, plus `self` mode when that is `shared-kv`: its reference holds
    the K/V and serves both, so one run shows which mode predicts the engine (docs/theory.md,
    "Measuring acceptance")."""
    configured = measurement.estimator
    if configured.mode == "self":
        return [configured]
    return [configured, Estimator(configured.runner, configured.reference, "self", configured.vocab_ids)]


def estimator_dict(
    profile: AcceptanceProfile, mode: str, policy: GammaPolicy, sampling: Sampling, measured: Summary
) -> dict[str, Any]:
    """The estimator's acceptance and tokens per round for the engine's γ, and the relative error.

    Greedy: the exact round simulation over the teacher-forced match vector (docs/theory.md, "The
    round rule"). Sampling: the i.i.d. closed form `E(γ)` at the mean `sum_x min(p, q)` — the
    estimator applies no top-k / top-p. A dynamic γ has no single prediction.
    """
    alpha = profile.alpha if sampling.greedy else profile.sampling_acceptance
    predicted = None
    if policy.is_fixed:
        gamma = policy.initial
        predicted = profile.tokens_per_round(gamma) if sampling.greedy else tokens_per_round_iid(alpha, gamma)
    actual = measured.tokens_per_round
    return {
        "mode": mode,
        "alpha": alpha,
        "measured_acceptance": measured.acceptance,
        "tokens_per_round": predicted,
        "measured_tokens_per_round": actual,
        "relative_error": (predicted - actual) / actual if predicted is not None and actual else None,
    }
