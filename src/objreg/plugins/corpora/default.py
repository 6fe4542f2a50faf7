"""The built-in default corpus and tokenizer: no downloads, ever.

The corpus is the prose of Python's own standard library: its docstrings and its comment blocks,
read from the source files with :mod:`ast` (nothing is imported, so no module runs). It is
English technical prose present wherever Python is, and the same for a given interpreter.
Docstrings alone give only about 12,000 clean sentences; the comments (why-explanations written
as prose) bring it to about 15,000-16,000 on Python 3.10-3.13.

Code, markup and argument lists are filtered out line by line, then sentences are kept only
when they look like prose (5-60 words, capital or digit first, closing punctuation, no code).
The corpus is built once (seconds) and cached as JSON; the WordPiece tokenizer trained on it is
cached beside it, keyed by the corpus content.

About 340 lines, one module: a plugin module loads no other plugin module (the import floors of
docs/architecture.md), and the extraction rules, the caches and the two providers belong together.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import json
import os
import re
import sys
import sysconfig
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import objreg
from objreg.toolkit.atomic import atomic_path, remove_stale_temporaries
from objreg.toolkit.wordpiece import train_wordpiece, wordpiece_from_vocab, wordpiece_tokenizer

NAME = "default"
#: Bump when the extraction rules change, so old caches are rebuilt rather than reused.
CORPUS_FORMAT = 1
#: 2: trained by objreg's own reproducible WordPiece trainer (toolkit.wordpiece).
TOKENIZER_FORMAT = 2
VOCAB_SIZE = 8000
#: The default tokenizer's vocabulary, trained once on the default corpus and shipped (see
#: load_tokenizer for why it is not retrained).
SHIPPED_VOCAB = Path(__file__).with_name("default_vocab.txt")

#: Directories of the standard library that hold tests, tools, data or generated code, not prose.
SKIP_DIRS = frozenset({
    "test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages",
    "ensurepip", "pydoc_data", "encodings", "__pycache__", "__phello__", "lib-dynload",
})
#: Single files that are data or jokes rather than documentation.
SKIP_FILES = frozenset({"this.py", "antigravity.py", "__hello__.py"})

MIN_WORDS, MAX_WORDS = 5, 60

# Lines that are not prose: doctest prompts, reST directives (``.. note::``), field lists
# (``:param x:``), underlines of section titles, and parameter lists (``name -- text``,
# ``name: text``, ``name (type): text``).
_DOCTEST = re.compile(r"^(>>>|\.\.\.)")
_DIRECTIVE = re.compile(r"^\.\.\s")
_FIELD = re.compile(r"^:[^:\s][^:]*:")
_UNDERLINE = re.compile(r"^([-=~^*+#_'`\"])\1{2,}\s*$")
_PARAM = re.compile(r"^\**[\w.\[\]]+(\s*\([^)]*\))?\s*(--|:)\s")
# A section title of a Google/NumPy-style docstring ("Args:", "Returns", "Example::") starts a list.
_SECTION = re.compile(
    r"^(args|arguments|parameters|params|keyword arguments|kwargs|returns?|yields?|raises?|"
    r"attributes|examples?|usage|methods|variables)\s*:{0,2}\s*$",
    re.IGNORECASE,
)
_SENTENCE_START = re.compile(r"^[A-Z0-9]")
_LETTER = re.compile(r"[A-Za-z]")
# Code inside a sentence: doctest prompts, assignments and comparisons, braces, escapes, e-mail
# addresses and decorators. Names such as os.path.join() are kept: they are part of the prose.
_CODE = re.compile(r">>>|=|[{}\\$@]|->")
_COMMENT_MARK = re.compile(r"^#+:?")


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
    identical on every machine. On any other corpus it is trained on that corpus by objreg's own
    reproducible trainer (:func:`objreg.toolkit.wordpiece.train_wordpiece`: the same corpus gives
    the same tokenizer on any machine, with or without a cache) and cached by content.
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


# -- building the corpus --------------------------------------------------------------------------


def build_corpus(stdlib: Path | None = None) -> objreg.Corpus:
    """Read the standard library at ``stdlib`` (this interpreter's by default) and keep the prose
    sentences of its docstrings and comment blocks; one document per docstring or comment block,
    in file and source order. Deterministic for a given tree."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    documents = []
    with _gc_paused():
        for source in _source_files(root):
            for text in _source_texts(source):
                # Repeated boilerplate ("Return self.", licence headers) would otherwise dominate.
                sentences = tuple(s for s in prose_sentences(text) if not (s in seen or seen.add(s)))
                if sentences:
                    documents.append(sentences)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not documents:
        raise objreg.DataError(
            f"default corpus is empty: no docstrings found under {root}; it needs the Python {version} "
            f"standard-library sources (.py files). Use --corpus PATH to train on a text or JSONL file instead"
        )
    n_sentences = sum(len(d) for d in documents)
    description = (
        f"Python {version} standard-library docstrings and comments: {len(documents)} documents, "
        f"{n_sentences} sentences"
    )
    return objreg.Corpus(name=NAME, documents=tuple(documents), description=description)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing hundreds of files allocates millions of AST
    nodes, which sets it off again and again (it doubles the build time) and frees nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _source_files(root: Path) -> Iterator[Path]:
    """The ``.py`` files under ``root`` in sorted order, outside the skipped directories."""
    for dirpath, dirnames, filenames in os.walk(root):
        # Sorting in place fixes the walk order, so the corpus is the same on every file system.
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
        for filename in sorted(filenames):
            if filename.endswith(".py") and filename not in SKIP_FILES and not filename.startswith("test_"):
                yield Path(dirpath) / filename


def _skip_dir(name: str) -> bool:
    return name in SKIP_DIRS or name.startswith((".", "config-"))


def _source_texts(source: Path) -> list[str]:
    """Docstrings (module, class, function) and comment blocks of one file, in source order.

    Read with :mod:`ast`, never imported. A file that does not parse is skipped: the corpus is
    what the interpreter ships, not something the user could fix.
    """
    try:
        code = source.read_bytes()
        tree = ast.parse(code, filename=str(source))
        lines = code.decode("utf-8").splitlines()
    except (OSError, SyntaxError, ValueError):
        return []
    found = []
    in_string: set[int] = set()
    # One walk does both jobs: walking the tree costs as much as parsing it.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                found.append((node.body[0].lineno, docstring))
        elif isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno and node.end_lineno > node.lineno:
            # Lines inside a multi-line string may start with "#" too; they are string content.
            in_string.update(range(node.lineno + 1, node.end_lineno + 1))
    found.extend(_comment_blocks(lines, in_string))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def _comment_blocks(lines: list[str], in_string: set[int]) -> list[tuple[int, str]]:
    """Runs of whole-line ``#`` comments as ``(first line number, dedented text)``."""
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    for number, line in enumerate([*lines, ""], start=1):
        stripped = line.lstrip()
        if stripped.startswith("#") and number not in in_string:
            # "#:" marks an attribute doc comment; the marker is not text.
            current.append(_COMMENT_MARK.sub("", stripped))
        elif current:
            blocks.append((number - len(current), textwrap.dedent("\n".join(current))))
            current = []
    return blocks


def prose_sentences(text: str) -> list[str]:
    """The prose sentences of a docstring or comment: code, markup and parameter lists removed."""
    sentences = []
    for paragraph in _prose_paragraphs(text):
        sentences.extend(s for s in objreg.split_sentences(paragraph) if _is_prose_sentence(s))
    return sentences


def _prose_paragraphs(text: str) -> Iterator[str]:
    """Runs of prose lines; every dropped line ends a paragraph, so text on either side of a
    code block is never glued into one sentence."""
    paragraph: list[str] = []
    in_section = False
    for line in text.splitlines():
        stripped = line.strip()
        if _SECTION.match(stripped):
            # Everything up to the next blank line belongs to an argument/return list.
            in_section = True
        if not stripped:
            in_section = False
        if in_section or not _is_prose_line(line):
            if paragraph:
                yield " ".join(paragraph)
            paragraph = []
            continue
        paragraph.append(stripped)
    if paragraph:
        yield " ".join(paragraph)


def _is_prose_line(line: str) -> bool:
    # cleandoc removed the common indent, so an indented line is a code block or a list body.
    if not line.strip() or line[:1].isspace():
        return False
    text = line.strip()
    if _DOCTEST.match(text) or _DIRECTIVE.match(text) or _FIELD.match(text) or _UNDERLINE.match(text):
        return False
    if _PARAM.match(text):
        return False
    letters = len(_LETTER.findall(text))
    return letters >= 0.6 * len(text.replace(" ", ""))


def _is_prose_sentence(sentence: str) -> bool:
    words = sentence.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return False
    if not _SENTENCE_START.match(sentence) or sentence[-1] not in ".!?":
        return False
    if _CODE.search(sentence):
        return False
    letters = len(_LETTER.findall(sentence))
    return letters >= 0.75 * len(sentence.replace(" ", ""))


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Temporary files of a write killed an hour ago or more: no write takes that long.
        remove_stale_temporaries(path.parent, older_than=3600)
        with atomic_path(path) as tmp:
            write(tmp)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for I/O errors
        warnings.warn(f"objreg: could not write cache file {path}: {e}", RuntimeWarning, stacklevel=2)
