"""Replaced-token detection: ELECTRA's selection, exact sampling, the loss against a loop, no
gradient from the discriminator into the generator, hard negatives."""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg import IGNORE_INDEX
from objreg.plugins.objectives import rtd
from objreg.testing import TINY_MODEL

H = 8


@pytest.fixture
def batch(tokenizer, texts):
    return tokenizer.batch_from_texts(texts)


def repeated(batch: objreg.TokenBatch, times: int) -> objreg.TokenBatch:
    return batch.select(torch.arange(batch.batch_size).repeat(times))


def within_4_sigma(count: float, n: float, p: float) -> bool:
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


class StandInGenerator(nn.Module):
    """A generator whose logits at a position depend on the token there: peaked, deterministic."""

    def __init__(self, vocab_size: int, sharpness: float = 3.0):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Parameter(sharpness * torch.randn(vocab_size, vocab_size, dtype=torch.float64))

    def forward(self, input_ids, attention_mask, position_ids, positions):
        return self.table[input_ids.gather(1, positions)]  # (B, K, V)


class StandInModel(nn.Module):
    """Generator, discriminator head and an ``encode`` that embeds tokens (the discriminator's pass)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        torch.manual_seed(1)
        self.heads = nn.ModuleDict({"generator": StandInGenerator(vocab_size),
                                    "discriminator": nn.Linear(H, 1).double()})
        self.embedding = nn.Embedding(vocab_size, H).double()

    def encode(self, input_ids, attention_mask, position_ids):
        return self.embedding(input_ids)


def test_selection_count_rate_and_mask_share(registry, tokenizer, batch):
    big = repeated(batch, 200)
    v = tokenizer.vocab
    cb = registry.get("rtd", vocab=v).corrupt(big, torch.Generator().manual_seed(0))
    selected = cb.labels != IGNORE_INDEX
    ordinary = ~(big.is_special | big.is_padding)
    n = ordinary.sum(dim=1)
    # ELECTRA's count: max(1, round(0.15 n)), never a special token or padding.
    assert torch.equal(selected.sum(dim=1), torch.round(n * 0.15).long().clamp(min=1))
    assert not (selected & ~ordinary).any()
    assert torch.equal(cb.labels[selected], big.input_ids[selected])
    # Unselected tokens are untouched; selected ones are [MASK] (85%) or kept.
    assert torch.equal(cb.input_ids[~selected], big.input_ids[~selected])
    masked = int((cb.input_ids[selected] == v.mask_id).sum())
    kept = int((cb.input_ids[selected] == big.input_ids[selected]).sum())
    assert masked + kept == int(selected.sum())
    assert within_4_sigma(masked, int(selected.sum()), 0.85)
    # Uniform over a row's ordinary positions: each is selected count/n of the time.
    row = 0
    rows = torch.arange(0, big.batch_size, batch.batch_size)  # the copies of row 0
    share = int(selected[rows].sum()) / len(rows) / int(n[row])
    per_position = selected[rows][:, ordinary[row]].sum(dim=0)
    assert all(within_4_sigma(int(c), len(rows), share) for c in per_position), per_position.tolist()
    # The position lists hold exactly the selected positions.
    positions, weights = cb.extras["masked_positions"], cb.extras["masked_weights"]
    listed = torch.zeros_like(selected).scatter(1, positions, weights > 0)
    assert torch.equal(listed, selected)


def test_sampling_draws_the_generator_distribution_without_special_tokens(tokenizer):
    v = tokenizer.vocab
    V, N = 12, 40000
    logits = torch.randn(1, 1, V, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).expand(N, 1, V)
    specials = torch.tensor([0, 3])
    small = objreg.Vocabulary(size=V, pad_id=0, unk_id=0, cls_id=0, sep_id=3, mask_id=3, special_ids=(0, 3))
    noise = torch.rand(N, 1, generator=torch.Generator().manual_seed(1))
    plain = {"hard_negatives": False, "hard_negative_beta": 5.0, "temperature": 1.0}  # beta unused without hard
    targets = torch.full((N, 1), 5)
    sampled = rtd.sample_replacements(logits, targets, noise, plain, small)[:, 0]
    probs = torch.softmax(logits[0, 0].masked_fill(torch.isin(torch.arange(V), specials), float("-inf")), dim=0)
    counts = torch.bincount(sampled, minlength=V)
    assert counts[specials].sum() == 0
    assert all(within_4_sigma(int(counts[w]), N, float(probs[w])) for w in range(V)), counts.tolist()
    # Hard negatives: tilted by p^(1+β), the original never drawn.
    hard = {"hard_negatives": True, "hard_negative_beta": 2.0, "temperature": 1.0}
    sampled = rtd.sample_replacements(logits, targets, noise, hard, small)[:, 0]
    tilted = probs ** 3
    tilted[5] = 0
    tilted /= tilted.sum()
    counts = torch.bincount(sampled, minlength=V)
    assert counts[5] == 0 and counts[specials].sum() == 0
    assert all(within_4_sigma(int(counts[w]), N, float(tilted[w])) for w in range(V)), counts.tolist()
    assert v.mask_id in v.special_ids  # the real vocabulary's [MASK] is among the excluded ids
    # The temperature divides the logits: 0.5 samples from softmax(2 · logits).
    sampled = rtd.sample_replacements(logits, targets, noise, {**plain, "temperature": 0.5}, small)[:, 0]
    sharp = torch.softmax(2 * logits[0, 0].masked_fill(torch.isin(torch.arange(V), specials), float("-inf")), dim=0)
    counts = torch.bincount(sampled, minlength=V)
    assert all(within_4_sigma(int(counts[w]), N, float(sharp[w])) for w in range(V)), counts.tolist()


def parts_of(objective: objreg.Objective, model, cb: objreg.CorruptedBatch) -> dict[str, torch.Tensor]:
    """``rtd.loss_parts`` with the objective's parameters, mask and vocabulary, as its loss calls it."""
    return rtd.loss_parts(model, cb, objective.params, objective.attention_mask(cb), objective.vocab)


