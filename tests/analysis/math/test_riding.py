"""Dots riding the loop's own backward (:class:`RidingDots`): every ghost rule, the loop's
weighting divided out, checked against a float64 per-example loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction
from objreg.analysis.math.per_sample import per_sample_dots
from objreg.analysis.math.riding import RidingDots
from objreg.core.errors import InvalidParameterError

VOCAB, WIDTH, LENGTH, ROWS = 13, 4, 6, 5


class Conv1D(nn.Module):
    """``transformers``' ``Conv1D`` as ghost recognises it: ``x W + b``, ``W`` stored ``[in, out]``."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) / nx**0.5)
        self.bias = nn.Parameter(torch.randn(nf) / 10)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


class Scale(nn.Module):
    """A module with no closed-form rule (ghost takes its own jvp)."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))

    def forward(self, x):
        return torch.tanh(x * self.gain)


class Head(nn.Module):
    """Hugging Face's LM head: it registers the decoder's bias as its own too (tied)."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.Linear(WIDTH, VOCAB)
        self.bias = self.decoder.bias

    def forward(self, x):
        return self.decoder(x)


class Every(nn.Module):
    """One module of every rule: embedding, LayerNorm, narrow and wide linear layers and Conv1Ds,
    a module without a rule, and an LM head wider than its input under a masked-token loss."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.up = Conv1D(3 * WIDTH, WIDTH)
        self.down = Conv1D(WIDTH, 3 * WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.scale = Scale()
        self.head = Head()
        self.pair = nn.Linear(WIDTH, 2)

    def body(self, ids):
        h = self.norm(self.embed(ids))
        h = h + self.down(torch.relu(self.up(h)))
        return self.scale(self.mix(h))

    def tokens(self, batch):  # a masked-token loss: the head's gradient is zero off the masked positions
        logits = self.head(self.body(batch["ids"]))
        token = F.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none", ignore_index=-100)
        return token.sum(1) / (batch["labels"] != -100).sum(1)

    def pairs(self, batch):
        return F.cross_entropy(self.pair(self.body(batch["ids"]).mean(1)), batch["y"], reduction="none")


def make_batch(seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(VOCAB, (ROWS, LENGTH), generator=generator)
    labels = torch.where(torch.rand(ROWS, LENGTH, generator=generator) < 0.3, ids, -100)
    labels[:, 0] = ids[:, 0]
    return {"ids": ids, "labels": labels, "y": torch.randint(2, (ROWS,), generator=generator)}


def model_and_direction():
    torch.manual_seed(0)
    model = Every().double()
    generator = torch.Generator().manual_seed(5)
    direction = {n: torch.randn(p.shape, generator=generator, dtype=p.dtype) for n, p in model.named_parameters()}
    return model, direction


def loop_dots(model, loss, batch, direction):
    """``⟨∇ℓ_i, v⟩`` by one backward per example, in float64."""
    params = dict(model.named_parameters())
    losses = loss(batch)
    out = []
    for i in range(ROWS):
        grads = torch.autograd.grad(losses[i], list(params.values()), retain_graph=True, allow_unused=True)
        out.append(sum(float((g * direction[n]).sum()) for n, g in zip(params, grads) if g is not None))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("per_example", [False, True], ids=["hooks", "per_example"])
def test_riding_dots_are_the_per_example_loops_for_every_rule_and_weighting(per_example):
    model, direction = model_and_direction()
    tokens, pairs = make_batch(1), make_batch(2)
    other = {n: 2 * t for n, t in direction.items()}
    with RidingDots(model, [direction, other], per_example=per_example) as riding:
        token_losses = riding.mark("tokens", model.tokens(tokens))
        pair_losses = riding.mark("pairs", model.pairs(pairs))
        # The loop's own weighting: a weighted mean, and a sum with per-example weights.
        rows = torch.arange(1, ROWS + 1, dtype=torch.float64)
        (0.3 * token_losses.mean() + (rows * pair_losses).sum()).backward()
    dots = riding.by_objective()
    for name, loss, batch in (("tokens", model.tokens, tokens), ("pairs", model.pairs, pairs)):
        expected = loop_dots(model, loss, batch, direction)
        torch.testing.assert_close(dots[name][0], expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dots[name][1], 2 * expected, rtol=1e-10, atol=1e-12)
    assert {"head.decoder.weight", "up.weight", "scale.gain"} <= riding.reached


def _step_gradients(model, riding=None):
    """``.grad`` after one two-objective backward (with ``riding``'s hooks on, when given)."""
    model.zero_grad()
    mark = riding.mark if riding is not None else (lambda name, losses: losses)
    (0.3 * mark("tokens", model.tokens(make_batch(1))).mean() + mark("pairs", model.pairs(make_batch(2))).sum()
     ).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [1, 2**24], ids=["one_example_a_chunk", "whole_batch"])
