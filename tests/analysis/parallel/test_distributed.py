"""Several processes give the one-process report: the ``Group`` on its own, its set-up from the
environment, and ``objreg.analyze`` in two gloo processes on loopback against one process."""

from __future__ import annotations

import gc
import json
import math
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from two_processes import TIMEOUT_S, assert_close_reports, free_port, run_two_processes

import objreg
from objreg.analysis.parallel import launch
from objreg.analysis.parallel.group import Group, ProcessGroup, shard_bounds
from objreg.analysis.parallel.launch import from_environment
from objreg.analysis.probe.writer import RunWriter
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import FIT_CHUNK, fit_chunk, prepare
from objreg.core.errors import DataError, DeviceError, InvalidParameterError, NonFiniteLossError, UnknownNameError
from objreg.plugins.models import transformer

#: A one-layer model keeps the two-process run to seconds; float64 makes the comparison tight.
TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
#: batch 5 splits 3 + 2; eval 20 is two chunks (16 + 4), one per process; contrastive is batch-coupled.
RUN = dict(model="tiny", steps=2, batch_size=5, seq_len=48, eval_size=20, head_fit_size=16,
           dtype="float64", optimizer="adam", lr=1e-3, spectrum=1, attribution_top=100)
PRETRAIN = "mlm,sop,contrastive"


class _TinyModel:
    @objreg.hookimpl
    def objreg_register_models(self, register):
        def load(name, vocab, config, generator):
            return transformer.build_backbone(transformer.build_config("default", vocab.size, TINY), generator)

        register(objreg.Provider("model", "tiny", "a one-layer Transformer", load))


def tiny_registry() -> objreg.Registry:
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(_TinyModel(), name="tiny-model")
    return objreg.Registry(pm)


# -- one process --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(0, 9))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_cover_every_row_once_in_rank_order(size, world_size):
    shards = [shard_bounds(size, rank, world_size) for rank in range(world_size)]
    rows = [row for s in shards for row in range(size)[s]]
    assert rows == list(range(size))
    lengths = [len(range(size)[s]) for s in shards]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


def test_one_process_group_is_the_identity_without_any_collective(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("one process must not call torch.distributed")

    for name in ("all_reduce", "all_gather", "broadcast", "broadcast_object_list", "all_gather_object", "barrier",
                 "init_process_group", "destroy_process_group"):
        monkeypatch.setattr(dist, name, forbidden)
    group = Group()
    assert (group.rank, group.world_size, group.backend, group.device) == (0, 1, None, None)
    assert group.is_main and not group.distributed and group.shard(7) == slice(0, 7)
    tree = {"a": torch.ones(2), "b": [torch.zeros(3, dtype=torch.float64), None]}
    assert group.all_reduce_sum(tree) is tree
    arrays = [torch.arange(3.0), torch.zeros(0)]
    gathered = group.all_gather(arrays)
    assert all(g is a for g, a in zip(gathered, arrays))
    assert group.broadcast_object({"x": 1}) == {"x": 1}
    assert group.agree(lambda: 5) == 5 and group.on_main(lambda: 6) == 6
    with pytest.raises(DataError, match="own message"):
        group.agree(lambda: (_ for _ in ()).throw(DataError("own message")))
    assert group.drive(lambda apply: apply({"w": torch.ones(2)})["w"].sum().item(), lambda v: {"w": 3 * v["w"]},
                       {"w": torch.zeros(2)}) == 6.0
    group.sync_([torch.ones(2)])


def _torchrun_env(**overrides):
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


@pytest.fixture
def init_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    return calls


@pytest.mark.parametrize("env", [{}, {"WORLD_SIZE": "1", "RANK": "0"}])
def test_without_a_multi_process_launch_the_group_is_one_process(env, init_calls):
    group = from_environment("cpu", environ=env)
    assert type(group) is Group and init_calls == []


def test_a_torchrun_environment_initialises_gloo_on_the_cpu_once(init_calls, monkeypatch):
    at_exit = []
    monkeypatch.setattr(launch.atexit, "register", at_exit.append)
    group = from_environment("cpu", environ=_torchrun_env(OBJREG_DISTRIBUTED_TIMEOUT="42"))
    assert isinstance(group, ProcessGroup)
    assert (group.rank, group.world_size, group.backend, group.device) == (1, 2, "gloo", torch.device("cpu"))
    assert not group.is_main and group.shard(5) == slice(3, 5)
    (args, kwargs), = init_calls
    assert args == ("gloo",) and kwargs["rank"] == 1 and kwargs["world_size"] == 2
    assert kwargs["timeout"] == timedelta(seconds=42) and kwargs["init_method"] == "env://"
    # Destroyed when the process exits; a later call in the same process reuses the group.
    destroyed = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: destroyed.append(True))
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    again = from_environment("cpu", environ=_torchrun_env())
    assert (again.rank, again.world_size, again.backend) == (1, 2, "gloo") and len(init_calls) == 1
    (destroy,) = at_exit
    destroy()
    assert destroyed == [True]


