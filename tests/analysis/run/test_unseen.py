"""Evaluation rows inside the pre-training text: objreg analyze refuses them before any training."""

from __future__ import annotations

import pytest

import objreg


def test_analyze_refuses_evaluation_rows_it_would_pre_train_on(tiny_bert, sentiment_tsv, tmp_path, registry):
    sentences = [line.split("\t")[0] for line in sentiment_tsv.read_text().splitlines()[1:]]
    corpus = tmp_path / "task-text.txt"
    corpus.write_text("\n\n".join(sentences) + "\n")
    with pytest.raises(objreg.DataError, match=r"evaluation rows of downstream_data=.* are in the pre-training text"
                       ) as error:
        objreg.analyze(["mlm"], "classification", model=str(tiny_bert), corpus=str(corpus),
                       downstream_data=str(sentiment_tsv), steps=1, batch_size=2, seq_len=32, eval_size=8,
                       head_fit_size=8, registry=registry)
    assert "\n" not in str(error.value)
    other = tmp_path / "other-text.txt"
    other.write_text("Rivers carry sediment to the sea. Deltas form where the current slows down.\n\n"
                     "Bees collect nectar from flowers and store honey in wax cells.\n")
    report = objreg.analyze(["mlm"], "classification", model=str(tiny_bert), corpus=str(other),
                            downstream_data=str(sentiment_tsv), steps=1, batch_size=2, seq_len=32, eval_size=8,
                            head_fit_size=8, registry=registry)
    assert len(report.steps) == 1
