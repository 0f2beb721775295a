"""Token choice and the acceptance rule of speculative decoding: small pure tensor functions.

Greedy and sampling are separate paths (docs/theory.md, "Lossless acceptance"): greedy accepts a
draft token when it is the target's argmax, sampling uses rejection sampling, which makes the output
distribution exactly the target's `p` whatever the draft's `q` (Leviathan et al. 2023, Theorem 1):

    accept x ~ q with probability min(1, p(x) / q(x)); on rejection sample norm(max(0, p - q)).

Both sides must see the same temperature and the same top-k / top-p truncation (same section): `p`
and `q` are then distributions over the same support and the ratio is meaningful.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skipsearch.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by draft and target. `temperature == 0` means greedy."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top-k must be >= 1 (or unset for no top-k), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)


GREEDY = Sampling()


def logits_to_probs(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float = 1.0
) -> torch.Tensor:
    """softmax(logits / T) restricted to the top-k tokens, then to the nucleus of mass `top_p`.

    The nucleus keeps a token when the mass of the tokens ranked above it is below `top_p`, so
    the most likely token always survives. Works on the last dimension of any shape.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to sample (greedy takes the argmax), got {temperature}")
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        above = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above < top_p)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token index per row of (possibly unnormalised, non-negative) weights, shape `[..., 1]`."""
    return torch.multinomial(probs, 1, generator=generator)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalised `max(0, p - q)`: where the target wants more mass than the draft gave.

    The clamp is what makes rejection sampling exact: a rejection happens with probability
    `sum_x max(0, q(x) - p(x))`, which equals the residual's mass, so `p = min(p, q) + max(0, p - q)`.
    """
    return torch.clamp(p - q, min=0.0)


def resample(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """The token after a rejection: a sample from `norm(max(0, p - q))` (1-D distributions).

    That residual is all zero only when `p == q` up to rounding (so a rejection had probability
    ~0); `p` itself is then the exact fallback.
    """
    weights = residual(p, q)
    if not bool((weights > 0).any()):
        weights = p
    return int(sample(weights, generator))


def sample_accept(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """One round of rejection sampling: (accepted draft tokens `n`, the round's extra token).

    `draft` `[γ]` holds the draft tokens, `q` the draft's distributions `[γ, V]`, `p` the target's
    `[γ + 1, V]`. All γ tests `u_j q_j(x_j) < p_j(x_j)` run at once and the first failure is read
    back in one host sync (gpt-fast's `generate.py` does the same); the tokens after it were never
    accepted, so their draws do not matter. The extra token is the resampled one at the first
    rejection, or a bonus sample from `p[γ]` when all `γ` pass.
    """
    gamma = len(draft)
    rows = torch.arange(gamma, device=p.device)
    u = torch.rand(gamma, generator=generator, device=p.device)
    rejected = u * q[rows, draft] >= p[rows, draft]
    first = int(torch.cat([rejected, rejected.new_ones(1)]).int().argmax())
    if first == gamma:
        return gamma, int(sample(p[gamma], generator))
    return first, resample(p[first], q[first], generator)


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy round: accept the longest prefix of `draft` `[γ]` equal to the target's argmax.

    `target_logits` `[γ + 1, V]`; the extra token is the target's argmax right after the accepted
    prefix — its correction at the first mismatch, or the bonus token when all `γ` match. One
    comparison over all drafts and one host sync per round (`greedy_commit`).
    """
    committed, _ = greedy_commit(draft, target_logits)
    return len(committed) - 1, committed[-1]


def greedy_commit(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The tokens a greedy round commits — the `n` accepted drafts and the extra token
    (`greedy_accept`) — and the extra token `[1, 1]` left on the device.

    Accepted drafts equal the target's argmax, so the committed tokens are `argmax[: n + 1]`: `n`
    and the whole argmax come back in one copy, the round's one host sync. The extra token is the
    next round's pending token; kept on the device, feeding it costs no copy from the host.
    """
    target = target_logits.argmax(dim=-1)
    accepted = (draft == target[: len(draft)]).int().cumprod(dim=0).sum()
    pending = target.index_select(0, accepted.view(1)).view(1, 1)
    count, *argmax = torch.cat([accepted.view(1), target]).tolist()
    return argmax[: count + 1], pending
