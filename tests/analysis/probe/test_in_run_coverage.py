"""``InRunAlignment`` measures every parameter of its measured set or refuses it by name: on
``nn.TransformerEncoderLayer``, a bare ``nn.MultiheadAttention`` (whose ``out_proj`` is never
called), layers calling ``F.linear`` on their own parameters and the tiny Hugging Face models, the
dots equal a float64 loop of one backward per example on the same forward (its dropout masks
replayed from the same generator state); a parameter the hooks cannot see is refused; rows the
loss gave no weight are flagged, never NaN."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from objreg.analysis.probe.in_run import InRunAlignment
from objreg.core.errors import InvalidParameterError

VOCAB, WIDTH, LENGTH, BATCH = 13, 8, 5, 6


class OwnLinear(nn.Module):
    """A layer calling ``F.linear`` on its own parameters (no ``nn.Linear`` forward)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5)
        self.bias = nn.Parameter(torch.randn(WIDTH) / 10)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return torch.tanh(F.linear(self.drop(x), self.weight, self.bias)) + x


class Borrowing(nn.Module):
    """A layer multiplying by its child's weight without calling the child: what the hooks cannot see."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.tanh(F.linear(x, self.proj.weight, self.proj.bias))


class Attention(nn.Module):
    """A bare ``nn.MultiheadAttention``, as a model calls it (its weights returned, not used)."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(WIDTH, 2, dropout=0.2, batch_first=batch_first)

    def forward(self, x):
        x = x if self.batch_first else x.transpose(0, 1)
        out = self.attn(x, x, x)[0]
        return out if self.batch_first else out.transpose(0, 1)


class Sequence(nn.Module):
    """``TransformerEncoderLayer`` in either layout."""

    def __init__(self, batch_first: bool, norm_first: bool = False):
        super().__init__()
        self.batch_first = batch_first
        self.layer = nn.TransformerEncoderLayer(WIDTH, 2, dim_feedforward=12, dropout=0.1, batch_first=batch_first,
                                                norm_first=norm_first)

    def forward(self, x):
        x = x if self.batch_first else x.transpose(0, 1)
        out = self.layer(x)
        return out if self.batch_first else out.transpose(0, 1)


class Model(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = body
        self.a_head = nn.Linear(WIDTH, VOCAB)
        self.b_head = nn.Linear(WIDTH, 2)
        self.task = nn.Linear(WIDTH, 3)

    def hidden(self, ids):
        return self.body(self.embed(ids)).mean(1)


def a_loss(model, batch):
    return F.cross_entropy(model.a_head(model.hidden(batch["ids"])), batch["y"] % VOCAB, reduction="none")


def b_loss(model, batch):
    return F.cross_entropy(model.b_head(model.hidden(batch["ids"])), batch["y"] % 2, reduction="none")


def task_loss(model, batch):
    return F.cross_entropy(model.task(model.hidden(batch["ids"])), batch["y"] % 3, reduction="none")


LOSSES = {"a": a_loss, "b": b_loss}


def sample(generator, n=BATCH):
    return {"ids": torch.randint(VOCAB, (n, LENGTH), generator=generator),
            "y": torch.randint(60, (n,), generator=generator)}


BODIES = {
    "encoder layer": lambda: Sequence(batch_first=True),
    "encoder layer, norm first": lambda: Sequence(batch_first=True, norm_first=True),
    "multi-head attention": lambda: Attention(batch_first=True),
    "multi-head attention, sequence first": lambda: Attention(batch_first=False),
    "F.linear on its own parameters": OwnLinear,
    "two layers": lambda: nn.Sequential(Sequence(batch_first=True), OwnLinear()),
}


def build(body, seed=0):
    torch.manual_seed(seed)
    return Model(body()).double()


def run(model, alignment, steps, weights=None, mask=None):
    """Train ``steps`` steps of SGD by hand; returns, per step, the parameters before it and, per
    objective, its batch and the generator state its forward began with."""
    weights = weights or {"a": 1.0, "b": 0.5}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    generator = torch.Generator().manual_seed(3)
    seen = []
    for _ in range(steps):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        data = {}
        optimizer.zero_grad()
        with alignment.step():
            total = 0.0
            for name, fn in LOSSES.items():
                batch = sample(generator)
                data[name] = (batch, torch.get_rng_state())
                losses = alignment.losses(name, fn(model, batch))
                kept = losses * mask if mask is not None else losses
                total = total + weights[name] * kept.mean()
            total.backward()
        optimizer.step()
        seen.append((before, data))
    return seen


def oracle(model, before, names, eval_batches, data):
    """Per objective, ``⟨∇ℓ_i, ∇D⟩`` by one backward per example (float64), ``∇D`` in eval mode
    over the evaluation set, the forward replayed in training mode with the generator as it was."""
    point = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in point.named_parameters():
            p.copy_(before[n])
    params = [point.get_parameter(n) for n in names]
    point.eval()
    total = sum(task_loss(point, b).sum() for b in eval_batches) / sum(len(b["ids"]) for b in eval_batches)
    direction = torch.autograd.grad(total, params)
    point.train()
    out = {}
    for name, (batch, state) in data.items():
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            losses = LOSSES[name](point, batch)
        dots = []
        for i in range(len(losses)):
            grads = torch.autograd.grad(losses[i], params, retain_graph=True, allow_unused=True)
            dots.append(sum(float((g * v).sum()) for g, v in zip(grads, direction) if g is not None))
        out[name] = dots
    return out


EVAL = [sample(torch.Generator().manual_seed(9), 10)]


def check(model, alignment, seen, *, shared=None):
    for record, (before, data) in zip(alignment.records, seen):
        expected = oracle(model, before, alignment.shared, EVAL, data)
        for name, dots in expected.items():
            got = record["alignment"][name]
            assert got["unmeasured_rows"] == []
            assert got["dots"] == pytest.approx(dots, rel=1e-9, abs=1e-13), name
            assert got["dot"] == pytest.approx(sum(dots) / len(dots), rel=1e-9, abs=1e-13)


@pytest.mark.parametrize("body", list(BODIES), ids=list(BODIES))
def test_default_set_keeps_every_parameter_and_the_dots_are_the_float64_loops(body):
    model = build(BODIES[body])
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1)
    seen = run(model, alignment, 2)
    body_names = tuple(n for n, p in model.named_parameters() if n.startswith(("embed.", "body.")))
    assert alignment.shared == body_names  # nothing of the body left out (the attention's four included)
    check(model, alignment, seen)


