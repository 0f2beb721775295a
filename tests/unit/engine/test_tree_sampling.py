"""Sampled token trees keep the target's distribution: the first two sampled tokens follow the
target's p and its marginal (chi-square, 8 bins), and the root's children are accepted as often as
recursive rejection sampling over draws without replacement says (within 4 standard deviations)."""

import pytest
import torch

from skipsearch.engine.sampling import Sampling, residual
from skipsearch.engine.tree_rounds import children_of, tree_decode, tree_sample_walk
from skipsearch.tree_shapes import TreeShape
from tests.unit.engine.test_sampling import CHI2_7_999, _chi_square, eight_token_setup

pytestmark = pytest.mark.usefixtures("one_thread")

DRAWS = 600


def accepted_at_root(p: torch.Tensor, q: torch.Tensor, children: int) -> float:
    """P(one of `children` draws without replacement from q is accepted), by enumeration: the
    first draw x is accepted with min(1, p(x)/q(x)); on rejection the target becomes the residual
    and the proposal q without x."""
    if children == 0 or q.sum() <= 0:
        return 0.0
    q = q / q.sum()
    total = 0.0
    for x in range(len(q)):
        if q[x] <= 0:
            continue
        accept = float(torch.clamp(p[x] / q[x], max=1.0))
        rest = residual(p, q)
        rest = rest / rest.sum() if rest.sum() > 0 else rest
        without = q.clone()
        without[x] = 0
        total += float(q[x]) * (accept + (1 - accept) * accepted_at_root(rest, without, children - 1))
    return total


def sampled_tokens(setup, tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Over `DRAWS` seeded decodes with token trees `tree`: histograms of the first and second
    sampled tokens, the second's expected marginal under the target, and how many first rounds
    accepted a draft token."""
    runner, sampling = setup.runner, setup.sampling
    with torch.no_grad():
        firsts = torch.tensor([[*setup.prompt, t] for t in range(len(setup.p))])
        second = sampling.probs(runner.forward(firsts)[:, -1]).cpu()
    first, later = torch.zeros(len(setup.p)), torch.zeros(len(setup.p))
    accepted = 0
    for seed in range(DRAWS):
        generator = torch.Generator().manual_seed(seed)
        result = tree_decode(
            runner, setup.prompt, setup.mask, tree, 3, sampling=sampling, generator=generator, timed=False
        )
        first[result.tokens[0]] += 1
        later[result.tokens[1]] += 1
        accepted += result.accepted[0] >= 1
    return first, later, setup.p @ second, accepted


@pytest.fixture(scope="module")
def setup():
    return eight_token_setup("cpu")


@pytest.mark.parametrize("shape", ["3x2", "2x2x1", "1x1"])
def test_sampled_tree_tokens_follow_the_target(setup, shape) -> None:
    tree = TreeShape.parse(shape)
    first, later, marginal, accepted = sampled_tokens(setup, tree)
    assert _chi_square(first, setup.p) < CHI2_7_999
    assert _chi_square(later, marginal) < CHI2_7_999
    expected = accepted_at_root(setup.p, setup.q, tree.widths[0])
    rate = accepted / DRAWS
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / DRAWS) ** 0.5
    if tree.widths[0] > 1:  # more children accept more often than one draft token does
        assert expected > float(torch.minimum(setup.p, setup.q).sum()) + 0.05


@pytest.mark.parametrize("children", [2, 3, 5])
def test_the_walk_over_draws_without_replacement_gives_p_exactly(children) -> None:
    """The root's first token, over many draws from a draft far from the target: p, and the root's
    acceptance as `accepted_at_root` computes it. A walk that kept a rejected child in `q` (draws
    with replacement's rule) would give neither."""
    p = torch.tensor([0.30, 0.02, 0.05, 0.25, 0.03, 0.15, 0.10, 0.10])
    q = torch.tensor([0.02, 0.40, 0.20, 0.05, 0.20, 0.03, 0.05, 0.05])
    shape, sampling = TreeShape((children,)), Sampling(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    counts, accepted, draws = torch.zeros(8), 0, 6000
    targets = torch.stack([p, *[p] * children])
    for _ in range(draws):
        kids, drafted_q = children_of(q.log()[None], children, sampling, generator, None)
        path, after = tree_sample_walk(shape, kids[0].tolist(), targets, drafted_q, generator)
        token = kids[0, path[0] - 1].item() if path else after
        counts[token] += 1
        accepted += bool(path)
    assert _chi_square(counts, p) < CHI2_7_999
    expected = accepted_at_root(p, q, children)
    assert abs(accepted / draws - expected) < 4 * (expected * (1 - expected) / draws) ** 0.5
