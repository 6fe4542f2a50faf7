"""objreg's own WordPiece trainer: reproducible, and the algorithm of ``tokenizers``' trainer."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from objreg.toolkit.wordpiece import SPECIALS, count_words, train_wordpiece, train_wordpiece_vocab

TEXTS = [
    "The committee met on Tuesday. It approved the budget for the new library.",
    "Rivers carry sediment to the sea. Deltas form where the current slows.",
    "A compiler translates source code into machine code. Optimisers remove redundant instructions.",
    "Bees collect nectar from flowers. They store honey in wax cells. The queen lays the eggs.",
]


def test_specials_come_first_in_layout_order():
    vocab = train_wordpiece_vocab(count_words(TEXTS * 5), 300)
    assert vocab[: len(SPECIALS)] == list(SPECIALS)
    assert len(vocab) == len(set(vocab))


def test_the_order_of_the_texts_does_not_matter():
    words = count_words(TEXTS * 7)
    shuffled = list(words.items())
    random.Random(3).shuffle(shuffled)
    assert train_wordpiece_vocab(dict(shuffled), 250) == train_wordpiece_vocab(words, 250)


def test_ties_go_to_the_pair_of_lowest_ids():
    # "ab" and "cd" occur equally often: the pair of lower ids (a, ##b) is merged first.
    vocab = train_wordpiece_vocab(Counter({"ab": 3, "cd": 3}), len(SPECIALS) + 7, specials=SPECIALS)
    merged = vocab[len(SPECIALS) + 6:]
    assert merged == ["ab"]


def test_merges_stop_below_the_minimum_frequency():
    vocab = train_wordpiece_vocab(Counter({"xy": 1}), 1000)
    assert "xy" not in vocab and "x" in vocab and "##y" in vocab


def test_continuation_pieces_join_without_their_prefix():
    vocab = train_wordpiece_vocab(Counter({"abc": 10}), 1000)
    assert {"ab", "abc"} <= set(vocab) or {"##bc", "abc"} <= set(vocab)
    assert all(not token.startswith("##") or "##" not in token[2:] for token in vocab)


def test_counting_matches_the_pipeline_sentence_by_sentence():
    from tokenizers import normalizers, pre_tokenizers

    texts = [*TEXTS, "Héllo\u00a0wörld, 北京 is\u2028a test\x1cof\x85things…!", "ﬁne İstanbul"]
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    expected = Counter(w for t in texts for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(t)))
    assert count_words(texts) == expected


def test_the_tokenizer_reads_literal_special_tokens():
    tokenizer = train_wordpiece(TEXTS * 10, vocab_size=300)
    ids, _ = tokenizer.encode_with_offsets("the [MASK] met")
    assert tokenizer.vocab.mask_id in ids


def test_the_same_in_another_process():
    code = (
        "from objreg.toolkit.wordpiece import train_wordpiece; import json, sys; "
        f"t = train_wordpiece({TEXTS!r} * 10, vocab_size=300); "
        "print(json.dumps(sorted(t.backend.get_vocab().items(), key=lambda kv: kv[1])))"
    )
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
               for _ in range(2)}
    assert len(outputs) == 1


@pytest.mark.parametrize("vocab_size", [77, 120, 200])
def test_merges_stop_at_the_size_asked(vocab_size):
    words = count_words(TEXTS * 3)
    # Like tokenizers' trainer, every character is kept, even past the size asked.
    base = len(SPECIALS) + len({c for w in words for c in w}) + len({c for w in words for c in w[1:]})
    vocab = train_wordpiece_vocab(words, vocab_size)
    assert len(vocab) == max(vocab_size, base)