def test_per_example_linear_layers_keep_the_steps_gradients_and_give_back_their_forward(monkeypatch, chunk):
    """The weight gradients summed example by example are autograd's own (float64: to rounding),
    whether the examples come one at a time or all at once; the modules' forwards are theirs again
    after the block, and a pass never marked runs the ordinary backward."""
    import objreg.analysis.math.per_example_linear as per_example_linear

    monkeypatch.setattr(per_example_linear, "CHUNK_ELEMENTS", chunk)
    model, direction = model_and_direction()
    plain = _step_gradients(model)
    with RidingDots(model, [direction], per_example=True) as riding:
        patched = [m for m in model.modules() if "forward" in vars(m)]
        unmarked = _step_gradients(model, None)
        riding.clear()
        riding.pending = []
        marked = _step_gradients(model, riding)
        dots = riding.by_objective()
    assert {type(m).__name__ for m in patched} == {"Linear", "Conv1D"} and len(patched) == 5
    assert not any("forward" in vars(m) for m in model.modules())
    for name, grad in plain.items():
        torch.testing.assert_close(unmarked[name], grad, rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(marked[name], grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dots["pairs"][0], loop_dots(model, model.pairs, make_batch(2), direction),
                               rtol=1e-10, atol=1e-12)


def test_calls_never_marked_add_nothing_and_a_row_without_weight_is_nan():
    model, direction = model_and_direction()
    batch = make_batch(1)
    with RidingDots(model, [direction]) as riding:
        model.pairs(make_batch(3)).sum().backward()  # another computation under the hooks: never marked
        losses = riding.mark("pairs", model.pairs(batch))
        weights = torch.tensor([1.0, 0.0, 2.0, 1.0, 1.0], dtype=torch.float64)
        (weights * losses).sum().backward()
    dots = riding.by_objective()["pairs"][0]
    expected = loop_dots(model, model.pairs, batch, direction)
    assert torch.isnan(dots[1])
    keep = torch.tensor([0, 2, 3, 4])
    torch.testing.assert_close(dots[keep], expected[keep], rtol=1e-10, atol=1e-12)


def test_micro_batches_of_one_objective_give_their_rows_in_order():
    model, direction = model_and_direction()
    first, second = make_batch(1), make_batch(2)
    with RidingDots(model, [direction]) as riding:
        for batch in (first, second):
            riding.mark("pairs", model.pairs(batch)).mean().backward()
    expected = torch.cat([loop_dots(model, model.pairs, b, direction) for b in (first, second)])
    torch.testing.assert_close(riding.by_objective()["pairs"][0], expected, rtol=1e-10, atol=1e-12)


def test_ghost_leaves_a_parameter_a_submodule_registers_to_that_submodule():
    model, direction = model_and_direction()
    batch = make_batch(1)
    function = ObjectiveFunction(model, CallableLoss("tokens", lambda m, b: m.tokens(b)), batch,
                                 shared=[n for n, _ in model.named_parameters()])
    shared = {n: p.detach() for n, p in model.named_parameters()}
    ghost, _ = per_sample_dots(function, shared, direction, "ghost")
    torch.testing.assert_close(ghost, loop_dots(model, model.tokens, batch, direction), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("losses, message", [
    (lambda m, b: m.pairs(b).unsqueeze(1), "shape \\[B\\]"),
    (lambda m, b: m.pairs(b).detach(), "do not require grad"),
    (lambda m, b: m.pairs(b)[:3], "ran on 5 rows but the losses of 'pairs' have 3"),
])
def test_bad_losses_are_refused_in_one_line(losses, message):
    model, direction = model_and_direction()
    with RidingDots(model, [direction]) as riding, pytest.raises(InvalidParameterError, match=message):
        riding.mark("pairs", losses(model, make_batch(1)))


def test_losses_marked_twice_without_a_forward_between_are_refused():
    model, direction = model_and_direction()
    with RidingDots(model, [direction]) as riding:
        losses = riding.mark("pairs", model.pairs(make_batch(1)))
        with pytest.raises(InvalidParameterError, match="no module owning a measured parameter ran"):
            riding.mark("again", losses * 2)


def test_a_frozen_linear_weight_still_gets_its_dots_by_per_example_gradients():
    """A direction may name a weight that is not trained: its dots come out of per-example
    gradients formed for it anyway, and equal the ghost rule's (checked against the loop above)."""
    model, direction = model_and_direction()
    model.mix.weight.requires_grad_(False)
    batch = make_batch(2)
    dots = []
    for per_example in (False, True):
        with RidingDots(model, [direction], per_example=per_example) as riding:
            riding.mark("pairs", model.pairs(batch)).mean().backward()
        dots.append(riding.by_objective()["pairs"][0])
    assert model.mix.weight.grad is None
    torch.testing.assert_close(dots[1], dots[0], rtol=1e-10, atol=1e-12)


class ByKeyword(Every):
    """Every, its linear layer called by keyword (``mix(input=h)``)."""

    def body(self, ids):
        h = self.norm(self.embed(ids))
        h = h + self.down(torch.relu(self.up(h)))
        return self.scale(self.mix(input=h))


def test_a_linear_layer_called_by_keyword_rides_as_one_called_by_position():
    """The swapped forward takes its one input by name too: no call goes unrecorded."""
    model, direction = model_and_direction()
    keyword = ByKeyword().double()
    keyword.load_state_dict(model.state_dict())
    batch = make_batch(2)
    with RidingDots(keyword, [direction], per_example=True) as riding:
        riding.mark("pairs", keyword.pairs(batch)).mean().backward()
    assert "mix.weight" in riding.reached
    torch.testing.assert_close(riding.by_objective()["pairs"][0], loop_dots(model, model.pairs, batch, direction),
                               rtol=1e-10, atol=1e-12)
