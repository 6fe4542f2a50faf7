"""Per-sample dots ⟨∇ℓ_i, v⟩ and per-sample gradients: every path against a float64 per-example loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import objreg
from objreg import masks
from objreg.analysis.math import ghost, per_sample
from objreg.analysis.math.functional import CallableLoss, ObjectiveFunction, detached, flat_dot, shared_parameters

FAST_METHODS = [m for m in per_sample.METHODS if m not in ("auto", "loop")]  # the loop is the reference


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().detach() / b.abs().max().detach())


def loop_grads(fn: ObjectiveFunction, shared: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, P]``: ∇ℓ_i of ℓ computed on the whole batch, one backward per example."""
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    losses = fn(params)
    rows = []
    for i in range(losses.shape[0]):
        grads = torch.autograd.grad(losses[i], list(params.values()), retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params.values())])
        )
    return torch.stack(rows)


class InBatchContrastive:
    """InfoNCE over first-token projections with in-batch negatives: row ``i``'s positive is row
    ``i ^ 1``, every other row a negative, so ℓ_i depends on the whole batch (batch-coupled)."""

    info = objreg.ObjectiveInfo(
        name="in_batch_contrastive",
        description="test objective",
        heads=(objreg.HeadSpec("proj", "projection", 8),),
        batch_coupled=True,
    )
    name = info.name

    def attention_mask(self, batch: objreg.CorruptedBatch) -> torch.Tensor:
        return masks.bidirectional(batch.is_padding)

    def loss(self, outputs: objreg.ModelOutputs, batch: objreg.CorruptedBatch) -> torch.Tensor:
        z = outputs.model.heads["proj"](outputs.hidden)  # (B, 8)
        z = z / z.norm(dim=-1, keepdim=True)
        B = z.shape[0]
        logits = (z @ z.T / 0.5).masked_fill(torch.eye(B, dtype=torch.bool), -1e9)  # (B, B), no self-pairs
        positive = torch.arange(B) ^ 1
        return -torch.log_softmax(logits, dim=-1)[torch.arange(B), positive]

    def losses(self, model, batch: objreg.CorruptedBatch, mask: torch.Tensor) -> torch.Tensor:
        hidden = model.encode(batch.input_ids, mask, batch.position_ids)
        return self.loss(objreg.ModelOutputs(hidden, model), batch)


@pytest.fixture
def build_coupled(registry, tokenizer, texts):
    """``build_coupled(attention)`` → ``(function, shared)`` of the batch-coupled objective on a
    float64 tiny model, with a real corrupted batch."""

    def make(attention="math"):
        batch = registry.get("mlm", vocab=tokenizer.vocab).corrupt(
            tokenizer.batch_from_texts(texts, 40), torch.Generator().manual_seed(0)
        )
        config = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32, "attention": attention}
        model = registry.load_model(
            "default", tokenizer.vocab, list(InBatchContrastive.info.heads), config, torch.Generator().manual_seed(0)
        ).double()
        return ObjectiveFunction(model, InBatchContrastive(), batch), detached(shared_parameters(model))

    return make


# -- exactness of every path ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["clm", "mlm", "sop"])
def test_every_method_equals_the_float64_loop(build, direction, name):
    fn, shared = build(name)
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)
    for method in FAST_METHODS:
        dots, used = per_sample.per_sample_dots(fn, shared, v, method)
        assert used == method
        assert rel_err(dots, reference) <= 1e-8, method


def test_loop_reference_matches_finite_differences(build, direction):
    # The loop is the reference for the others; check it against a central difference of each ℓ_i.
    fn, shared = build("mlm")
    v = direction(shared)
    eps = 1e-6
    plus = fn({n: t + eps * v[n] for n, t in shared.items()})
    minus = fn({n: t - eps * v[n] for n, t in shared.items()})
    assert rel_err(per_sample.dots_loop(fn, shared, v), (plus - minus) / (2 * eps)) <= 1e-6


