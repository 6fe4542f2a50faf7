"""ShardedProbe refuses batches that differ between processes (rank-local rows, as a
``DistributedSampler`` gives, and their siblings) in one line on every process, before any
gradient: two gloo processes, each case its own probe."""

from __future__ import annotations

import pytest
import torch
from test_sharded import LR, OBJECTIVES, batches, downstream, eval_batch, model
from two_processes import gloo_json

from objreg.analysis.probe.sharded import ShardedProbe
from objreg.core.errors import InvalidParameterError


def _rank_local(rank, step_batches):
    return {k: v[rank::2] for k, v in step_batches.items()}  # a DistributedSampler's split


def _one_row_changed(rank, step_batches):
    if rank == 1:
        step_batches = dict(step_batches)
        step_batches["fit"] = step_batches["fit"].clone()
        step_batches["fit"][2, 0] += 1e-9
    return step_batches


def _rows_reordered(rank, step_batches):
    return {k: (v.flip(0) if rank == 1 else v) for k, v in step_batches.items()}


def _other_objective_only(rank, step_batches):
    return {**step_batches, "spread": step_batches["spread"][:3] if rank == 0 else step_batches["spread"]}


#: Case → (this rank's batches, this rank's eval batch).
CASES = {
    "rank-local rows": (_rank_local, lambda rank, e: e),
    "one row changed on one process": (_one_row_changed, lambda rank, e: e),
    "the rows in another order": (_rows_reordered, lambda rank, e: e),
    "one objective's batch shorter": (_other_objective_only, lambda rank, e: e),
    "rank-local evaluation rows": (lambda rank, b: b, lambda rank, e: e[rank::2]),
    "the same batches": (lambda rank, b: b, lambda rank, e: e),
}


def _cases(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    out = {}
    for name, (local, local_eval) in CASES.items():
        net = model()
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        probe = ShardedProbe(net, OBJECTIVES, downstream, torch.optim.SGD(net.parameters(), lr=LR),
                             eval_batch=local_eval(rank, eval_batch()))
        try:
            probe.measure(local(rank, batches(0)))
            out[name] = None
        except InvalidParameterError as error:
            out[name] = str(error)
    return out


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    return gloo_json(_cases, tmp_path_factory.mktemp("rows"))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_batches_that_differ_between_processes_are_refused_on_every_process(found, case):
    for per_rank in found:
        if case == "the same batches":
            assert per_rank[case] is None
        else:
            assert per_rank[case] is not None and per_rank[case].startswith(
                "ShardedProbe needs every process to pass the same whole batches")
            assert "\n" not in per_rank[case]
