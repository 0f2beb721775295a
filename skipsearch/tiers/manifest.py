"""The tier manifest (`tiers.json`): the masks, draft lengths and policy an engine captures
(docs/theory.md, "Tier sets and CUDA graphs").

One CUDA graph per tier is pre-captured (docs/theory.md, "Tier sets and CUDA graphs": multi-graph
pre-capture, tier switching on the CPU); the manifest is what the engine and the exports read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.store import write_text_atomic
from skipsearch.tiers.policy import TierPolicy, check_policy

MANIFEST_VERSION = 1


# -- the capture manifest --------------------------------------------------------------------------
@dataclass(frozen=True)
class TierManifest:
    """`tiers.json`: what an engine pre-captures and how it switches (docs/theory.md, "Tier sets and
    CUDA graphs").

    One draft-step graph per (tier, batch-size bucket) and one verify graph per (tier, draft
    length 0..γ_tier, bucket): the last round of a sequence drafts fewer so it never overshoots.
    The policy runs on the CPU between rounds; switching tiers is choosing which graph to replay.
    """

    model: str
    masks: tuple[SkipMask, ...]
    policy: TierPolicy
    gammas: tuple[int, ...]
    buckets: tuple[int, ...] = (1,)
    predicted: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_policy(self.policy, len(self.masks))
        if len({m.num_layers for m in self.masks}) != 1:
            raise ConfigError("every tier's mask must be for the same model depth")
        if len({str(m) for m in self.masks}) != len(self.masks):
            raise ConfigError("tier masks must be distinct: a repeated mask is one tier")
        if len(self.gammas) != len(self.masks) or min(self.gammas) < 1:
            raise ConfigError(f"need one draft length >= 1 per tier, got {list(self.gammas)}")
        buckets = list(self.buckets)
        if not buckets or buckets[0] < 1 or buckets != sorted(set(buckets)):
            raise ConfigError(f"buckets must be increasing batch sizes >= 1, got {list(self.buckets)}")

    @property
    def num_layers(self) -> int:
        return self.masks[0].num_layers

    def graphs(self) -> dict[str, list[dict[str, int]]]:
        """The graphs to capture, by kind."""
        tiers = range(len(self.masks))
        return {
            "draft": [{"tier": t, "bucket": b} for t in tiers for b in self.buckets],
            "verify": [
                {"tier": t, "gamma": g, "bucket": b}
                for t in tiers
                for g in range(self.gammas[t] + 1)
                for b in self.buckets
            ],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "skipsearch-tiers",
            "version": MANIFEST_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "tiers": [
                {
                    "tier": i,
                    "mask": str(m),
                    "gamma": self.gammas[i],
                    "skipped_attn": sorted(m.attn),
                    "skipped_mlp": sorted(m.mlp),
                    "exit_layer": m.exit_layer,
                    "first_divergent_layer": m.first_divergent_layer,
                    "r_draft": m.r_draft(),
                    "r_reuse": m.r_reuse,
                }
                for i, m in enumerate(self.masks)
            ],
            "policy": {
                "window": self.policy.window,
                "thresholds": list(self.policy.thresholds),
                "start_tier": 0,
            },
            "buckets": list(self.buckets),
            "graphs": self.graphs(),
            "predicted": dict(self.predicted),
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierManifest:
        try:
            num_layers = int(data["num_layers"])
            policy = data["policy"]
            return cls(
                model=str(data["model"]),
                masks=tuple(SkipMask.parse(t["mask"], num_layers) for t in data["tiers"]),
                policy=TierPolicy(int(policy["window"]), tuple(float(t) for t in policy["thresholds"])),
                gammas=tuple(int(t["gamma"]) for t in data["tiers"]),
                buckets=tuple(int(b) for b in data.get("buckets", (1,))),
                predicted=dict(data.get("predicted", {})),
                provenance=dict(data.get("provenance", {})),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"tier manifest is malformed ({type(error).__name__}: {error}): "
                "write it with `skipsearch export` or experiments/tiers_smollm2.py"
            ) from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> TierManifest:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read tier manifest {path}: {error}") from None
        if not _has_tiers(data):
            raise ConfigError(f"{path} is not a tier manifest (no 'tiers' list): pass a tiers.json")
        return cls.from_dict(data)


def is_tier_manifest(path: Path) -> bool:
    """Whether `path` is a `tiers.json` rather than a one-mask file such as best.json (an
    unreadable file is not: the one-mask reader reports it)."""
    try:
        return _has_tiers(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError):
        return False


def _has_tiers(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("tiers"), list)
