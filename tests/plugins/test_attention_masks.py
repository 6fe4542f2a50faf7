"""Every built-in objective's attention, as the backbone receives it, against a loop over every
(query, key) pair built from the batch's padding, documents and prefix lengths alone.

Most objectives implement no ``objreg_attention_mask``: the host builds the mask their
``ObjectiveInfo.attention`` declares. The loop restates the masks their removed hooks returned,
so the host's masks are today's; contrastive (its two views kept apart) and fim (causal in the
permuted order) keep hooks of their own, checked against their own rules.
"""

from __future__ import annotations

import pytest
import torch

import objreg

REGISTRY = objreg.Registry.load(load_entrypoints=False)
#: Objectives that refuse rows holding several documents.
ONE_DOCUMENT_PER_ROW = {"contrastive", "nsp", "sop"}
#: Objectives whose corrupted rows keep a packed row's documents (the others rearrange a row into
#: one document: ``[source ; target]``, fim's three parts).
KEEP_DOCUMENTS = {"clm", "mlm", "rtd", "span", "wwm"}


def batch_for(name: str, tokenizer, texts) -> objreg.TokenBatch:
    """Rows of unequal length (padding); for the objectives that take them, the first two rows
    hold two documents each."""
    batch = tokenizer.batch_from_texts(texts)
    if name in ONE_DOCUMENT_PER_ROW:
        return batch
    documents = batch.document_ids.clone()
    documents[0, 9:] = 10
    documents[1, 6:] = 11
    return batch._replace(document_ids=documents.masked_fill(batch.is_padding, -1))


def loop_mask(batch: objreg.CorruptedBatch, pattern: str, blocks: torch.Tensor | None = None) -> torch.Tensor:
    """``mask[b, i, j]``: key ``j`` is real, in query ``i``'s block (its document, or ``blocks``)
    and, by ``pattern``, anywhere (bidirectional), not after ``i`` (causal), not after ``i`` or
    inside the row's prefix (prefix), or not after ``i`` in the order of ``position_ids`` (fim)."""
    padding = batch.is_padding.tolist()
    block = (batch.document_ids if blocks is None else blocks).tolist()
    order = batch.position_ids.tolist()
    prefix = batch.extras["prefix_length"].tolist() if pattern == "prefix" else None
    B, T = batch.input_ids.shape
    rows = []
    for b in range(B):
        rows.append([[not padding[b][j] and block[b][j] >= 0 and block[b][i] == block[b][j] and (
            pattern == "bidirectional"
            or pattern == "causal" and j <= i
            or pattern == "prefix" and (j <= i or j < prefix[b])
            or pattern == "fim" and order[b][j] <= order[b][i]
        ) for j in range(T)] for i in range(T)])
    return torch.tensor(rows, dtype=torch.bool)


def expected_mask(name: str, batch: objreg.CorruptedBatch) -> torch.Tensor:
    if name == "fim":
        return loop_mask(batch, "fim")
    if name == "contrastive":
        views = batch.extras["view_ids"]  # 0 and 1 in a row's two views, -1 at padding
        return loop_mask(batch, "bidirectional", torch.where(views < 0, -1, 2 * batch.document_ids + views))
    return loop_mask(batch, REGISTRY.info(name).pattern)


def test_only_contrastive_and_fim_describe_their_own_attention():
    assert {n for n in REGISTRY.objectives() if REGISTRY.get(n).describes_attention} == {"contrastive", "fim"}


@pytest.mark.parametrize("name", REGISTRY.objectives())
def test_the_mask_equals_a_loop_over_padding_documents_and_prefixes(name, tokenizer, texts):
    objective = REGISTRY.get(name, vocab=tokenizer.vocab)
    batch = objective.corrupt(batch_for(name, tokenizer, texts), torch.Generator().manual_seed(0))
    assert bool(batch.is_padding.any())
    if name in KEEP_DOCUMENTS:  # the packed rows reach the corrupted batch
        assert len(set(batch.document_ids[0].tolist()) - {-1}) == 2
    described = objective.attention(batch)
    if objective.info.pattern != "custom":  # structured, O(B·T), with the declared pattern
        assert isinstance(described, objreg.AttentionMask) and described.pattern == objective.info.pattern
    assert torch.equal(objective.attention_mask(batch), expected_mask(name, batch))
