"""The built-in default corpus and tokenizer: no downloads, ever.

The corpus is the prose of Python's own standard library (:mod:`.stdlib_prose`), built once
(seconds) and cached as JSON; the WordPiece tokenizer trained on it is shipped, and one trained on
any other corpus is cached beside it, keyed by the corpus content.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import objreg
from objreg.toolkit.wordpiece import train_wordpiece, wordpiece_from_vocab, wordpiece_tokenizer

from .stdlib_prose import NAME, build_corpus

#: Bump when the extraction rules (:mod:`.stdlib_prose`) change, so old caches are rebuilt, not reused.
CORPUS_FORMAT = 1
TOKENIZER_FORMAT = 1
VOCAB_SIZE = 8000
#: The default tokenizer's vocabulary, trained once on the default corpus and shipped (see
#: load_tokenizer for why it is not retrained).
SHIPPED_VOCAB = Path(__file__).with_name("default_vocab.txt")


# -- the hooks ------------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_register_corpora(register: Callable[[objreg.Provider], None]) -> None:
    # An exact name wins over path-like names: a file called ``default`` is reached as ``./default``.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    register(objreg.Provider(
        "corpus", NAME, f"prose of the Python {version} standard library's docstrings and comments (built in)",
        load_corpus,
    ))


@objreg.hookimpl
def objreg_register_tokenizers(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "tokenizer", NAME,
        f"lower-cased WordPiece, {VOCAB_SIZE} tokens: shipped for the default corpus, else trained on the corpus "
        f"and cached (for every model without a tokenizer of its own)",
        load_tokenizer, fallback=True,
    ))


def load_corpus(name: str, cache_dir: Path) -> objreg.Corpus:
    """The standard-library docstring corpus."""
    path = Path(cache_dir) / f"default-corpus-py{sys.version_info.major}{sys.version_info.minor}-v{CORPUS_FORMAT}.json"
    corpus = _read_cached_corpus(path)
    if corpus is None:
        corpus = build_corpus()
        payload = {"format": CORPUS_FORMAT, "description": corpus.description, "documents": corpus.documents}
        _write_cache(path, lambda tmp: tmp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8"))
    return corpus


def load_tokenizer(model: str, corpus: objreg.Corpus, cache_dir: Path) -> objreg.Tokenizer:
    """A lower-cased WordPiece tokenizer of ``VOCAB_SIZE`` tokens, for every model that brings no
    tokenizer of its own (a fallback: a model's own tokenizer provider answers first).

    On the default corpus it is the vocabulary shipped with objreg (trained once on this corpus),
    identical on every machine: WordPiece training is not bit-reproducible (tokenizers#1794), so
    training it afresh would make the same seed give different numbers on another machine. On any
    other corpus it is trained on that corpus and cached by content, which keeps it stable on one
    machine.
    """
    if corpus.name == NAME:
        return wordpiece_from_vocab(SHIPPED_VOCAB, f"default WordPiece-{VOCAB_SIZE} (shipped)")
    from tokenizers import Tokenizer as Backend

    name = f"default WordPiece-{VOCAB_SIZE} on corpus {corpus.name!r}"
    path = Path(cache_dir) / f"default-tokenizer-{_tokenizer_key(corpus)[:24]}.json"
    if path.is_file():
        try:
            return wordpiece_tokenizer(Backend.from_file(str(path)), name)
        except Exception:  # noqa: BLE001 - a corrupt or foreign cache file is rebuilt, not an error
            pass
    sentences = [s for doc in corpus.documents for s in doc]
    if not sentences:
        raise objreg.DataError(f"corpus {corpus.name!r} is empty: there is no text to train a tokenizer on")
    tokenizer = train_wordpiece(sentences, vocab_size=VOCAB_SIZE, name=name)
    _write_cache(path, lambda tmp: tokenizer.backend.save(str(tmp)))
    return tokenizer


# -- the caches -----------------------------------------------------------------------------------


def _read_cached_corpus(path: Path) -> objreg.Corpus | None:
    """The cached corpus, or ``None`` when there is none or it is unusable (then it is rebuilt)."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload["format"] != CORPUS_FORMAT:
            return None
        documents = tuple(tuple(doc) for doc in payload["documents"])
        if not documents or not all(doc and all(isinstance(s, str) for s in doc) for doc in documents):
            return None
        return objreg.Corpus(name=NAME, documents=documents, description=str(payload["description"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tokenizer_key(corpus: objreg.Corpus) -> str:
    """sha256 of the corpus text, the vocabulary size and the format: a changed corpus or
    training setup never reuses a stale tokenizer."""
    digest = hashlib.sha256(f"objreg-tokenizer-v{TOKENIZER_FORMAT}-vocab{VOCAB_SIZE}\n".encode())
    for doc in corpus.documents:
        for sentence in doc:
            digest.update(sentence.encode("utf-8"))
            digest.update(b"\x1f")  # unit separator: sentence boundaries are part of the content
        digest.update(b"\x1e")  # record separator: so are document boundaries
    return digest.hexdigest()


def _write_cache(path: Path, write: Callable[[Path], object]) -> None:
    """Write a cache file atomically: a temp file in the same directory, synced, then renamed,
    so a reader never sees a half-written file. The cache is an optimisation: when it cannot
    be written the caller goes on without it (with a warning)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
        write(tmp)
        with open(tmp, "rb+") as f:
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for I/O errors
        warnings.warn(f"objreg: could not write cache file {path}: {e}", RuntimeWarning, stacklevel=2)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
