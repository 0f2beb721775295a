"""The draft's LM head over a draft vocabulary: `k` rows of the head, gathered once (docs/theory.md,
"The draft vocabulary").

A draft only has to propose likely tokens, and the full head is a large share of a draft step
(17% on SmolLM2's 49k vocabulary, more on 152k). Multiplying only the rows of the draft
vocabulary's ids makes that share `k / V`. Verify keeps the full head, so the output is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.packed import PackedLinear, linear_product
from skipsearch.errors import ConfigError
from skipsearch.models.runner import LayerwiseRunner


@dataclass(frozen=True)
class DraftHead:
    """Final norm + the LM head restricted to `ids`: logits over the subset, in `ids` order.

    `product` multiplies by a contiguous copy of those rows (a gather per step would read the full
    matrix's pages again) on the kernel the full head runs on (`cpu.bf16_weights`, or
    `cpu.packed.linear_product`);
    `vocab_size` is the full vocabulary, for scattering subset probabilities back.
    """

    runner: LayerwiseRunner
    ids: torch.Tensor
    product: torch.nn.Module
    vocab_size: int

    @classmethod
    def gather(cls, runner: LayerwiseRunner, ids: Sequence[int]) -> DraftHead:
        head = runner.model.lm_head
        full = head.weight  # read once: a packed head unpacks its matrix on each read
        vocab_size = full.shape[0]
        index = torch.as_tensor(list(ids), dtype=torch.long, device=full.device)
        if index.numel() == 0 or index.unique().numel() != index.numel():
            raise ConfigError("a draft vocabulary needs at least one id and no id twice")
        if int(index.min()) < 0 or int(index.max()) >= vocab_size:
            raise ConfigError(f"draft vocabulary ids must be in 0..{vocab_size - 1}: the model's vocabulary")
        with torch.no_grad():
            weight = full.index_select(0, index).contiguous()
            bias = None if head.bias is None else head.bias.index_select(0, index).contiguous()
        if isinstance(head, Bf16WeightLinear):
            product: torch.nn.Module = Bf16WeightLinear(weight, bias, head.kernel)
        else:
            product = linear_product(weight, bias, pack=isinstance(head, PackedLinear))
        return cls(runner, index, product, vocab_size)

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[..., k]` of the subset for the last layer's output `hidden` `[..., d]`."""
        return self.product(self.runner.decoder.norm(hidden))

    def token(self, index: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of positions `index` in the subset."""
        return self.ids[index]

    def scatter(self, probs: torch.Tensor) -> torch.Tensor:
        """Subset probabilities `[k]` as a distribution over the full vocabulary (zero outside)."""
        full = probs.new_zeros(self.vocab_size)
        return full.index_copy_(0, self.ids, probs)
