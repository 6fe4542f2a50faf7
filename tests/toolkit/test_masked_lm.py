"""The masked-LM batch and loss with label smoothing and consistency."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg.toolkit import masked_lm


class ViewModel(nn.Module):
    """A stand-in model: the second backbone pass returns ``other`` (a leaf we can differentiate by)."""

    def __init__(self, V: int, H: int, other: torch.Tensor):
        super().__init__()
        torch.manual_seed(0)
        self.heads = nn.ModuleDict({"lm": nn.Linear(H, V).double()})
        self.other = other

    def encode(self, input_ids, attention_mask, position_ids):
        return self.other


def test_masked_lm_loss_adds_smoothing_and_a_stopped_consistency_term(zipf):
    B, T, H, V = 3, 9, 4, zipf.vocab.size
    g = torch.Generator().manual_seed(10)
    batch = zipf.batch(B, T, seed=11)
    first = torch.rand(B, T, generator=g) < 0.6
    second = torch.rand(B, T, generator=g) < 0.6
    view = masked_lm.MaskedView(batch.input_ids.clone(), first & ~batch.is_special)
    other_view = masked_lm.MaskedView(batch.input_ids.flip(1), second & ~batch.is_special)
    params = {"label_smoothing": 0.2, "consistency_weight": 0.7}
    cb = masked_lm.masked_lm_batch(batch, view, other_view)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    other = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    model = ViewModel(V, H, other)
    loss = masked_lm.masked_lm_loss(objreg.ModelOutputs(hidden, model), cb, params, masked_lm.attention(cb).dense())
    head = model.heads["lm"]
    for b in range(B):  # by hand, every position at a time
        picked = [t for t in range(T) if view.selected[b, t]]
        both = [t for t in range(T) if view.selected[b, t] and other_view.selected[b, t]]
        nll = [F.cross_entropy(head(hidden[b, t]), batch.input_ids[b, t], label_smoothing=0.2) for t in picked]
        kl = [F.kl_div(torch.log_softmax(head(other[b, t]), -1), torch.log_softmax(head(hidden[b, t]), -1),
                       reduction="sum", log_target=True) for t in both]
        want = sum(nll) / max(len(nll), 1) + 0.7 * sum(kl) / max(len(kl), 1)
        assert abs(float(loss[b].detach()) - float(want.detach())) < 1e-12
    grad_other, grad_hidden = torch.autograd.grad(loss.sum(), [other, hidden], allow_unused=True,
                                                  materialize_grads=True)
    assert torch.equal(grad_other, torch.zeros_like(other)) and grad_hidden.abs().sum() > 0
    # extras hold data only: the loss options come from params.
    assert set(cb.extras) == {"masked_positions", "masked_weights", "consistency_input_ids", "consistency_positions",
                              "consistency_weights"}


def test_document_positions_equal_positions_within_documents():
    """The one-document shortcut gives what the scan gives, and packed rows still take the scan."""
    g = torch.Generator().manual_seed(0)
    B, T = 6, 23
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    padding = torch.arange(T)[None, :] >= lengths[:, None]
    one = torch.where(padding, -1, torch.arange(B)[:, None] + 5)
    packed = torch.where(padding, -1, torch.randint(0, 3, (B, T), generator=g).cumsum(dim=1))
    for documents in (one, packed, one[:, :1], one[:, :0]):
        expected = objreg.masks.positions_within_documents(documents)
        assert torch.equal(masked_lm.document_positions(documents), expected)
    assert not torch.equal(objreg.masks.positions_within_documents(packed), torch.arange(T).expand(B, T))
