"""The device a command runs on, checked in one line before any model is loaded there."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skipsearch.errors import ConfigError

if TYPE_CHECKING:
    import torch


def check_device(device: str) -> None:
    """Refuse a device this torch cannot use, in one line, before any model is loaded on it.

    Imports torch (the only torch use in this module), so callers check everything else first."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a torch device: use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"--device {device}: this torch {torch.__version__} sees no CUDA device: use --device cpu, "
                "or install a CUDA build of torch (README, Installing on a GPU)"
            )
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(f"--device {device}: only {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available here: use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device}: skipsearch runs on cpu, cuda or mps")


def device_sync(device: torch.device | str) -> Callable[[], None]:
    """What waits for `device`'s queued kernels: CUDA returns from a call once they are queued, so
    a clock read without it would time the launch; elsewhere the work is done and it does nothing."""
    import torch

    device = torch.device(device)
    return torch.cuda.synchronize if device.type == "cuda" else lambda: None
