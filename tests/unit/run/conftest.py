"""Finished runs on a synthetic evaluator (no model) for the export tests, and the per-test cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import candidate_generator

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.config import RunConfig
from skipsearch.executors.base import LocalExecutor
from skipsearch.masks import SkipMask
from skipsearch.run.export_source import ExportedDraft, ExportSource
from skipsearch.run.report import write_run_outputs
from skipsearch.search import SearchConfig, make_strategy, run_study
from skipsearch.search.objective import make_scorer
from skipsearch.search.space_files import parse_space

LAYERS = 8


# Layers 1 and 2 are nearly free to skip, the last layer is expensive: the best mask is sparse
# ({1, 2}) and every early exit, which must skip the last layer, scores lower.
DAMAGE = np.array([3.0, 0.02, 0.02, 0.6, 0.8, 0.9, 1.0, 2.0])

DRAWS = np.random.default_rng(7).random((4, 48))

SPACES = {
    "contiguous": {"kind": "contiguous"},
    "sparse-with-exits": {"kind": "sparse", "protected": [0], "max_skipped": 2},
    "sparse": {"kind": "sparse", "protected": [0, -1], "max_skipped": 2},
}


def synthetic_profile(mask: SkipMask) -> AcceptanceProfile:
    accept = float(np.exp(-DAMAGE[sorted(mask.skipped_layers)].sum()))
    matches = tuple(tuple(bool(d < accept) for d in row) for row in DRAWS)
    return AcceptanceProfile(str(mask), matches, tuple((accept,) * len(row) for row in DRAWS), 1.0)


def make_run(run_dir: Path, space_name: str) -> Path:
    """An exhaustive search of a small space, written out as `skipsearch run` would."""
    space = parse_space(SPACES[space_name], space_name, space_name).resolve(LAYERS)
    with LocalExecutor(synthetic_profile) as executor:
        run_study(
            space,
            make_strategy("exhaustive"),
            executor,
            make_scorer(),
            run_dir,
            SearchConfig(budget=space.size()),
        )
    provenance = {"num_layers": LAYERS, "prompt_set": "synthetic-0123", "torch": "t", "transformers": "tf"}
    RunConfig(space=space_name, strategy="exhaustive", budget=space.size()).save(
        run_dir / "run.yaml", provenance
    )
    write_run_outputs(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three runs; the journal's fsync (most of the time) is off, as in test_search."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        return {name: make_run(root / name, name) for name in SPACES}


# -- the HF export drives transformers' early-exit assisted generation ------------------------------
def hf_source(num_layers: int) -> ExportSource:
    best = ExportedDraft(SkipMask.prefix(num_layers, num_layers // 2), 3, 1.2, 0)
    return ExportSource(Path("run"), None, {"model": "m"}, best, best, None, None)


def assisted_greedy(
    model, prompt: tuple[int, ...], new_tokens: int, directory: Path, monkeypatch
) -> list[int]:
    """`model.generate` with the exported generation config, recording each draft's length."""
    drafted: list[int] = []
    original = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        drafted.append(ids.shape[1] - input_ids.shape[1])
        return ids, logits

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates", spy)
    model.generation_config = GenerationConfig.from_pretrained(directory)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )
    assert drafted and max(drafted) == 3  # num_assistant_tokens = γ, no confidence cut
    return out[0, len(prompt) :].tolist()
