"""How many CPU threads ``objreg analyze`` gives torch, chosen for the machine it finds.

torch's default, one intra-op thread per core, suits a machine of one's own. Where other jobs
share the cores, every parallel kernel waits for whichever of its threads is not scheduled, and
the run takes several times as long (docs/performance.md measures it). So unless told otherwise
(``--threads N``, or ``OMP_NUM_THREADS``, which torch reads itself) objreg counts the CPUs this
process may run on (its affinity, a cgroup's CPU quota, shared out among the processes torchrun
started on the machine), takes off what other processes keep busy (the one-minute load average),
and uses the rest: at least one thread, at most one per CPU.

On a busy machine the console script also asks OpenMP to let waiting threads sleep
(``OMP_WAIT_POLICY=PASSIVE``) rather than spin on a core another job needs. OpenMP reads that
once, when torch loads, so it is set before torch is imported, and only where the user has not
set it (:func:`prepare_environment`).

Nothing here imports torch at module level: :func:`prepare_environment` runs before torch loads.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: A one-minute load average from which the console script lets OpenMP's waiting threads sleep.
BUSY_LOAD = 0.5


@dataclass(frozen=True)
class Threads:
    """The intra-op thread count a run uses and where it came from.

    Attributes:
        count: Threads torch computes with.
        source: ``auto``, ``--threads`` or ``OMP_NUM_THREADS``.
        cpus: CPUs this process may use (its share under torchrun).
        load: The one-minute load average when the count was chosen (None where the system has none).
    """

    count: int
    source: str
    cpus: int
    load: float | None

    def describe(self) -> str:
        """``1 thread (auto: 2 CPUs, load 1.93)``; ``4 threads (--threads)``."""
        plural = "thread" if self.count == 1 else "threads"
        if self.source != "auto":
            return f"{self.count} {plural} ({self.source})"
        load = "" if self.load is None else f", load {self.load:.2f}"
        return f"{self.count} {plural} (auto: {self.cpus} CPU{'s' * (self.cpus != 1)}{load})"


#: The most threads ``--threads`` takes: torch's count is a 32-bit integer, and no machine has the
#: cores for more than a few thousand.
MAX_THREADS = 4096


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def _cgroup_quota() -> int | None:
    """The CPUs a cgroup's quota allows (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded up; None: no quota."""
    try:
        fields = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return math.ceil(int(fields[0]) / int(fields[1]))
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return math.ceil(quota / period)
    except (OSError, ValueError):
        pass
    return None


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _processes_here(environ: MutableMapping[str, str]) -> int:
    """Processes torchrun started on this machine (``LOCAL_WORLD_SIZE``), else 1."""
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def choose(requested: int | None, environ: MutableMapping[str, str], cpus: int, load: float | None) -> Threads:
    """The thread count for a run: ``requested`` (``--threads``), else ``OMP_NUM_THREADS``, else
    what ``cpus`` CPUs have left at load average ``load`` (module docstring), shared among the
    processes torchrun started here."""
    cpus = max(1, cpus // _processes_here(environ))
    if requested is not None:
        return Threads(requested, "--threads", cpus, load)
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return Threads(int(given), "OMP_NUM_THREADS", cpus, load)
    free = cpus if load is None else math.floor(cpus - load + 0.5)
    return Threads(max(1, min(cpus, free)), "auto", cpus, load)


def for_this_machine(requested: int | None) -> Threads:
    """:func:`choose` on this machine, now."""
    return choose(requested, os.environ, usable_cpus(), load_average())


def prepare_environment(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Before torch loads: on a busy machine, ``OMP_WAIT_POLICY=PASSIVE`` where the user set no
    policy. Returns the policy set (None: nothing set, torch already loaded or the machine idle)."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in environ:
        return None
    load = load_average()
    if load is None or load < BUSY_LOAD:
        return None
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "PASSIVE"


@contextmanager
def using(threads: Threads) -> Iterator[None]:
    """torch computes with ``threads.count`` intra-op threads inside, its own count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads.count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
