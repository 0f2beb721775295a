"""Closed-form cost model: how much faster speculative decoding is than plain decoding
(docs/theory.md, "Speedup").

Pure arithmetic, no model. Every speedup here has the same shape,

    S(γ) = E(γ) / round_cost(γ),

tokens committed per round over the cost of one round in units of one autoregressive step. `E`
comes from an acceptance rate, per-depth rates or a measured `AcceptanceProfile`; the round cost
comes from a *cost form*: the closed forms of docs/theory.md, "Speedup" (separate draft, self-speculative
general and contiguous, each with the verify overhead `f(γ) = 1 + εγ`), or the calibrated form of
`skipsearch.cost.calibrated`, which prices one round with a device-measured `LatencyProfile`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, Protocol

import numpy as np

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask

Acceptance = float | Sequence[float] | AcceptanceProfile
"""A per-token acceptance rate `α`, per-depth rates `α_1..α_n`, or a measured AcceptanceProfile."""

# -- validation ----------------------------------------------------------------------------------


def check_gamma(gamma: int) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, Integral) or gamma < 1:
        raise ConfigError(f"draft length gamma must be an integer >= 1, got {gamma!r}")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1] (it is an acceptance probability), got {value}")


def _check_epsilon(epsilon: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ConfigError(f"verify overhead epsilon must be a finite number >= 0, got {epsilon}")


def _check_head_saving(saving: float, r_draft: float) -> None:
    if not 0.0 <= saving < r_draft:
        raise ConfigError(
            f"head saving must be in [0, r_draft={r_draft}) (a smaller head cannot save the whole draft "
            f"step), got {saving}"
        )


def _check_kv_saving(saving: float, head_saving: float, r_draft: float, r_reuse: float) -> None:
    if not 0.0 <= saving < r_draft - head_saving:
        raise ConfigError(
            f"KV-pattern saving must be in [0, r_draft - head saving = {r_draft - head_saving:g}) (keys "
            f"left unread cannot save the whole draft step), got {saving}"
        )
    if saving > 0.0 and r_reuse > 0.0:
        raise ConfigError(
            "a draft that reads fewer keys changes every layer's output, so verify reuses nothing: "
            f"r_reuse must be 0 with a KV-pattern saving, got {r_reuse}"
        )


# -- tokens per round ----------------------------------------------------------------------------


def tokens_per_round_iid(alpha: float, gamma: int) -> float:
    """`E(γ) = (1 - α^(γ+1)) / (1 - α)` (docs/theory.md, "Tokens per round"): accepted drafts plus
    the target's token.

    With i.i.d. acceptance, draft `j` survives with probability `α^j`, so `E = Σ_{j=0..γ} α^j`;
    at `α = 1` every draft is accepted and `E = γ + 1`.
    """
    _check_probability("alpha", alpha)
    check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def tokens_per_round_by_depth(alphas: Sequence[float], gamma: int) -> float:
    """`E(γ) = 1 + Σ_{k=1..γ} Π_{j=1..k} α_j` (docs/theory.md, "Tokens per round"): acceptance that
    varies by depth.

    `α_j` is the probability that draft `j` is accepted given the first `j - 1` were, so the
    round reaches depth `k` with probability `Π_{j≤k} α_j`.
    """
    check_gamma(gamma)
    if len(alphas) < gamma:
        raise ConfigError(
            f"depth-wise acceptance needs alpha_1..alpha_{gamma} for gamma={gamma}, got {len(alphas)} "
            "values: give more rates or a smaller gamma"
        )
    for depth, alpha in enumerate(alphas[:gamma], start=1):
        _check_probability(f"alpha_{depth}", alpha)
    return 1.0 + float(np.sum(np.cumprod(np.asarray(alphas[:gamma], dtype=float))))


def expected_tokens(acceptance: Acceptance, gamma: int) -> float:
    """Tokens committed per round: i.i.d. closed form, depth-wise product, or measured by simulation."""
    if isinstance(acceptance, AcceptanceProfile):
        check_gamma(gamma)
        return acceptance.tokens_per_round(gamma)
    if isinstance(acceptance, Real):
        return tokens_per_round_iid(float(acceptance), gamma)
    return tokens_per_round_by_depth(acceptance, gamma)


# -- closed-form cost forms ----------------------------------------------------------------------


def verify_overhead(gamma: int, epsilon: float) -> float:
    """`f(γ) = 1 + εγ` (docs/theory.md, "Verify overhead"): verifying `γ+1` positions costs more
    than one step."""
    return 1.0 + epsilon * gamma


class CostForm(Protocol):
    """Cost of one speculative round of draft length `γ`, in units of one autoregressive step."""

    name: str

    def round_cost(self, gamma: int) -> float: ...


@dataclass(frozen=True)
class SeparateDraft:
    """Speculative decoding with a separate draft model of relative cost `c` (docs/theory.md, "Speedup").

    One round is `γ` draft steps and one verify pass: `γc + f(γ)`, so `S = E(γ) / (γc + 1)` at ε = 0.
    """

    c: float
    epsilon: float = 0.0
    name: str = field(default="sd", init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.c) and self.c > 0.0):
            raise ConfigError(f"draft cost ratio c must be a finite number > 0, got {self.c}")
        _check_epsilon(self.epsilon)

    def round_cost(self, gamma: int) -> float:
        check_gamma(gamma)
        return gamma * self.c + verify_overhead(gamma, self.epsilon)


@dataclass(frozen=True)
class SelfSpeculative:
    """Self-speculative decoding, any skip pattern (docs/theory.md, "Speedup").

    The draft runs a share `r_draft` of the model; verify skips the share `r_reuse` whose KV the
    draft wrote exactly: `γ r_draft + (1 - r_reuse) f(γ)`, so `S = E / (γ r_draft + 1 - r_reuse)` at
    ε = 0. With `r_reuse = 0` this is `SeparateDraft(c=r_draft)`: no KV reuse, no SSD advantage.
    A draft head with fewer rows makes each draft step `head_saving` cheaper (`draft_head_saving`),
    and a KV pattern that leaves keys unread `kv_saving` cheaper (`kv_pattern_saving`; verify then
    reuses nothing): the draft step costs `draft_step = r_draft - head_saving - kv_saving`.
    """

    r_draft: float
    r_reuse: float
    epsilon: float = 0.0
    head_saving: float = 0.0
    kv_saving: float = 0.0
    name: str = field(default="ssd", init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.r_draft <= 1.0:
            raise ConfigError(f"r_draft must be in (0, 1] (a share of the full forward), got {self.r_draft}")
        if not 0.0 <= self.r_reuse <= self.r_draft:
            raise ConfigError(
                f"r_reuse must be in [0, r_draft={self.r_draft}] (verify can only reuse what the draft "
                f"ran), got {self.r_reuse}"
            )
        _check_epsilon(self.epsilon)
        _check_head_saving(self.head_saving, self.r_draft)
        _check_kv_saving(self.kv_saving, self.head_saving, self.r_draft, self.r_reuse)

    @classmethod
    def from_mask(
        cls,
        mask: SkipMask,
        epsilon: float = 0.0,
        draft_vocab: int | None = None,
        head_share: float = 0.0,
        vocab_size: int | None = None,
        kv: KVPattern | None = None,
        kv_share: float = 0.0,
        context: float = 512,
    ) -> SelfSpeculative:
        """Shares by sub-layer count: `r_draft` from the mask (a sub-layer at int8 or int4 counted by
        its bytes, `masks.BYTES_SHARE`), `r_reuse` = reused sub-layers / 2L (those before the first one
        skipped or quantized).

        A draft vocabulary of `draft_vocab` of the `vocab_size` ids saves `head_share × (1 − k/V)`
        per draft step; at the full vocabulary (None) every number is as without it. A KV pattern
        `kv` saves, in each attention sub-layer the draft runs, the K/V reads (`kv_share` of a step
        at `context`) of the keys it leaves out, and makes `r_reuse` 0, as the engine does.
        """
        r_draft = mask.r_draft()
        saving = draft_head_saving(r_draft, head_share, vocab_share(draft_vocab, vocab_size))
        if kv is None:
            return cls(r_draft, mask.reused_sublayers / (2 * mask.num_layers), epsilon, saving)
        attention_run = 1.0 - len(mask.attn) / mask.num_layers
        unread = kv_pattern_saving(kv_share, attention_run, keys_share(kv, context))
        return cls(r_draft, 0.0, epsilon, saving, unread)

    @property
    def draft_step(self) -> float:
        return self.r_draft - self.head_saving - self.kv_saving

    def round_cost(self, gamma: int) -> float:
        check_gamma(gamma)
        return gamma * self.draft_step + (1.0 - self.r_reuse) * verify_overhead(gamma, self.epsilon)


@dataclass(frozen=True)
class Contiguous:
    """Contiguous-prefix SSD, draft = the first share `r` of the layers (docs/theory.md, "Speedup").

    Written as the reference writes it, `1 + (γ - 1) r`; with verify overhead the convention is
    `γ r + (1 - r) f(γ)`: only the `1 - r` layers verify computes pay the extra positions. A
    smaller draft head takes `head_saving` off each of the `γ` draft steps.
    """

    r: float
    epsilon: float = 0.0
    head_saving: float = 0.0
    name: str = field(default="ssd_contiguous", init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.r <= 1.0:
            raise ConfigError(f"draft share r must be in (0, 1], got {self.r}")
        _check_epsilon(self.epsilon)
        _check_head_saving(self.head_saving, self.r)

    def round_cost(self, gamma: int) -> float:
        check_gamma(gamma)
        return 1.0 + (gamma - 1) * self.r + (1.0 - self.r) * self.epsilon * gamma - gamma * self.head_saving


# -- the draft's head ----------------------------------------------------------------------------


def vocab_share(draft_vocab: int | None, vocab_size: int | None) -> float:
    """`k / V`, the share of the LM head's rows a draft vocabulary keeps (1 for the full one)."""
    if draft_vocab is None:
        return 1.0
    if vocab_size is None:
        raise ConfigError(
            f"a draft vocabulary of {draft_vocab} ids needs the model's vocabulary size to price"
        )
    if (
        isinstance(draft_vocab, bool)
        or not isinstance(draft_vocab, Integral)
        or not 1 <= draft_vocab <= vocab_size
    ):
        raise ConfigError(
            f"draft vocabulary {draft_vocab!r} does not fit a vocabulary of {vocab_size} ids: "
            f"use --draft-vocab between 1 and {vocab_size}, or full"
        )
    return draft_vocab / vocab_size


