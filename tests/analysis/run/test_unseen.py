"""Evaluation rows inside the pre-training text: the overlap test against a brute-force loop, and
the refusal before any training."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg.analysis.run.unseen import SHORTEST, WINDOW, seen_rows


def contains(sentence: list[int], piece: list[int]) -> bool:
    return any(sentence[i:i + len(piece)] == piece for i in range(len(sentence) - len(piece) + 1))


def brute_force(rows: list[list[int]], sentences: list[list[int]]) -> list[int]:
    """The module's rule, written as plain loops over every window and every sentence."""
    seen = []
    for index, row in enumerate(rows):
        if len(row) < SHORTEST:
            continue
        pieces = [row] if len(row) < WINDOW else [row[i:i + WINDOW] for i in range(len(row) - WINDOW + 1)]
        distinct = {tuple(p) for p in pieces}
        hit = sum(any(contains(s, list(p)) for s in sentences) for p in distinct)
        if 2 * hit >= len(distinct):
            seen.append(index)
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_seen_rows_match_a_brute_force_loop(seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 6 if seed % 2 else 40  # a small vocabulary makes chance overlaps common
    rows = [torch.randint(vocab, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(15)]
    sentences = [torch.randint(vocab, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(10)]
    # Copy parts of some rows into sentences: a whole row, its first half, a third of it.
    for row, share in zip(rows[:3], (1.0, 0.5, 0.34)):
        sentences.append([99, *row[:max(1, round(len(row) * share))], 98])
    assert seen_rows(rows, sentences) == brute_force(rows, sentences)


def test_a_copied_row_is_seen_and_a_fresh_one_is_not():
    row = list(range(100, 120))
    assert seen_rows([row, list(range(200, 220))], [[1, 2, *row, 3]]) == [0]
    assert seen_rows([row[:SHORTEST - 1]], [row]) == []  # too short to check
    assert seen_rows([row[:WINDOW - 1]], [row]) == [0]  # a short row, whole inside a sentence


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