@pytest.mark.parametrize("body", ["encoder layer", "multi-head attention, sequence first"])
def test_the_attention_alone_named_in_shared_gives_its_own_share(body):
    model = build(BODIES[body])
    attention = [n for n in dict(model.named_parameters()) if "in_proj" in n or "out_proj" in n]
    assert len(attention) == 4
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=attention)
    seen = run(model, alignment, 2)
    assert alignment.shared == tuple(attention)
    check(model, alignment, seen)


@pytest.mark.parametrize("shared", [None, ["body.layer.linear1.weight"], ["embed.weight", "body.layer.norm2.bias"]],
                         ids=["default set", "a linear layer", "a norm"])
def test_a_sequence_first_encoder_layer_is_refused_before_training(shared):
    # Its linear layers see [T, B, ...]: not the batch's rows (silently so were T = B).
    model = build(lambda: Sequence(batch_first=False))
    with pytest.raises(InvalidParameterError, match=r"sequence-first \(batch_first=False\).*body\.layer\."):
        InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=shared)


def test_the_attention_of_a_sequence_first_encoder_layer_alone_is_the_float64_loop():
    model = build(lambda: Sequence(batch_first=False))
    attention = [n for n in dict(model.named_parameters()) if ".self_attn." in n]
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=attention)
    seen = run(model, alignment, 2)
    check(model, alignment, seen)


def test_dropout_replays_leave_the_training_trajectory_as_it_was():
    runs = []
    for measured in (False, True):
        model = build(BODIES["two layers"])
        torch.manual_seed(5)
        if measured:
            run(model, InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1), 3)
        else:
            class Plain:  # the same loop without the alignment
                def step(self):
                    import contextlib
                    return contextlib.nullcontext()

                def losses(self, name, losses):
                    return losses
            run(model, Plain(), 3)
        runs.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for name in runs[0]:
        assert torch.equal(runs[0][name], runs[1][name]), name


@pytest.mark.parametrize("shared", [None, ["body.proj.weight"], ["body.proj.weight", "body.proj.bias"]],
                         ids=["default set", "weight named", "both named"])
def test_a_parameter_used_outside_its_modules_forward_is_refused_by_name(shared):
    model = build(Borrowing)
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=shared)
    with pytest.raises(InvalidParameterError, match=r"cannot see: 'body\.proj\.(bias|weight)'") as error:
        run(model, alignment, 1)
    for name in shared or ["body.proj.weight", "body.proj.bias"]:
        assert repr(name) in str(error.value)


def test_a_parameter_the_hooks_cannot_see_is_refused_when_attached_too():
    model = build(Borrowing)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL).attach(optimizer)
    batch = sample(torch.Generator().manual_seed(1))
    alignment.losses("a", a_loss(model, batch)).mean().backward()
    with pytest.raises(InvalidParameterError, match="body.proj.bias"):
        optimizer.step()


def test_leaving_the_unseen_parameters_out_of_shared_measures_the_rest():
    model = build(Borrowing)
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=["embed.weight"])
    seen = run(model, alignment, 1)
    check(model, alignment, seen)


