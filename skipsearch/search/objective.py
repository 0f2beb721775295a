"""The default scorers: predicted speedup (closed form or calibrated) or acceptance (docs/theory.md,
"Speedup").

A Score stores every number the trials table and best.json report, so a run directory explains
itself without the model. A mask measured at several draft-vocabulary sizes (docs/theory.md, "The
draft vocabulary") and KV patterns ("KV patterns") is scored with each and keeps the best, as it
keeps the best γ: both are exact optima per mask, found by arithmetic on its measurement. A mask
whose sub-layers read their weights at int8 or int4 is priced by what it reads (`cost.calibrated`),
so it is scored with every draft vocabulary, KV pattern, tree and γ as any other mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.config import check_context
from skipsearch.cost.calibrated import Calibrated, Prediction, predict
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.tree_cost import score_tree
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask, kv_label, vocab_label
from skipsearch.search.score import Score, Scorer
from skipsearch.search.space_precision import precision_label
from skipsearch.tree_shapes import Tree, as_tree, tree_label

OBJECTIVES = ("speedup", "acceptance")
COSTS = ("closed-form", "calibrated")
AUTO_COST = "auto"
"""The cost a run asks for when it leaves the choice to the device: calibrated once `skipsearch
profile` has measured the model here, else the closed form (resolved by `run.preflight`)."""
DEFAULT_CONTEXT = 512


def scoring_latency(
    cost: str,
    latency: LatencyProfile | None,
    context: int | None,
    extrapolate: bool = False,
    kv_patterns: bool = False,
) -> LatencyProfile | None:
    """The LatencyProfile that prices candidates at an explicit `--context` (checked against its measured
    range), or `latency` unchanged when no context was asked for.

    The calibrated cost model reads context; the closed form reads it only to price `kv_patterns`
    (their unread keys' share of a step), and otherwise counts sub-layers, so asking for one it
    would not read is an error rather than a flag that silently does nothing.
    """
    check_context(context)
    if context is None:
        return latency
    if cost == "closed-form" and kv_patterns:
        return latency
    if cost != "calibrated" or latency is None:
        raise ConfigError(
            f"--context {context} prices attention by context length, which only the calibrated cost "
            "model does: run `skipsearch profile --model M` and use --cost calibrated (or auto)"
        )
    return latency.for_context(context, extrapolate)


def make_scorer(
    objective: str = "speedup",
    cost: str = "closed-form",
    latency: LatencyProfile | None = None,
    gamma_max: int = 8,
    context: int | None = None,
    extrapolate_context: bool = False,
    **options: Any,
) -> Scorer:
    """Scorer maximising the best-γ predicted speedup, or greedy acceptance (SWIFT-style, with the
    r_draft budget set by the search space), over the draft vocabularies and the KV patterns
    `options` allow (`priced_scorer`'s keywords); the calibrated form prices rounds at `context`
    tokens (default `DEFAULT_CONTEXT`, see `scoring_latency` for an explicit one)."""
    _check_scoring(objective, cost, latency)
    patterned = any(pattern is not None for pattern in options.get("kv", (None,)))
    priced = scoring_latency(cost, latency, context, extrapolate_context, patterned)
    return priced_scorer(
        objective, cost, priced, DEFAULT_CONTEXT if context is None else context, gamma_max, **options
    )


def _check_scoring(objective: str, cost: str, latency: LatencyProfile | None) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if cost not in COSTS:
        raise ConfigError(f"unknown cost model {cost!r}: use one of {', '.join(COSTS)}")
    if cost == "calibrated" and latency is None:
        raise ConfigError(
            "--cost calibrated needs a latency profile: run `skipsearch profile --model M` first"
        )


def priced_scorer(
    objective: str,
    cost: str,
    latency: LatencyProfile | None,
    at: int,
    gamma_max: int = 8,
    *,
    draft_vocab: Sequence[int | None] = (None,),
    vocab_size: int | None = None,
    head_share: float | None = None,
    kv: Sequence[KVPattern | None] = (None,),
    kv_share: float | None = None,
    gamma_min: int = 1,
    trees: Sequence[Tree] = (),
) -> Scorer:
    """`make_scorer` over a latency profile already priced at the scoring context `at`
    (`scoring_latency`): what a run builds once and scores every mask and finalist with.

    `draft_vocab` and `kv` are the draft vocabularies and KV patterns a mask is scored with (its
    best kept). `vocab_size` and `head_share` (the LM head's share of a step, for the closed form
    without a LatencyProfile: `cost.closed_forms.head_share_from_config`) price a draft vocabulary's
    smaller head, and `kv_share` (the K/V cache's share of a step, for the closed form without a
    LatencyProfile: `model_kv_share`) a KV pattern's unread keys. A mask's best γ is chosen in
    `gamma_min..gamma_max` (a space file's bounds)."""
    _check_scoring(objective, cost, latency)
    allowed, allowed_kv = tuple(draft_vocab), tuple(kv)
    shapes = tuple(t for t in map(as_tree, trees) if t is not None) if cost == "calibrated" else ()

    def score_variant(mask: SkipMask, profile: AcceptanceProfile) -> Score:
        prediction = predict(
            profile,
            mask,
            gamma_max=gamma_max,
            latency=latency,
            context=at,
            draft_vocab=profile.draft_vocab,
            vocab_size=vocab_size,
            head_share=head_share,
            kv=profile.kv,
            kv_share=kv_share,
            gamma_min=gamma_min,
        )
        curve = prediction.calibrated if cost == "calibrated" else prediction.closed_form
        best = prediction.best_calibrated if cost == "calibrated" else prediction.best_closed_form
        per_gamma = {g: s for g, s in enumerate(curve, start=1)}
        value = best.speedup if objective == "speedup" else profile.alpha
        details = _details(mask, profile, prediction)
        kv_shapes = tuple(s for s in shapes if profile.kv is None or profile.kv.window > s.depth)
        if kv_shapes and latency is not None and not _pillars(profile.kv) and objective == "speedup":
            form = Calibrated(latency, mask, at, profile.draft_vocab, vocab_size, profile.kv)
            scored = [score_tree(profile, form, shape) for shape in kv_shapes]
            winner = max(scored, key=lambda s: (s.speedup, -s.shape.nodes))
            details["score_by_tree"] = {tree_label(None): value, **{str(s.shape): s.speedup for s in scored}}
            details["tree_verify_steps"] = (winner.shape.verify_rows, _verify_steps(form, winner.shape))
            details["tree"] = tree_label(None)
            if winner.speedup > value:
                value = winner.speedup
                details |= {"tree": str(winner.shape), "tree_tokens_per_round": winner.tokens_per_round}
        return Score(value=value, gamma_best=best.gamma, per_gamma=per_gamma, details=details)

    def score(mask: SkipMask, profile: AcceptanceProfile) -> Score:
        wanted = [v for v in profile.variants if v.draft_vocab in allowed and v.kv in allowed_kv]
        variants = wanted or [profile]
        scores = [score_variant(mask, variant) for variant in variants]
        best = max(scores, key=lambda s: s.value)
        if len(scores) == 1:
            return best
        by = {**_best_by("draft_vocab", scores), **_best_by("kv", scores)}
        return replace(best, details={**best.details, **by})

    return score


def _verify_steps(form: Calibrated, shape: Tree) -> float:
    """A verify of the tree's rows, in steps of one row: what rows cost on this device."""
    latency = form.latency
    return latency.weights(form.context, shape.verify_rows).total / latency.step_time(form.context)


def _pillars(kv: KVPattern | None) -> bool:
    """Whether a draft's KV pattern chooses pillars, which a token tree's draft does not take
    (`engine.tree_rounds.check_tree_pattern`): its trees are not scored."""
    return kv is not None and kv.pillars > 0


def _details(mask: SkipMask, profile: AcceptanceProfile, prediction: Prediction) -> dict:
    """What the trials table and best.json report of one scored variant."""
    details = {
        "draft_vocab": vocab_label(profile.draft_vocab),
        "kv": kv_label(profile.kv),
        "alpha": profile.alpha,
        "sampling_acceptance": profile.sampling_acceptance,
        "r_reuse": mask.r_reuse if profile.kv is None else 0.0,  # a KV pattern leaves verify nothing
        "skipped_attn": sorted(mask.attn),
        "skipped_mlp": sorted(mask.mlp),
        # the closed form prices a draft that changes no sub-layer at nothing (run.pipeline)
        "speedup_closed_form": None if mask.is_empty else prediction.best_closed_form.speedup,
        "gamma_closed_form": None if mask.is_empty else prediction.best_closed_form.gamma,
        **{f"tokens_per_round_{g}": t for g, t in enumerate(prediction.tokens_per_round, start=1)},
    }
    if mask.quantized:  # a column only where the draft reads some weights at lower precision
        details["precision"] = precision_label(mask)
    if prediction.best_calibrated is not None:
        details |= {
            "speedup_calibrated": prediction.best_calibrated.speedup,
            "gamma_calibrated": prediction.best_calibrated.gamma,
        }
    return details


def _best_by(dimension: str, scores: Sequence[Score]) -> dict[str, dict[str, float]]:
    """`{"score_by_<dimension>": {label: best score with it}}` where the variants differ in that
    dimension (the report reads from it which dimension a winner's gain comes from); else empty."""
    best: dict[str, float] = {}
    for score in scores:
        label = str(score.details[dimension])
        best[label] = max(best.get(label, score.value), score.value)
    return {f"score_by_{dimension}": best} if len(best) > 1 else {}


def model_kv_share(model: object, context: float) -> float:
    """The closed form's K/V share of a step at `context` cached positions, from the bytes a step
    of the loaded `model` reads on its kernel plan (`models.kernels.step_bytes`)."""
    from skipsearch.cost.closed_forms import kv_read_share
    from skipsearch.models.kernels import step_bytes

    weights, per_position = step_bytes(model)
    return kv_read_share(weights, per_position * context)
