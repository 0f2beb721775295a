"""The estimator's prediction next to what the engine measured (docs/theory.md, "Measuring acceptance")."""

from __future__ import annotations

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import MODES_WITH_KV
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.acceptance.worker import Measurement
from skipsearch.bench.decode_report import EstimatorCheck
from skipsearch.cost.closed_forms import tokens_per_round_iid
from skipsearch.engine.gamma import GammaPolicy
from skipsearch.engine.result import Summary
from skipsearch.engine.sampling import Sampling
from skipsearch.tree_shapes import Tree


def estimators(
    measurement: Measurement, tree: Tree | None = None, vocab: int | None = None
) -> list[Estimator]:
    """The configured estimator, plus `self` mode when that is `shared-kv`: its reference holds
    the K/V and serves both, so one run shows which mode predicts the engine (docs/theory.md,
    "Measuring acceptance"). For a token `tree`: `shared-kv` and `rounds` simulating the tree's
    rounds with the draft vocabulary `vocab`."""
    configured = measurement.estimator
    if tree is not None and configured.mode in MODES_WITH_KV:
        runner, reference, ids = configured.runner, configured.reference, configured.vocab_ids
        return [
            Estimator(runner, reference, "shared-kv", ids),
            Estimator(runner, reference, "rounds", ids, round_vocab=vocab, round_tree=tree),
        ]
    if configured.mode == "self":
        return [configured]
    return [configured, Estimator(configured.runner, configured.reference, "self", configured.vocab_ids)]


def estimator_check(
    profile: AcceptanceProfile,
    mode: str,
    policy: GammaPolicy,
    sampling: Sampling,
    measured: Summary,
    tree: Tree | None = None,
) -> EstimatorCheck:
    """The estimator's acceptance and tokens per round for the engine's γ, and the relative error.

    Greedy: the exact round simulation over the teacher-forced match vector (docs/theory.md, "The
    round rule"), with the draft's stop where the policy has one (`stop_below`). Sampling: the
    i.i.d. closed form `E(γ)` at the mean `sum_x min(p, q)` — the estimator applies no top-k /
    top-p. A dynamic γ, or a sampled draft that stops early, has no single prediction:
    `no_prediction` says why.
    """
    alpha = profile.alpha if sampling.greedy else profile.sampling_acceptance
    predicted, why_not = None, None
    gamma, stop = policy.initial, policy.stop_below
    if tree is not None:
        if sampling.greedy:
            predicted = profile.tree_tokens_per_round(tree)
        else:
            why_not = "a sampled tree's acceptance has no closed form here"
    elif not policy.is_fixed:
        why_not = "gamma is dynamic"
    elif sampling.greedy:
        predicted = profile.tokens_per_round(gamma, stop)
    elif policy.stops_early:
        why_not = "the closed form for sampling has no stop"
    else:
        predicted = tokens_per_round_iid(alpha, gamma)
    actual = measured.tokens_per_round
    return EstimatorCheck(
        mode=mode,
        alpha=alpha,
        measured_acceptance=measured.acceptance,
        tokens_per_round=predicted,
        no_prediction=why_not,
        measured_tokens_per_round=actual,
        relative_error=(predicted - actual) / actual if predicted is not None and actual else None,
    )