def expected_losses(model: StandInModel, cb: objreg.CorruptedBatch, vocab: objreg.Vocabulary,
                    disc_weight: float = 50.0, selected_only: bool = False) -> torch.Tensor:
    """The loss written out per row and position, with a float64 CDF walk for the samples; with
    ``selected_only`` the discriminator's mean runs over the selected positions (ELECTRA 15%)."""
    generator, disc = model.heads["generator"], model.heads["discriminator"]
    specials = set(vocab.special_ids)
    out = []
    for b in range(cb.batch_size):
        ids = cb.input_ids[b].tolist()
        real = [p for p, w in zip(cb.extras["masked_positions"][b].tolist(), cb.extras["masked_weights"][b].tolist())
                if w > 0]
        noise = cb.extras["sample_noise"][b].tolist()
        replaced, fake, nll = list(ids), [0.0] * len(ids), []
        for k, p in enumerate(real):
            logits = generator.table[ids[p]].tolist()
            original = int(cb.labels[b, p])
            nll.append(-(logits[original] - math.log(sum(math.exp(x) for x in logits))))
            weights = [0.0 if w in specials else math.exp(x) for w, x in enumerate(logits)]
            total, cumulative, choice = sum(weights), 0.0, None
            for w, x in enumerate(weights):
                cumulative += x / total
                if cumulative > noise[k] * 1.0 and x > 0:
                    choice = w
                    break
            replaced[p] = choice
            fake[p] = float(choice != original)
        hidden = model.embedding(torch.tensor(replaced))
        scores = disc(hidden)[:, 0].tolist()
        n = int((~cb.is_padding[b]).sum())
        counted = sorted(real) if selected_only else range(n)
        bce = [math.log1p(math.exp(scores[t])) - fake[t] * scores[t] for t in counted]
        out.append(sum(nll) / len(nll) + disc_weight * sum(bce) / len(bce))
    return torch.tensor(out, dtype=torch.float64)


