"""Every committed result's per-seed verdicts are what its experiment's rule says today.

``recombine`` reads each seed's verdict again through the experiment's ``seed_verdict(figures)``;
an experiment without one would keep per-seed verdicts made under an older rule (stale), so
each experiment with a committed result must define it, and re-reading the committed seeds must
give back exactly the committed file (else it was left stale: run
``python -m objreg.experiments.docs recombine NAME``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from objreg.experiments import EXPERIMENTS, module
from objreg.experiments.replication import recombine

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "results"
COMMITTED = [name for name in EXPERIMENTS if (RESULTS / f"{name}.json").is_file()]


def current(name: str) -> bool:
    """The committed result was judged under the experiment's rule of today (a result of an
    earlier design keeps its own rule until its redesign is run; the table marks it)."""
    return json.loads((RESULTS / f"{name}.json").read_text())["rule"] == module(name).RULE


CURRENT = [name for name in COMMITTED if current(name)]


def test_the_committed_results_are_found():
    assert len(COMMITTED) >= 10 and len(CURRENT) >= 10


@pytest.mark.parametrize("name", CURRENT)
def test_each_seed_verdict_is_read_again_and_matches_the_committed_one(name):
    experiment = module(name)
    assert callable(getattr(experiment, "seed_verdict", None)), f"{name} has no seed_verdict(figures)"
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recombine warns where it keeps recorded verdicts
        again = recombine(experiment, committed).to_dict()
    for seed, (was, now) in enumerate(zip(committed["replicates"], again["replicates"])):
        assert (now["verdict"], now["reason"]) == (was["verdict"], was["reason"]), f"{name}: seed #{seed} is stale"
    assert again == committed


@pytest.mark.parametrize("name", CURRENT)
def test_seed_verdict_reads_the_figures_not_the_recorded_verdict(name):
    # The re-read must come from the figures: a replicate whose recorded verdict and reason are
    # blanked still gets them back.
    experiment = module(name)
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    blanked = {**committed, "replicates": [{**r, "verdict": "", "reason": ""} for r in committed["replicates"]]}
    again = recombine(experiment, blanked).to_dict()
    assert [r["verdict"] for r in again["replicates"]] == [r["verdict"] for r in committed["replicates"]]