def draft_head_saving(r_draft: float, head_share: float, vocab_share: float) -> float:
    """What a draft head with the share `vocab_share = k/V` of the rows saves per draft step.

    `head_share × (1 − k/V)` of a full step, time ∝ rows (the closed forms' assumption). The closed
    form has no head term, so the saving comes out of the draft's sub-layer share `r_draft`, which
    cannot hold a head larger than itself: a draft sharing less than `head_share` saves
    `r_draft × (1 − k/V)`, and its step never costs less than `k/V` of what it did.
    """
    if not (math.isfinite(head_share) and 0.0 <= head_share < 1.0):
        raise ConfigError(f"head share must be in [0, 1) (the LM head's share of a step), got {head_share}")
    if not (math.isfinite(vocab_share) and 0.0 < vocab_share <= 1.0):
        raise ConfigError(f"draft vocabulary share k/V must be in (0, 1], got {vocab_share}")
    return min(head_share, r_draft) * (1.0 - vocab_share)


# -- the draft's KV pattern ----------------------------------------------------------------------


def kv_read_share(weight_bytes: float, kv_bytes: float) -> float:
    """The K/V cache's share of the bytes a decode step reads, `kv / (weights + kv)` at the K/V
    bytes of some context: the closed form's attention share as a function of context (a
    memory-bound step costs what it reads; the bytes of the latency profile's memory floor)."""
    if not (weight_bytes > 0 and kv_bytes >= 0):
        raise ConfigError(
            f"cannot take the K/V share of {weight_bytes} weight bytes and {kv_bytes} K/V bytes"
        )
    return kv_bytes / (weight_bytes + kv_bytes)


