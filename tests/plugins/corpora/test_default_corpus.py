"""The built-in default corpus (standard-library prose) and the default WordPiece tokenizer."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

import objreg
from objreg.plugins.corpora import default


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    # The same directory the autouse fixture points OBJREG_CACHE_DIR at, so the corpus and the
    # tokenizer are built once per test session, whichever test asks first.
    return tmp_path_factory.getbasetemp() / "objreg-cache"


@pytest.fixture(scope="session")
def default_corpus(session_cache):
    return default.load_corpus("default", session_cache)


@pytest.fixture(scope="session")
def default_tok(default_corpus, session_cache):
    return default.load_tokenizer("default", default_corpus, session_cache)


def _corpus_cache_file(cache):
    return cache / f"default-corpus-py{sys.version_info.major}{sys.version_info.minor}-v1.json"


# -- the corpus -----------------------------------------------------------------------------------


def test_default_corpus_is_large_and_described_honestly(default_corpus):
    assert default_corpus.name == "default"
    assert default_corpus.num_sentences >= 15_000
    version = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    assert version in default_corpus.description
    assert f"{len(default_corpus.documents)} documents" in default_corpus.description
    assert f"{default_corpus.num_sentences} sentences" in default_corpus.description


def test_default_corpus_sentences_are_prose(default_corpus):
    sentences = [s for doc in default_corpus.documents for s in doc]
    assert all(doc for doc in default_corpus.documents)
    assert not [s for s in sentences if ">>>" in s]
    assert not [s for s in sentences if not 5 <= len(s.split()) <= 60]
    assert not [s for s in sentences if not re.match(r"[A-Z0-9]", s) or s[-1] not in ".!?"]
    # Boilerplate is kept once.
    assert len(set(sentences)) == len(sentences)


def test_default_corpus_cache_is_written_and_reloads_equal(default_corpus, session_cache):
    path = _corpus_cache_file(session_cache)
    assert path.is_file()
    assert json.loads(path.read_text(encoding="utf-8"))["format"] == default.CORPUS_FORMAT
    assert not list(session_cache.glob(".*.tmp"))  # no temp file left behind
    assert default.load_corpus("default", session_cache) == default_corpus


def test_default_corpus_build_is_deterministic(default_corpus):
    # A fresh build (no cache) equals the first one, which the session fixture cached.
    assert default.build_corpus() == default_corpus


def test_corrupt_cache_is_rebuilt_not_an_error(tmp_path, monkeypatch):
    small = objreg.Corpus("default", (("One small sentence is here.", "Another one follows it."),), "stub")
    calls = []
    monkeypatch.setattr(default, "build_corpus", lambda: calls.append(1) or small)
    cache = tmp_path
    _corpus_cache_file(cache).write_text('{"format": 1, "documents": [["trunc', encoding="utf-8")
    assert default.load_corpus("default", cache) == small
    assert default.load_corpus("default", cache) == small
    assert len(calls) == 1  # rebuilt once, then read from the repaired cache


def test_cache_dir_is_created(tmp_path, monkeypatch):
    small = objreg.Corpus("default", (("One small sentence is here.",),), "stub")
    monkeypatch.setattr(default, "build_corpus", lambda: small)
    cache = tmp_path / "a" / "b"
    default.load_corpus("default", cache)
    assert _corpus_cache_file(cache).is_file()


def test_other_names_are_not_answered(tmp_path):
    provided = []
    default.objreg_register_corpora(provided.append)
    (corpus,) = provided
    assert corpus.handles("default") and not corpus.handles("wiki") and not corpus.handles("./default")
    assert not list(tmp_path.iterdir())


# -- what counts as prose -------------------------------------------------------------------------


def test_prose_sentences_drop_code_markup_and_argument_lists():
    docstring = textwrap.dedent(
        """\
        Return the parsed configuration of the named section as a mapping.

        The section is read lazily, so a missing file is reported only here.

            parser.read(path)  # an indented code block

        >>> parse("demo") is None
        ... True
        .. versionadded:: 3.2
        :param name: the section to read from the file on disk.
        timeout -- how long to wait for the lock in seconds.
        Short one here.
        Returns a value when the flag x = 1 is set for the section.
        This line has 12 34 56 78 90 12 34 56 78 90 digits.

        Args:
        Every line up to the next blank line belongs to the list.

        A last sentence of plain prose closes the docstring.
        """
    )
    assert default.prose_sentences(docstring) == [
        "Return the parsed configuration of the named section as a mapping.",
        "The section is read lazily, so a missing file is reported only here.",
        "A last sentence of plain prose closes the docstring.",
    ]


def test_source_texts_are_docstrings_and_comments_in_source_order(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        textwrap.dedent(
            '''\
            """The module docstring comes first in the file."""

            # A comment block explains why the next function exists.
            # It spans two lines of the source file.
            def f():
                """The function docstring comes after the comment."""
                template = """
            # This line is inside a string, not a comment.
            """
                return template
            '''
        ),
        encoding="utf-8",
    )
    assert default._source_texts(source) == [
        "The module docstring comes first in the file.",
        "A comment block explains why the next function exists.\nIt spans two lines of the source file.",
        "The function docstring comes after the comment.",
    ]


def test_build_skips_tests_and_tools(tmp_path):
    keep = '"""This module is kept in the corpus because it is library code."""\n'
    skip = '"""This module must never appear in the corpus at all."""\n'
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(keep, encoding="utf-8")
    for folder in ("test", "idlelib", "site-packages", "encodings"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mod.py").write_text(skip, encoding="utf-8")
    (tmp_path / "test_something.py").write_text(skip, encoding="utf-8")
    (tmp_path / "broken.py").write_text("def (:\n", encoding="utf-8")  # skipped, not an error
    corpus = default.build_corpus(tmp_path)
    assert corpus.documents == (("This module is kept in the corpus because it is library code.",),)


def test_build_of_a_tree_without_prose_is_a_data_error(tmp_path):
    (tmp_path / "mod.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(objreg.DataError, match="default corpus is empty"):
        default.build_corpus(tmp_path)


# -- the tokenizer --------------------------------------------------------------------------------


def test_default_tokenizer_vocabulary(default_tok):
    vocab = default_tok.vocab
    assert 7_500 <= vocab.size <= 8_000
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 1, 2, 3, 4)


def test_default_tokenizer_round_trips_lower_case_text(default_tok):
    sentence = "the parser reads the configuration file and returns a list of sections."
    ids, _ = default_tok.encode_sentences([sentence])[0]
    assert default_tok.vocab.unk_id not in ids
    assert default_tok.decode(ids) == sentence


def test_default_corpus_uses_the_shipped_vocabulary(default_tok, default_corpus, tmp_path):
    # Shipped, not trained: WordPiece training is not reproducible (tokenizers#1794), and the
    # default tokenizer must be the same on every machine.
    shipped = default.SHIPPED_VOCAB.read_text(encoding="utf-8").splitlines()
    assert len(shipped) == default.VOCAB_SIZE == default_tok.vocab.size
    assert shipped[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    again = default.load_tokenizer("default", default_corpus, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing trained, nothing cached
    sentences = list(default_corpus.documents[0]) + ["An unusual Zyzzyva word appears here."]
    assert again.encode_sentences(sentences) == default_tok.encode_sentences(sentences)
    assert [default_tok.tokens([i])[0] for i in range(50)] == shipped[:50]


def test_cached_tokenizer_gives_identical_ids(tmp_path, texts):
    corpus = objreg.Corpus("mine", tuple(tuple(objreg.split_sentences(t)) for t in texts * 5))
    first = default.load_tokenizer("default", corpus, tmp_path)
    assert list(tmp_path.glob("default-tokenizer-*.json"))
    again = default.load_tokenizer("default", corpus, tmp_path)
    sentences = list(texts) + ["An unusual Zyzzyva word appears here."]
    assert again.encode_sentences(sentences) == first.encode_sentences(sentences)
    assert again.vocab == first.vocab


def test_tokenizer_cache_is_keyed_by_corpus_content(tmp_path, texts):
    first = objreg.Corpus("a", tuple((t,) for t in texts))
    second = objreg.Corpus("a", tuple((t,) for t in texts[:-1]))
    default.load_tokenizer("default", first, tmp_path)
    default.load_tokenizer("default", second, tmp_path)
    assert len(list(tmp_path.glob("default-tokenizer-*.json"))) == 2


def test_corrupt_tokenizer_cache_is_rebuilt(tmp_path, texts):
    corpus = objreg.Corpus("a", tuple((t,) for t in texts))
    default.load_tokenizer("default", corpus, tmp_path)
    (path,) = tmp_path.glob("default-tokenizer-*.json")
    path.write_text("{ not a tokenizer", encoding="utf-8")
    rebuilt = default.load_tokenizer("default", corpus, tmp_path)
    # Not compared with the first training: tokenizers' WordPiece training breaks ties in hash
    # order (huggingface/tokenizers#1794), so a retrained vocabulary may differ slightly.
    assert rebuilt.vocab.mask_id == 4
    reloaded = default.load_tokenizer("default", corpus, tmp_path)
    assert reloaded.encode_sentences(texts) == rebuilt.encode_sentences(texts)


class OwnTokenizer:
    """A model plugin that brings its own tokenizer for the model "custom"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @objreg.hookimpl
    def objreg_register_tokenizers(self, register):
        register(objreg.Provider("tokenizer", "custom", "its own", lambda model, corpus, cache_dir: self.tokenizer))


