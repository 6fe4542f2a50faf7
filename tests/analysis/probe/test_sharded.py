"""ShardedProbe on an FSDP2 model (fully_shard) and TransferProbe on a DDP model, in two gloo
processes, each process passing its own rows (a DistributedSampler's split, uneven), under AdamW
with weight decay: the records of TransferProbe in one process on the concatenated batch. Float64
to 1e-9; float32 and a bfloat16-autocast loop to the tolerances stated below."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from two_processes import assert_close_reports, gloo_json

import objreg
from objreg.analysis.probe.sharded import ShardedProbe
from objreg.core.errors import InvalidParameterError

STEPS, LR, DECAY = 2, 0.05, 0.1
WEIGHTS = {"fit": 1.0, "spread": 0.5}
ROWS = {"fit": 5, "spread": 4}  # 5 rows deal 3 and 2: uneven shares


class Net(nn.Module):
    """A body, the objectives' head ``out`` and the downstream task's head (not trained)."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 8), nn.Tanh())
        self.out = nn.Linear(8, 3)  # 3 rows: FSDP2 pads the shards
        self.task_head = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.body(x))

    def task(self, x):
        return self.task_head(self.body(x))


def model(dtype=torch.float64, dropout: float = 0.0) -> Net:
    generator = torch.Generator().manual_seed(0)
    net = Net(dropout).to(dtype)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=dtype) * 0.5)
    net.task_head.requires_grad_(False)
    return net


# A batch is one tensor [B, 9]: 6 inputs, then 3 targets (a downstream batch: 6 inputs, a label).
def fit(m, batch):
    return (m(batch[:, :6]) - batch[:, 6:]).pow(2).sum(1)


def spread(m, batch):
    return m(batch[:, :6]).logsumexp(1)


def downstream(m, batch):
    return F.cross_entropy(m.task(batch[:, :6]), batch[:, 6].long(), reduction="none")


OBJECTIVES = {"fit": fit, "spread": spread}


def whole_batches(step: int, dtype=torch.float64) -> dict:
    generator = torch.Generator().manual_seed(100 + step)
    return {k: torch.randn(n, 9, generator=generator, dtype=torch.float64).to(dtype) for k, n in ROWS.items()}


def labelled(seed: int, rows: int, dtype=torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=generator, dtype=torch.float64)
    return torch.cat([x, (x[:, :1] + 0.3 * x[:, 1:2] > 0).double()], 1).to(dtype)


def eval_batches(dtype=torch.float64) -> list:
    return [labelled(7, 6, dtype), labelled(8, 5, dtype)]


def fit_batches(dtype=torch.float64) -> torch.Tensor:
    return labelled(9, 12, dtype)


def own_rows(batches: dict, rank: int, world: int) -> dict:
    """This process's rows: a DistributedSampler's split (rows rank, rank + world, …)."""
    return {k: v[rank::world] for k, v in batches.items()}


def concatenated(batches: dict, world: int = 2) -> dict:
    """The processes' rows, in rank order: the batch one process sees."""
    return {k: torch.cat([v[r::world] for r in range(world)]) for k, v in batches.items()}


#: Case → (wrapper, dtype, the loop under bfloat16 autocast, TransferProbe's options).
CASES = {
    "fsdp float64, re-fitted head, double backward": (
        "fsdp", torch.float64, False, {"hvp_method": "double_backward", "head": True}),
    "fsdp float64, forward over reverse": ("fsdp", torch.float64, False, {"hvp_method": "forward_over_reverse"}),
    "fsdp float64, the middle step tracked": ("fsdp", torch.float64, False, {"every": 2}),
    "ddp float64, re-fitted head": ("ddp", torch.float64, False, {"hvp_method": "double_backward", "head": True}),
    "fsdp float32": ("fsdp", torch.float32, False, {}),
    "fsdp float32, bfloat16 autocast": ("fsdp", torch.float32, True, {}),
}
#: Case → (rtol, atol) of the records against one process's. Observed at 2 steps (CPU): float64
#: within 2e-13 of each number; float32 (D in float64, the default) within 1.1e-5 (a Taylor
#: remainder ratio, 5e-7 absolute) and 1.2e-6 absolute (a noise ratio); the bfloat16-autocast
#: loop within 4e-3 (1.3e-4 absolute), its steps' gradients being bfloat16's and summed in
#: another order over two processes (the probe itself measures in float32).
TOLERANCE = {
    "fsdp float64, re-fitted head, double backward": (1e-9, 1e-12),
    "fsdp float64, forward over reverse": (1e-9, 1e-12),
    "fsdp float64, the middle step tracked": (1e-9, 1e-12),
    "ddp float64, re-fitted head": (1e-9, 1e-12),
    "fsdp float32": (2e-5, 5e-6),
    "fsdp float32, bfloat16 autocast": (1e-2, 5e-4),
}