def test_loss_equals_a_per_position_loop(registry, tokenizer, batch):
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(3))
    model = StandInModel(tokenizer.vocab.size)
    loss = objective.loss(objreg.ModelOutputs(torch.zeros(1), model), cb)
    with torch.no_grad():
        torch.testing.assert_close(loss, expected_losses(model, cb, tokenizer.vocab), rtol=1e-9, atol=1e-9)
        weighted = registry.get("rtd", vocab=tokenizer.vocab, discriminator_weight=3.0)
        torch.testing.assert_close(weighted.loss(objreg.ModelOutputs(None, model), cb),
                                   expected_losses(model, cb, tokenizer.vocab, disc_weight=3.0), rtol=1e-9, atol=1e-9)
    parts = parts_of(objective, model, cb)
    replaced = parts["replaced"] != cb.labels.clamp(min=0)
    assert parts["is_replaced"].any() and not (parts["is_replaced"] & (cb.labels == IGNORE_INDEX)).any()
    # Every position the discriminator is told "replaced" really holds another token.
    assert torch.equal(parts["is_replaced"], replaced & (cb.labels != IGNORE_INDEX))


def test_electra_15_averages_the_discriminator_over_the_selected_positions_only(registry, tokenizer, batch):
    objective = registry.get("rtd", vocab=tokenizer.vocab, discriminator_positions="selected")
    cb = objective.corrupt(batch, torch.Generator().manual_seed(3))
    model = StandInModel(tokenizer.vocab.size)
    with torch.no_grad():
        loss = objective.loss(objreg.ModelOutputs(None, model), cb)
        torch.testing.assert_close(loss, expected_losses(model, cb, tokenizer.vocab, selected_only=True),
                                   rtol=1e-9, atol=1e-9)
        everywhere = registry.get("rtd", vocab=tokenizer.vocab).loss(objreg.ModelOutputs(None, model), cb)
    assert not torch.allclose(loss, everywhere)
    with pytest.raises(objreg.InvalidParameterError, match="discriminator_positions"):
        registry.get("rtd", vocab=tokenizer.vocab, discriminator_positions="masked")


def test_a_sample_equal_to_the_original_counts_as_original(registry, tokenizer, batch):
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(4))
    model = StandInModel(tokenizer.vocab.size)

    def sure_generator(input_ids, attention_mask, position_ids, positions):  # all mass on the original token
        original = cb.labels.gather(1, positions).clamp(min=0)
        return 40.0 * F.one_hot(original, tokenizer.vocab.size).double()  # (B, K, V)

    # The discriminator then sees the original text, and every label says "original".
    sure = types.SimpleNamespace(heads={"discriminator": model.heads["discriminator"], "generator": sure_generator},
                                 encode=model.encode)
    parts = parts_of(objective, sure, cb)
    original = torch.where(cb.labels == IGNORE_INDEX, cb.input_ids, cb.labels)
    assert torch.equal(parts["replaced"], original)
    assert not parts["is_replaced"].any()
    # With hard negatives the original is never drawn: every selected position is replaced.
    hard_objective = registry.get("rtd", vocab=tokenizer.vocab, hard_negatives=True)
    hard = hard_objective.corrupt(batch, torch.Generator().manual_seed(4))
    parts = parts_of(hard_objective, sure, hard)
    assert torch.equal(parts["is_replaced"], hard.labels != IGNORE_INDEX)


def generator_gradients(model: nn.Module, objective: objreg.Objective, cb: objreg.CorruptedBatch,
                        part: str | None = None) -> dict[str, torch.Tensor | None]:
    own = {n: p for n, p in model.named_parameters() if n.startswith("heads.generator.")}
    mask = objective.attention_mask(cb)
    outputs = objreg.ModelOutputs(model.encode(cb.input_ids, mask, cb.position_ids), model)
    loss = objective.loss(outputs, cb) if part is None else parts_of(objective, model, cb)[part]
    grads = torch.autograd.grad(loss.sum(), list(own.values()), allow_unused=True)
    return dict(zip(own, grads))


@pytest.fixture
def model(registry, tokenizer):
    heads = list(registry.info("rtd").heads)
    return registry.load_model("default", tokenizer.vocab, heads, TINY_MODEL, torch.Generator().manual_seed(0)).double()


