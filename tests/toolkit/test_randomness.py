"""The named random streams: the same generators as the ``seed * 7919 + k`` each place built before."""

from __future__ import annotations

import re

import pytest
import torch

import objreg
from objreg.toolkit import randomness
from objreg.toolkit.randomness import STREAMS, stream, stream_seed

# Each stream's number as written out at its place of use before the helper existed: the
# recorded results (the default job, every experiment's figures) were drawn from these.
OLD_NUMBERS = {
    "data": 1,  # analysis.run.loop, experiments._support.train, consistency_collapse.train
    "corruption": 2,  # analysis.run.loop, experiments._support.train (consistency_collapse too until its split views)
    "heldout_rows": 3,  # experiments._support.heldout_rows, hard_negatives, weight_tying, consistency_collapse
    "char_noise": 3,  # analysis.run.prepare
    "heldout_corruption": 4,  # entropy_masking, hard_negatives, weight_tying, inverse_frequency, fim, label smoothing
    "second_heldout_corruption": 5,  # inverse_frequency, fim_attention
    "replacements": 5,  # hard_negatives
    "new_weights": 5,  # weight_tying, consistency_collapse
    "permutations": 5,  # analysis.math.shapley
    "misspellings": 6,  # char_noise_robustness
    "random_tokens": 6,  # weight_tying
    "paired_rows": 11,  # span_length_qa
}
#: Streams added since, each with a number no stream drawn in the same run has.
NEW_NUMBERS = {
    "resolution": 7,  # analysis.math.resolution: a probe's run draws data, corruption, char_noise, permutations
    "downstream_head": 12,  # analysis.run.prepare (the task's head under a re-fitted head)
    "moment_rounding": 13,  # analysis.math.shapley: stochastic rounding of bfloat16 coalition moments
    "screen_random_order": 20,  # analysis.run.screen (the random-order baseline, drawn after every run)
    "entropy_heldout_corruption": 30,  # entropy_masking: held-out masks drawn by the entropy twin's policy
    "finetune": 40,  # experiments.sst2_finetune: the SST-2 fine-tune's head init and batch order
    "finetune_split": 41,  # analysis.run.finetune: the cross-validation folds (objreg finetune)
    "data_split": 42,  # toolkit.splits: the rows a split holds out (objreg split)
    "collapse_views": 45,  # consistency_collapse: the split point of each training row (beside data only)
    "screen_mixtures": 46,  # screen_validity: its drawn mixtures (seed 0, once per list)
    "screen_validity_bootstrap": 47,  # screen_validity: the bootstrap over candidates and seeds (after every run)
}


def test_every_stream_is_one_that_was_used():
    assert set(STREAMS) == set(OLD_NUMBERS) | set(NEW_NUMBERS)
    assert all(STREAMS[name] == number for name, number in NEW_NUMBERS.items())
    run = ("data", "corruption", "char_noise", "permutations")
    assert STREAMS["resolution"] not in {STREAMS[name] for name in run}


@pytest.mark.parametrize("name", sorted(OLD_NUMBERS))
@pytest.mark.parametrize("seed", [0, 1, 3, 12345])
def test_stream_gives_the_old_generator(name, seed):
    old = torch.Generator().manual_seed(seed * 7919 + OLD_NUMBERS[name])
    new = stream(seed, name)
    assert stream_seed(seed, name) == seed * 7919 + OLD_NUMBERS[name]
    assert torch.equal(new.get_state(), old.get_state())
    assert torch.equal(torch.rand(8, generator=new), torch.rand(8, generator=old))


def test_each_call_is_a_fresh_generator():
    first = stream(2, "data")
    torch.rand(4, generator=first)
    assert torch.equal(stream(2, "data").get_state(), torch.Generator().manual_seed(2 * 7919 + 1).get_state())


@pytest.mark.parametrize("call", [stream, stream_seed])
def test_an_unknown_stream_is_an_error_naming_the_streams(call):
    with pytest.raises(objreg.InvalidParameterError, match="'eval'") as error:
        call(0, "eval")
    for name in OLD_NUMBERS:
        assert name in str(error.value)


def test_the_documented_table_is_the_table():
    rows = re.findall(r"^``(\w+)``\s+(\d+)\s", randomness.__doc__, flags=re.MULTILINE)
    assert {name: int(number) for name, number in rows} == STREAMS
    assert len(rows) == len(STREAMS)
