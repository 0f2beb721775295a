"""The dtype half of the kernel plan: what `--dtype auto` means on this device
(docs/cpu-backend.md).

Weights and activations run in bfloat16 on an accelerator and on a CPU that multiplies bf16
natively (`avx512_bf16` or AMX in its flags): there bf16 linear layers read half the bytes and
cost the same for 1 to 5 positions, while fp32 ones cost more with every extra position, which
makes a verify pass cost several steps. Without native bf16, bf16 is emulated and slower, so the
dtype stays float32. The flags are read, never guessed. Pure: no torch, so the choice can be made
(and a LatencyProfile's path named) before anything heavy loads. The flags say what a CPU can do, not what
is fastest on it: where they say bf16, `loading.dtype_choice` also weighs the fallback plan's
float32 activations on the same bf16 weights, measured once per machine
(`cpu.bf16_activations`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags as the kernel reports them, or None where they cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_model(path: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as the kernel reports it ("unknown CPU" where it cannot be read)."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown CPU"
    names = (line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name"))
    return next(names, "") or "unknown CPU"


def describe_cpu(flags: frozenset[str] | None = None, model: str | None = None) -> str:
    """The CPU in the words every results table names it by: its model and the vector units the
    plan is chosen by, e.g. `<model name> (AVX2, no AVX-512, no AMX)`."""
    flags = cpu_flags() if flags is None else flags
    model = cpu_model() if model is None else model
    if flags is None:
        return f"{model} (flags unreadable)"
    units = [
        "AMX" if "amx_tile" in flags else "no AMX",
        "AVX-512" + (" with bf16" if "avx512_bf16" in flags else "") if "avx512f" in flags else "no AVX-512",
    ]
    widest = "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model} ({', '.join([widest, *units[::-1]])})"


def native_bf16(flags: frozenset[str] | None) -> str | None:
    """The flag that says this CPU multiplies bf16 natively, or None."""
    return next((flag for flag in NATIVE_BF16_FLAGS if flags and flag in flags), None)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype `--dtype` resolves to, and why (printed by every command that loads a model)."""

    name: str
    reason: str


def choose_dtype(device_kind: str, requested: str, flags: frozenset[str] | None = None) -> DtypeChoice:
    """`--dtype auto`: bf16 on an accelerator and on a CPU with native bf16, else float32.

    `flags` defaults to this machine's (`cpu_flags`); tests pass their own.
    """
    if requested != "auto":
        return DtypeChoice(requested.removeprefix("torch."), "as --dtype asked")
    if device_kind != "cpu":
        return DtypeChoice("bfloat16", f"--dtype auto on {device_kind}")
    flags = cpu_flags() if flags is None else flags
    flag = native_bf16(flags)
    if flag is not None:
        return DtypeChoice("bfloat16", f"--dtype auto: this CPU multiplies bf16 natively ({flag})")
    seen = "its flags could not be read" if flags is None else f"no {' or '.join(NATIVE_BF16_FLAGS)}"
    return DtypeChoice("float32", f"--dtype auto: this CPU has no native bf16 ({seen}), so fp32 is faster")
