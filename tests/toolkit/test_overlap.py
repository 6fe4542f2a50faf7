"""Text shared between rows: the containment test and the groups against brute-force loops."""

from __future__ import annotations

import pytest
import torch

from objreg.toolkit.overlap import SHORTEST, WINDOW, contained_rows, text_groups


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
    assert contained_rows(rows, sentences) == brute_force(rows, sentences)


def test_a_copied_row_is_seen_and_a_fresh_one_is_not():
    row = list(range(100, 120))
    assert contained_rows([row, list(range(200, 220))], [[1, 2, *row, 3]]) == [0]
    assert contained_rows([row[:SHORTEST - 1]], [row]) == []  # too short to check
    assert contained_rows([row[:WINDOW - 1]], [row]) == [0]  # a short row, whole inside a sentence


def components(rows: list[list[int]]) -> list[set[int]]:
    """Groups by repeated passes: join two rows whenever they share a window or are the same short row."""
    def keys(row):
        if len(row) >= WINDOW:
            return {tuple(row[i:i + WINDOW]) for i in range(len(row) - WINDOW + 1)}
        return {tuple(row)} if len(row) >= SHORTEST else set()

    groups = [{i} for i in range(len(rows))]
    changed = True
    while changed:
        changed = False
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                if groups[a] and groups[b] and any(keys(rows[i]) & keys(rows[j]) for i in groups[a] for j in groups[b]):
                    groups[a] |= groups[b]
                    groups[b] = set()
                    changed = True
    return [g for g in groups if g]


@pytest.mark.parametrize("seed", range(8))
def test_text_groups_are_the_connected_rows(seed):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(5, (int(torch.randint(2, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(14)]
    ids = text_groups(rows)
    found = {}
    for row, group in enumerate(ids):
        found.setdefault(group, set()).add(row)
    assert sorted(map(sorted, found.values())) == sorted(map(sorted, components(rows)))
    assert ids[0] == 0 and max(ids) == len(found) - 1
