"""Rows are what the model's own tokenizer gives for the running text: a byte-level BPE (GPT-2,
RoBERTa, Llama 3 styles) keeps the space before a sentence's first word in that word's token, so
objreg's rows, cut from the encoding of the whole document, equal ``tokenizer.encode(text)``;
sentence boundaries stay as metadata. WordPiece and Metaspace rows are what they were, sentence by
sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli
from objreg.toolkit import hf_directory
from objreg.toolkit.tokenizer import TokenizedCorpus, split_sentences

transformers = pytest.importorskip("transformers")

DOCUMENT = ("The committee met on Tuesday. Unlike last year, it approved the budget! Members argued about the "
            "roof? 1990 was a dry year. \"Quotes\" start this one.")
STYLES = ("gpt2", "roberta", "llama3")
#: The model family each tokenizer style comes with.
FAMILY = {"gpt2": "gpt2", "roberta": None, "llama3": "llama"}


@pytest.fixture(scope="module", params=STYLES)
def bpe_dir(request, tmp_path_factory, tiny_model, tokenizer_trainers) -> tuple[str, str]:
    """``(style, directory)``: a model directory whose tokenizer.json is a byte-level BPE of that
    style (a tiny GPT-2 or Llama built from a config; RoBERTa's directory holds its config only)."""
    style = request.param
    directory = tmp_path_factory.mktemp(style)
    size = tokenizer_trainers[style](directory)
    if FAMILY[style] is None:
        (directory / "config.json").write_text(json.dumps({"model_type": "roberta", "vocab_size": size}))
    else:
        tiny_model(directory, FAMILY[style], size)
    return style, str(directory)


def own_ids(tokenizer: objreg.Tokenizer, text: str) -> list[int]:
    return tokenizer.backend.encode(text, add_special_tokens=False).ids


def test_rows_equal_the_tokenizers_own_encoding_of_the_text(bpe_dir):
    style, directory = bpe_dir
    tokenizer = hf_directory.load_tokenizer(directory)
    sentences = split_sentences(DOCUMENT)
    assert len(sentences) == 5
    encoding = tokenizer.backend.encode(DOCUMENT, add_special_tokens=False)
    batch = tokenizer.batch_from_texts([DOCUMENT])
    n = int((~batch.is_padding[0]).sum())
    v = tokenizer.vocab
    assert batch.input_ids[0, :n].tolist() == [v.cls_id, *encoding.ids, v.sep_id]
    # Sentence by sentence the tokens would differ: the first word of each later sentence loses its space.
    alone = [i for sentence in sentences for i in own_ids(tokenizer, sentence)]
    assert alone != encoding.ids
    # Word ids are the pre-tokeniser's words of the running text; sentence ids mark each sentence's tokens.
    assert batch.word_ids[0, 1 : n - 1].tolist() == encoding.word_ids
    sentence_ids = batch.sentence_ids[0, 1 : n - 1].tolist()
    assert sentence_ids == sorted(sentence_ids) and set(sentence_ids) == set(range(len(sentences)))
    for k, sentence in enumerate(sentences):
        ids = [i for i, s in zip(encoding.ids, sentence_ids) if s == k]
        assert tokenizer.decode(ids).strip() == sentence


@pytest.mark.parametrize("seq_len", [12, 24, 200])
def test_pre_training_chunks_are_cut_from_the_documents_encoding(bpe_dir, seq_len):
    _, directory = bpe_dir
    tokenizer = hf_directory.load_tokenizer(directory)
    other = "Bees collect nectar. They store honey in wax cells."
    corpus = objreg.Corpus("two documents", (tuple(split_sentences(DOCUMENT)), tuple(split_sentences(other))))
    tokenized = TokenizedCorpus(tokenizer, corpus, seq_len)
    for document, text in enumerate((DOCUMENT, other)):
        chunks = [c for c in tokenized.chunks if c.document == document]
        if seq_len == 200:
            assert len(chunks) == 1
        ids = [i for chunk in chunks for sentence, _ in chunk.sentences for i in sentence]
        assert ids == own_ids(tokenizer, text)
    # A sampled row is [CLS] + a chunk's tokens (cut at seq_len, a sentence longer than a row) + [SEP].
    batch = tokenized.sample(4, torch.Generator().manual_seed(0))
    chunk_ids = {tuple(i for s, _ in c.sentences for i in s)[: seq_len - 2] for c in tokenized.chunks}
    for row, padding in zip(batch.input_ids.tolist(), batch.is_padding.tolist()):
        content = [i for i, pad in zip(row, padding) if not pad][1:-1]
        assert tuple(content) in chunk_ids


def test_corrupt_with_the_models_tokenizer_prints_its_ids(bpe_dir):
    _, directory = bpe_dir
    tokenizer = hf_directory.load_tokenizer(directory)
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    done = CliRunner().invoke(cli, ["corrupt", "clm", "--model", directory, "--text", DOCUMENT, "--json"])
    assert done.exit_code == 0, done.output
    row = json.loads(done.stdout)["rows"][0]
    v = tokenizer.vocab
    assert row["original_ids"] == [v.cls_id, *own_ids(tokenizer, DOCUMENT), v.sep_id]
    assert row["original"] == tokenizer.tokens(row["original_ids"])
    assert row["input"] == tokenizer.tokens(row["input_ids"])


def test_corrupt_refuses_what_the_models_tokenizer_cannot_do(gpt2_bpe_dir):
    cli = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    done = CliRunner().invoke(cli, ["corrupt", "mlm", "--model", gpt2_bpe_dir, "--text", DOCUMENT])
    assert done.exit_code == 1
    assert done.stderr.startswith("Error: mlm needs a mask token") and "add_tokens" in done.stderr


def per_sentence(tokenizer: objreg.Tokenizer, documents: list[tuple[str, ...]]) -> list[tuple[list[int], list[int]]]:
    """The old rows: each sentence encoded on its own."""
    out = []
    for sentence in (s for document in documents for s in document):
        encoding = tokenizer.backend.encode(sentence, add_special_tokens=False)
        out.append((encoding.ids, [-1 if w is None else w for w in encoding.word_ids]))
    return out


@pytest.fixture(scope="module")
def documents() -> list[tuple[str, ...]]:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    paragraphs = [p for p in readme.split("\n\n") if p.strip() and not p.startswith(("```", "|", "#"))]
    return [tuple(split_sentences(p)) for p in paragraphs[:40]] + [("Empty next.", "", "  Spaces around.  ")]


def test_wordpiece_rows_are_those_of_each_sentence_alone(bert_tokenizer_json, tmp_path, documents):
    directory = tmp_path / "bert"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (directory / "tokenizer.json").write_bytes(bert_tokenizer_json.read_bytes())
    for tokenizer in (hf_directory.load_tokenizer(str(directory)), objreg.default_tokenizer()):
        encoded = [s for document in tokenizer.encode_documents(documents) for s in document]
        assert encoded == per_sentence(tokenizer, documents)
        assert encoded[-2] == ([], [])  # the empty sentence


def test_metaspace_rows_are_those_of_each_sentence_alone(tmp_path, documents, tokenizer_trainers):
    tokenizer_trainers["unigram"](tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    tokenizer = hf_directory.load_tokenizer(str(tmp_path))
    encoded = [s for document in tokenizer.encode_documents(documents) for s in document]
    # Every corpus splits its text with split_sentences, which strips each sentence: here that is
    # the one difference (Metaspace would make tokens of the spaces around a sentence).
    stripped = [tuple(s.strip() for s in document) for document in documents]
    assert encoded == per_sentence(tokenizer, stripped)
    assert sum(len(ids) for ids, _ in encoded) > 500


def test_token_classification_rows_are_the_encoding_of_the_sentence(bpe_dir, tmp_path):
    _, directory = bpe_dir
    tokenizer = hf_directory.load_tokenizer(directory)
    words = ["Unlike", "last", "year", ",", "Warsaw", "approved", "the", "budget", "."]
    data = tmp_path / "tags.jsonl"
    data.write_text(json.dumps({"tokens": words, "tags": ["O", "O", "O", "O", "LOC", "O", "O", "O", "O"]}) + "\n")
    task = objreg.Registry.load(load_entrypoints=False).get_task("token_classification")
    batch = task.task_data(str(data), [], tokenizer, 64, 8).batch
    n = int((~batch.is_padding[0]).sum())
    assert batch.input_ids[0, 1 : n - 1].tolist() == own_ids(tokenizer, " ".join(words))
    # Each word's tag sits on its first token (the one holding its space), the rest ignored.
    firsts, at = [], 1
    for ids, _ in tokenizer.encode_documents([words])[0]:
        firsts.append(at)
        at += len(ids)
    labels = batch.labels[0].tolist()
    tagged = [i for i, label in enumerate(labels) if label != objreg.IGNORE_INDEX]
    assert tagged == firsts
    assert [labels[i] for i in firsts].count(labels[firsts[4]]) == 1  # Warsaw, the one LOC


def test_token_classification_wordpiece_rows_are_those_of_each_word_alone(bert_tokenizer_json, tmp_path):
    directory = tmp_path / "bert"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (directory / "tokenizer.json").write_bytes(bert_tokenizer_json.read_bytes())
    tokenizer = hf_directory.load_tokenizer(str(directory))
    words = ["Unlike", "last", "year", ",", "Warsaw's", "council", "approved", "the", "budget", "."]
    data = tmp_path / "tags.jsonl"
    data.write_text(json.dumps({"tokens": words, "tags": ["O"] * len(words)}) + "\n")
    task = objreg.Registry.load(load_entrypoints=False).get_task("token_classification")
    batch = task.task_data(str(data), [], tokenizer, 64, 8).batch
    n = int((~batch.is_padding[0]).sum())
    assert batch.input_ids[0, 1 : n - 1].tolist() == [i for w in words for i in own_ids(tokenizer, w)]