def test_mean_of_dots_is_the_batch_gradient_dot(build, direction):
    fn, shared = build("sop")
    v = direction(shared)
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    grads = dict(zip(params, torch.autograd.grad(fn(params).mean(), list(params.values()))))
    dots, _ = per_sample.per_sample_dots(fn, shared, v)
    assert torch.allclose(dots.mean(), flat_dot(grads, v), rtol=1e-10)


# -- ghost dot products -----------------------------------------------------------------------------


def test_ghost_counts_a_tied_weight_at_both_uses(build):
    # mlm's decoder weight is the token embedding: a direction on that one tensor alone must
    # give the loop's dots, i.e. the embedding rule plus the decoder's linear rule, each once.
    fn, shared = build("mlm")
    name = "backbone.token_embedding.weight"
    generator = torch.Generator().manual_seed(3)
    v = {
        n: torch.randn(t.shape, generator=generator, dtype=t.dtype) if n == name else torch.zeros_like(t)
        for n, t in shared.items()
    }
    reference = per_sample.dots_loop(fn, shared, v)
    assert reference.abs().max() > 0
    assert rel_err(ghost.dots_ghost(fn, shared, v), reference) <= 1e-8


def test_ghost_runs_through_fused_attention(build, direction):
    # Ghost dots need first derivatives only, which the fused SDPA kernel has.
    fn, shared = build("clm", attention="sdpa")
    v = direction(shared)
    assert rel_err(ghost.dots_ghost(fn, shared, v), per_sample.dots_loop(fn, shared, v)) <= 1e-8


def test_ghost_honours_an_embedding_padding_index(build, direction):
    fn, shared = build("clm")
    fn.model.backbone.token_embedding.padding_idx = fn.batch.input_ids[0, 3].item()  # a token that occurs
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)
    assert rel_err(ghost.dots_ghost(fn, shared, v), reference) <= 1e-8


class ScaledNorm(nn.Module):
    """A module the ghost rules do not know: its own parameter, a non-linear use of it."""

    def __init__(self, size: int):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, size, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(self.gain) / x.norm(dim=-1, keepdim=True).clamp(min=1e-6)


def test_ghost_handles_an_unknown_module_by_its_local_directional_derivative(build, direction):
    fn, _ = build("sop")
    fn.model.backbone.final_norm = ScaledNorm(fn.model.hidden_size)
    fn = ObjectiveFunction(fn.model, fn.objective, fn.batch, fn.mask)
    shared = detached(shared_parameters(fn.model))
    assert "backbone.final_norm.gain" in shared
    v = direction(shared)
    assert rel_err(ghost.dots_ghost(fn, shared, v), per_sample.dots_loop(fn, shared, v)) <= 1e-8


def test_ghost_dots_ride_along_an_ordinary_training_backward(build, direction):
    # In-run use: the step's own backward of the mean loss (weight gradients and all) also yields
    # the dots, and the gradients are those of a backward without hooks.
    fn, shared = build("mlm")
    v = direction(shared)
    params = {n: t.clone().requires_grad_(True) for n, t in shared.items()}
    plain = torch.autograd.grad(fn(params).mean(), list(params.values()))
    with ghost.GhostDots(fn.model, v, fn.batch_size) as in_run:
        grads = torch.autograd.grad(fn(params).mean(), list(params.values()))
    assert rel_err(in_run.dots() * fn.batch_size, per_sample.dots_loop(fn, shared, v)) <= 1e-8
    assert all(torch.equal(a, b) for a, b in zip(grads, plain))


def test_ghost_works_under_no_grad_and_leaves_no_hooks(build, direction):
    fn, shared = build("mlm")
    v = direction(shared)
    with torch.no_grad():
        dots = ghost.dots_ghost(fn, shared, v)
    assert rel_err(dots, per_sample.dots_loop(fn, shared, v)) <= 1e-8
    assert all(not m._forward_hooks for m in fn.model.modules())


# -- batch-coupled losses ---------------------------------------------------------------------------


