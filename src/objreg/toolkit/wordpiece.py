"""objreg's own WordPiece tokenizers: the special-token layout (the BERT five, span sentinels,
named markers), training one on a corpus, and loading one from a ``vocab.txt``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from objreg.toolkit.tokenizer import Tokenizer

#: Special tokens of tokenizers objreg trains itself, in id order: the BERT five first, then span
#: sentinels (T5, UL2, BART infilling) and named markers (UL2 modes, FIM, end of text).
BASE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


SENTINELS = tuple(f"[S{i}]" for i in range(64))


NAMED_SPECIALS = ("[EOS]", "[NLU]", "[NLG]", "[S2S]", "[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]", "[FIM_PAD]")


def wordpiece_tokenizer(backend: object, name: str) -> Tokenizer:
    """Wrap a backend built with the default special-token layout."""
    return Tokenizer(
        backend, pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
        sentinels=SENTINELS, named=NAMED_SPECIALS, name=name,
    )


def _bert_style_backend(model: object) -> object:
    """A lower-casing BERT pipeline (normaliser, pre-tokeniser, decoder) around a WordPiece model."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, normalizers, pre_tokenizers

    backend = Backend(model)
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return backend


def train_wordpiece(texts: Sequence[str], vocab_size: int = 8000, name: str = "wordpiece") -> Tokenizer:
    """Train a lower-cased BERT-style WordPiece tokenizer on ``texts``. Special tokens get the
    first ids, in the order of ``BASE_SPECIALS + SENTINELS + NAMED_SPECIALS``.

    Not bit-reproducible: two trainings on the same texts can break frequency ties differently
    (tokenizers#1794). Save the result (``tokenizer.backend.save``) and reuse the file where runs
    must repeat; the built-in default tokenizer ships its vocabulary for that reason.
    """
    from tokenizers import models, trainers

    backend = _bert_style_backend(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[*BASE_SPECIALS, *SENTINELS, *NAMED_SPECIALS],
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer=trainer)  # type: ignore[attr-defined]
    return wordpiece_tokenizer(backend, name)


def wordpiece_from_vocab(path: str | Path, name: str) -> Tokenizer:
    """The BERT-style WordPiece tokenizer for a ``vocab.txt`` file (one token per line, id = line
    number) with objreg's special-token layout."""
    from tokenizers import models

    vocab = {token: i for i, token in enumerate(Path(path).read_text(encoding="utf-8").splitlines())}
    model = models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    return wordpiece_tokenizer(_bert_style_backend(model), name)


