"""The head-fit set is split from the evaluation set by document: no evaluation text in it."""

from __future__ import annotations

import objreg
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import downstream_sets, split_documents
from objreg.toolkit.cache import cache_dir


def test_evaluation_documents_are_evenly_spaced_and_fit_documents_share_no_sentence():
    documents = [[f"sentence {i}.", f"another {i}."] for i in range(20)]
    documents[7] = ["sentence 0.", "unique."]  # repeats a sentence of evaluation document 0
    evaluation, fit, dropped = split_documents(documents, len, 4)
    assert evaluation == [documents[i] for i in (0, 6, 13, 19)]
    assert dropped == 1 and documents[7] not in fit and len(fit) == 20 - 4 - 1
    seen = {s for doc in evaluation for s in doc}
    assert not any(s in seen for doc in fit for s in doc)


def test_more_evaluation_documents_are_taken_until_they_give_enough_rows():
    documents = [[f"s{i}."] for i in range(40)]
    evaluation, fit, _ = split_documents(documents, lambda docs: len(docs) // 3, 5)  # a row per 3 documents
    assert len(evaluation) == 20 and len(fit) == 20  # 5 → 10 → 20 (at most half)


def test_no_evaluation_question_of_the_default_qa_set_is_in_a_fit_context():
    # With a row split, 23 of the 64 evaluation questions appeared verbatim (answer filled in) in
    # the head-fit contexts: neighbouring cloze questions of a document share context sentences.
    registry = objreg.Registry.load()
    config = AnalysisConfig(pretrain=("mlm",))
    corpus = registry.load_corpus("default", cache_dir())
    tokenizer = registry.load_tokenizer("default", corpus, cache_dir())
    evaluation, fit, _, split = downstream_sets(registry.get_task("qa"), config, corpus.split()[1].documents,
                                                tokenizer, config.head_fit_size)
    assert split["split"] == "documents"
    assert evaluation.batch_size == config.eval_size and fit.batch_size == config.head_fit_size
    vocab = tokenizer.vocab

    def question_and_context(batch, b):
        ids = batch.input_ids[b][~batch.is_padding[b]].tolist()
        first, second = [i for i, t in enumerate(ids) if t == vocab.sep_id][:2]
        start = int(batch.extras["start_positions"][b]) - first - 1
        end = int(batch.extras["end_positions"][b]) - first - 1
        return ids[1:first], ids[first + 1:second], start, end

    contexts = [" ".join(map(str, question_and_context(fit, b)[1])) for b in range(fit.batch_size)]
    for b in range(evaluation.batch_size):
        question, context, start, end = question_and_context(evaluation, b)
        mask = question.index(vocab.mask_id)
        sentence = " ".join(map(str, question[:mask] + context[start:end + 1] + question[mask + 1:]))
        assert not any(f" {sentence} " in f" {c} " for c in contexts), b