def test_batch_coupled_dots_equal_the_whole_batch_loop(build_coupled, direction):
    fn, shared = build_coupled()
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)
    for method in ("jvp", "double_backward", "vmap"):
        assert rel_err(per_sample.per_sample_dots(fn, shared, v, method)[0], reference) <= 1e-8, method
    dots, used = per_sample.per_sample_dots(fn, shared, v)
    assert used == "jvp" and rel_err(dots, reference) <= 1e-8


def test_ghost_is_refused_for_a_batch_coupled_loss_and_would_be_wrong(build_coupled, direction):
    fn, shared = build_coupled()
    v = direction(shared)
    with pytest.raises(objreg.InvalidParameterError, match="couples the examples"):
        ghost.dots_ghost(fn, shared, v)
    # Why: with the guard lifted, ghost attributes gradient by row, which is not ∇ℓ_i here.
    uncoupled = ObjectiveFunction(fn.model, _Uncoupled(), fn.batch, fn.mask)
    reference = per_sample.dots_loop(fn, shared, v)
    assert rel_err(ghost.dots_ghost(uncoupled, shared, v), reference) > 1e-3


class _Uncoupled(InBatchContrastive):
    info = objreg.ObjectiveInfo(
        name="mislabelled", description="the same loss, wrongly marked uncoupled", heads=InBatchContrastive.info.heads
    )


def test_auto_never_uses_ghost_for_a_batch_coupled_loss_on_fused_attention(build_coupled, direction):
    # Fused attention rules out jvp and double backward; for an uncoupled loss auto would take
    # ghost, for a coupled one it must fall through to the exact loop.
    fn, shared = build_coupled(attention="sdpa")
    v = direction(shared)
    dots, used = per_sample.per_sample_dots(fn, shared, v)
    assert used == "loop"
    assert rel_err(dots, per_sample.dots_loop(fn, shared, v)) == 0.0


def test_batch_coupled_per_sample_grads_are_whole_batch_jacobian_rows(build_coupled):
    fn, shared = build_coupled()
    grads = per_sample.per_sample_grads(fn, shared, chunk_size=2)
    flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
    assert rel_err(flat, loop_grads(fn, shared)) <= 1e-8


# -- fallbacks --------------------------------------------------------------------------------------


def test_auto_takes_ghost_for_an_uncoupled_loss(build, direction):
    fn, shared = build("sop")
    v = direction(shared)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "ghost"
    assert rel_err(dots, per_sample.dots_loop(fn, shared, v)) <= 1e-8


def test_auto_falls_back_to_jvp_then_double_backward(build, direction, monkeypatch):
    fn, shared = build("mlm")
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)

    def ghost_unsupported(*args):
        raise ghost.GhostUnsupportedError("a module returned a tuple")

    def no_forward_mode(*args):
        raise NotImplementedError("Trying to use forward AD with an operator that does not support it")

    monkeypatch.setitem(per_sample._COMPUTE, "ghost", ghost_unsupported)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "jvp" and rel_err(dots, reference) <= 1e-8
    monkeypatch.setitem(per_sample._COMPUTE, "jvp", no_forward_mode)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "double_backward" and rel_err(dots, reference) <= 1e-8


def test_ghost_reports_a_module_that_is_not_batch_first(build, direction):
    fn, shared = build("sop")
    position = fn.model.backbone.position_embedding
    # Looked up once for the whole batch and broadcast, as Hugging Face models do: no per-row output.
    handle = position.register_forward_pre_hook(lambda module, args: (args[0][:1],))
    try:
        with pytest.raises(ghost.GhostUnsupportedError, match="batch-first"):
            ghost.dots_ghost(fn, shared, direction(shared))
        assert per_sample.per_sample_dots(fn, shared, direction(shared))[1] == "jvp"
    finally:
        handle.remove()


def test_auto_takes_ghost_on_fused_attention(build, direction):
    # The fused CPU SDPA kernel has no forward mode: auto must still give the exact dots, equal
    # to those of the same weights on the math attention path.
    fn, shared = build("mlm", attention="sdpa")
    math_fn, math_shared = build("mlm", attention="math")
    v = direction(shared)
    with pytest.raises((NotImplementedError, RuntimeError)):
        per_sample.dots_jvp(fn, shared, v)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "ghost"
    assert rel_err(dots, per_sample.dots_loop(math_fn, math_shared, v)) <= 1e-8


