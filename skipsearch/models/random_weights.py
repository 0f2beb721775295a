"""Weight-free models: an architecture from its config with seeded random weights
(docs/architecture.md, "Weight-free models").

Latency does not depend on weight values, so the cost side of a model — `profile`, the timing of
`decode` — can be measured without downloading it. The registry ships the `config.json` of every
alias (`models/configs/`, small public facts); a local model directory's own config works too.
`num_layers` keeps the width and cuts the depth, so a 7B-wide model fits a small machine: every
decoder layer has the same shape, so per-layer costs measured on a few layers stand for all of
them (`cost.depth` scales a LatencyProfile back to the real depth and says so).

Acceptance on random weights is meaningless — every draft disagrees with the target by chance —
so commands that report acceptance refuse such a model (`refuse_acceptance`).
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skipsearch.errors import ConfigError, ModelLoadError
from skipsearch.models.registry import REGISTRY

CONFIG_PACKAGE = "skipsearch.models.configs"


@dataclass(frozen=True)
class RandomWeights:
    """Build the model with seeded random weights; `num_layers` cuts its depth (None: the real depth)."""

    num_layers: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_layers is not None and self.num_layers < 1:
            raise ConfigError(f"--num-layers must be >= 1, got {self.num_layers}")


def shipped_configs() -> list[str]:
    """Aliases whose config ships with the package."""
    files = importlib.resources.files(CONFIG_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def architecture_config(name: str) -> dict[str, Any]:
    """The `config.json` of an alias (shipped) or of a local model directory, as a dict."""
    if name in REGISTRY:
        resource = importlib.resources.files(CONFIG_PACKAGE) / f"{name}.json"
        return json.loads(resource.read_text())
    path = Path(name).expanduser() / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    raise ModelLoadError(
        f"--random-weights needs an architecture config: {name!r} is neither an alias with a shipped "
        f"config ({', '.join(shipped_configs())}) nor a model directory with config.json"
    )


def random_config(name: str, weights: RandomWeights) -> Any:
    """The transformers config of `name`, cut to `weights.num_layers` layers when asked."""
    from transformers import AutoConfig

    data = architecture_config(name)
    real = int(data["num_hidden_layers"])
    layers = weights.num_layers or real
    if layers > real:
        raise ConfigError(f"--num-layers {layers} exceeds {name}'s {real} layers: give at most {real}")
    data["num_hidden_layers"] = layers
    if data.get("layer_types"):
        data["layer_types"] = data["layer_types"][:layers]
    model_type = data.pop("model_type")
    config = AutoConfig.for_model(model_type, **data)
    config.real_num_layers = real  # what a depth-cut profile is scaled back to
    return config


def random_model(name: str, device: str, dtype: Any, weights: RandomWeights, matrices: Any = None) -> Any:
    """The architecture of `name` with random weights drawn from `weights.seed`, built on `device`
    in `dtype`, its weight matrices in `matrices` (None: `dtype`; `models.weight_layout`).

    The model is laid out on the meta device first, then each module's own weights are made, drawn
    and cast to their dtype before the next module's are made, so a matrix exists in `dtype` one at
    a time: a 7B's bf16 matrices never stand in float32 all at once. Each module is drawn by
    transformers' own initialisation (`_init_weights`), in the model's order, from the seed."""
    import torch
    from transformers import AutoModelForCausalLM

    from skipsearch.models.weight_layout import WeightDtypes

    config = random_config(name, weights)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    layout = WeightDtypes(str(dtype).removeprefix("torch."), str(matrices or dtype).removeprefix("torch."))
    dtypes = layout.dtypes(model)
    made: set[int] = set()
    # transformers initialises weights from the global RNG and takes no generator: seed it for the
    # build only, and give the caller's RNG state back (`fork_rng`).
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(weights.seed)
        with torch.no_grad():
            for module in model.modules():
                own = {id(t) for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))}
                if not own or own <= made:
                    continue  # a head tied to the input embedding: made with it, tied again below
                made |= own
                targets = layout.targets(module, dtypes)
                module.to_empty(device=device, recurse=False)
                model._init_weights(module)
                layout.apply(module, targets)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[tuple[int, ...]]:
    """Seeded random token ids: a weight-free model has no tokenizer, and its timing needs none."""
    import random

    rng = random.Random(seed)
    return [tuple(rng.randrange(vocab_size) for _ in range(length)) for _ in range(count)]


def refuse_acceptance(weights: RandomWeights | None, command: str) -> None:
    """Acceptance measured on random weights says nothing about the real model: refuse it."""
    if weights is not None:
        raise ConfigError(
            f"{command} reports acceptance, which is meaningless on random weights: drop --random-weights "
            "(it serves `profile` and the timing of `decode`)"
        )
