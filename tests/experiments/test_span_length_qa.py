"""span-length-qa: answer lengths, the gradients and cosines, the verdict rule, a tiny run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import objreg
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import shared_parameters
from objreg.core.registry import merge_heads
from objreg.core.types import Corpus
from objreg.experiments import _support
from objreg.experiments import span_length_qa as sl
from objreg.experiments.base import Setting
from objreg.toolkit.tokenizer import TokenizedCorpus, split_sentences

TINY_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture(scope="module")
def text(registry, tokenizer, texts):
    documents = tuple(tuple(split_sentences(t)) for t in texts)
    corpus = Corpus("test", documents)
    return _support.DefaultText(registry, TokenizedCorpus(tokenizer, corpus, 32), TokenizedCorpus(tokenizer, corpus, 32))


def squad_file(path, texts, answers_per_text=3):
    """A SQuAD-format file over ``texts``: questions whose answers are a text's first 1, 2, 3 words."""
    paragraphs = []
    for i, context in enumerate(texts):
        words = context.split()
        qas = [{"id": f"{i}-{n}", "question": f"What comes first in text {i}?",
                "answers": [{"text": " ".join(words[:n]), "answer_start": 0}]} for n in range(1, answers_per_text + 1)]
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))


@pytest.fixture(scope="module")
def squad(tmp_path_factory, texts):
    folder = tmp_path_factory.mktemp("squad_v1.1")
    squad_file(folder / sl.SQUAD_FILES[0], texts[:3])
    squad_file(folder / sl.SQUAD_FILES[1], texts * 4)
    return folder


@pytest.fixture(scope="module")
def qa_data(registry, text, squad):
    return registry.get_task("qa").task_data(str(squad / sl.SQUAD_FILES[1]), (), text.train.tokenizer, 48, 100).batch


def test_missing_squad_is_one_clear_error(text, tmp_path):
    config = sl.Config(batches=1, batch_size=2, seq_len=32, pretrain_steps=1, pretrain_batch_size=2, eval_size=2,
                       head_fit_size=2, head_warmup_steps=1)
    with pytest.raises(objreg.DataError, match="needs SQuAD v1.1 dev halves .*dev-v1.1.half-a.json, "
                                               "dev-v1.1.half-b.json missing.*OBJREG_SHARED_DATA"):
        sl._run(config, Setting(quick=True, device="cpu"), text=text, squad=tmp_path)


def test_real_squad_answers_are_mostly_short_but_not_single_words(shared_file, tokenizer):
    from objreg.toolkit.lengths import answer_length_distribution

    path = shared_file(f"squad_v1.1/{sl.SQUAD_FILES[0]}")
    distribution = answer_length_distribution(path, tokenizer, sl.MAX_ANSWER_WORDS)
    mean = sum(n * p for n, p in distribution.items())
    assert 0.2 < distribution[1] < 0.5 and 2.0 < mean < 3.5  # unlike the cloze task's 96% single words


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


@pytest.mark.parametrize(("single_word", "long", "expected"), [
    ((0.01, 0.02), (0.005, 0.03), "confirmed"),
    ((0.01, 0.02), (-0.01, 0.03), "inconclusive"),
    ((-0.03, -0.01), (0.005, 0.03), "refuted"),
])
def test_verdict_rule(single_word, long, expected):
    figures = _figures({"single_word": single_word, "geometric": (-1.0, -0.5), "long": long})
    verdict, reason = sl.seed_verdict(figures)
    assert verdict == expected  # geometric (close to SQuAD's lengths) never decides
    assert "cos(matched) - cos(single_word)" in reason and "within-seed" in reason


def test_measure_pairs_the_differences():
    rng = np.random.default_rng(0)
    rows = {n: rng.normal(size=(12, 4)) for n in sl.CONDITIONS}
    figures = sl.measure(rows, seed=0)
    difference = rows["matched"][:, 0] - rows["long"][:, 0]
    assert figures["difference_from_matched"]["long"]["cosine"] == pytest.approx(difference.mean())
    half = 2.200985 * difference.std(ddof=1) / np.sqrt(12)  # t(0.975, 11)
    assert figures["difference_from_matched"]["long"]["ci95"] == pytest.approx(
        [difference.mean() - half, difference.mean() + half], rel=1e-5)


def test_a_tiny_run_is_deterministic_and_keeps_the_budget(text, squad, tmp_path):
    config = sl.Config(batches=3, batch_size=4, seq_len=32, pretrain_steps=2, pretrain_batch_size=4, eval_size=8,
                       head_fit_size=16, head_warmup_steps=2)
    result = sl._run(config, Setting(quick=True, seed=0, out_dir=tmp_path, device="cpu"), text=text,
                     model_config=TINY_MODEL, squad=squad)
    # Lengths from half a: answers of 1, 2 and 3 words, equally often.
    assert result.figures["answer_lengths"] == pytest.approx({"1": 1 / 3, "2": 1 / 3, "3": 1 / 3})
    assert result.figures["parts"] == {"vs_single_word": result.figures["difference_from_matched"]["single_word"]["cosine"],
                                       "vs_long": result.figures["difference_from_matched"]["long"]["cosine"]}
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.verdict in ("confirmed", "refuted", "inconclusive")
    shares = [c["masked_share"] for c in result.figures["conditions"].values()]
    assert max(shares) - min(shares) < 0.1  # the same 15% budget, whatever the span lengths
    assert (tmp_path / "span-length-qa.png").is_file()
    again = sl._run(config, Setting(quick=True, seed=0, device="cpu"), text=text, model_config=TINY_MODEL,
                    squad=squad)
    assert again.figures == result.figures


def test_the_full_setting_reads_minilm_through_a_fitted_mlm_head():
    assert sl.FULL.model == "minilm" and sl.TOY.model == "default"
    assert sl.FULL.pretrain_steps == 0 and sl.FULL.lm_head_steps > 0  # MiniLM ships no MLM head


@pytest.mark.e2e
def test_a_tiny_run_on_a_hugging_face_encoder(tiny_bert, hf_text, squad):
    # The MiniLM setting's path on a 2-layer BERT with MiniLM's tokenizer: no pre-training, the MLM
    # head fitted alone (the encoder's weights untouched), then the alignment read.
    config = sl.Config(batches=3, batch_size=4, seq_len=32, pretrain_steps=0, pretrain_batch_size=4, eval_size=8,
                       head_fit_size=16, head_warmup_steps=2, model="minilm", lm_head_steps=3)
    result = sl._run(config, Setting(quick=True, seed=0, device="cpu"), text=hf_text, squad=squad,
                     model_path=str(tiny_bert))
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.setting["model"].startswith("all-MiniLM-L6-v2") and result.setting["lm_head_steps"] == 3
    assert set(result.figures["conditions"]) == set(sl.CONDITIONS)
    assert sl.seed_verdict(result.figures) == (result.verdict, result.reason)
