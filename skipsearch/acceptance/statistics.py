"""The per-position statistics of a draft's logits against the target's: the greedy match and the
sampled acceptance `sum_x min(p(x), q(x))` (of the full vocabulary or a draft vocabulary's subset),
and the draft's confidence. Pure tensor arithmetic, shared by the estimator and the engine's stop.
"""

from __future__ import annotations

import torch


def sampling_acceptance(
    target_logits: torch.Tensor, target_tokens: torch.Tensor, draft_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per position `sum_x min(p(x), q(x))`: the probability a sampled draft token is accepted.

    At temperature 0 both distributions are one-hot: the draft's on its argmax, the target's on the
    token the full model decodes there (`target_tokens`, see `estimator.Estimator`).
    """
    if temperature == 0:
        return (target_tokens == draft_logits.argmax(-1)).float()
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1)


def greedy_confidence(draft_logits: torch.Tensor) -> torch.Tensor:
    """Per position, the draft's softmax maximum over the vocabulary of `draft_logits` (a subset's
    logits for a draft vocabulary): what a draft that stops when unsure compares with its
    threshold (`engine.steps.confidence`)."""
    logits = draft_logits.float()
    return torch.exp(logits.max(-1).values - torch.logsumexp(logits, dim=-1))


def subset_acceptance(
    target_logits: torch.Tensor,
    target_tokens: torch.Tensor,
    draft_logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy match and `sum_x min(p(x), q(x))` per position of a draft restricted to `ids`.

    The draft proposes only ids of the subset: greedy, the argmax over the subset's logits; sampling,
    `q` = softmax over the subset, zero outside it, so `min(p, q)` sums over the subset alone.
    """
    subset = draft_logits[..., ids]
    match = ids[subset.argmax(-1)] == target_tokens
    if temperature == 0:
        return match, match.float()
    p = torch.softmax(target_logits.float() / temperature, dim=-1)[..., ids]
    q = torch.softmax(subset.float() / temperature, dim=-1)
    return match, torch.minimum(p, q).sum(-1)


def target_rank(
    draft_logits: torch.Tensor, target_tokens: torch.Tensor, cap: int, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Per position, the rank of the target's token among the draft's logits (0: the draft's
    argmax; over the subset `ids` of a draft vocabulary, where a token outside it ranks `cap`),
    capped at `cap`: a token tree whose node has `c` children keeps the target's token there when its
    rank is below `c` (docs/theory.md, "Token trees")."""
    logits = draft_logits.float()
    chosen = logits.gather(-1, target_tokens[..., None])
    if ids is None:
        return (logits > chosen).sum(-1).clamp(max=cap)
    rank = (logits[..., ids] > chosen).sum(-1).clamp(max=cap)
    return torch.where(torch.isin(target_tokens, ids), rank, torch.full_like(rank, cap))


def top_probs(draft_logits: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per position, the draft's `k` largest probabilities `[..., k]` (over the subset `ids` of a
    draft vocabulary, renormalised over it): what a dynamic token tree ranks its nodes by
    (`tree_shapes.DynamicTree.accepted_depth`)."""
    logits = draft_logits.float() if ids is None else draft_logits.float()[..., ids]
    return logits.softmax(-1).topk(k, dim=-1).values
