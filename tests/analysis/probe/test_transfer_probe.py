"""The public probe on a plain PyTorch model and loop: the trajectory is untouched, the records
agree with an independent float64 computation, and bad arguments give one clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg.core.errors import InvalidParameterError, ProbeStateError

VOCAB, WIDTH, LENGTH, BATCH = 11, 6, 5, 8


class Tiny(nn.Module):
    """A bag-of-embeddings body shared by two pre-training heads and a downstream head."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(dropout)
        self.token_head = nn.Linear(WIDTH, VOCAB)
        self.pair_head = nn.Linear(WIDTH, 2)
        self.task_head = nn.Linear(WIDTH, 3)

    def hidden(self, ids):
        return torch.tanh(self.body(self.drop(self.embed(ids)))).mean(1)

    def forward(self, ids):
        hidden = self.hidden(ids)
        return self.token_head(hidden), self.pair_head(hidden)


def token_loss(model, batch):
    return F.cross_entropy(model.token_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


def pair_loss(model, batch):
    return F.cross_entropy(model.pair_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


def task_loss(model, batch):
    return F.cross_entropy(model.task_head(model.hidden(batch["ids"])), batch["y"], reduction="none")


def batch(generator, classes, size=BATCH):
    return {"ids": torch.randint(VOCAB, (size, LENGTH), generator=generator),
            "y": torch.randint(classes, (size,), generator=generator)}


WEIGHTS = {"tokens": 1.0, "pairs": 0.5}
EVAL = [batch(torch.Generator().manual_seed(99), 3, 12), batch(torch.Generator().manual_seed(98), 3, 5)]


def make(optimizer="sgd", dropout=0.0, dtype=torch.float64, lr=0.05):
    torch.manual_seed(0)
    model = Tiny(dropout).to(dtype)
    trained = [p for n, p in model.named_parameters() if not n.startswith("task_head")]
    opt = {"sgd": lambda: torch.optim.SGD(trained, lr=lr), "adam": lambda: torch.optim.Adam(trained, lr=lr),
           "adamw": lambda: torch.optim.AdamW(trained, lr=lr)}[optimizer]()
    return model, opt


def new_probe(model, opt, **options):
    return objreg.TransferProbe(model, {"tokens": token_loss, "pairs": pair_loss}, task_loss, opt,
                                eval_batches=EVAL, weights=WEIGHTS, **options)


def train(model, opt, steps, probe=None, every=1):
    """A plain loop; with ``probe``, measured every ``every`` steps (tracked on the others)."""
    generator = torch.Generator().manual_seed(1)
    losses, records = [], []
    for step in range(steps):
        batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
        opt.zero_grad()
        loss = sum(w * {"tokens": token_loss, "pairs": pair_loss}[k](model, batches[k]).mean()
                   for k, w in WEIGHTS.items())
        loss.backward()
        if probe is not None and step % every == 0:
            measured = probe.measure(batches, step=step)
            opt.step()
            records.append(probe.finish(measured))
        else:
            if probe is not None:
                probe.track(batches)
            opt.step()
        losses.append(loss.item())
    return losses, records


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_probing_leaves_the_trajectory_bit_identical(optimizer):
    plain_model, plain_opt = make(optimizer, dropout=0.2, dtype=torch.float32)
    torch.manual_seed(5)
    plain_losses, _ = train(plain_model, plain_opt, 4)
    plain_rng = torch.get_rng_state()

    model, opt = make(optimizer, dropout=0.2, dtype=torch.float32)
    probe = new_probe(model, opt)
    torch.manual_seed(5)
    losses, records = train(model, opt, 4, probe, every=2)
    assert len(records) == 2 and model.training
    assert losses == plain_losses
    assert torch.equal(torch.get_rng_state(), plain_rng)
    for a, b in zip(plain_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(plain_opt.state.values(), opt.state.values()):
        assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def flat_grad(loss, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


def test_records_match_a_float64_per_example_loop():
    model, opt = make("sgd")
    probe = new_probe(model, opt)
    # The downstream head is reached by D only: the default shared set leaves it (and the
    # objectives' own heads, which D does not reach) out.
    generator = torch.Generator().manual_seed(1)
    batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
    shared = [model.embed.weight, model.body.weight, model.body.bias]
    losses = {"tokens": token_loss, "pairs": pair_loss}

    def downstream(params_model=model):
        return torch.cat([task_loss(params_model, b) for b in EVAL]).mean()

    before = [p.detach().clone() for p in shared]
    grad_d = flat_grad(downstream(), shared)
    per_example = {k: torch.stack([flat_grad(losses[k](model, {n: t[i:i + 1] for n, t in b.items()})[0], shared)
                                   for i in range(BATCH)]) for k, b in batches.items()}
    dots = {k: g @ grad_d for k, g in per_example.items()}
    gradients = {k: g.mean(0) for k, g in per_example.items()}

    def hvp(v, eps=1e-5):  # central differences of ∇D along v
        offsets = torch.split(v, [p.numel() for p in shared])
        with torch.no_grad():
            for p, o in zip(shared, offsets):
                p.add_(eps * o.view_as(p))
        plus = flat_grad(downstream(), shared)
        with torch.no_grad():
            for p, o in zip(shared, offsets):
                p.sub_(2 * eps * o.view_as(p))
        minus = flat_grad(downstream(), shared)
        with torch.no_grad():
            for p, b in zip(shared, before):
                p.copy_(b)
        return (plus - minus) / (2 * eps)

    s_cross = float(gradients["tokens"] @ hvp(gradients["pairs"]))
    d_before = float(downstream().detach())

    opt.zero_grad()
    sum(w * losses[k](model, batches[k]).mean() for k, w in WEIGHTS.items()).backward()
    measured = probe.measure(batches, step=0)
    opt.step()
    record = probe.finish(measured)
    delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(shared, before)])

    assert set(probe.shared_parameters) == {"embed.weight", "body.weight", "body.bias"}
    for k in losses:
        assert record["alignment"][k]["dot"] == pytest.approx(float(dots[k].mean()), rel=1e-9)
        assert record["alignment"][k]["conflict_fraction"] == pytest.approx(float((dots[k] < 0).double().mean()))
        assert record["update"]["first_order"][k] == pytest.approx(-0.05 * WEIGHTS[k] * float(dots[k].mean()),
                                                                   rel=1e-9)
    assert record["second_order"]["tokens,pairs"] == pytest.approx(s_cross, rel=1e-5)
    assert record["predicted_delta"]["first_order"] == pytest.approx(float(grad_d @ delta), rel=1e-9)
    assert record["downstream_loss"] == pytest.approx(d_before, rel=1e-12)
    assert record["actual_delta"] == pytest.approx(float(downstream().detach()) - d_before, rel=1e-9, abs=1e-15)
    assert record["update"]["decomposition_residual"] < 1e-12
    assert record["weights"] == WEIGHTS


def test_records_have_the_schema_of_analyze(tiny_trainer):
    trainer = tiny_trainer()
    analyzed = trainer.run()[0]
    model, opt = make("sgd")
    _, records = train(model, opt, 1, new_probe(model, opt))

    def keys(record, depth=0):
        return {k: keys(v, depth + 1) if isinstance(v, dict) and k not in ("alignment", "second_order", "first_order",
                                                                              "norms", "losses", "weights") else None
                for k, v in record.items()}

    assert keys(records[0]) == keys(analyzed)
    assert set(records[0]["alignment"]["tokens"]) == set(next(iter(analyzed["alignment"].values())))


def test_clipped_gradients_are_split_by_what_the_optimizer_steps_on():
    model, opt = make("sgd")
    probe = new_probe(model, opt)
    generator = torch.Generator().manual_seed(1)
    batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
    opt.zero_grad()
    sum(w * {"tokens": token_loss, "pairs": pair_loss}[k](model, batches[k]).mean() for k, w in WEIGHTS.items()
        ).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    measured = probe.measure(batches)
    opt.step()
    record = probe.finish(measured)
    assert record["update"]["decomposition_residual"] < 1e-9
    assert record["weights"] == WEIGHTS


def test_adam_needs_every_step():
    model, opt = make("adam")
    probe = new_probe(model, opt)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
        opt.zero_grad()
        sum(w * {"tokens": token_loss, "pairs": pair_loss}[k](model, batches[k]).mean() for k, w in WEIGHTS.items()
            ).backward()
        opt.step()  # neither tracked nor measured
    with pytest.raises(ProbeStateError, match="every step"):
        probe.measure(batches)


def test_adam_parts_add_up_to_the_step():
    model, opt = make("adamw")
    _, records = train(model, opt, 3, new_probe(model, opt), every=2)
    assert [r["step"] for r in records] == [0, 2]
    for record in records:
        assert record["update"]["attribution"] == "shapley"
        assert record["update"]["decomposition_residual"] < 1e-12
        assert set(record["update"]["first_order"]) == {"tokens", "pairs", "weight_decay"}


@pytest.mark.parametrize(("change", "message"), [
    ({"model": "not a model"}, "model must be a torch.nn.Module"),
    ({"objectives": {}}, "objectives must be a non-empty mapping"),
    ({"objectives": {"tokens": 3}}, "objective 'tokens' must be a per-sample loss"),
    ({"optimizer": object()}, "optimizer must be a torch.optim.Optimizer"),
    ({"eval_batches": None}, "eval_batches is required"),
    ({"weights": {"tokens": 1.0}}, "weights must give one weight per objective"),
    ({"weights": {"tokens": 1.0, "pairs": float("nan")}}, "weights must be finite"),
    ({"shared": ["body.weight", "nope"]}, "no trainable parameter called: 'nope'"),
    ({"shared": lambda name, p: False}, "no shared parameters"),
    ({"per_sample_method": "magic"}, "per_sample_method must be one of auto, ghost"),
    ({"eval_dtype": torch.int64}, "eval_dtype must be a floating"),
    ({"momentum": 0.9}, "plain SGD only"),
])
def test_bad_arguments_give_one_clear_error(change, message):
    model, opt = make("sgd")
    if change.pop("momentum", None):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    arguments = {"model": model, "objectives": {"tokens": token_loss, "pairs": pair_loss}, "downstream": task_loss,
                 "optimizer": opt, "eval_batches": EVAL, "weights": WEIGHTS, **change}
    with pytest.raises(InvalidParameterError, match=message):
        objreg.TransferProbe(arguments.pop("model"), arguments.pop("objectives"), arguments.pop("downstream"),
                             arguments.pop("optimizer"), **arguments)


def test_measure_refuses_calls_out_of_order():
    model, opt = make("sgd")
    probe = new_probe(model, opt)
    generator = torch.Generator().manual_seed(1)
    batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
    with pytest.raises(InvalidParameterError, match="batches must map every objective"):
        probe.measure({"tokens": batches["tokens"]})
    with pytest.raises(ProbeStateError, match="after the backward"):
        probe.measure(batches)
    opt.zero_grad()
    token_loss(model, batches["tokens"]).mean().backward()
    measured = probe.measure(batches)
    opt.step()
    probe.finish(measured)
    with pytest.raises(ProbeStateError, match="once"):
        probe.finish(measured)



# -- data-parallel: each process its own rows, the collectives on the user's process group ---------


def both_token_loss(model, batch):
    return F.cross_entropy(model(batch["ids"])[0], batch["token"], reduction="none")


def both_pair_loss(model, batch):
    return F.cross_entropy(model(batch["ids"])[1], batch["pair"], reduction="none")


def data_parallel_run(rank=None, world=1):
    """Two steps of Adam on one batch per step (both objectives on the same rows, one forward),
    this process's rows of it; returns the probe's records."""
    model, opt = make("adam")
    model.task_head.requires_grad_(False)  # D's head, not trained (DDP wants every trained parameter used)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    probe = objreg.TransferProbe(trained, {"tokens": both_token_loss, "pairs": both_pair_loss}, task_loss, opt,
                                 eval_batches=EVAL, weights=WEIGHTS)
    generator = torch.Generator().manual_seed(1)
    rows = slice(0, BATCH) if world == 1 else (slice(0, 5) if rank == 0 else slice(5, BATCH))  # uneven shares
    for step in range(2):
        whole = batch(generator, VOCAB)
        whole["token"], whole["pair"] = whole.pop("y"), torch.randint(2, (BATCH,), generator=generator)
        mine = {k: t[rows] for k, t in whole.items()}
        opt.zero_grad()
        tokens, pairs = trained(mine["ids"])
        # DDP averages the processes' gradients: weighting each process's mean by its share of
        # the rows makes that average the whole batch's mean.
        share = world * (rows.stop - rows.start) / BATCH
        loss = share * (WEIGHTS["tokens"] * F.cross_entropy(tokens, mine["token"])
                        + WEIGHTS["pairs"] * F.cross_entropy(pairs, mine["pair"]))
        loss.backward()
        measured = probe.measure({"tokens": mine, "pairs": mine}, step=step)
        opt.step()
        probe.finish(measured)
    return probe.records


def _ddp_worker(rank: int, port: int, results: str) -> None:
    import gc
    import json
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=1800))  # bounds a hang only
    try:
        records = data_parallel_run(rank, 2)
        with open(os.path.join(results, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(records, f)
    finally:
        # The DDP model (in reference cycles with the probe) must die while its process group
        # still exists: freed at interpreter exit, its gloo threads abort the process.
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.e2e
def test_a_ddp_loop_gives_the_one_process_records(tmp_path):
    import json

    from test_distributed import _free_port, assert_close_reports, run_two_processes

    run_two_processes(_ddp_worker, _free_port(), str(tmp_path))
    records = data_parallel_run()
    for rank in (0, 1):
        ranked = json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8"))
        assert_close_reports({"steps": records, "summary": {}}, {"steps": ranked, "summary": {}}, rtol=1e-9)
