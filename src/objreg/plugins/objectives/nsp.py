"""Next-sentence prediction (BERT): is segment B the text that follows segment A, or text from
another document?

Each row ``[CLS] s_0 … s_{n-1} [SEP]`` is split at a sentence boundary chosen uniformly into
``A = s_0 … s_{k-1}`` and its true continuation ``B = s_k … s_{n-1}``, and becomes
``[CLS] A [SEP] B [SEP]``. With probability ``random_next_prob`` (BERT: 0.5) B is replaced by the
B segment of another row of the batch whose *document differs*, drawn uniformly among those rows.
Labels follow google-research/bert: ``next_sentence_label`` 1 = random next (B from another
document), 0 = actual next. A random B longer than the row's width is cut at the end (BERT's
``truncate_seq_pair`` trims too), so it always starts at a sentence boundary of its document.

What it avoids: google-research/bert draws the random document from the whole corpus and, after
10 failed tries, accepts the *same* document, labelling a true continuation "random". Here a
negative never comes from its own document. A batch that holds a single document (e.g. one text)
has no valid negative at all: that is a :class:`objreg.DataError`, not a silent all-positive
batch (which would train the classifier on one label only). With ``random_next_prob=0`` no
negative is needed and one document is fine.

The pair is one sequence to the model: the attention is bidirectional over all of it (both
segments carry the row's own document id; ``next_document`` in ``extras`` records where B came
from). The extra ``[SEP]`` makes rows one token longer: the output has width ``T + 1``. The split
and the layout are :mod:`objreg.toolkit.segments`, shared with ``sop`` and ``contrastive``.

Written exactly like a third-party plugin: it imports only ``objreg``, its toolkit and ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import objreg
from objreg.toolkit import losses, segments


@objreg.hookimpl
def objreg_objective_info() -> objreg.ObjectiveInfo:
    return objreg.ObjectiveInfo(
        name="nsp",
        description="Next-sentence prediction (BERT): is segment B the continuation, or from another document?",
        kind="pretrain",
        attention="bidirectional",
        heads=(objreg.HeadSpec("next_sentence", "classifier", 2),),
        params=(
            objreg.Param(
                "random_next_prob", 0.5, "Probability that segment B comes from another document of the batch "
                "(label 1, BERT's 'random next'); otherwise B is the true continuation (label 0).", float, 0.0, 1.0,
            ),
        ),
        references=(
            "Devlin et al. 2019, BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
            "google-research/bert create_pretraining_data.py create_instances_from_document (random next with "
            "probability 0.5, next_sentence_label = 1 if random else 0)",
        ),
        min_seq_len=4,
        min_sentences=2,
    )


@objreg.hookimpl
def objreg_corrupt(
    batch: objreg.TokenBatch, generator: torch.Generator, params: Mapping[str, Any], vocab: objreg.Vocabulary
) -> objreg.CorruptedBatch:
    ids = batch.input_ids
    B, T = ids.shape
    a, b = segments.split_pair(batch, vocab, generator, "nsp")
    random_next = objreg.uniform((B,), generator, ids.device) < params["random_next_prob"]  # (B,)
    document = batch.document_ids[:, 0]  # (B,): one document per row (checked)
    partner = _other_document_rows(document, generator, needed=params["random_next_prob"] > 0)
    source = torch.where(random_next, partner, b.row)  # (B,): the row B is taken from
    # A random B is cut to the row's width: [CLS] A [SEP] B [SEP] fits in T + 1 positions.
    length = torch.minimum(b.length[source], T - 2 - a.length)  # (B,)
    tokens, is_padding, _ = segments.join_pair(ids, a, segments.Segment(source, b.start[source], length), vocab)
    return objreg.CorruptedBatch(
        input_ids=tokens,
        labels=torch.full_like(tokens, objreg.IGNORE_INDEX),
        is_padding=is_padding,
        position_ids=torch.arange(T + 1, device=ids.device).expand(B, T + 1).clone(),
        # The pair is one sequence: both segments carry the row's document id, so the block-diagonal
        # mask does not cut A off from a B of another document.
        document_ids=torch.where(is_padding, -1, document[:, None]),
        extras={"next_sentence_label": random_next.long(), "next_document": document[source]},
    )


@objreg.hookimpl
def objreg_loss(outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
    logits = outputs.model.heads["next_sentence"](outputs.hidden)  # (B, 2), from the first token
    return losses.class_nll(logits, batch.extras["next_sentence_label"])  # (B,)


def _other_document_rows(document: torch.Tensor, generator: torch.Generator, needed: bool) -> torch.Tensor:
    """For each row, a row of the batch drawn uniformly among those of another document.

    ``document``: ``[B]``. Random keys over a ``[B, B]`` grid, rows of the same document knocked
    out, argmax per row. The keys are drawn whatever the data, so the generator always advances
    the same way. Raises :class:`objreg.DataError` when ``needed`` and the batch holds one document.
    """
    B = document.shape[0]
    other = document[:, None] != document[None, :]  # (B, B)
    keys = torch.where(other, objreg.uniform((B, B), generator, document.device), -1.0)  # (B, B)
    if needed and not bool(other.any()):
        raise objreg.DataError(
            f"nsp takes a random next segment from another document of the batch, but all {B} row(s) come "
            f"from one document; give rows from at least 2 documents (e.g. several --text), or set "
            f"random_next_prob=0"
        )
    return keys.argmax(dim=1)  # (B,): with >= 2 documents every row has another-document row
