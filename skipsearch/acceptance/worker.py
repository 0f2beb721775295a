"""Everything a worker needs to evaluate masks: model, prompts, ReferenceCache, estimator.

`prepare` is the one place that turns a model name and a prompt spec into a ready Estimator,
reusing the on-disk ReferenceCache when the same (model, prompts, options) was built before.
The local executor calls it once per run; a Ray actor calls it once per worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial

import torch

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import MODES_WITH_KV, MeasureConfig
from skipsearch.acceptance.profile import Evaluator
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts, select_prompts
from skipsearch.acceptance.reference import ReferenceCache, build_reference, reference_key
from skipsearch.acceptance.vocab import VocabRanking, ranking_for
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern
from skipsearch.models.attention import GROUPED_KEYS, GROUPED_QUERIES
from skipsearch.models.loading import LoadedModel, load_model
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.store import reference_cache_path

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """A loaded model with its estimator; the draft-vocabulary ranking is counted on first use."""

    loaded: LoadedModel
    runner: LayerwiseRunner
    estimator: Estimator
    reference_path: str
    prompts: PromptSpec
    model_released: bool = False
    """Set by `release_model`: the weights are gone, so nothing here can compute any more."""

    @property
    def num_layers(self) -> int:
        return self.runner.num_layers

    @cached_property
    def ranking(self) -> VocabRanking:
        """Token ids by frequency on text disjoint from the measured prompts (`acceptance.vocab`)."""
        return ranking_for(self.loaded, self.prompts)

    def prompt_ids(self) -> list[tuple[int, ...]]:
        """The measured prompts' token ids, read back from the reference (encoding them again would
        repeat every warning the encoding gave)."""
        reference = self.estimator.reference
        return [
            tuple(ids[:length].tolist())
            for ids, length in zip(reference.input_ids, reference.prompt_lengths.tolist(), strict=True)
        ]

    def vocab_ids(self, size: int) -> tuple[int, ...]:
        """The draft vocabulary of `size`: the ranking's top `size` ids."""
        return self.ranking.top(size)

    def evaluator(
        self, temperature: float, vocabs: Sequence[int] = (), patterns: Sequence[KVPattern] = ()
    ) -> Evaluator:
        """Measures one mask at `temperature`, with the full vocabulary and each size in `vocabs`,
        attending to every key and through each of `patterns`."""
        return partial(
            self.estimator.evaluate, temperature=temperature, vocabs=tuple(vocabs), patterns=tuple(patterns)
        )

    def release_model(self) -> None:
        """Free the device of this process's weights and reference states, keeping their shapes.

        With Ray GPU workers each actor loads its own copy from the on-disk reference; the driver
        only reads the depth and the reference's path afterwards, so its copy (14.5 GB + 2.2 GB at
        7B in bf16) would hold a GPU twice. Anything that computes with it afterwards fails on the
        `meta` device instead of using freed memory.
        """
        self.model_released = True
        self.loaded.model.to("meta")
        reference, estimator = self.estimator.reference, self.estimator
        for name in ("hidden", "keys", "values"):
            tensor = getattr(reference, name)
            setattr(reference, name, None if tensor is None else tensor.to("meta"))
        estimator.target_logits = estimator.target_logits.to("meta")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def prepare(config: MeasureConfig, check: Callable[[int], object] | None = None) -> Measurement:
    """Load the model and the (cached or freshly built) ReferenceCache for `config`.

    `check(num_layers)` runs between the two, so input that depends on the model's depth (a
    mask) is rejected before the slow reference build.
    """
    select_prompts(config.prompts)  # fail on a bad prompt file before the slow model load
    loaded = load_model(config.model, device=config.device, dtype=config.dtype)
    runner = LayerwiseRunner(loaded.model)
    vocab_size = int(loaded.model.config.vocab_size)
    too_large = [k for k in config.draft_vocabs if k > vocab_size]
    if too_large:
        raise ConfigError(
            f"draft vocabulary {too_large[0]} is larger than {config.model}'s vocabulary of {vocab_size} "
            f"ids: use at most {vocab_size}, or full"
        )
    if check is not None:
        check(runner.num_layers)
    with_kv = config.mode in MODES_WITH_KV
    # The kernels are part of the numbers: a bf16 model's continuations differ under fp32 attention,
    # and may at a near-tie with grouped query rows (packed weights give the same bits, so they are
    # not part of the key).
    implementation = loaded.model.config._attn_implementation
    dtype = f"{loaded.model.dtype}/{implementation}/grouped{GROUPED_QUERIES}x{GROUPED_KEYS}"
    # A cache holding K/V also serves `self` mode, so look for it first.
    candidates = [reference_key(loaded.source, dtype, config.prompts.key(), kv) for kv in (True, with_kv)]
    paths = [reference_cache_path(key) for key in candidates]
    existing = next((p for p in paths if p.is_file()), None)
    if existing is not None:
        reference = ReferenceCache.load(existing, runner.device, with_kv)
        path = existing
    else:
        prompts = encode_prompts(
            config.prompts, loaded.tokenizer, getattr(loaded.model.config, "max_position_embeddings", None)
        )
        reference = build_reference(runner, prompts, config.prompts.new_tokens, with_kv)
        path = paths[-1]
        reference.save(
            path, {"model": config.model, "source": loaded.source, "prompts": config.prompts.to_dict()}
        )
        log.info("reference cache saved to %s", path)
    measurement = Measurement(
        loaded,
        runner,
        Estimator(
            runner, reference, config.mode, round_gamma=config.round_gamma, round_stop=config.round_stop
        ),
        str(path),
        config.prompts,
    )
    measurement.estimator.vocab_ids = measurement.vocab_ids
    return measurement
