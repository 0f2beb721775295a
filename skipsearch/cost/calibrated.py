"""The calibrated cost form and the one-mask prediction (docs/theory.md, "Calibrated cost").

A round priced with measured times instead of layer counts, and `predict()`: a mask's speedup
curve from both the closed form and, given a LatencyProfile, the calibrated form.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.cost.closed_forms import (
    Optimum,
    SelfSpeculative,
    best_of,
    check_gamma,
    expected_tokens,
    kv_read_share,
    speedup_curve,
)
from skipsearch.cost.latency import LatencyProfile
from skipsearch.masks import FULL_VOCAB, KVPattern, SkipMask, SublayerWeights, kv_label


@dataclass(frozen=True)
class RoundTime:
    """Seconds of one speculative round, split the way the engine reports it (docs/theory.md,
    "Bottleneck share")."""

    draft: float
    verify: float
    overhead: float

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.overhead


@dataclass(frozen=True)
class Calibrated:
    """One round priced with measured times instead of layer counts (docs/theory.md, "Calibrated cost").

    `γ` draft steps run embed, the draft's sub-layers and the head over one position each: the
    draft's own head of `draft_vocab` rows (None: the full head; `LatencyProfile.draft_head_time`,
    `vocab_size` only for a LatencyProfile that records no vocabulary size). Verify runs over `γ + 1`
    positions every sub-layer from the first one the draft skipped (see
    `SkipMask.reused_sublayers`), and the sub-layers before it, with the embedding, only for the last draft
    token, which the draft never ran; then the full head over `γ + 1` positions. Plus the measured
    per-round overhead. `round_cost = round time / step time`, so `S = E(γ) × step / round`.

    Under a KV pattern `kv` each attention sub-layer of a draft step is priced at the number of
    keys it reads (the LatencyProfile's attention at that context: the same projections and cache append,
    SDPA over fewer keys), and verify reuses nothing, as the engine does
    (`engine.steps.divergent_layer`). A pattern with pillars adds the LatencyProfile's pillar choice to the
    verify, which makes it.

    A sub-layer the mask runs at int8 or int4 is priced in each draft step at what it costs there
    (the LatencyProfile's `precisions`, else its bytes, `masks.BYTES_SHARE`, said once:
    `LatencyProfile.check_precisions`); verify runs it at full precision, and reuses only the
    sub-layers before the first one skipped or quantized (`SkipMask.reused_sublayers`).
    """

    latency: LatencyProfile
    mask: SkipMask
    context: float = 512
    draft_vocab: int | None = None
    vocab_size: int | None = None
    kv: KVPattern | None = None
    name: str = field(default="calibrated", init=False)

    def round_time(self, gamma: int) -> RoundTime:
        check_gamma(gamma)
        one = self.latency.weights(self.context, 1)
        full = self.latency.weights(self.context, gamma + 1)
        head = self.latency.draft_head_time(self.draft_vocab, self.context, self.vocab_size)
        drafted = self._draft_weights(one)
        draft_step = draft_time(self.latency, self.mask, drafted) - (one.head - head)
        reused = self.mask.reused_sublayers if self.kv is None else 0
        step_one, step_full = _in_order(one), _in_order(full)
        verify = one.embed + sum(step_one[:reused]) + sum(step_full[reused:]) + full.head
        if self.kv is not None and self.kv.pillars:
            verify += self.latency.pillar_choice_time(self.context)
        return RoundTime(gamma * draft_step, verify, self.latency.overhead(gamma))

    def round_cost(self, gamma: int) -> float:
        return self.round_time(gamma).total / self.latency.step_time(self.context)

    def _draft_weights(self, one: SublayerWeights) -> SublayerWeights:
        """A draft step's parts: one step's, with attention at the keys the KV pattern reads."""
        if self.kv is None:
            return one
        return attention_at(one, self.latency.weights(min(self.context, self.kv.keys_read), 1))


def draft_time(latency: LatencyProfile, mask: SkipMask, weights: SublayerWeights) -> float:
    """Seconds of one draft pass whose parts cost `weights` (full head included): every sub-layer
    `mask` runs, at the precision it runs it (`SublayerWeights.share`, which prices a precision the
    profile did not time by its bytes, said once)."""
    latency.check_precisions(mask)
    return weights.total * mask.r_draft(weights)


def attention_at(weights: SublayerWeights, at_keys: SublayerWeights) -> SublayerWeights:
    """`weights` with every attention sub-layer's time, at each precision, taken from `at_keys` (a
    pass over fewer keys: a KV pattern's draft)."""
    low = {bits: (at_keys.low_bits[bits][0], mlp) for bits, (_, mlp) in weights.low_bits.items()}
    return replace(weights, attn=at_keys.attn, low_bits=low)


