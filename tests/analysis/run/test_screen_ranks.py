"""``objreg.screen`` ranks only what a rank means: two probes per candidate at least (refused before
any work otherwise), no run that diverged (listed "diverged at step N", not ranked, whichever way
it diverged), and no budget too large to end."""

from __future__ import annotations

import math

import pytest
import torch

import objreg
from objreg.analysis.math.refit import RefitDownstream
from objreg.analysis.run import screen as screen_module
from objreg.analysis.run.loop import Trainer
from objreg.analysis.run.screen import parse_budget, rank_with_ties, screen
from objreg.analysis.run.screen_candidates import MAX_SECONDS, MAX_STEPS

SMALL = {"batch_size": 4, "seq_len": 48, "eval_size": 8, "head_fit_size": 16, "dtype": "float64"}


@pytest.fixture(scope="module")
def registry():
    return objreg.Registry.load()


@pytest.mark.parametrize("budget", [MAX_STEPS + 1, 100_000_000_000, "100000000000", "86401s", "1e9s"])
def test_budgets_too_large_to_end_are_refused(budget):
    with pytest.raises(objreg.InvalidParameterError, match="budget must be at most") as error:
        parse_budget(budget)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("budget, every", [(4, 4), (2, 2), (3, 5), ("4", 4), (2, 3)])
def test_one_probe_per_candidate_is_refused_before_anything_is_loaded(registry, budget, every):
    stages = []
    with pytest.raises(objreg.InvalidParameterError, match="gives one probe per candidate; a rank needs at least two"):
        screen("mlm,sop", "qa", budget=budget, probe_every=every, registry=registry, on_status=stages.append,
               **SMALL)
    assert stages == []


def test_a_time_budget_runs_to_its_second_probe(registry):
    report = screen("mlm", "qa", budget="0.001s", probe_every=3, registry=registry, **SMALL)
    (entry,) = report.candidates
    assert entry["probes"] == 2 and entry["steps"] == 4  # probes at steps 0 and 3
    assert entry["runnable"] and entry["rank"] == 1 and entry["score"]["low"] < entry["score"]["high"]


def test_an_enormous_learning_rate_ranks_nothing(registry):
    report = screen("mlm,sop", "qa", budget=4, registry=registry, lr=1e6, **SMALL)
    for entry in report.candidates:
        assert not entry["runnable"] and entry["rank"] is None and entry["score"] is None
        assert entry["diverged_at"] == 0
        assert entry["reason"].startswith("diverged at step 0: its step's predicted change of D*")


def _diverging(monkeypatch, how, at):
    """Make the run diverge at step ``at`` in one way: the training loss, the weights, or D*."""
    if how == "loss":
        original = Trainer.accumulate_gradients

        def accumulate(self, step, *args, **kwargs):
            losses, gradients = original(self, step, *args, **kwargs)
            return ({k: (math.nan if step == at else v) for k, v in losses.items()}, gradients)

        monkeypatch.setattr(Trainer, "accumulate_gradients", accumulate)
    elif how == "weights":
        steps = []

        def poison(optimizer, *_):
            steps.append(None)
            if len(steps) == at + 1:
                with torch.no_grad():
                    optimizer.param_groups[0]["params"][0].fill_(math.inf)

        original_init = Trainer.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            steps.clear()
            self.optimizer.register_step_post_hook(poison)

        monkeypatch.setattr(Trainer, "__init__", init)
    else:
        calls = []
        original_loss = RefitDownstream.loss

        def loss(self, model):
            calls.append(None)
            return math.nan if len(calls) == at + 1 else original_loss(self, model)

        monkeypatch.setattr(RefitDownstream, "loss", loss)


@pytest.mark.parametrize("how, at, reason", [
    ("loss", 2, "its training loss is nan"),
    ("loss", 0, "its training loss is nan"),
    ("weights", 1, "its weights became infinite or NaN"),
    ("D*", 2, "its D* is nan"),
])
def test_a_run_diverging_any_way_is_listed_with_its_step_not_ranked(registry, monkeypatch, how, at, reason):
    _diverging(monkeypatch, how, at)
    report = screen("mlm", "qa", budget=4, registry=registry, **SMALL)
    (entry,) = report.candidates
    assert not entry["runnable"] and entry["rank"] is None and entry["score"] is None
    assert entry["diverged_at"] == at and entry["reason"] == f"diverged at step {at}: {reason}"
    assert entry["steps"] == at


