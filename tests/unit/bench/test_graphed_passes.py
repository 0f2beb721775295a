"""`bench.graphed_passes`: the graphed parts' chain, and the whole pass, are the real forward pass
(eager on a CPU: no capture here)."""

import pytest
import torch

from skipsearch.bench.graphed_passes import graphed_passes, run_in_order
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

CONTEXTS = (8, 24)

POSITIONS = (1, 3, 4)

LAYERS = 4


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=LAYERS))


def test_the_chained_parts_compute_the_full_forward_pass(runner: LayerwiseRunner) -> None:
    """Each part reads the previous part's output: in order they are the model over context + ids,
    as the plain forward of the whole sequence (no cache at all) computes it; so is the whole pass."""
    grid = graphed_passes(runner, CONTEXTS, POSITIONS, torch.Generator().manual_seed(1))
    assert [[p.context for p in row] for row in grid] == [[c] * len(POSITIONS) for c in CONTEXTS]
    for row in grid:
        for graphed in row:
            k = graphed.ids.shape[1]
            assert len(graphed.parts) == 2 * LAYERS + 2
            expected = runner.forward(torch.cat([graphed.tokens, graphed.ids], dim=1))[:, -k:]
            chained = run_in_order(graphed.parts)
            graphed.restore()
            whole = graphed.whole(None)
            graphed.restore()
            torch.testing.assert_close(chained, expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(whole, expected, rtol=1e-5, atol=1e-5)
