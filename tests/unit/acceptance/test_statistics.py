"""The per-position statistics by hand: the greedy match and sampled acceptance of a draft, over
the full vocabulary and over a draft vocabulary's subset (the confidence: engine/test_steps.py)."""

import pytest
import torch

from skipsearch.acceptance.statistics import sampling_acceptance, subset_acceptance


def test_sampling_acceptance_is_total_variation_overlap():
    target = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    draft = torch.log(torch.tensor([[0.2, 0.3, 0.5]]))
    assert sampling_acceptance(target, target.argmax(-1), draft, 1.0).item() == pytest.approx(0.7)
    assert sampling_acceptance(target, target.argmax(-1), draft, 0.0).item() == 0.0


def test_subset_acceptance_by_hand() -> None:
    target = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 1.0, 0.0]])  # argmax: 1, then 0
    draft = torch.tensor([[6.0, 1.0, 2.0, 0.0], [0.0, 2.0, 1.0, 4.0]])
    ids = torch.tensor([1, 2])
    match, _ = subset_acceptance(target, target.argmax(-1), draft, ids, 0.0)
    assert match.tolist() == [False, False]  # row 0: the subset's best is 2; row 1: 0 is outside it
    hidden_best = torch.tensor([[0.0, 2.0, 9.0, 1.0]])
    match, _ = subset_acceptance(target[:1], target[:1].argmax(-1), hidden_best, torch.tensor([1, 3]), 0.0)
    assert match.tolist() == [True]  # the subset hides the draft's own argmax (2): it proposes 1
    _, accept = subset_acceptance(target[:1], target[:1].argmax(-1), draft[:1], ids, 2.0)
    p = torch.softmax(target[0] / 2.0, -1)
    q = torch.zeros(4)
    q[ids] = torch.softmax(draft[0, ids] / 2.0, -1)
    assert float(accept[0]) == pytest.approx(float(torch.minimum(p, q).sum()))
