"""The threads ``objreg analyze`` computes with: chosen for the machine (the CPUs it may use less the
load of other jobs), ``--threads N`` and ``OMP_NUM_THREADS`` as given, said first on stderr and in
the report's header, torch's own count restored after; OpenMP's waiting threads sleep on a busy
machine where the user set no policy."""

from __future__ import annotations

import sys

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli, threads

SMALL = ["--pretrain", "mlm", "--steps", "1", "--batch-size", "2", "--seq-len", "32", "--eval-size", "4",
         "--head-warmup-steps", "1", "--head-fit-size", "4", "--downstream-head", "frozen"]


@pytest.mark.parametrize(("cpus", "load", "expected"), [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.9, 1), (2, 7.0, 1), (16, 3.2, 13), (16, None, 16), (1, 0.0, 1)])
def test_auto_takes_the_cpus_other_jobs_leave(cpus, load, expected):
    chosen = threads.choose(None, {}, cpus, load)
    assert (chosen.count, chosen.source, chosen.cpus) == (expected, "auto", cpus)


def test_given_counts_win_and_torchrun_shares_the_cpus():
    assert threads.choose(3, {"OMP_NUM_THREADS": "1"}, 2, 0.0).count == 3  # --threads first
    given = threads.choose(None, {"OMP_NUM_THREADS": "4"}, 2, 5.0)
    assert (given.count, given.source) == (4, "OMP_NUM_THREADS")
    assert threads.choose(None, {"OMP_NUM_THREADS": "many"}, 2, 0.0).source == "auto"  # not a count: ignored
    shared = threads.choose(None, {"LOCAL_WORLD_SIZE": "4"}, 16, 0.0)  # four processes on 16 CPUs
    assert (shared.count, shared.cpus) == (4, 4)


def test_described_as_the_header_and_first_line_show_it():
    assert threads.Threads(1, "auto", 2, 1.934).describe() == "1 thread (auto: 2 CPUs, load 1.93)"
    assert threads.Threads(4, "--threads", 2, 0.0).describe() == "4 threads (--threads)"
    assert threads.Threads(2, "auto", 2, None).describe() == "2 threads (auto: 2 CPUs)"


def test_usable_cpus_is_at_most_the_affinity():
    assert 1 <= threads.usable_cpus() <= len(__import__("os").sched_getaffinity(0))


def test_using_sets_torch_and_restores_it():
    before = torch.get_num_threads()
    with threads.using(threads.Threads(before + 1, "--threads", 2, None)):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


def test_openmp_waits_passively_on_a_busy_machine_unless_set(monkeypatch):
    # Before torch loads, as in the console script (here torch is loaded, so it is hidden).
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(threads, "load_average", lambda: 1.5)
    environ: dict[str, str] = {}
    assert threads.prepare_environment(environ) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.prepare_environment(mine) is None and mine == {"OMP_WAIT_POLICY": "ACTIVE"}
    monkeypatch.setattr(threads, "load_average", lambda: 0.1)  # an idle machine: OpenMP's default
    idle: dict[str, str] = {}
    assert threads.prepare_environment(idle) is None and idle == {}


def test_openmp_policy_is_left_alone_once_torch_is_loaded():
    environ: dict[str, str] = {}
    assert threads.prepare_environment(environ) is None and environ == {}


@pytest.fixture
def cli():
    return make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))


def test_analyze_computes_with_the_threads_given_and_says_so(cli, monkeypatch):
    seen = []
    real = objreg.analyze

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(objreg, "analyze", spy)
    before = torch.get_num_threads()
    result = CliRunner().invoke(cli, ["analyze", *SMALL, "--threads", "3"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert seen == [3] and torch.get_num_threads() == before
    assert result.stderr.splitlines()[0].endswith("computing with 3 threads (--threads); --threads N to change")
    assert result.stdout.startswith("objreg analyze  device=cpu, 3 threads (--threads)")


def test_analyze_follows_omp_num_threads_where_set(cli, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = CliRunner().invoke(cli, ["analyze", *SMALL, "--json"], catch_exceptions=False)
    assert result.exit_code == 0 and result.stderr == ""  # --json: nothing on stderr that is no terminal
    shown = CliRunner().invoke(cli, ["analyze", *SMALL], catch_exceptions=False)
    assert "computing with 1 thread (OMP_NUM_THREADS)" in shown.stderr.splitlines()[0]


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_bad_thread_counts_are_refused_naming_the_option(cli, bad):
    result = CliRunner().invoke(cli, ["analyze", *SMALL, "--threads", bad])
    assert result.exit_code == 2 and "--threads" in result.stderr
