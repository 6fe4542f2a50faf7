"""Text shared between rows: the n-gram overlap test of contamination studies, on any sequences of
tokens (ids, or words).

A row is *contained* in a body of sentences when at least half of its ``WINDOW``-token windows
occur inside one sentence (GPT-3's contamination check used 13-grams of words); a row shorter
than ``WINDOW`` tokens when it occurs whole inside a sentence; rows under ``SHORTEST`` tokens
("a masterpiece .") are too common to tell reuse from chance and are never counted. Two rows
*share text* when they have a window in common (or are the same short row).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

WINDOW = 8
SHORTEST = 4


def windows(tokens: Sequence[Hashable], size: int) -> Iterable[tuple[Hashable, ...]]:
    """Every run of ``size`` consecutive tokens."""
    return (tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1))


def _keys(row: Sequence[Hashable]) -> set[tuple[Hashable, ...]]:
    if len(row) >= WINDOW:
        return set(windows(row, WINDOW))
    return {tuple(row)} if len(row) >= SHORTEST else set()


def contained_rows(rows: Sequence[Sequence[Hashable]], sentences: Iterable[Sequence[Hashable]]) -> list[int]:
    """Indices of ``rows`` that the ``sentences`` contain (module docstring)."""
    keys_of = [_keys(r) for r in rows]
    wanted = set().union(*keys_of) if keys_of else set()
    sizes = sorted({len(k) for k in wanted})
    found: set[tuple[Hashable, ...]] = set()
    for sentence in sentences:
        for size in sizes:
            found.update(w for w in windows(sentence, size) if w in wanted)
    return [i for i, keys in enumerate(keys_of) if keys and 2 * len(keys & found) >= len(keys)]


def text_groups(rows: Sequence[Sequence[Hashable]]) -> list[int]:
    """A group id per row: rows that share text (module docstring) are in one group,
    transitively; ids count from 0 in order of first appearance."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_row: dict[tuple[Hashable, ...], int] = {}
    for i, row in enumerate(rows):
        for key in _keys(row):
            parent[root(i)] = root(first_row.setdefault(key, i))
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) for i in range(len(rows))]
