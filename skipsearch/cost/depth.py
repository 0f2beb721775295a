"""Scale a profile measured on a depth-cut model (`--num-layers`) back to the real depth.

Every decoder layer of a model has the same shape, so on a weight-free model (random weights,
where nothing distinguishes one layer from another) each real layer costs what the measured
layers cost on average. Embedding, head and the per-round overhead do not depend on depth. The
profile then prices masks over all the real layers, and its meta says it was scaled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError

PER_LAYER = ("attn", "mlp")


def scale_to_depth(profile: LatencyProfile, num_layers: int) -> LatencyProfile:
    """`profile` with its per-layer tables repeated as their layer mean to `num_layers` layers."""
    measured = profile.num_layers
    if num_layers < measured:
        raise ConfigError(f"cannot scale a {measured}-layer profile down to {num_layers} layers")
    if num_layers == measured:
        return profile
    data: dict[str, Any] = profile.to_dict()
    for name in PER_LAYER:
        for tables in (data, data["spread"], *data["precisions"].values()):
            mean = np.asarray(tables[name]).mean(axis=0)
            tables[name] = np.repeat(mean[None], num_layers, axis=0).tolist()
    for costs in data["precisions"].values():  # a step and its bytes were of the cut model too
        costs |= {"step": [], "weight_bytes": None}
    # The bytes a step reads were counted on the cut model: no memory floor for the real depth.
    meta = {k: v for k, v in data["meta"].items() if k not in ("weight_bytes", "kv_bytes_per_position")}
    data["meta"] = {
        **meta,
        "num_layers": num_layers,
        "measured_layers": measured,
        "depth_scaled": f"per-layer entries are the mean of {measured} measured layers, repeated to "
        f"the real depth of {num_layers}",
    }
    return LatencyProfile.from_dict(data)
