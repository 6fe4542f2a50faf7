"""Span-length distributions."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

import objreg
from objreg.toolkit import lengths


def test_geometric_lengths_mean_and_sampled_histogram():
    distribution = lengths.geometric_lengths(0.2, 1, 10)
    q, n = 0.8, 10
    closed_form = 1 / 0.2 - n * q**n / (1 - q**n)  # mean of a geometric truncated to 1..n
    assert abs(distribution.mean - closed_form) < 1e-12 and abs(closed_form - 3.797) < 1e-3
    samples = distribution.sample((400, 500), torch.Generator().manual_seed(12))
    assert samples.min() >= 1 and samples.max() <= 10
    histogram = torch.bincount(samples.flatten(), minlength=11)[1:].double() / samples.numel()
    assert (histogram - distribution.probs).abs().max() < 0.004  # 200k draws: sigma <= 0.0009
    assert abs(float(samples.double().mean()) - closed_form) < 0.02


def test_empirical_lengths_parse_and_round_trip():
    distribution = lengths.parse_lengths(" 3:1, 1:2,2:1 ")
    assert distribution.lengths.tolist() == [1, 2, 3] and distribution.probs.tolist() == [0.5, 0.25, 0.25]
    again = lengths.parse_lengths(lengths.format_lengths(distribution))
    assert torch.equal(again.lengths, distribution.lengths) and torch.allclose(again.probs, distribution.probs)
    for bad in ("", "1:0", "0:1", "two:1", "1=0.5", "1:-1"):
        with pytest.raises(objreg.InvalidParameterError, match="span lengths"):
            lengths.parse_lengths(bad)


def test_answer_length_distribution_from_squad(shared_file, tokenizer, tmp_path):
    path = shared_file("squad_v1.1/dev-v1.1.half-a.json")
    distribution = lengths.answer_length_distribution(path, tokenizer)
    assert abs(sum(distribution.values()) - 1) < 1e-12 and min(distribution) >= 1
    # Independent count: BERT's pre-tokeniser splits on whitespace and punctuation.
    answers = [qa["answers"][0]["text"] for article in json.loads(path.read_text())["data"]
               for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    counted = Counter(len(re.findall(r"\w+|[^\w\s]", a)) for a in answers)
    total = sum(counted.values())
    observed = set(counted) | set(distribution)
    assert max(abs(counted.get(n, 0) / total - distribution.get(n, 0)) for n in observed) < 0.005
    assert 2.5 < sum(n * p for n, p in distribution.items()) < 4.5 and max(distribution, key=distribution.get) == 1
    short = lengths.answer_length_distribution(path, tokenizer, max_length=5)
    assert max(short) == 5 and abs(sum(short.values()) - 1) < 1e-12
    with pytest.raises(objreg.DataError, match="does not exist"):
        lengths.answer_length_distribution(tmp_path / "missing.json", tokenizer)
    (tmp_path / "bad.json").write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(objreg.DataError, match="SQuAD"):
        lengths.answer_length_distribution(tmp_path / "bad.json", tokenizer)