def test_a_real_error_is_not_swallowed_by_the_fallback(build, direction, monkeypatch):
    fn, shared = build("clm")

    def broken(*args):
        raise RuntimeError("shape mismatch: a bug, not a missing derivative")

    monkeypatch.setitem(per_sample._COMPUTE, "ghost", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        per_sample.per_sample_dots(fn, shared, direction(shared))


def test_unknown_method_is_an_error(build, direction):
    fn, shared = build("clm")
    with pytest.raises(objreg.InvalidParameterError, match="one of auto, ghost, jvp, double_backward, vmap, loop"):
        per_sample.per_sample_dots(fn, shared, direction(shared), method="magic")


# -- projected per-sample gradients -----------------------------------------------------------------


def projection_matrix(projection: per_sample.GaussianProjection, shared) -> torch.Tensor:
    """``[P, k]``: the projection's blocks stacked in parameter order (small P only)."""
    parts = []
    for name, t in shared.items():
        parts += [block for _, block in projection.blocks(name, t.dtype, t.device)]
    return torch.cat(parts)


@pytest.mark.parametrize("coupled_loss", [False, True])
def test_projected_grads_equal_the_projected_loop(build, build_coupled, coupled_loss):
    fn, shared = build_coupled() if coupled_loss else build("mlm")
    projected = per_sample.projected_per_sample_grads(fn, shared, 32, torch.Generator().manual_seed(5), chunk_size=4)
    projection = per_sample.GaussianProjection(
        {n: t.shape for n, t in shared.items()}, 32, torch.Generator().manual_seed(5)
    )
    expected = loop_grads(fn, shared) @ projection_matrix(projection, shared)
    assert projected.shape == (fn.batch_size, 32)
    assert rel_err(projected, expected) <= 1e-8


def test_projection_is_seeded_and_blockwise(build):
    fn, shared = build("sop")
    small_blocks = per_sample.GaussianProjection(
        {n: t.shape for n, t in shared.items()}, 8, torch.Generator().manual_seed(1), block_rows=7
    )
    again = per_sample.GaussianProjection(
        {n: t.shape for n, t in shared.items()}, 8, torch.Generator().manual_seed(1), block_rows=7
    )
    other = per_sample.GaussianProjection(
        {n: t.shape for n, t in shared.items()}, 8, torch.Generator().manual_seed(2), block_rows=7
    )
    m = projection_matrix(small_blocks, shared)
    assert m.shape == (sum(t.numel() for t in shared.values()), 8)
    assert torch.equal(m, projection_matrix(again, shared))
    assert not torch.equal(m, projection_matrix(other, shared))


def test_projection_preserves_inner_products_within_the_jl_bound(build):
    # With k = 512, ⟨Πa, Πb⟩ has standard deviation at most ‖a‖‖b‖·√(2/k) ≈ 0.0625 ‖a‖‖b‖, and
    # ‖Πa‖/‖a‖ about half that: the bounds are ~5σ over the 21 pairs and 6 norms.
    fn, shared = build("sop")
    grads = loop_grads(fn, shared)
    projected = per_sample.projected_per_sample_grads(fn, shared, 512, torch.Generator().manual_seed(0))
    exact, approx = grads @ grads.T, projected @ projected.T
    norms = grads.norm(dim=1)
    assert float(((approx - exact) / (norms[:, None] * norms[None, :])).abs().max()) < 0.3
    assert float(((projected.norm(dim=1) - norms) / norms).abs().max()) < 0.15


def test_projection_dimension_must_be_positive(build):
    fn, shared = build("sop")
    with pytest.raises(objreg.InvalidParameterError, match="positive integer"):
        per_sample.projected_per_sample_grads(fn, shared, 0, torch.Generator())


@pytest.mark.parametrize("name, method", [("mlm", "auto"), ("mlm", "jvp"), ("contrastive", "auto")])
def test_several_directions_from_one_pass_are_each_directions_dots(build, direction, name, method):
    # mlm: ghost, one forward and backward for all three; contrastive is batch-coupled: one jvp each.
    fn, shared = build(name)
    directions = [direction(shared, seed) for seed in (1, 2, 3)]
    many, used = per_sample.per_sample_dots_many(fn, shared, directions, method)
    assert used == ("ghost" if (name, method) == ("mlm", "auto") else "jvp")
    assert len(many) == 3
    for v, dots in zip(directions, many):
        assert rel_err(dots, per_sample.dots_loop(fn, shared, v)) <= 1e-8


def test_ghost_has_a_closed_form_for_gpt2_conv1d(monkeypatch, direction):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).double().eval()
    ids = torch.randint(30, (3, 7), generator=torch.Generator().manual_seed(1))

    def causal_loss(m, batch):
        logits = m(input_ids=batch["ids"], position_ids=torch.arange(7).expand(3, 7)).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch["ids"][:, 1:],
                                                 reduction="none").mean(1)

    names = [n for n, _ in model.named_parameters()]
    fn = ObjectiveFunction(model, CallableLoss("clm", causal_loss), {"ids": ids}, shared=names)
    shared = {n: p.detach() for n, p in model.named_parameters()}
    v = direction(shared)
    generic = []
    monkeypatch.setattr(ghost, "jvp", lambda *a, **k: generic.append(1) or torch.func.jvp(*a, **k))
    dots = ghost.dots_ghost(fn, shared, v)
    assert not generic  # every module owning parameters has a closed-form rule, Conv1D included
    assert rel_err(dots, per_sample.dots_loop(fn, shared, v)) <= 1e-8


