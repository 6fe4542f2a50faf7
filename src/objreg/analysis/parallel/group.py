"""What the analysis needs of a process group, and the one-process case.

A :class:`Group` gives this process's ``rank`` among ``world_size``, its contiguous share of a
batch's rows (:meth:`Group.shard`), sums over processes (:meth:`Group.all_reduce_sum`, one
collective per dtype however many tensors), per-example arrays gathered in rank order
(:meth:`Group.all_gather`), and decisions every process takes together (:meth:`Group.agree`,
:meth:`Group.on_main`, :meth:`Group.drive`), so an error on one process raises on all of them
instead of leaving the others waiting in a collective.

The plain :class:`Group` is one process: every operation is the identity and no
``torch.distributed`` function is called. :class:`ProcessGroup` runs the collectives of a
``torch.distributed`` default process group; :mod:`objreg.analysis.parallel.launch` decides which one a
run gets. See docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

from objreg.core.errors import DistributedError

T = TypeVar("T")

#: The dtypes :meth:`Group.all_gather` takes.
_GATHER_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64)


def shard_bounds(size: int, rank: int, world_size: int) -> slice:
    """Rows ``[start, stop)`` of ``size`` that process ``rank`` of ``world_size`` takes: contiguous,
    in rank order, the first ``size % world_size`` processes one row more than the rest."""
    base, extra = divmod(size, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


class Group:
    """One process: the identity of every operation (no ``torch.distributed`` call at all)."""

    rank: int = 0
    world_size: int = 1
    #: ``gloo`` or ``nccl``; None for one process.
    backend: str | None = None
    #: The device this process computes on; None: the run's own setting decides.
    device: torch.device | None = None

    @property
    def is_main(self) -> bool:
        """Whether this process writes outputs and prints (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def shard(self, size: int) -> slice:
        """This process's contiguous share of ``size`` rows."""
        return shard_bounds(size, self.rank, self.world_size)

    def all_reduce_sum(self, tree: T) -> T:
        """The sum over processes of every tensor in ``tree`` (a tensor, or lists, tuples and
        dicts of them; other leaves such as None pass through), as new tensors of the same
        structure, dtypes and devices."""
        return tree

    def all_gather(self, arrays: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """For each 1-D tensor of ``arrays`` (this process's per-example values), the
        concatenation of every process's, in rank order. Lengths may differ between processes
        (0 included). With several processes the results have the dtype all of them promote to."""
        return list(arrays)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of process ``src`` (picklable), on every process."""
        return obj

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order, on every process."""
        return [obj]

    def broadcast_tensor(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Process ``src``'s ``tensor`` on every process (the others pass one of its shape and dtype)."""
        return tensor

    def sync_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with the main process's (parameters after set-up)."""

    def agree(self, action: Callable[[], T]) -> T:
        """Run ``action`` on every process; if it raised on any, raise that error on all of them
        (the lowest rank's), so none waits in a later collective for one that stopped."""
        return action()

    def on_main(self, action: Callable[[], T]) -> T | None:
        """Run ``action`` on the main process alone (writing outputs); its result there, None
        elsewhere. An error it raises is raised on every process."""
        return action()

    def drive(self, driver: Callable[[Callable[[T], Any]], Any], operator: Callable[[T], Any], like: Mapping) -> Any:
        """``driver(operator)`` where ``operator`` (a map of tensors like ``like`` to another,
        itself a collective, e.g. a Hessian-vector product of ``D``) must run on every process:
        the main process runs ``driver`` and sends each argument it calls ``operator`` with to
        the others, which apply ``operator`` too until the driver is done. Only the main process
        runs the driver's own code (e.g. ARPACK), so no rounding difference between machines
        can make the processes take different paths. The driver's result (picklable) or error
        reaches every process."""
        return driver(operator)


class ProcessGroup(Group):
    """A ``torch.distributed`` default process group of ``world_size`` > 1 processes.

    Tensors travel through ``comm_device`` (the CPU for gloo, this process's GPU for NCCL) and
    come back on the device they came from.
    """

    def __init__(self, rank: int, world_size: int, backend: str, device: torch.device | None):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = device
        nccl = "nccl" in backend and device is not None and device.type == "cuda"
        self.comm_device = device if nccl else torch.device("cpu")

    @contextlib.contextmanager
    def _peers(self) -> Iterator[None]:
        """A collective: where the backend lost another process (it exited, was killed, or stopped
        answering), one :class:`DistributedError` naming the rank instead of the backend's error."""
        try:
            yield
        except RuntimeError as error:
            if not _lost_peer(error):
                raise
            others = [r for r in range(self.world_size) if r != self.rank]
            who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {', '.join(map(str, others))}"
            detail = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
            raise DistributedError(
                f"process rank {self.rank} lost the other processes in a collective: {who} stopped or failed first "
                f"(its own output says why); this process stops too ({detail[:200]})") from None

    def _collective_per_dtype(self, tensors: Sequence[torch.Tensor], collective: Callable[[torch.Tensor], Any]
                              ) -> list[torch.Tensor]:
        """Apply the in-place ``collective`` to one flat buffer per dtype (one call however many
        tensors); returns each tensor's part of the result, shaped like it, on ``comm_device``."""
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        out: list[torch.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        for indices in by_dtype.values():
            buffer = torch.cat([tensors[i].detach().reshape(-1).to(self.comm_device) for i in indices])
            with self._peers():
                collective(buffer)
            for i, part in zip(indices, buffer.split([tensors[i].numel() for i in indices])):
                out[i] = part.reshape(tensors[i].shape)
        return out

    def all_reduce_sum(self, tree: T) -> T:
        leaves, spec = tree_flatten(tree)
        indices = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        summed = self._collective_per_dtype([leaves[i] for i in indices],
                                            lambda buffer: dist.all_reduce(buffer, op=dist.ReduceOp.SUM))
        out = list(leaves)
        for i, total in zip(indices, summed):
            out[i] = total.to(leaves[i].device)
        return tree_unflatten(out, spec)

    def all_gather(self, arrays: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not arrays:
            return []
        # Each process's lengths and dtypes first: the buffers must agree in size and dtype.
        header = [a.numel() for a in arrays] + [_GATHER_DTYPES.index(a.dtype) for a in arrays]
        own = torch.tensor(header, dtype=torch.int64, device=self.comm_device)
        headers = [torch.empty_like(own) for _ in range(self.world_size)]
        with self._peers():
            dist.all_gather(headers, own)
        counts = [[int(n) for n in row[: len(arrays)]] for row in headers]
        dtype = arrays[0].dtype
        for row in headers:
            for code in row[len(arrays):]:
                dtype = torch.promote_types(dtype, _GATHER_DTYPES[int(code)])
        longest = max(sum(row) for row in counts)
        local = torch.zeros(longest, dtype=dtype, device=self.comm_device)
        values = [a.detach().reshape(-1).to(self.comm_device, dtype) for a in arrays]
        local[: sum(counts[self.rank])] = torch.cat(values)
        every = [torch.empty_like(local) for _ in range(self.world_size)]
        with self._peers():
            dist.all_gather(every, local)
        pieces: list[list[torch.Tensor]] = [[] for _ in arrays]
        for row, buffer in zip(counts, every):
            for j, part in enumerate(buffer[: sum(row)].split(row)):
                pieces[j].append(part)
        return [torch.cat(parts).to(arrays[0].device) for parts in pieces]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        holder = [obj]
        # NCCL moves the pickled bytes through this process's GPU; gloo through the CPU.
        with self._peers():
            dist.broadcast_object_list(holder, src=src, device=self.comm_device)
        return holder[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        every = [None] * self.world_size
        with self._peers():
            dist.all_gather_object(every, obj)
        return every

    def broadcast_tensor(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        buffer = tensor.detach().to(self.comm_device, copy=True)
        with self._peers():
            dist.broadcast(buffer, src=src)
        return buffer.to(tensor.device)

    @torch.no_grad()
    def sync_(self, tensors: Sequence[torch.Tensor]) -> None:
        for t, main in zip(tensors, self._collective_per_dtype(tensors, lambda buffer: dist.broadcast(buffer, src=0))):
            t.copy_(main)

    def agree(self, action: Callable[[], T]) -> T:
        result, error = _attempt(action)
        failures = self.gather_objects(_describe(error))
        _raise_first(failures, error, self.rank)
        return result  # type: ignore[return-value]

    def on_main(self, action: Callable[[], T]) -> T | None:
        result, error = _attempt(action) if self.is_main else (None, None)
        failure = self.broadcast_object(_describe(error))
        _raise_first([failure], error, 0 if self.is_main else -1)
        return result

    def drive(self, driver: Callable[[Callable[[T], Any]], Any], operator: Callable[[T], Any], like: Mapping) -> Any:
        names = list(like)
        sizes = [like[n].numel() for n in names]
        template = next(iter(like.values()))

        def packed(value: Mapping | None) -> torch.Tensor:
            # The argument, then one element saying whether it is one (1) or the driver is done (0).
            if value is None:
                body = torch.zeros(sum(sizes), dtype=template.dtype, device=template.device)
            else:
                body = torch.cat([value[n].reshape(-1).to(template.dtype) for n in names])
            flag = torch.ones(1, dtype=template.dtype, device=template.device) * (value is not None)
            return torch.cat([body, flag])

        if self.is_main:
            def remote(value: T) -> Any:
                self.broadcast_tensor(packed(value))  # type: ignore[arg-type]
                return operator(value)

            result, error = _attempt(lambda: driver(remote))
            self.broadcast_tensor(packed(None))
            outcome = self.broadcast_object((result, _describe(error)))
        else:
            empty = torch.empty(sum(sizes) + 1, dtype=template.dtype, device=template.device)
            while True:
                message = self.broadcast_tensor(empty)
                if float(message[-1]) == 0.0:
                    break
                parts = message[:-1].split(sizes)
                operator({n: p.reshape(like[n].shape) for n, p in zip(names, parts)})  # type: ignore[arg-type]
            result, error = None, None
            outcome = self.broadcast_object(None)
        _raise_first([outcome[1]], error, 0 if self.is_main else -1)
        return outcome[0]


# -- errors every process raises together ---------------------------------------------------------


#: What gloo and NCCL say when a peer process is gone or does not answer.
_LOST_PEER_MARKERS = ("connection closed", "connection reset", "connection refused", "broken pipe", "timed out",
                      "timeout", "gloo", "nccl", "socket", "peer")


def _lost_peer(error: RuntimeError) -> bool:
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(error, backend_error):
        return True
    text = str(error).lower()
    return any(marker in text for marker in _LOST_PEER_MARKERS)


def _attempt(action: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    try:
        return action(), None
    except Exception as error:  # shared with the other processes, then raised here too
        return None, error


def _describe(error: BaseException | None) -> tuple[str, str, str] | None:
    """A picklable description (exception classes with their own ``__init__`` do not unpickle)."""
    if error is None:
        return None
    return type(error).__module__, type(error).__qualname__, str(error)


def _raise_first(failures: Sequence[tuple[str, str, str] | None], own: BaseException | None, own_index: int) -> None:
    for index, failure in enumerate(failures):
        if failure is None:
            continue
        if index == own_index and own is not None:
            raise own
        raise _rebuilt(*failure) from None


def _rebuilt(module: str, qualname: str, message: str) -> Exception:
    """An exception of the named class with ``message`` (a plain RuntimeError if it cannot be made)."""
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            error = cls.__new__(cls)
            Exception.__init__(error, message)
            return error
    except Exception:  # an unimportable class: the message still says what happened
        pass
    return RuntimeError(f"{qualname}: {message}")