def _in_order(weights: SublayerWeights) -> list[float]:
    """Sub-layer times in execution order: `attn_0, mlp_0, attn_1, mlp_1, ...`."""
    return [t for pair in zip(weights.attn, weights.mlp, strict=True) for t in pair]


# -- scoring one mask ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Predicted speedup of one mask for γ = 1..γ_max: closed form and, with a LatencyProfile, calibrated.

    Index `γ - 1` of each curve holds draft length `γ`. `r_draft` and `r_reuse` are the shares the
    closed form used: the draft step (less its smaller head's saving, with a `draft_vocab`) and the
    sub-layers verify reuses (`SkipMask.reused_sublayers / 2L`).
    """

    mask: str
    r_draft: float
    r_reuse: float
    context: float
    tokens_per_round: tuple[float, ...]
    closed_form: tuple[float, ...]
    calibrated: tuple[float, ...] | None = None
    draft_vocab: int | None = None
    kv: KVPattern | None = None
    gamma_min: int = 1

    @property
    def best_closed_form(self) -> Optimum:
        return best_of(self.closed_form, self.gamma_min)

    @property
    def best_calibrated(self) -> Optimum | None:
        return None if self.calibrated is None else best_of(self.calibrated, self.gamma_min)

    @property
    def best(self) -> Optimum:
        """The score to report: calibrated when a LatencyProfile was given, else the closed form."""
        return self.best_calibrated or self.best_closed_form

    def to_dict(self) -> dict:
        def optimum(best: Optimum | None) -> dict | None:
            return None if best is None else {"gamma": best.gamma, "speedup": best.speedup}

        return {
            "mask": self.mask,
            "draft_vocab": FULL_VOCAB if self.draft_vocab is None else self.draft_vocab,
            "kv": kv_label(self.kv),
            "r_draft": self.r_draft,
            "r_reuse": self.r_reuse,
            "context": self.context,
            "tokens_per_round": list(self.tokens_per_round),
            "closed_form": list(self.closed_form),
            "calibrated": None if self.calibrated is None else list(self.calibrated),
            "best_closed_form": optimum(self.best_closed_form),
            "best_calibrated": optimum(self.best_calibrated),
        }


def predict(
    profile: AcceptanceProfile,
    mask: SkipMask,
    gamma_max: int = 8,
    latency: LatencyProfile | None = None,
    context: float = 512,
    epsilon: float = 0.0,
    draft_vocab: int | None = None,
    vocab_size: int | None = None,
    head_share: float | None = None,
    kv: KVPattern | None = None,
    kv_share: float | None = None,
    gamma_min: int = 1,
) -> Prediction:
    """Score a mask from its measured acceptance: cheap enough to call for every search trial.

    `profile` was measured with a draft head of `draft_vocab` rows (None: the full head) and the KV
    pattern `kv` (None: every key), and each draft step is priced with them. The closed form takes
    the LM head's share of a step from `head_share` (e.g. `head_share_from_config`), else from the
    latency profile, else 0 (no saving priced), and the K/V cache's share from `kv_share`, else
    from the bytes the latency profile records (`closed_forms.kv_read_share`), else 0 (a profile
    from before they were recorded: the closed form then prices a pattern's reuse lost, not its
    keys saved; the calibrated form prices both). `vocab_size`, the
    model's `V`, is needed with a draft vocabulary unless the latency profile records it.
    """
    if latency is not None:
        vocab_size = vocab_size or latency.vocab_size
        if head_share is None:
            head_share = latency.head_time(context) / latency.step_time(context)
        read = latency.read_bytes(context)
        if kv_share is None and read is not None:
            kv_share = kv_read_share(*read)
    closed = SelfSpeculative.from_mask(
        mask, epsilon, draft_vocab, head_share or 0.0, vocab_size, kv, kv_share or 0.0, context
    )
    return Prediction(
        mask=str(mask),
        r_draft=closed.draft_step,
        r_reuse=closed.r_reuse,
        context=context,
        tokens_per_round=tuple(expected_tokens(profile, g) for g in range(1, gamma_max + 1)),
        closed_form=speedup_curve(profile, closed, gamma_max),
        calibrated=None
        if latency is None
        else speedup_curve(
            profile, Calibrated(latency, mask, context, draft_vocab, vocab_size, kv), gamma_max
        ),
        draft_vocab=draft_vocab,
        kv=kv,
        gamma_min=gamma_min,
    )
