"""How a run finds its processes: ``torchrun``'s environment, the backend, the device.

:func:`from_environment` returns a :class:`~objreg.analysis.parallel.group.ProcessGroup` when ``torchrun``
started the process (``WORLD_SIZE`` > 1 with ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``) or when the caller has already initialised a process group (their own DDP
code), else the one-process :class:`~objreg.analysis.parallel.group.Group`. gloo serves CPU runs, NCCL
CUDA runs (each process on ``cuda:LOCAL_RANK``); ``OBJREG_DISTRIBUTED_BACKEND`` picks one
explicitly and ``OBJREG_DISTRIBUTED_TIMEOUT`` (seconds, default 1800) bounds how long a
collective waits for a process that stopped. The process group objreg initialises lives as long
as the process (it is destroyed at exit): a second ``analyze`` in the same process reuses it,
since initialising the default group again under torchrun reads the previous group's stale
addresses from torchrun's store. See docs/distributed.md.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from objreg.analysis.parallel.devices import resolve_device
from objreg.analysis.parallel.group import Group, ProcessGroup
from objreg.core.errors import DeviceError, DistributedError, InvalidParameterError

ENV_BACKEND = "OBJREG_DISTRIBUTED_BACKEND"
ENV_TIMEOUT = "OBJREG_DISTRIBUTED_TIMEOUT"
BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 1800.0
#: What torchrun sets for every process it starts (besides WORLD_SIZE).
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _integer(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value in (None, "") and default is not None:
        return default
    try:
        number = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidParameterError(f"environment variable {name} must be an integer, got {value!r}") from None
    if number < 0:
        raise InvalidParameterError(f"environment variable {name} must be ≥ 0, got {value!r}")
    return number


def requested_backend(environ: Mapping[str, str]) -> str | None:
    """``OBJREG_DISTRIBUTED_BACKEND`` (gloo or nccl), None when unset or ``auto``."""
    value = (environ.get(ENV_BACKEND) or "auto").strip().lower()
    if value == "auto":
        return None
    if value not in BACKENDS:
        raise InvalidParameterError(f"{ENV_BACKEND} must be auto, gloo or nccl, got {value!r}")
    return value


def timeout_seconds(environ: Mapping[str, str]) -> float:
    """``OBJREG_DISTRIBUTED_TIMEOUT``: how long a collective waits for the other processes."""
    value = environ.get(ENV_TIMEOUT)
    if value in (None, ""):
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidParameterError(f"{ENV_TIMEOUT} must be a positive number of seconds, got {value!r}")
    return seconds


def device_and_backend(device: str, local_rank: int, local_world_size: int, backend: str | None
                       ) -> tuple[torch.device, str]:
    """Where this process computes and which backend connects the processes.

    ``auto`` and ``cuda`` put process ``LOCAL_RANK`` on ``cuda:LOCAL_RANK``; ``cpu`` (or ``auto``
    without CUDA) runs gloo.

    Raises:
        DeviceError: CUDA asked for and absent, fewer GPUs than processes on this node, or NCCL
            asked for without CUDA or without NCCL in this PyTorch build.
        InvalidParameterError: ``cuda:N`` (one GPU) for several processes on this node, or a bad
            device string.
    """
    chosen = resolve_device((device or "auto").strip())
    if chosen.type == "cpu":
        if backend == "nccl":
            raise DeviceError(f"{ENV_BACKEND}=nccl needs CUDA devices, and this run is on the CPU; use gloo "
                              f"(unset {ENV_BACKEND}) or run on GPUs")
        return chosen, "gloo"
    if chosen.index is not None and local_world_size > 1:
        raise InvalidParameterError(
            f"device {device!r} names one GPU for the {local_world_size} processes torchrun started on this "
            f"node; use --device cuda (process LOCAL_RANK computes on cuda:LOCAL_RANK)"
        )
    if chosen.index is None:
        count = torch.cuda.device_count()
        if local_world_size > count or local_rank >= count:
            raise DeviceError(
                f"torchrun started {max(local_world_size, local_rank + 1)} processes on this node but only {count} "
                f"CUDA device(s) exist; use --nproc-per-node {count} (one process per GPU) or --device cpu"
            )
        chosen = torch.device("cuda", local_rank)
    if backend is None:
        backend = "nccl" if dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not dist.is_nccl_available():
        raise DeviceError(f"{ENV_BACKEND}=nccl but this PyTorch build has no NCCL; use gloo")
    return chosen, backend


def from_environment(device: str = "auto", environ: Mapping[str, str] | None = None) -> Group:
    """The process group this process belongs to.

    * A process group initialised already (by the caller's own DDP code, or by an earlier call):
      wrapped.
    * A ``torchrun`` launch of several processes: the default process group is initialised here
      (gloo on the CPU, NCCL on CUDA, see :func:`device_and_backend`), with the timeout of
      ``OBJREG_DISTRIBUTED_TIMEOUT``, and destroyed when the process exits.
    * Otherwise one process: the plain :class:`Group`.

    Raises:
        InvalidParameterError: ``WORLD_SIZE`` > 1 without the rest of a torchrun environment, or
            malformed variables.
        DeviceError: see :func:`device_and_backend`.
    """
    environ = os.environ if environ is None else environ
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        if world_size == 1:
            return Group()
        backend = str(dist.get_backend())
        local_rank = _integer(environ, "LOCAL_RANK", default=0)
        local_world_size = _integer(environ, "LOCAL_WORLD_SIZE", default=1)
        chosen, _ = device_and_backend(device, local_rank, local_world_size, None)
        return ProcessGroup(dist.get_rank(), world_size, backend, chosen)
    world_size = _integer(environ, "WORLD_SIZE", default=1)
    if world_size <= 1:
        return Group()
    missing = [name for name in LAUNCH_VARIABLES if not environ.get(name)]
    if missing:
        raise InvalidParameterError(
            f"WORLD_SIZE={world_size} is set but {', '.join(missing)} is not: start the processes with torchrun, "
            f"e.g. torchrun --nproc-per-node {world_size} $(command -v objreg) analyze ..."
        )
    if not dist.is_available():
        raise DeviceError("this PyTorch build has no torch.distributed; run in one process")
    rank = _integer(environ, "RANK")
    local_rank = _integer(environ, "LOCAL_RANK")
    local_world_size = _integer(environ, "LOCAL_WORLD_SIZE", default=1)
    if rank >= world_size:
        raise InvalidParameterError(f"RANK={rank} is not below WORLD_SIZE={world_size}")
    chosen, backend = device_and_backend(device, local_rank, local_world_size, requested_backend(environ))
    timeout = timedelta(seconds=timeout_seconds(environ))
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    atexit.register(_destroy)
    return ProcessGroup(rank, world_size, backend, chosen)


def _destroy() -> None:
    if dist.is_initialized():
        # Objects of the run still holding the group (in reference cycles) are freed first: freed
        # after it, gloo's threads can go down with them and abort the process at exit.
        gc.collect()
        dist.destroy_process_group()


def check_batch(batch_size: int, group: Group, what: str = "batch_size") -> None:
    """Every process needs at least one row of each batch it splits.

    Raises:
        InvalidParameterError: fewer rows than processes.
    """
    if batch_size < group.world_size:
        raise InvalidParameterError(
            f"{what} {batch_size} is smaller than the {group.world_size} processes: each process takes a share "
            f"of every batch's rows; use {what} ≥ {group.world_size} or fewer processes"
        )


def check_same_settings(group: Group, settings: Mapping[str, str]) -> None:
    """Every process must have been started with the same settings: ``torchrun`` runs one command
    per process, and processes that differ (another ``--seed``, ``--corpus`` or ``--lr``) would
    be merged into one report of nothing that ran, or (another ``--out``) wait for one another in
    different collectives until the timeout. Compared before the first other collective, in one.

    Args:
        settings: Setting → its value, as a string (equal strings: the same setting).

    Raises:
        DistributedError: on every process, naming the first process and setting that differ
            from the main process's.
    """
    if not group.distributed:
        return
    every = group.gather_objects(dict(settings))
    main = every[0]
    for rank, theirs in enumerate(every[1:], start=1):
        for key in [*main, *(k for k in theirs if k not in main)]:
            if main.get(key) != theirs.get(key):
                raise DistributedError(
                    f"process rank {rank} was started with {key} {theirs.get(key, '(not given)')} but rank 0 with "
                    f"{main.get(key, '(not given)')}: every process torchrun starts must be given the same settings")
