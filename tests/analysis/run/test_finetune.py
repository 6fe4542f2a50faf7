"""objreg.finetune on a tiny BERT: the same seed gives the same numbers, the folds partition the
rows, the intervals are what scipy computes from the units, and the linear probe's D* equals an
independent float64 logistic regression on the same features."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import optimize, stats

import objreg
from objreg.analysis.run.finetune import Schedule, finetune, grouped_folds
from objreg.analysis.run.prepare import build_model
from objreg.analysis.run.unseen import row_tokens
from objreg.toolkit.overlap import text_groups
from objreg.toolkit.randomness import stream_seed

SMALL = {"schedule": Schedule(epochs=2, lr=1e-3, batch_size=8), "seq_len": 32}


@pytest.fixture(scope="module")
def report(tiny_bert, sentiment_tsv, registry):
    return finetune(str(tiny_bert), "classification", str(sentiment_tsv), folds=3, seeds=2, registry=registry, **SMALL)


def test_the_same_seed_gives_the_same_numbers(report, tiny_bert, sentiment_tsv, registry):
    again = finetune(str(tiny_bert), "classification", str(sentiment_tsv), folds=3, seeds=2, registry=registry, **SMALL)
    first, second = report.to_dict(predictions=True), again.to_dict(predictions=True)
    first.pop("timing"), second.pop("timing")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_each_seed_holds_out_every_row_once(report):
    for seed in (0, 1):
        rows = sorted(p["row"] for p in report.predictions if p["seed"] == seed)
        assert rows == list(range(60))
    folds = {(p["seed"], p["fold"]) for p in report.predictions}
    assert len(folds) == 6


def test_no_fold_trains_on_text_it_is_scored_on(tiny_bert, tmp_path, registry, distinct_sentences):
    # Each premise with three hypotheses (RTE's shape): rows sharing a premise share its 8-token windows.
    texts = distinct_sentences(8)
    rows = [f"{texts[i // 3]}\tthis is hypothesis {i} .\t{i % 2}" for i in range(24)]
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n")
    report = finetune(str(tiny_bert), "classification", str(path), folds=4, registry=registry,
                      schedule=Schedule(epochs=1, batch_size=8), seq_len=48)
    for fold in range(4):
        held = {p["row"] // 3 for p in report.predictions if p["fold"] == fold}
        assert report.units[fold]["heldout_rows"] == 3 * len(held)  # whole premises held out
    assert sorted(p["row"] for p in report.predictions) == list(range(24))


def test_the_interval_is_a_t_interval_over_the_seeds_pooled_rows(report):
    per_seed = [np.mean([p["accuracy"] for p in report.predictions if p["seed"] == s]) for s in (0, 1)]
    summary = report.summary["finetune"]["accuracy"]
    assert summary["interval_over"] == "seeds"
    assert summary["values"] == pytest.approx(per_seed, abs=1e-6)
    mean = np.mean(per_seed)
    half = stats.t.ppf(0.975, 1) * np.std(per_seed, ddof=1) / np.sqrt(2)
    assert summary["mean"] == pytest.approx(mean, abs=1e-6)
    if half > 0:
        assert summary["ci95"] == pytest.approx([mean - half, mean + half], abs=1e-6)


def test_fine_tuning_learns_the_bag_of_words_task(tiny_bert, sentiment_tsv, registry):
    # The labels follow the words; a fine-tune that trains at all beats chance (0.5) by far.
    report = finetune(str(tiny_bert), "classification", str(sentiment_tsv), folds=3, registry=registry,
                      schedule=Schedule(epochs=10, lr=1e-3, batch_size=8), seq_len=32)
    assert report.summary["finetune"]["accuracy"]["mean"] > 0.75
    assert all(u["train_loss"]["last"] < u["train_loss"]["first"] for u in report.units)


def test_the_probe_is_a_float64_logistic_regression_on_the_frozen_features(tiny_bert, sentiment_tsv, registry):
    report = finetune(str(tiny_bert), "classification", str(sentiment_tsv), folds=2, seeds=1, registry=registry, **SMALL)
    task = registry.get_task("classification")
    tokenizer = registry.load_tokenizer(str(tiny_bert), None, objreg.cache_dir())
    data = task.task_data(str(sentiment_tsv), (), tokenizer, 32, 10**9)
    net = build_model(registry, str(tiny_bert), tokenizer.vocab, {"classification": data.heads}, 0).double().eval()
    captured = []
    net.heads["classification"].classifier.register_forward_hook(lambda m, args, out: captured.append(args[0]))
    with torch.no_grad():
        task.losses(net, data.batch)
    features = captured[0].numpy()  # the pooled states the linear part reads, [60, 32]
    labels = data.batch.extras["label"].numpy()
    groups = text_groups(row_tokens(data.batch, tokenizer.vocab))
    for fold, (held, _) in enumerate(grouped_folds(groups, 2, stream_seed(0, "finetune_split"))):
        test = np.zeros(60, dtype=bool)
        test[held.numpy()] = True
        x, y = features[~test], labels[~test]
        l2 = 1.0 / len(y)

        def penalised(flat, x=x, y=y, l2=l2):
            w, b = flat[:64].reshape(2, 32), flat[64:]
            logits = x @ w.T + b
            nll = np.mean(np.logaddexp.reduce(logits, axis=1) - logits[np.arange(len(y)), y])
            return nll + l2 / 2 * np.sum(flat ** 2)

        flat = optimize.minimize(penalised, np.zeros(66), method="BFGS", options={"gtol": 1e-10}).x
        w, b = flat[:64].reshape(2, 32), flat[64:]
        logits = features[test] @ w.T + b
        d_star = np.mean(np.logaddexp.reduce(logits, axis=1) - logits[np.arange(test.sum()), labels[test]])
        accuracy = np.mean(logits.argmax(axis=1) == labels[test])
        unit = report.units[fold]["probe"]
        assert unit["d_star"] == pytest.approx(d_star, abs=1e-6)
        assert unit["accuracy"] == pytest.approx(accuracy)


def test_held_out_file(tiny_bert, sentiment_tsv, tmp_path, registry):
    lines = sentiment_tsv.read_text().splitlines()
    train, held = tmp_path / "train.tsv", tmp_path / "held.tsv"
    train.write_text("\n".join(lines[:41]) + "\n")
    held.write_text("\n".join([lines[0], *lines[41:]]) + "\n")
    report = finetune(str(tiny_bert), "classification", str(train), eval_data=str(held), registry=registry, **SMALL)
    assert [u["train_rows"] for u in report.units] == [40]
    assert [u["heldout_rows"] for u in report.units] == [20]
    assert report.summary["finetune"]["accuracy"]["interval_over"] == "rows"
    assert report.setting["folds"] is None


@pytest.mark.parametrize("given, message", [
    ({"folds": 61}, r"folds \(--folds\) must lie in \[2, \d+\] \(the groups of rows"),
    ({"folds": 1}, r"folds \(--folds\) must be an integer >= 2"),
    ({"seeds": 0}, r"seeds \(--seeds\) must be an integer >= 1"),
    ({"schedule": "lr"}, None),
])
def test_bad_settings_are_one_line_before_any_work(tiny_bert, sentiment_tsv, registry, given, message):
    if message is None:
        with pytest.raises(objreg.InvalidParameterError, match="lr must be a finite number > 0"):
            Schedule(lr=float("nan"))
        return
    with pytest.raises(objreg.InvalidParameterError, match=message) as error:
        finetune(str(tiny_bert), "classification", str(sentiment_tsv), registry=registry, **given)
    assert "\n" not in str(error.value)


def test_a_task_without_a_metric_and_missing_data_are_refused(tiny_bert, sentiment_tsv, registry):
    with pytest.raises(objreg.InvalidParameterError, match="task 'ordering' reports no metric"):
        finetune(str(tiny_bert), "ordering", str(sentiment_tsv), registry=registry)
    with pytest.raises(objreg.InvalidParameterError, match="needs the task's data"):
        finetune(str(tiny_bert), "classification", None, registry=registry)


def test_a_run_directory_without_a_trained_model_is_refused(tmp_path, registry):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"pretrain": ["mlm"], "model": "default"}))
    (run / "report.json").write_text("{}")
    with pytest.raises(objreg.DataError, match="holds no trained model .*built-in model 'default'"):
        finetune(str(run), "classification", "x.tsv", registry=registry)


def test_qa_reports_exact_match_and_f1_and_keeps_each_context_in_one_fold(tiny_bert, registry):
    from pathlib import Path

    from objreg.toolkit.overlap import windows

    squad = Path(__file__).resolve().parents[3] / "examples" / "data" / "squad-v1.1-dev-sample.json"
    report = finetune(str(tiny_bert), "qa", str(squad), folds=3, registry=registry, seq_len=96,
                      schedule=Schedule(epochs=1, batch_size=16))
    assert report.metrics == ["exact_match", "f1"]
    for name in ("exact_match", "f1", "loss"):
        assert name in report.summary["finetune"]
    for p in report.predictions:
        assert 0 <= p["exact_match"] <= p["f1"] <= 1  # an exact match has F1 1
    task = registry.get_task("qa")
    tokenizer = registry.load_tokenizer(str(tiny_bert), None, objreg.cache_dir())
    rows = row_tokens(task.task_data(str(squad), (), tokenizer, 96, 10**9).batch, tokenizer.vocab)
    for fold in range(3):
        held = {p["row"] for p in report.predictions if p["fold"] == fold}
        held_windows = {w for i in held for w in windows(rows[i], 8)}
        train_windows = {w for i in range(len(rows)) if i not in held for w in windows(rows[i], 8)}
        assert not held_windows & train_windows  # no context (or question) on both sides of a fold