# -- squared gradient norms, and ghost's checks -----------------------------------------------------


@pytest.mark.parametrize("name", ["clm", "mlm", "sop"])
def test_ghost_norms_equal_the_loops_squared_gradient_norms(build, direction, name):
    # mlm's decoder is the token embedding: its norm needs the cross terms of both uses.
    fn, shared = build(name)
    if name == "clm":
        fn.model.backbone.token_embedding.padding_idx = fn.batch.input_ids[0, 3].item()
    reference = (loop_grads(fn, shared) ** 2).sum(1)
    dots, norms = ghost.dots_and_norms_ghost(fn, shared, [direction(shared)])
    assert norms is not None and rel_err(norms, reference) <= 1e-8
    assert rel_err(per_sample.per_sample_sq_norms(fn, shared), reference) <= 1e-8  # the fallback's vmap


def test_norms_of_a_module_without_a_ghost_rule_come_from_per_example_gradients(build, direction):
    fn, _ = build("sop")
    fn.model.backbone.final_norm = ScaledNorm(fn.model.hidden_size)
    fn = ObjectiveFunction(fn.model, fn.objective, fn.batch, fn.mask)
    shared = detached(shared_parameters(fn.model))
    assert ghost.dots_and_norms_ghost(fn, shared, [direction(shared)])[1] is None
    dots, norms, method = per_sample.per_sample_dots_and_norms(fn, shared, [direction(shared)])
    assert method == "ghost" and rel_err(norms, (loop_grads(fn, shared) ** 2).sum(1)) <= 1e-8


class RowsAndPositions(nn.Module):
    """Token and position embeddings, a relative-position bias and a linear read-out; its
    per-row loss is ℓ_i. ``positions``: look positions up per row ([B, T]) or once ([T])."""

    def __init__(self, positions="per_row", bias=False):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.tokens, self.positions, self.relative = nn.Embedding(11, 6), nn.Embedding(8, 6), nn.Embedding(15, 1)
        self.out = nn.Linear(6, 3)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=generator)
        self.double()
        self.per_row, self.bias = positions == "per_row", bias

    def forward(self, ids):
        b, t = ids.shape
        positions = torch.arange(t).expand(b, t) if self.per_row else torch.arange(t)
        x = self.tokens(ids) + self.positions(positions)  # (B, T, 6)
        if self.bias:  # T5's relative-position bias: one [T, T] table shared by every row
            relative = torch.arange(t)[None, :] - torch.arange(t)[:, None] + 7
            scores = x @ x.transpose(1, 2) / 6 + self.relative(relative).squeeze(-1)  # (B, T, T)
            x = torch.softmax(scores, -1) @ x
        return self.out(x)  # (B, T, 3)