ZERO = {
    "objective weighted 0": ({"a": 1.0, "b": 0.0}, None, {"a": [], "b": list(range(BATCH))}),
    "one row masked": ({"a": 1.0, "b": 0.5}, [1.0, 0.0, 1.0, 1.0, 1.0, 1.0], {"a": [1], "b": [1]}),
    "rows masked, one weight 0": ({"a": 0.0, "b": 0.5}, [0.0, 0.0, 1.0, 1.0, 1.0, 0.0],
                                  {"a": list(range(BATCH)), "b": [0, 1, 5]}),
}


@pytest.mark.parametrize("case", list(ZERO), ids=list(ZERO))
def test_rows_without_weight_are_flagged_and_the_others_are_the_loops(case):
    weights, mask, missing = ZERO[case]
    model = build(BODIES["encoder layer"])
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = run(model, alignment, 2, weights=weights,
                   mask=torch.tensor(mask, dtype=torch.float64) if mask else None)
    assert sum("gave no weight" in str(w.message) for w in caught) == 1  # warned once
    for record, (before, data) in zip(alignment.records, seen):
        expected = oracle(model, before, alignment.shared, EVAL, data)
        for name, dots in expected.items():
            got = record["alignment"][name]
            assert got["unmeasured_rows"] == missing[name]
            kept = [d for i, d in enumerate(dots) if i not in missing[name]]
            assert [d for d in got["dots"] if d is not None] == pytest.approx(kept, rel=1e-9, abs=1e-13)
            assert [i for i, d in enumerate(got["dots"]) if d is None] == missing[name]
            if kept:
                assert got["dot"] == pytest.approx(sum(kept) / len(kept), rel=1e-9, abs=1e-13)
            else:
                assert got["dot"] is None and got["ci95"] is None and got["conflict_fraction"] is None
            assert not any(isinstance(v, float) and math.isnan(v) for v in [got["dot"], *got["dots"]])


transformers = None
try:
    import transformers  # noqa: F811
except ImportError:  # pragma: no cover - the HF cases skip below
    pass


class HF(nn.Module):
    """A tiny Hugging Face backbone (dropout on) under the same heads."""

    def __init__(self, kind: str):
        super().__init__()
        if kind == "gpt2":
            config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=1, n_head=2, n_positions=16,
                                             bos_token_id=0, eos_token_id=0, attn_implementation="eager")
            self.net = transformers.GPT2Model(config)
        else:
            config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=12, max_position_embeddings=16,
                                             attn_implementation="eager")
            self.net = transformers.BertModel(config, add_pooling_layer=False)

    def forward(self, x):
        raise NotImplementedError


class HFModel(Model):
    def __init__(self, kind):
        super().__init__(nn.Identity())
        self.body = HF(kind)

    def hidden(self, ids):
        # Positions per row: riding needs every embedding look-up to map the batch's rows.
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        return self.body.net(ids, position_ids=positions).last_hidden_state.mean(1)


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_hugging_face_models_are_the_float64_loops(kind):
    if transformers is None:
        pytest.skip("transformers is not installed")
    torch.manual_seed(0)
    model = HFModel(kind).double()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1)
    seen = run(model, alignment, 2)
    assert len(alignment.shared) > 10
    check(model, alignment, seen)


class TiedByHand(nn.Module):
    """An LM head tied to the embedding by hand: ``embed.weight`` is used in the embedding's
    forward (seen) and again by ``F.linear`` outside it (not seen)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.task = nn.Linear(WIDTH, 3)
        self.b_head = nn.Linear(WIDTH, 2)

    def hidden(self, ids):
        return torch.tanh(self.body(self.embed(ids))).mean(1)


def tied_a_loss(model, batch):
    return F.cross_entropy(F.linear(model.hidden(batch["ids"]), model.embed.weight), batch["y"] % VOCAB,
                           reduction="none")


@pytest.mark.parametrize("shared", [None, ["embed.weight"], ["embed.weight", "body.weight"]],
                         ids=["default set", "the tied weight", "with another"])
def test_a_weight_used_both_inside_and_outside_its_module_is_refused(shared, monkeypatch):
    monkeypatch.setitem(LOSSES, "a", tied_a_loss)
    torch.manual_seed(0)
    model = TiedByHand().double()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=shared)
    with pytest.raises(InvalidParameterError, match=r"the losses of 'a' depend on .*cannot see: 'embed\.weight'"):
        run(model, alignment, 1)


def test_the_tied_model_without_its_tied_weight_is_the_float64_loop(monkeypatch):
    monkeypatch.setitem(LOSSES, "a", tied_a_loss)
    torch.manual_seed(0)
    model = TiedByHand().double()
    alignment = InRunAlignment(model, task_loss, eval_batches=EVAL, refresh_every=1, shared=["body.weight", "body.bias"])
    seen = run(model, alignment, 2)
    check(model, alignment, seen)
