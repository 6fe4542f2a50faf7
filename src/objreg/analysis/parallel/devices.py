"""The ``--device`` setting (``auto``, ``cpu``, ``cuda``, ``cuda:N``) turned into a device."""

from __future__ import annotations

import torch

from objreg.core.errors import DeviceError, InvalidParameterError


def resolve_device(setting: str) -> torch.device:
    """The device ``setting`` names; ``auto`` is CUDA where available, else the CPU.

    Raises:
        InvalidParameterError: not one of ``auto``, ``cpu``, ``cuda[:N]``.
        DeviceError: CUDA asked for where there is none, or a GPU index beyond those present.
    """
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(setting)
    except RuntimeError:
        raise InvalidParameterError(f"device must be auto, cpu or cuda[:N], got {setting!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {setting!r} requested but CUDA is not available on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {setting!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif device.type != "cpu":
        raise InvalidParameterError(f"device must be auto, cpu or cuda[:N], got {setting!r}")
    return device