def test_a_jump_of_d_star_larger_than_d_star_itself_is_divergence(registry, monkeypatch):
    calls = []
    original_loss = RefitDownstream.loss

    def loss(self, model):
        calls.append(None)
        value = original_loss(self, model)
        return value * 12 if len(calls) == 3 else value  # D* at the probe of step 2: 12 times the start's

    monkeypatch.setattr(RefitDownstream, "loss", loss)
    (entry,) = screen("mlm", "qa", budget=4, registry=registry, **SMALL).candidates
    assert entry["diverged_at"] == 2 and "a change larger than D* at the start" in entry["reason"]


def _entry(name, mean, low, high):
    return {"candidate": name, "runnable": True, "score": {"mean": mean, "low": low, "high": high},
            "rank": None, "tied": False}


@pytest.mark.parametrize("score", [(math.nan, 0.0, 1.0), (1.0, math.nan, math.nan), (1.0, 0.5, math.inf),
                                   (math.inf, math.inf, math.inf), (7.6e28, -math.inf, math.inf)])
def test_an_interval_that_is_not_a_number_is_not_ranked(score):
    entries = [_entry("a", 1.0, 0.5, 1.5), _entry("bad", *score)]
    rank_with_ties(entries)
    assert entries[0]["rank"] == 1 and not entries[0]["tied"]
    assert entries[1]["rank"] is None and not entries[1]["runnable"] and entries[1]["reason"].startswith("diverged")


def test_the_largest_budgets_are_accepted():
    assert parse_budget(MAX_STEPS).steps == MAX_STEPS
    assert parse_budget(f"{MAX_SECONDS}s").seconds == MAX_SECONDS


@pytest.mark.parametrize("candidates, message", [
    ("mlm+sop,sop+mlm", "candidates 'mlm\\+sop' and 'sop\\+mlm' are the same"),
    ("mlm,mlm:mask_prob=0.15", "candidates 'mlm' and 'mlm:mask_prob=0.15' are the same"),
    ("mlm:mask_prob=.4,mlm:mask_prob=0.4", "candidates 'mlm:mask_prob=.4' and 'mlm:mask_prob=0.4' are the same"),
    ("mlm:mask_prob=0.4,mlm:mask_prob=4e-1", "are the same"),
    ("mlm+sop:mask_prob=0.4,sop+mlm", "unknown parameter"),  # sop has no mask_prob: the plugin says so first
    ("sop+mlm:mask_prob=0.4,mlm:mask_prob=0.40+sop", "candidates 'sop\\+mlm:mask_prob=0.4' and "
                                                     "'mlm:mask_prob=0.40\\+sop' are the same"),
    ("mlm:mask_prob=0.4:mask_prob=0.5", "gives mlm's parameter 'mask_prob' twice"),
    ("mlm:mask_prob=0.4:mask_prob=0.4", "gives mlm's parameter 'mask_prob' twice"),
    (["mlm", 3], "every candidate must be a string .*got 3 \\(int\\)"),
    (("mlm", None), "every candidate must be a string .*got None \\(NoneType\\)"),
    (["mlm", b"sop"], "every candidate must be a string"),
    (5, "candidates must be a comma-separated string or a list of strings, got int"),
])
def test_candidates_that_are_the_same_after_parsing_or_not_strings_are_refused(registry, candidates, message):
    with pytest.raises(objreg.ObjregError, match=message) as error:
        screen_module.parse_candidates(candidates, registry)
    assert "\n" not in str(error.value)


def test_different_candidates_of_one_objective_are_kept(registry):
    parsed = screen_module.parse_candidates("mlm,mlm:mask_prob=0.4,mlm+sop,sop", registry)
    assert [c.label for c in parsed] == ["mlm", "mlm:mask_prob=0.4", "mlm+sop", "sop"]
