"""The split of ``[source ; target]`` rows into encoder and decoder inputs, and the merge back
into the prefix-LM layout, on rows written out by hand."""

from __future__ import annotations

import torch

from objreg import masks
from objreg.toolkit import encoder_decoder

PAD, START = 0, 7


def test_a_prefix_row_splits_into_source_and_shifted_target():
    ids = torch.tensor([[10, 11, 12, 20, 21, PAD]])
    is_padding = ids == PAD
    parts = encoder_decoder.split(ids, masks.prefix(is_padding, torch.tensor([3])), START)
    assert parts.source_length.tolist() == [3]
    assert parts.decoder_ids[0, :3].tolist() == [START, 20, 21]  # start, then the target shifted right
    assert parts.encoder_mask[0].tolist() == [[True, True, True, False, False, False]] * 6
    assert torch.equal(parts.cross_mask, parts.encoder_mask)
    steps = torch.tensor([True, True, True, False, False, False])  # start + two target tokens
    assert torch.equal(parts.decoder_mask[0], torch.ones(6, 6, dtype=torch.bool).tril() & steps[None, :])
    assert parts.uses_decoder[0].tolist() == [False, False, True, True, True, True]
    encoder = torch.arange(6.0)[None, :, None]  # state p at position p
    decoder = 100 + torch.arange(6.0)[None, :, None]  # state 100 + k at decoder step k
    merged = encoder_decoder.merge(encoder, decoder, parts)[0, :, 0]
    # Position L - 1 + k holds decoder step k: the last source token predicts the first target token.
    assert merged[:5].tolist() == [0.0, 1.0, 100.0, 101.0, 102.0]


def test_bidirectional_rows_stay_on_the_encoder():
    ids = torch.tensor([[10, 11, 12, 13], [10, 11, 20, 21]])
    documents = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]])  # the second row packs two documents
    mask = masks.bidirectional(ids == PAD) & masks.same_document(documents)
    parts = encoder_decoder.split(ids, mask, START)
    assert not parts.uses_decoder.any()
    assert torch.equal(parts.encoder_mask, mask)  # the row's own mask, documents kept apart
    encoder, decoder = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    assert torch.equal(encoder_decoder.merge(encoder, decoder, parts), encoder)
