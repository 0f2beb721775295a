"""The importance proxy, computed from the ReferenceCache in one extra pass (no mask measured).

The cache holds the full model's input of every layer, `h_l`, so the stream around the MLP of
layer `l` is missing only its middle: `m_l = h_l + attn_l(h_l)`. One attention sub-layer per layer,
run teacher-forced over the cached states (cheaper than one full forward), gives it. Then per
prediction position (the positions whose acceptance the search measures)

    attention of l: 1 − cos(h_l, m_l)    MLP of l: 1 − cos(m_l, h_{l+1})    layer l: 1 − cos(h_l, h_{l+1})

averaged over positions. The cosine ignores the stream's growing norm, so early and late layers
compare on one scale; it is the KnapSpec / ShortGPT "block influence" measure.
"""

from __future__ import annotations

import torch

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.acceptance.reference import FORWARD_BATCH, ReferenceCache
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner


def _distance(before: torch.Tensor, after: torch.Tensor) -> float:
    """Mean `1 − cos` over positions (rows of `[N, d]`)."""
    cos = torch.nn.functional.cosine_similarity(before.float(), after.float(), dim=-1)
    return float((1.0 - cos).clamp_min(0.0).mean())


@torch.no_grad()
def proxy_importance(runner: LayerwiseRunner, reference: ReferenceCache) -> SublayerImportance:
    """The stream-cosine importance of every sub-layer and layer of the full model."""
    rows, cols = reference.prediction_index()
    count, width = reference.input_ids.shape
    num_layers = reference.num_layers
    position_ids = torch.arange(width, device=runner.device)[None]
    attn, mlp, layer = [], [], []
    for index in range(num_layers):
        only_attention = SkipMask(num_layers, mlp={index})
        middle = torch.cat(
            [
                runner.run_layers(
                    reference.hidden[index, begin : begin + FORWARD_BATCH],
                    index,
                    index + 1,
                    position_ids,
                    only_attention,
                )
                for begin in range(0, count, FORWARD_BATCH)
            ]
        )[rows, cols]
        before = reference.hidden[index][rows, cols]
        after = reference.hidden[index + 1][rows, cols]
        attn.append(_distance(before, middle))
        mlp.append(_distance(middle, after))
        layer.append(_distance(before, after))
    return SublayerImportance("proxy", tuple(attn), tuple(mlp), tuple(layer))