def rows_function(model, backward=False):
    ids = torch.randint(11, (5, 5), generator=torch.Generator().manual_seed(2))  # T = B: the coincidence
    labels = torch.randint(3, (5, 5), generator=torch.Generator().manual_seed(3))

    def loss(m, batch):
        logits = m(batch["ids"])
        losses = nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none").mean(1)
        if backward and losses.requires_grad:  # a loss that also runs a backward of its own (to log a norm)
            losses.sum().backward(retain_graph=True)
        return losses

    fn = ObjectiveFunction(model, CallableLoss("rows", loss), {"ids": ids, "labels": labels},
                           shared=[n for n, _ in model.named_parameters()])
    return fn, {n: p.detach() for n, p in model.named_parameters()}


def test_ghost_refuses_an_embedding_looked_up_once_for_every_row(direction):
    # pos(arange(T)) with T = B: its output [T, H] passes for a batch, and ghost would give each
    # example the positions' gradient of the whole batch.
    fn, shared = rows_function(RowsAndPositions(positions="shared"))
    v = direction(shared)
    with pytest.raises(ghost.GhostUnsupportedError, match="per-row embedding"):
        ghost.dots_ghost(fn, shared, v)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    assert method == "jvp" and rel_err(dots, per_sample.dots_loop(fn, shared, v)) <= 1e-8


def test_ghost_refuses_a_loss_that_runs_its_own_backward(direction):
    fn, shared = rows_function(RowsAndPositions(), backward=True)
    v = direction(shared)
    with pytest.raises(ghost.GhostUnsupportedError, match="backward pass of its own"):
        ghost.dots_ghost(fn, shared, v)
    dots, method = per_sample.per_sample_dots(fn, shared, v)
    reference = per_sample.dots_loop(*rows_function(RowsAndPositions()), v)
    assert method == "jvp" and rel_err(dots, reference) <= 1e-8


def test_the_check_against_jvp_catches_a_shared_bias_that_passes_for_a_batch(direction):
    fn, shared = rows_function(RowsAndPositions(bias=True))
    v = direction(shared)
    reference = per_sample.dots_loop(fn, shared, v)
    assert rel_err(ghost.dots_ghost(fn, shared, v), reference) > 1e-3  # silently wrong on its own
    checks = per_sample.GhostChecks()
    with pytest.warns(UserWarning, match="ghost per-example dots of 'rows' differ from jvp"):
        (dots,), norms, method = per_sample.per_sample_dots_and_norms(fn, shared, [v], checks=checks)
    assert method == "jvp" and rel_err(dots, reference) <= 1e-8
    assert rel_err(norms, (loop_grads(fn, shared) ** 2).sum(1)) <= 1e-8
    assert checks.failures[0]["objective"] == "rows" and checks.failures[0]["relative_difference"] > 1e-3
    # From then on that model and objective go to jvp at once, without ghost.
    assert per_sample.per_sample_dots_and_norms(fn, shared, [v], checks=checks)[2] == "jvp"


def test_ghost_is_checked_once_per_model_and_objective_and_for_shapes_where_a_size_is_the_batchs(
        build, direction, monkeypatch):
    fn, shared = build("sop")
    v = direction(shared)
    checks = per_sample.GhostChecks()
    calls = []
    original = checks.compare
    monkeypatch.setattr(checks, "compare", lambda *a: calls.append(1) or original(*a))
    for _ in range(3):
        assert per_sample.per_sample_dots_and_norms(fn, shared, [v], checks=checks)[2] == "ghost"
    assert len(calls) == 1 and not checks.failures
    assert fn.batch_size not in fn.batch.input_ids.shape[1:]