def test_no_gradient_from_the_discriminator_into_the_generator(registry, tokenizer, batch, model):
    cb = registry.get("rtd", vocab=tokenizer.vocab).corrupt(batch, torch.Generator().manual_seed(5))
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    from_disc = generator_gradients(model, objective, cb, "discriminator")
    assert from_disc and all(g is None or not g.any() for g in from_disc.values())
    # The whole loss: the generator's gradient does not depend on the discriminator's weight ...
    with_50 = generator_gradients(model, objective, cb)
    with_0 = generator_gradients(model, registry.get("rtd", vocab=tokenizer.vocab, discriminator_weight=0.0), cb)
    assert all(torch.equal(with_50[n], with_0[n]) for n in with_50)
    assert all(g is not None and g.any() for g in with_50.values())  # ... and the MLM loss does train it
    # The discriminator does train the backbone it shares, embeddings included (ELECTRA shares them).
    disc_loss = parts_of(objective, model, cb)["discriminator"].sum()
    (g,) = torch.autograd.grad(disc_loss, [model.backbone.token_embedding.weight])
    assert g.any()


def test_the_generator_is_a_quarter_width_transformer_on_the_shared_embeddings(model):
    generator = model.heads["generator"]
    assert generator.token_embedding.weight is model.backbone.token_embedding.weight
    assert generator.decoder.weight is model.backbone.token_embedding.weight
    assert generator.position_embedding.weight is model.backbone.position_embedding.weight
    assert generator.project_in.out_features == TINY_MODEL["hidden_size"] // 4
    assert len(generator.blocks) == TINY_MODEL["num_layers"]
    names = [n for n, _ in model.named_parameters()]
    assert not any("embedding" in n for n in names if n.startswith("heads.generator."))  # counted once, in the backbone


def test_loss_is_a_deterministic_function_of_parameters_and_batch(registry, tokenizer, batch, model):
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    cb = objective.corrupt(batch, torch.Generator().manual_seed(6))
    mask = objective.attention_mask(cb)
    with torch.no_grad():
        first, second = (
            objective.loss(objreg.ModelOutputs(model.encode(cb.input_ids, mask, cb.position_ids), model), cb)
            for _ in range(2)
        )
        hosted = objective.losses(model, cb)  # the host's path: rtd runs the backbone itself, the host does not
    assert objective.info.runs_backbone
    assert torch.equal(first, second) and torch.equal(first, hosted) and torch.isfinite(first).all()


def test_hard_negatives_are_more_probable_under_the_generator(registry, tokenizer, batch):
    big = repeated(batch, 30)
    model = StandInModel(tokenizer.vocab.size)
    table = model.heads["generator"].table.detach()
    log_probs = {}
    for hard in (False, True):
        objective = registry.get("rtd", vocab=tokenizer.vocab, hard_negatives=hard)
        cb = objective.corrupt(big, torch.Generator().manual_seed(7))
        parts = parts_of(objective, model, cb)
        fake = parts["is_replaced"]
        # log p_G(replacement) under the generator's own softmax over ordinary tokens.
        generator_lp = torch.log_softmax(table[cb.input_ids], dim=-1)  # (B, T, V)
        lp = generator_lp.gather(-1, parts["replaced"].unsqueeze(-1)).squeeze(-1)
        log_probs[hard] = float(lp[fake].mean())
        if hard:
            assert torch.equal(fake, cb.labels != IGNORE_INDEX)  # never the original
    assert log_probs[True] > log_probs[False] + 0.5, log_probs


def test_same_seed_same_output_other_seed_differs(registry, tokenizer, batch):
    objective = registry.get("rtd", vocab=tokenizer.vocab)
    a, b, c = (objective.corrupt(batch, torch.Generator().manual_seed(s)) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    assert not torch.equal(a.labels, c.labels)


def test_info_declares_electra_defaults(registry):
    info = registry.info("rtd")
    defaults = info.defaults()
    assert defaults["mask_prob"] == 0.15 and defaults["discriminator_weight"] == 50.0
    assert defaults["generator_weight"] == 1.0 and defaults["mask_replace_prob"] == 0.85
    assert defaults["hard_negatives"] is False and defaults["temperature"] == 1.0
    kinds = {h.name: (h.kind, h.num_outputs) for h in info.heads}
    assert kinds == {"generator": ("generator", 4), "discriminator": ("token_classifier", 1)}


def test_hard_negatives_keep_the_contract(registry):
    from objreg.testing import check_objective_contract

    passed = check_objective_contract("rtd", registry=registry, params={"hard_negatives": True})
    assert "HVPs by the analyzer's forward_over_reverse path equal double backward" in passed
