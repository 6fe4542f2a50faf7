"""Character noise on text before tokenising (an augmentation of the data, not of a batch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from objreg.core.errors import InvalidParameterError
from objreg.core.types import Corpus

CHAR_OPERATIONS = ("insert", "delete", "substitute")


def char_noise(
    texts: Sequence[str],
    rate: float,
    generator: torch.Generator,
    alphabet: str | None = None,
    operations: Sequence[str] = CHAR_OPERATIONS,
) -> list[str]:
    """Character-level noise before tokenising: each non-whitespace character is hit with
    probability ``rate`` by one of ``operations`` (equally likely): ``delete`` it, ``substitute``
    a random character for it, or ``insert`` a random character after it. Whitespace is never
    touched, so word boundaries stay (a word can vanish when every character is deleted).

    Random characters come from ``alphabet`` (default: the non-whitespace characters of ``texts``,
    so the noise stays in the script of the text). Vectorised per text; deterministic for a
    generator state.
    """
    if not 0 <= rate <= 1:
        raise InvalidParameterError(f"char_noise: rate must lie in [0, 1], got {rate}")
    unknown = set(operations) - set(CHAR_OPERATIONS)
    if unknown or not operations:
        raise InvalidParameterError(f"char_noise: operations must be a non-empty subset of {CHAR_OPERATIONS}")
    if isinstance(texts, str):
        raise InvalidParameterError("char_noise takes a list of texts, not a single string")
    chars = alphabet if alphabet is not None else "".join(sorted({c for t in texts for c in t if not c.isspace()}))
    if rate == 0 or not chars:
        return list(texts)
    table = _code_points(chars)
    wanted = torch.tensor([op in operations for op in CHAR_OPERATIONS])
    choices = torch.nonzero(wanted).flatten()  # indices into CHAR_OPERATIONS
    out = []
    for text in texts:
        codes = _code_points(text)  # (N,)
        N = len(codes)
        spaces = torch.isin(codes, _code_points("".join({c for c in text if c.isspace()}) or " "))
        hit = (torch.rand(N, generator=generator) < rate) & ~spaces
        op = choices[torch.randint(len(choices), (N,), generator=generator)]  # 0 insert, 1 delete, 2 substitute
        randoms = table[torch.randint(len(table), (N, 2), generator=generator)]  # (N, 2)
        first = torch.where(hit & (op == 2), randoms[:, 0], codes)
        emitted = torch.stack([first, randoms[:, 1]], dim=1)  # (N, 2): the character, then an insertion
        keep = torch.stack([~(hit & (op == 1)), hit & (op == 0)], dim=1)
        out.append(_from_code_points(emitted[keep]))
    return out


def noisy_corpus(corpus: Corpus, rate: float, generator: torch.Generator, alphabet: str | None = None) -> Corpus:
    """``corpus`` with :func:`char_noise` applied to every sentence (a static augmentation: apply it
    before ``TokenizedCorpus``)."""
    sentences = [s for document in corpus.documents for s in document]
    noisy = iter(char_noise(sentences, rate, generator, alphabet))
    documents = tuple(tuple(next(noisy) for _ in document) for document in corpus.documents)
    return Corpus(corpus.name, documents, f"{corpus.description} (character noise {rate:g})".strip())


def _code_points(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()


def _from_code_points(codes: torch.Tensor) -> str:
    return "".join(map(chr, codes.tolist()))