def run(case: str, rank: int | None = None, world: int = 1, dropout: float = 0.0) -> list:
    """The loop of ``case``, measured every step (or every ``every``-th, tracked on the others,
    for ``every`` + 1 steps); this process's rows of each batch (``world`` 1: the concatenated
    batch in one process, TransferProbe)."""
    wrapper, dtype, autocast, options = CASES[case]
    options = dict(options)
    every = options.pop("every", 1)
    net = model(dtype, dropout)
    if options.pop("head", False):
        options.update(refit_head=net.task_head, fit_batches=fit_batches(dtype))
    trained, mode = net, "full"
    if world > 1 and wrapper == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in [*net.body, net.out, net.task_head]:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        trained, mode = fully_shard(net), "sharded"
    elif world > 1:
        trained = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=LR, weight_decay=DECAY)
    settings = objreg.ProbeSettings(**{k: options.pop(k) for k in ("hvp_method",) if k in options})
    # Through the front door: the sharded mode takes the full mode's arguments and settings.
    probe = objreg.make_probe(trained, downstream, mode=mode, objectives=OBJECTIVES, optimizer=optimizer,
                              eval_batches=eval_batches(dtype), weights=WEIGHTS, settings=settings, **options)
    assert probe.mode == mode and probe.settings == settings
    assert isinstance(probe, ShardedProbe if mode == "sharded" else objreg.TransferProbe)
    for step in range(STEPS if every == 1 else every + 1):
        whole = whole_batches(step, dtype)
        mine = own_rows(whole, rank, world) if world > 1 else concatenated(whole)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            # FSDP and DDP average the processes' gradients: each process's mean weighted by its
            # share of the rows makes that average the whole batch's mean.
            loss = sum(WEIGHTS[k] * world * len(mine[k]) / ROWS[k] * fn(trained, mine[k]).mean()
                       for k, fn in OBJECTIVES.items())
        loss.backward()
        if step % every:
            probe.track(mine)
            optimizer.step()
            continue
        measured = probe.measure(mine, step=step)
        optimizer.step()
        probe.finish(measured)
    return probe.records


def _every_case(rank: int) -> dict:
    return {case: run(case, rank, 2) for case in CASES}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    return gloo_json(_every_case, tmp_path_factory.mktemp("sharded"))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_two_processes_own_rows_give_one_process_records(two_processes, case):
    zero, one = (per_rank[case] for per_rank in two_processes)
    assert zero == one  # every process ends with the same records
    if CASES[case][2]:  # under autocast the loop's .grad is bfloat16's: the probe warns that it flags the split
        with pytest.warns(UserWarning, match="does not describe the step the optimizer took"):
            records = run(case)
    else:
        records = run(case)
    rtol, atol = TOLERANCE[case]
    assert_close_reports({"steps": records, "summary": {}}, {"steps": zero, "summary": {}}, rtol=rtol, atol=atol)
    for record in zero:
        assert record["update"]["attribution"] == "shapley"
        assert "counterfactual" in record and "weight_decay" in record["update"]["first_order"]
        assert len(record["alignment"]["fit"]["ci95_bootstrap"]) == 2  # the per-example dots' interval
        # The split is of the step taken, but where the loop's gradients are bfloat16's.
        assert record["update"].get("decomposition_flagged", False) == CASES[case][2]
        assert abs(record["predicted_delta"]["second_order"]) > 1e-6  # not a comparison of zeros
    if CASES[case][3].get("head"):
        assert all("downstream_fit" in r for r in zero)


