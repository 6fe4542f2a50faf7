"""What every benchmark shares: the machine description, interleaved timing, peak memory, the
default workload (corpus, tokenizer, model, a corrupted batch, the downstream gradient)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import objreg
from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.functional import ObjectiveFunction, Params, detached, shared_parameters
from objreg.analysis.run.prepare import build_model

REPO = Path(__file__).resolve().parents[1]


# -- the machine ------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else platform.machine()


def machine(device: torch.device) -> dict[str, Any]:
    """Enough to tell two runs' machines apart."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- timing -----------------------------------------------------------------------------------------


def interleaved(
    paths: Mapping[str, Callable[[], Any]],
    repeats: int,
    device: torch.device,
    warmup: int = 1,
    repeats_of: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """Median seconds of each path, measured round-robin: round r runs every path once, in a
    shuffled (seeded) order, so slow phases of a shared machine and the state one path leaves for
    the next hit all of them alike. ``repeats_of`` gives slow paths fewer rounds."""
    repeats_of = dict(repeats_of or {})
    for path in paths.values():
        for _ in range(warmup):
            path()
    times: dict[str, list[float]] = {name: [] for name in paths}
    order = random.Random(0)
    for round_ in range(repeats):
        names = list(paths)
        order.shuffle(names)
        for name in names:
            path = paths[name]
            if round_ >= repeats_of.get(name, repeats):
                continue
            synchronize(device)
            start = time.perf_counter()
            path()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# -- peak memory ------------------------------------------------------------------------------------
#
# CUDA: torch.cuda.max_memory_allocated above what was allocated before the path (tensor bytes).
# CPU: torch keeps no peak statistic for its CPU allocator, and tracemalloc does not see tensor
# storage. Each path runs in a fresh subprocess with glibc told to serve every allocation of 64 KiB
# or more by mmap (MALLOC_MMAP_THRESHOLD_, which also stops glibc from raising that threshold), so
# freed tensors leave the resident set at once; after one warm-up run the kernel's resident-set
# high-water mark is reset (/proc/self/clear_refs 5) and the path's peak is VmHWM − VmRSS before it.

MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status_mib(key: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) / 1024  # type: ignore[union-attr]


def peak_memory_here(path: Callable[[], Any], device: torch.device) -> float:
    """MiB above the starting point at the peak of one run of ``path`` (after one warm-up run)."""
    path()
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        path()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    before = _status_mib("VmRSS")
    path()
    return _status_mib("VmHWM") - before


def memory_method(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated above the allocation before the path, after one warm-up run"
    return (
        "resident-set high-water mark (VmHWM, reset via /proc/self/clear_refs) above VmRSS before the path, "
        "one fresh subprocess per path, glibc MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave RSS at once, "
        "after one warm-up run"
    )


def peak_memory_in_subprocess(module: str, argv: Sequence[str], path: str) -> float:
    """Run ``python -m module *argv --memory-child path`` with the memory environment; its last
    stdout line is the peak in MiB."""
    env = {**os.environ, **MEMORY_ENV}
    result = subprocess.run(
        [sys.executable, "-m", module, *argv, "--memory-child", path],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"memory child for {path!r} failed:\n{result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


# -- the workload -----------------------------------------------------------------------------------


@dataclass
class Workload:
    """A model, one corrupted batch of an objective, and the downstream gradient as direction."""

    registry: objreg.Registry
    tokenizer: objreg.Tokenizer
    model: torch.nn.Module
    function: ObjectiveFunction
    shared: dict[str, torch.Tensor]
    direction: dict[str, torch.Tensor]
    downstream: list[ObjectiveFunction]
    device: torch.device

    @property
    def parameters(self) -> int:
        return sum(t.numel() for t in self.shared.values())


def mean_gradient(functions: Sequence[ObjectiveFunction], shared: Params) -> Params:
    """The gradient of the mean loss over every example of ``functions`` (chunks of one set), as
    :class:`Curvature` takes it for ``D`` (no Hessian-vector product)."""
    return Curvature(list(functions), shared, "forward_over_reverse").gradient_and_products([])[0]


def build_workload(
    objective: str,
    model_name: str,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    downstream: str = "qa",
    downstream_size: int = 32,
    seed: int = 0,
    objectives: Sequence[str] = (),
) -> Workload:
    """The default corpus and tokenizer, ``batch_size`` rows of ``seq_len`` corrupted by
    ``objective``, a fresh model (heads for ``objective``, ``objectives`` and the task) and the
    downstream task's mean gradient over ``downstream_size`` examples."""
    registry = objreg.Registry.load()
    cache = objreg.cache_dir()
    corpus = registry.load_corpus("default", cache)
    tokenizer = registry.load_tokenizer("default", corpus, cache)
    names = [objective, *(o for o in objectives if o != objective)]
    loaded = {n: registry.get(n, vocab=tokenizer.vocab) for n in names}
    task = registry.get_task(downstream)
    pretrain, heldout = corpus.split()
    tokens = objreg.TokenizedCorpus(tokenizer, pretrain, seq_len)
    generator = torch.Generator().manual_seed(seed)
    main = loaded[objective]
    batch = main.corrupt(tokens.sample(batch_size, generator, min_sentences=main.info.min_sentences), generator)
    task_batch, task_heads = task.task_data(None, heldout.documents, tokenizer, seq_len, downstream_size)
    owners = {**{n: o.info.heads for n, o in loaded.items()}, task.name: task_heads}
    model = build_model(registry, model_name, tokenizer.vocab, owners, seed).to(device)
    function = ObjectiveFunction(model, main, batch.to(device))
    shared = detached(shared_parameters(model))
    downstream_functions = list(ObjectiveFunction(model, task, task_batch.to(device)).chunks(downstream_size))
    direction = mean_gradient(downstream_functions, shared)
    return Workload(registry, tokenizer, model, function, shared, direction, downstream_functions, device)


def batch_for(workload: Workload, objective: str, batch_size: int, seq_len: int, seed: int = 1) -> ObjectiveFunction:
    """Another objective's corrupted batch on the same model (for the S matrix of two objectives)."""
    registry, tokenizer = workload.registry, workload.tokenizer
    corpus = registry.load_corpus("default", objreg.cache_dir())
    pretrain, _ = corpus.split()
    tokens = objreg.TokenizedCorpus(tokenizer, pretrain, seq_len)
    loaded = registry.get(objective, vocab=tokenizer.vocab)
    generator = torch.Generator().manual_seed(seed)
    batch = loaded.corrupt(tokens.sample(batch_size, generator, min_sentences=loaded.info.min_sentences), generator)
    return ObjectiveFunction(workload.model, loaded, batch.to(workload.device))


# -- command line -----------------------------------------------------------------------------------


def base_parser(description: str, threads_default: int | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="the default model (B=32, T=128) instead of BERT-base size"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (medians are reported)")
    parser.add_argument(
        "--threads",
        type=int,
        default=threads_default,
        help=f"torch CPU threads (default: {threads_default or 'torch default'})",
    )
    return parser


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory instead of returning it to the kernel (``M_TRIM_THRESHOLD``
    1 GiB, ``M_MMAP_THRESHOLD`` 32 MiB, its largest), as ``MALLOC_TRIM_THRESHOLD_`` /
    ``MALLOC_MMAP_THRESHOLD_`` in the environment would, or jemalloc/tcmalloc, which PyTorch's
    CPU tuning guide recommends. Whole-batch tensor code allocates megabyte tensors per operation;
    with glibc's defaults each one can come back as fresh pages, and every page costs a fault.
    Returns whether both settings were accepted (False where glibc is not the allocator)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20))
    except (OSError, AttributeError):
        return False


def page_faults() -> int:
    """Minor page faults of this process so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def apply_threads(threads: int | None) -> None:
    """On an oversubscribed CPU, a second OpenMP thread that is not scheduled stalls every parallel
    kernel; a fixed count keeps runs comparable. Recorded in ``machine.torch_threads``."""
    if threads:
        torch.set_num_threads(threads)


def emit(result: Mapping[str, Any], as_json: bool, rows: Sequence[tuple[str, Any]] = ()) -> None:
    if as_json:
        print(json.dumps(result, indent=None, default=str))
        return
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        if isinstance(value, float):
            value = f"{value:.4g}"
        print(f"{name:<{width}}  {value}")


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")
