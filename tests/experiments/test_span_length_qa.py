"""span-length-qa: answer lengths, the gradients and cosines, the verdict rule, a tiny run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import objreg
from objreg.analysis.downstream import Downstream
from objreg.analysis.functional import shared_parameters
from objreg.core.registry import merge_heads
from objreg.core.types import Corpus
from objreg.experiments import _support
from objreg.experiments import span_length_qa as sl
from objreg.experiments.base import Setting
from objreg.toolkit.tokenizer import TokenizedCorpus, split_sentences

TINY_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture(scope="module")
def registry():
    return objreg.Registry.load(load_entrypoints=False)


@pytest.fixture(scope="module")
def text(registry, tokenizer, texts):
    documents = tuple(tuple(split_sentences(t)) for t in texts)
    corpus = Corpus("test", documents)
    return _support.DefaultText(registry, TokenizedCorpus(tokenizer, corpus, 32), TokenizedCorpus(tokenizer, corpus, 32))


@pytest.fixture(scope="module")
def qa_data(registry, text):
    return registry.get_task("qa").task_data(None, text.heldout.corpus.documents, text.train.tokenizer, 48, 100).batch


def test_answer_lengths_match_a_count_of_the_answers_words(qa_data, tokenizer):
    lengths = sl.answer_word_lengths(qa_data, tokenizer)
    start, end = qa_data.extras["start_positions"], qa_data.extras["end_positions"]
    counts: dict[int, int] = {}
    for b in range(qa_data.batch_size):
        if start[b] > 0:  # the built-in cloze answers are words, names or numbers: whitespace splits them
            n = len(tokenizer.decode(qa_data.input_ids[b, start[b]: end[b] + 1]).split())
            counts[n] = counts.get(n, 0) + 1
    total = sum(counts.values())
    assert total > 5
    assert lengths == pytest.approx({n: c / total for n, c in counts.items()})


def test_conditions_and_total_variation():
    params = sl.condition_params({1: 0.75, 2: 0.25})
    assert params["matched"]["empirical_lengths"] == "1:0.75,2:0.25"
    assert set(params) == set(sl.CONDITIONS)
    assert sl.total_variation({1: 0.75, 2: 0.25}, {1: 1.0}) == pytest.approx(0.25)
    assert sl.total_variation({1: 1.0}, {8: 1.0}) == pytest.approx(1.0)
    geometric = sl._length_distribution(params["geometric"])
    assert geometric.mean == pytest.approx(3.797, abs=1e-3)  # SpanBERT's mean, in its docstring


def test_gradients_and_cosine_match_plain_autograd(registry, text, qa_data):
    vocab = text.train.vocab
    task = registry.get_task("qa")
    span = registry.get("span", vocab=vocab)
    model = registry.load_model("default", vocab, merge_heads({"span": span.info.heads, "qa": task.info.heads}), TINY_MODEL,
                                torch.Generator().manual_seed(0)).double()
    model.eval()
    evaluation = qa_data.select(slice(0, 8))
    downstream = Downstream(task, evaluation)
    # The rows and corruption paired_alignment draws for batch 0 with seed 0.
    batch = span.corrupt(text.train.sample(4, torch.Generator().manual_seed(11)), torch.Generator().manual_seed(0))

    def backward(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in shared_parameters(model).items()}

    expected_d = backward(task.losses(model, evaluation).mean())
    expected_g = backward(span.losses(model, batch).mean())
    got_d = sl.downstream_gradient(model, downstream)
    got_g = sl.objective_gradient(model, span, batch)
    for name in expected_d:
        torch.testing.assert_close(got_d[name], expected_d[name], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got_g[name], expected_g[name], rtol=1e-9, atol=1e-12)
    flat = lambda g: torch.cat([t.flatten() for t in g.values()])  # noqa: E731
    cosine = float(torch.nn.functional.cosine_similarity(flat(expected_g), flat(expected_d), dim=0))
    rows = sl.paired_alignment(model, downstream, {"matched": span}, text.train, 1, 4, 0, torch.device("cpu"))
    assert rows["matched"][0, 0] == pytest.approx(cosine, rel=1e-9)
    assert rows["matched"][0, 1] == pytest.approx(float(flat(expected_g) @ flat(expected_d)), rel=1e-9)


def _figures(differences: dict[str, tuple[float, float]]) -> dict:
    return {
        "batches": 10,
        "conditions": {n: {"cosine": 0.0} for n in sl.CONDITIONS},
        "difference_from_matched": {n: {"cosine": (lo + hi) / 2, "ci95": [lo, hi]} for n, (lo, hi) in differences.items()},
    }


@pytest.mark.parametrize(("geometric", "long", "expected"), [
    ((0.01, 0.02), (0.005, 0.03), "confirmed"),
    ((0.01, 0.02), (-0.01, 0.03), "inconclusive"),
    ((-0.03, -0.01), (0.005, 0.03), "refuted"),
])
def test_verdict_rule(geometric, long, expected):
    figures = _figures({"single_word": (-1.0, -0.5), "geometric": geometric, "long": long})
    verdict, reason = sl.decide(figures)
    assert verdict == expected  # the single-word control never decides
    assert "cos(matched) - cos(geometric)" in reason


def test_measure_pairs_the_differences():
    rng = np.random.default_rng(0)
    rows = {n: rng.normal(size=(12, 4)) for n in sl.CONDITIONS}
    figures = sl.measure(rows, seed=0)
    difference = rows["matched"][:, 0] - rows["long"][:, 0]
    assert figures["difference_from_matched"]["long"]["cosine"] == pytest.approx(difference.mean())
    half = 2.200985 * difference.std(ddof=1) / np.sqrt(12)  # t(0.975, 11)
    assert figures["difference_from_matched"]["long"]["ci95"] == pytest.approx(
        [difference.mean() - half, difference.mean() + half], rel=1e-5)


def test_a_tiny_run_is_deterministic_and_keeps_the_budget(text, tmp_path):
    config = sl.Config(batches=3, batch_size=4, seq_len=32, pretrain_steps=2, pretrain_batch_size=4, eval_size=8,
                       head_fit_size=16, head_warmup_steps=2)
    result = sl._run(config, Setting(quick=True, seed=0, out_dir=tmp_path, device="cpu"), text=text,
                     model_config=TINY_MODEL)
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.verdict in ("confirmed", "refuted", "inconclusive")
    shares = [c["masked_share"] for c in result.figures["conditions"].values()]
    assert max(shares) - min(shares) < 0.1  # the same 15% budget, whatever the span lengths
    assert (tmp_path / "span-length-qa.png").is_file()
    again = sl._run(config, Setting(quick=True, seed=0, device="cpu"), text=text, model_config=TINY_MODEL)
    assert again.figures == result.figures