@pytest.mark.parametrize(
    ("device", "env", "error", "message"),
    [
        ("cpu", {"MASTER_PORT": None}, InvalidParameterError, "MASTER_PORT is not.*torchrun"),
        ("cpu", {"RANK": "x"}, InvalidParameterError, "RANK must be an integer"),
        ("cpu", {"RANK": "2"}, InvalidParameterError, "RANK=2 is not below WORLD_SIZE=2"),
        ("cpu", {"OBJREG_DISTRIBUTED_BACKEND": "nccl"}, DeviceError, "nccl needs CUDA"),
        ("cpu", {"OBJREG_DISTRIBUTED_BACKEND": "mpi"}, InvalidParameterError, "auto, gloo or nccl"),
        ("cpu", {"OBJREG_DISTRIBUTED_TIMEOUT": "0"}, InvalidParameterError, "positive number of seconds"),
        ("tpu", {}, InvalidParameterError, "auto, cpu or cuda"),
    ],
)
def test_impossible_launches_fail_before_connecting(device, env, error, message, init_calls):
    with pytest.raises(error, match=message):
        from_environment(device, environ=_torchrun_env(**env))
    assert init_calls == []


def test_cuda_placement_one_gpu_per_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="CUDA is not available"):
        launch.device_and_backend("cuda", 1, 2, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match="2 processes on this node but only 1 CUDA device"):
        launch.device_and_backend("auto", 0, 2, None)  # every process fails alike, rank 0 too
    with pytest.raises(InvalidParameterError, match="names one GPU for the 2 processes"):
        launch.device_and_backend("cuda:0", 0, 2, None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert launch.device_and_backend("cuda", 1, 2, None) == (torch.device("cuda", 1), "nccl")
    assert launch.device_and_backend("auto", 1, 2, "gloo") == (torch.device("cuda", 1), "gloo")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert launch.device_and_backend("cuda", 0, 2, None)[1] == "gloo"
    with pytest.raises(DeviceError, match="no NCCL"):
        launch.device_and_backend("cuda", 0, 2, "nccl")


def test_a_batch_smaller_than_the_processes_is_refused():
    group = ProcessGroup(0, 3, "gloo", torch.device("cpu"))
    with pytest.raises(InvalidParameterError, match="batch_size 2 is smaller than the 3 processes"):
        launch.check_batch(2, group)
    launch.check_batch(3, group)


def test_every_process_holds_a_chunk_of_the_refit_set():
    # Downstream deals chunk j to process j mod world_size; a process without a chunk would run
    # the fit's collectives on other shapes than the rest (gloo aborts).
    for processes in range(1, 9):
        for rows in range(processes, 200):
            size = fit_chunk(rows, processes)
            chunks = len(range(0, rows, size))
            assert size >= 1 and chunks >= processes, (rows, processes, size)
            assert size == min(FIT_CHUNK, rows) or processes > 1


def test_a_refit_set_smaller_than_the_processes_is_refused():
    group = ProcessGroup(0, 3, "gloo", torch.device("cpu"))
    config = AnalysisConfig(pretrain=("mlm",), downstream="qa", **{**RUN, "head_fit_size": 2, "batch_size": 6})
    with pytest.raises(InvalidParameterError, match="head_fit_size gives 2 fit examples for 3 processes"):
        prepare(config, tiny_registry(), objreg.cache_dir(), group=group)


# -- two processes ------------------------------------------------------------------------------------


def _group_checks(group: Group) -> None:
    """The collectives against what they must give, in each of two processes."""
    r = group.rank
    assert group.world_size == 2 and group.backend == "gloo" and group.is_main == (r == 0)
    tree = {"a": torch.full((2, 3), r + 1.0), "b": [torch.arange(4, dtype=torch.float64) * (r + 1), None],
            "n": torch.tensor([r + 5])}
    out = group.all_reduce_sum(tree)
    assert torch.equal(out["a"], torch.full((2, 3), 3.0)) and torch.equal(tree["a"], torch.full((2, 3), r + 1.0))
    assert out["b"][0].dtype == torch.float64 and torch.equal(out["b"][0], torch.arange(4, dtype=torch.float64) * 3)
    assert out["b"][1] is None and torch.equal(out["n"], torch.tensor([11]))
    # Uneven lengths, an empty array (of another dtype) on one process, several arrays in one gather.
    first = torch.arange(3.0) if r == 0 else torch.tensor([10.0, 11.0])
    second = torch.zeros(0) if r == 0 else torch.tensor([7.0], dtype=torch.float64)
    gathered = group.all_gather([first, second])
    assert gathered[0].tolist() == [0.0, 1.0, 2.0, 10.0, 11.0] and gathered[1].tolist() == [7.0]
    assert gathered[0].dtype == gathered[1].dtype == torch.float64
    values = torch.arange(5.0) ** 2
    assert torch.equal(group.all_gather([values[group.shard(5)]])[0], values)
    assert group.broadcast_object({"from": r}) == {"from": 0}
    # An error on one process is raised on both (even of a class whose __init__ takes other arguments).
    def fail_on_one():
        if r == 1:
            raise UnknownNameError("model", "tinny", ["tiny"])
        return "fine"

    with pytest.raises(UnknownNameError, match="unknown model 'tinny'. Did you mean 'tiny'"):
        group.agree(fail_on_one)
    with pytest.raises(DataError, match="main cannot write"):
        group.on_main(lambda: (_ for _ in ()).throw(DataError("main cannot write")))
    assert group.on_main(lambda: 42) == (42 if r == 0 else None)
    # The driver runs on rank 0 only; each operator call is a collective of both processes.
    calls = []

    def operator(v):
        calls.append(float(v["w"].sum()))
        return group.all_reduce_sum({"w": 2 * v["w"]})  # 4v over two processes

    def driver(apply):
        assert r == 0
        return float(apply(apply({"w": torch.ones(3, dtype=torch.float64)}))["w"].sum())

    assert group.drive(driver, operator, {"w": torch.zeros(3, dtype=torch.float64)}) == 48.0
    assert calls == [3.0, 12.0]
    params = [torch.full((2,), float(r)), torch.tensor([r], dtype=torch.int64)]
    group.sync_(params)
    assert params[0].tolist() == [0.0, 0.0] and params[1].tolist() == [0]


def _forbidden(*args, **kwargs):
    raise AssertionError("only rank 0 writes the run's files")


def _worker(rank: int, port: int, out_dir: str, results: str) -> None:
    """One of two processes: the user's own process group (as DDP code would set up), the Group
    checks in it, then ``objreg.analyze`` inside it."""
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    try:
        group = from_environment("cpu")
        assert isinstance(group, ProcessGroup)
        _group_checks(group)
        # Every file of the run goes through the writer, which only rank 0 may make.
        writer = RunWriter if rank == 0 else _forbidden
        report = objreg.analyze(PRETRAIN, "qa", registry=tiny_registry(), out_dir=out_dir, writer=writer, **RUN)
        with open(os.path.join(results, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            f.write(report.to_json())
        # A diverging run stops on both processes at the same step (the checks read the summed losses):
        # D after the first step is no number.
        with pytest.raises(NonFiniteLossError, match="is not finite after step 0"):
            objreg.analyze("mlm,sop", "qa", registry=tiny_registry(), **{**RUN, "lr": 1e300, "optimizer": "sgd",
                                                                           "spectrum": 0})
    finally:
        gc.collect()  # the run's objects before the group: gloo can abort at exit otherwise
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_process():
    return objreg.analyze(PRETRAIN, "qa", registry=tiny_registry(), **RUN).to_dict()


@pytest.fixture(scope="module")
def two_processes(one_process, tmp_path_factory):
    out_dir, results = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("results")
    run_two_processes(_worker, free_port(), str(out_dir), str(results))
    reports = [json.loads((results / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]
    return reports, out_dir


@pytest.mark.e2e
def test_two_processes_give_the_one_process_report(one_process, two_processes):
    (rank0, rank1), _ = two_processes
    assert rank0 == rank1  # every process returns the same report
    assert_close_reports(one_process, rank0)
    # D is summed chunk by chunk in the one-process order: before the first step it is exact.
    assert rank0["steps"][0]["downstream_loss"] == one_process["steps"][0]["downstream_loss"]
    assert all(set(step["alignment"]) == {"mlm", "sop", "contrastive"} for step in rank0["steps"])
    assert len(one_process["summary"]["spectrum"]) == 2
    attribution_one, attribution_two = one_process["summary"]["attribution"], rank0["summary"]["attribution"]
    assert attribution_two["examples"] == attribution_one["examples"] > 0
    for kind in ("helpful", "harmful"):
        assert [(e["objective"], e["text"], e["steps"]) for e in attribution_two[kind]] == [
            (e["objective"], e["text"], e["steps"]) for e in attribution_one[kind]]


@pytest.mark.e2e
def test_the_report_config_adds_only_the_processes(one_process, two_processes):
    (rank0, _), _ = two_processes
    assert (one_process["config"]["world_size"], one_process["config"]["backend"]) == (1, None)
    assert (rank0["config"]["world_size"], rank0["config"]["backend"]) == (2, "gloo")
    differing = {k for k in one_process["config"] if one_process["config"][k] != rank0["config"][k]}
    assert differing == {"world_size", "backend"}
    assert rank0["config"]["downstream_fit"]["examples"] == RUN["head_fit_size"]
    # The re-fit is split too (each process holds its chunks of the fit set): its loss and its
    # gradient's size agree with one process's.
    for one, two in zip(one_process["steps"], rank0["steps"]):
        for side in ("before", "after"):
            assert math.isclose(two["downstream_fit"][side]["fit_loss"], one["downstream_fit"][side]["fit_loss"],
                                rel_tol=1e-12)
            assert two["downstream_fit"][side]["gradient_norm"] < 1e-10


@pytest.mark.e2e
def test_rank_zero_wrote_the_run_files(two_processes):
    (rank0, _), out_dir = two_processes
    assert json.loads((out_dir / "report.json").read_text(encoding="utf-8")) == rank0
    assert json.loads((out_dir / "config.json").read_text(encoding="utf-8"))["world_size"] == 2
    assert len((out_dir / "steps.jsonl").read_text(encoding="utf-8").splitlines()) == RUN["steps"]
    assert not (out_dir / "checkpoint.pt").exists()


# -- processes that disagree or stop -------------------------------------------------------------------


def _disagreeing_worker(rank: int, port: int, results: str) -> None:
    """Two processes given different seeds, then one that stops before a collective the other waits in."""
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    lines = []
    try:
        try:
            objreg.analyze("mlm", "qa", registry=tiny_registry(), **{**RUN, "seed": 3 * rank})
        except objreg.DistributedError as error:
            lines.append(str(error))
        group = from_environment("cpu")
        if rank == 1:
            os._exit(0)  # stops without a word, as a killed process would
        try:
            group.all_reduce_sum(torch.ones(3))
        except objreg.DistributedError as error:
            lines.append(str(error))
        with open(os.path.join(results, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(lines, f)
    finally:
        if rank == 0:
            dist.destroy_process_group()


@pytest.mark.e2e
def test_processes_that_disagree_or_stop_are_named(tmp_path):
    run_two_processes(_disagreeing_worker, free_port(), str(tmp_path))
    settings, lost = json.loads((tmp_path / "rank0.json").read_text(encoding="utf-8"))
    assert settings == ("process rank 1 was started with seed (seed=) 3 but rank 0 with 0: every process torchrun "
                        "starts must be given the same settings")
    assert lost.startswith("process rank 0 lost the other processes in a collective: rank 1 stopped or failed first")