def _other_checks(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    out = {}
    net = fully_shard(model())
    cases = {
        "rank-local evaluation rows": lambda: ShardedProbe(
            net, OBJECTIVES, downstream, torch.optim.AdamW(net.parameters()), eval_batches=eval_batches()[0][rank::2]),
        "SGD with momentum": lambda: ShardedProbe(
            net, OBJECTIVES, downstream, torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9),
            eval_batches=eval_batches()),
    }
    for name, make in cases.items():
        try:
            make()
            out[name] = None
        except InvalidParameterError as error:
            out[name] = str(error)
    out["dropout"] = run("fsdp float64, forward over reverse", rank, 2, dropout=0.3)
    out["resumed"] = _resumed(rank)
    return out


def _resumed(rank: int) -> dict:
    """A probe made after AdamW's first step, loaded with the first probe's state_dict, records
    the second step as the first probe does; the first probe's report."""
    from torch.distributed.fsdp import fully_shard

    net = model()
    for layer in [*net.body, net.out]:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    net = fully_shard(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=DECAY)

    def new_probe():
        return ShardedProbe(net, OBJECTIVES, downstream, optimizer, eval_batches=eval_batches(), weights=WEIGHTS)

    probe, state, resumed = new_probe(), None, {}
    for step in range(2):
        mine = own_rows(whole_batches(step), rank, 2)
        optimizer.zero_grad()
        sum(WEIGHTS[k] * 2 * len(mine[k]) / ROWS[k] * fn(net, mine[k]).mean() for k, fn in OBJECTIVES.items()).backward()
        if step == 1:
            later = new_probe()
            later.load_state_dict(state)
            resumed["measured"] = later.measure(mine, step=step)
        measured = probe.measure(mine, step=step)
        optimizer.step()
        probe.finish(measured)
        if step == 1:
            resumed["record"] = later.finish(resumed["measured"])
        state = probe.state_dict()
    report = probe.report().to_dict()
    return {"record": resumed["record"], "original": probe.records[1], "summary": sorted(report["summary"]),
            "steps": len(report["steps"])}


@pytest.fixture(scope="module")
def other_checks(tmp_path_factory):
    return gloo_json(_other_checks, tmp_path_factory.mktemp("checks"))


@pytest.mark.parametrize(("case", "message"), [
    ("rank-local evaluation rows", "ShardedProbe needs every process to pass the same whole eval_batches"),
    ("SGD with momentum", "plain SGD only"),
])
def test_what_stays_unsupported_is_refused_on_every_process(other_checks, case, message):
    for per_rank in other_checks:
        assert per_rank[case] is not None and message in per_rank[case]
        assert "\n" not in per_rank[case]


def test_the_probe_replays_the_sharded_models_dropout_on_its_copy(other_checks):
    """The loop's forward on the sharded model draws dropout's masks; the probe's own gradients
    on the gathered copy replay them, so the split is of the step taken (not flagged)."""
    for per_rank in other_checks:
        for record in per_rank["dropout"]:
            assert "decomposition_flagged" not in record["update"]
            assert record["update"]["decomposition_residual"] < 1e-12
    assert other_checks[0]["dropout"] == other_checks[1]["dropout"]


def test_an_unsharded_model_is_refused():
    net = model()
    with pytest.raises(InvalidParameterError, match="sharded with torch.distributed.fsdp.fully_shard"):
        ShardedProbe(net, OBJECTIVES, downstream, torch.optim.AdamW(net.parameters()), eval_batches=eval_batches())


def test_a_probe_resumed_from_a_state_dict_and_the_report(other_checks):
    for per_rank in other_checks:
        resumed = per_rank["resumed"]
        assert_close_reports({"steps": [resumed["original"]], "summary": {}},
                             {"steps": [resumed["record"]], "summary": {}}, rtol=1e-12)
        assert resumed["steps"] == 2 and "weights_by_step" in resumed["summary"]