def keys_share(kv: KVPattern, context: float) -> float:
    """The share of `context` cached keys a draft step with pattern `kv` reads (1 while it covers them)."""
    return 1.0 if context <= 0 else min(1.0, kv.keys_read / context)


def kv_pattern_saving(kv_share: float, attention_run: float, read_share: float) -> float:
    """What a KV pattern saves per draft step: the K/V reads (`kv_share` of a step) of the keys it
    leaves out (`1 − read_share`), in the share `attention_run` of attention sub-layers the draft
    runs (a skipped one reads nothing either way)."""
    for name, value in (("K/V share", kv_share), ("attention share run", attention_run)):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ConfigError(f"{name} must be in [0, 1], got {value}")
    if not (math.isfinite(read_share) and 0.0 < read_share <= 1.0):
        raise ConfigError(f"the share of keys a KV pattern reads must be in (0, 1], got {read_share}")
    return kv_share * attention_run * (1.0 - read_share)


def head_share_from_config(config: Mapping[str, Any]) -> float:
    """The LM head's share of the weights one decode step reads, from a model's `config.json`.

    `V d / (V d + L (attention + MLP))`: without a LatencyProfile, a memory-bound step costs what it reads.
    Attention is `q, k, v, o` with grouped K/V heads; the MLP is gated (gate, up, down), as in every
    supported family. The embedding reads one row per token, norms and biases are negligible.
    """
    try:
        vocab, hidden, layers = (int(config[k]) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
        heads, ffn = int(config["num_attention_heads"]), int(config["intermediate_size"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
    except KeyError as missing:
        raise ConfigError(f"model config lacks {missing}: cannot price its LM head") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model config is malformed ({error}): cannot price its LM head") from None
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * ffn
    head = vocab * hidden
    return head / (head + layers * (attention + mlp))


# -- speedup and the best draft length -----------------------------------------------------------


@dataclass(frozen=True)
class Optimum:
    """The best draft length in `1..γ_max` and the speedup there."""

    gamma: int
    speedup: float


def speedup(acceptance: Acceptance, form: CostForm, gamma: int) -> float:
    """`S(γ) = E(γ) / round_cost(γ)`: tokens per round over the round's cost in plain-decoding steps."""
    return expected_tokens(acceptance, gamma) / form.round_cost(gamma)


def speedup_curve(acceptance: Acceptance, form: CostForm, gamma_max: int) -> tuple[float, ...]:
    """`S(1), ..., S(γ_max)`."""
    check_gamma(gamma_max)
    return tuple(speedup(acceptance, form, gamma) for gamma in range(1, gamma_max + 1))


def best_of(curve: Sequence[float], gamma_min: int = 1) -> Optimum:
    """Argmax of a speedup curve indexed from γ = 1, over γ >= `gamma_min`; ties go to the smaller γ
    (cheaper, less waste)."""
    index = max(range(gamma_min - 1, len(curve)), key=lambda i: (curve[i], -i))
    return Optimum(index + 1, curve[index])


def optimal_gamma(acceptance: Acceptance, form: CostForm, gamma_max: int = 8) -> Optimum:
    """Grid search over integer γ: the optimum has no closed form (docs/theory.md, "Choosing γ")."""
    return best_of(speedup_curve(acceptance, form, gamma_max))