def test_default_tokenizer_is_the_fallback_for_models_without_their_own(tmp_path, tokenizer, default_corpus):
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(OwnTokenizer(tokenizer), name="own-tokenizer")
    registry = objreg.Registry(pm)
    assert registry.load_tokenizer("custom", default_corpus, tmp_path) is tokenizer
    fallback = registry.load_tokenizer("bert-base", default_corpus, tmp_path)
    assert fallback.vocab.size == default.VOCAB_SIZE


def test_tokenized_default_corpus_has_sentence_pairs(default_tok, default_corpus):
    tokenized = objreg.TokenizedCorpus(default_tok, default_corpus, 128)
    assert len(tokenized) > 2_000
    # SOP needs two sentences of one document in a window.
    assert len(tokenized.eligible(2)) > 500


# -- through the registry -------------------------------------------------------------------------


def test_providers():
    provided = []
    default.objreg_register_corpora(provided.append)
    default.objreg_register_tokenizers(provided.append)
    assert {(p.kind, p.name, p.fallback) for p in provided} == {("corpus", "default", False), ("tokenizer", "default", True)}


def test_registry_loads_the_default_corpus(default_corpus, session_cache):
    registry = objreg.Registry.load(load_entrypoints=False)
    assert registry.load_corpus("default", session_cache) == default_corpus
    with pytest.raises(objreg.UnknownNameError, match="default"):
        registry.load_corpus("nosuch", session_cache)


def test_builtin_name_wins_over_a_folder_called_default(default_corpus, session_cache, tmp_path, monkeypatch):
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "a.txt").write_text("A file that shadows the built-in name.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    registry = objreg.Registry.load(load_entrypoints=False)
    assert registry.load_corpus("default", session_cache) == default_corpus
    assert registry.load_corpus("./default", session_cache).num_sentences == 1
