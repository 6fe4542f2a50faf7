"""The public probe on a plain PyTorch model and loop: the trajectory is untouched, the records
agree with an independent float64 computation, and bad arguments give one clear error."""

from __future__ import annotations

import json
import types
import typing

import pytest
import torch
import torch.nn.functional as F
from probe_stand_ins import (
    BATCH,
    EVAL,
    FIT,
    VOCAB,
    WEIGHTS,
    batch,
    make,
    pair_loss,
    step_batches,
    task_loss,
    token_loss,
)
from torch import nn

import objreg
from objreg.analysis.math.curvature import HVP_METHODS
from objreg.analysis.math.per_sample import METHODS as PER_SAMPLE_METHODS
from objreg.analysis.records import StepRecord, Summary
from objreg.core.errors import InvalidParameterError, ProbeStateError


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


def one_record(**options):
    model, opt = make("sgd")
    return train(model, opt, 1, new_probe(model, opt, **options))[1][0]


@pytest.mark.parametrize("method", [m for m in PER_SAMPLE_METHODS if m != "loop"])
def test_every_per_sample_method_gives_the_loops_records(method):
    # Every method objreg analyze offers (vmap too) is one the probe takes, with the same numbers.
    reference, record = one_record(per_sample_method="loop"), one_record(per_sample_method=method)
    for k in WEIGHTS:
        for key in ("dot", "cosine", "conflict_fraction"):
            assert record["alignment"][k][key] == pytest.approx(reference["alignment"][k][key], rel=1e-9), (k, key)
    assert record["update"]["first_order"] == pytest.approx(reference["update"]["first_order"], rel=1e-9)


@pytest.mark.parametrize("method", [m for m in HVP_METHODS if m != "double_backward"])
def test_every_hvp_method_gives_the_double_backward_records(method):
    reference, record = one_record(hvp_method="double_backward"), one_record(hvp_method=method)
    assert record["second_order"] == pytest.approx(reference["second_order"], rel=1e-9)
    assert record["predicted_delta"] == pytest.approx(reference["predicted_delta"], rel=1e-9)


def conforms(value, hint, path="record"):
    """Whether ``value`` has the shape the type ``hint`` declares, recursively (TypedDicts: their
    keys, in the declared order, each value by its own hint)."""
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        assert isinstance(value, dict), path
        assert hint.__required_keys__ <= set(value) <= set(hints), (path, sorted(value), sorted(hints))
        assert list(value) == [k for k in hints if k in value], (path, "key order")
        for key, item in value.items():
            conforms(item, hints[key], f"{path}.{key}")
    elif typing.get_origin(hint) is dict:
        key_type, item_type = typing.get_args(hint)
        assert isinstance(value, dict) and all(isinstance(k, key_type) for k in value), path
        for key, item in value.items():
            conforms(item, item_type, f"{path}.{key}")
    elif typing.get_origin(hint) is list:
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            conforms(item, typing.get_args(hint)[0], f"{path}[{i}]")
    elif typing.get_origin(hint) in (typing.Union, types.UnionType):
        problems = []
        for option in typing.get_args(hint):
            try:
                return conforms(value, option, path)
            except AssertionError as e:
                problems.append(e)
        raise AssertionError(path, problems)
    elif hint is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (path, value)
    elif hint is type(None):
        assert value is None, (path, value)
    else:
        assert isinstance(value, hint) and (hint is bool or not isinstance(value, bool)), (path, value)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_records_have_the_typed_schema_of_analyze(tiny_trainer, optimizer):
    trainer = tiny_trainer(optimizer=optimizer, steps=2)
    trainer.probe.engine.spectrum = 2
    analyzed = trainer.run()
    model, opt = make(optimizer)
    _, records = train(model, opt, 1, new_probe(model, opt))
    for record in [*analyzed, *records]:
        conforms(record, StepRecord)
    assert "spectrum" in analyzed[0] and "spectrum" not in records[0]
    for record in [*analyzed, *records]:
        conforms(json.loads(json.dumps(record)), StepRecord)  # as steps.jsonl holds it
    with pytest.raises(AssertionError):
        conforms({**records[0], "alignment": {"tokens": {"dot": 1.0}}}, StepRecord)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_report_summary_has_its_typed_schema(optimizer):
    model, opt = make(optimizer)
    probe = new_probe(model, opt, spectrum=1, steps=3)
    train(model, opt, 3, probe)
    summary = probe.report("task").summary
    conforms(summary, Summary, "summary")
    conforms(json.loads(json.dumps(summary)), Summary, "summary")
    with pytest.raises(AssertionError):
        conforms({**summary, "probes": "three"}, Summary, "summary")


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




# -- a re-fitted downstream head ---------------------------------------------------------------------


def refitted_loss(model, body=None):
    """``D*`` computed independently: multinomial logistic regression of FIT's labels on the
    body's features (penalty ``‖h‖²/2n``) solved by scipy's L-BFGS and polished by Newton steps on
    its autograd Hessian, then the evaluation loss at it, in float64, ``body``'s weights swapped in."""
    scipy_optimize = pytest.importorskip("scipy.optimize")
    import copy

    model = copy.deepcopy(model)
    if body is not None:
        with torch.no_grad():
            for name, value in body.items():
                model.get_parameter(name).copy_(value)
    with torch.no_grad():
        hidden = [model.hidden(b["ids"]) for b in FIT]
    rows = sum(b["ids"].shape[0] for b in FIT)
    shapes = [model.task_head.weight.shape, model.task_head.bias.shape]

    def head_of(x):
        weight, bias = x.split([shapes[0].numel(), shapes[1].numel()])
        return weight.view(shapes[0]), bias.view(shapes[1])

    def fit_loss(x):
        weight, bias = head_of(x)
        data = sum(F.cross_entropy(h @ weight.T + bias, b["y"], reduction="sum") for h, b in zip(hidden, FIT))
        return data / rows + (x @ x) / (2 * rows)

    def value_and_grad(x):
        tensor = torch.tensor(x, requires_grad=True)
        value = fit_loss(tensor)
        (grad,) = torch.autograd.grad(value, tensor)
        return float(value.detach()), grad.numpy()

    start = torch.zeros(sum(s.numel() for s in shapes), dtype=torch.float64).numpy()
    x = torch.tensor(scipy_optimize.minimize(value_and_grad, start, jac=True, method="L-BFGS-B").x)
    for _ in range(4):
        hessian = torch.autograd.functional.hessian(fit_loss, x)
        grad = torch.autograd.functional.jacobian(fit_loss, x)
        x = x - torch.linalg.solve(hessian, grad)
    weight, bias = head_of(x)
    with torch.no_grad():
        losses = [F.cross_entropy(model.hidden(b["ids"]) @ weight.T + bias, b["y"], reduction="sum") for b in EVAL]
    return float(sum(losses)) / sum(b["ids"].shape[0] for b in EVAL)


def test_a_refitted_head_gives_the_independently_refitted_loss_and_its_slope():
    model, opt = make("sgd", lr=1e-4)
    probe = new_probe(model, opt, refit_head=model.task_head, fit_batches=FIT)
    body = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith(("embed", "body"))}
    _, records = train(model, opt, 1, probe)
    record = records[0]
    assert record["downstream_loss"] == pytest.approx(refitted_loss(make()[0]), rel=1e-8)
    assert record["downstream_fit"]["before"]["gradient_norm"] < 1e-12
    # Each objective's dot is ⟨g_k, ∇D*⟩: the slope of D* along g_k, by central differences.
    reference, _ = make("sgd")
    for name, loss in (("tokens", token_loss), ("pairs", pair_loss)):
        generator = torch.Generator().manual_seed(1)
        batches = {"tokens": batch(generator, VOCAB), "pairs": batch(generator, 2)}
        names = list(body)
        grads = torch.autograd.grad(loss(reference, batches[name]).mean(), [reference.get_parameter(n) for n in names])
        g = dict(zip(names, grads))

        def along(s, g=g):
            return refitted_loss(reference, {n: body[n] + s * g[n] for n in g})

        eps = 1e-3
        slope = [(along(e) - along(-e)) / (2 * e) for e in (eps, eps / 2)]
        assert record["alignment"][name]["dot"] == pytest.approx((4 * slope[1] - slope[0]) / 3, rel=1e-6)
    # The step's prediction against the change that happened (lr 1e-4: first order all but exact).
    assert record["actual_delta"] == pytest.approx(sum(record["predicted_delta"].values()), rel=1e-3)
    assert record["downstream_loss_after"] == pytest.approx(
        refitted_loss(make()[0], {n: p.detach() for n, p in model.named_parameters() if n in body}), rel=1e-8)


@pytest.mark.parametrize(("change", "message"), [
    ({"refit_head": "task_head.weight"}, "refit_head must be the head module or a list"),
    ({"refit_head": ["task_head.nope"]}, "parameters the model does not have: 'task_head.nope'"),
    ({"refit_head": nn.Linear(2, 2)}, "must be a module of the model"),
    ({"refit_head": ["task_head.weight"], "fit_batches": None}, "refit_head needs fit_batches"),
    ({"fit_batches": FIT}, "fit_batches is for a re-fitted head"),
])
def test_bad_refit_arguments_give_one_clear_error(change, message):
    model, opt = make("sgd")
    options = {"refit_head": model.task_head, "fit_batches": FIT, **change}
    options = {k: v for k, v in options.items() if v is not None}
    if "refit_head" not in change and "fit_batches" in change:
        options.pop("refit_head")
    with pytest.raises(InvalidParameterError, match=message):
        new_probe(model, opt, **options)


# -- checkpoints and the attached probe --------------------------------------------------------------


def backward(model, opt, batches):
    opt.zero_grad()
    sum(w * {"tokens": token_loss, "pairs": pair_loss}[k](model, batches[k]).mean() for k, w in WEIGHTS.items()
        ).backward()


def explicit_steps(model, opt, probe, generator, steps, every=2):
    """The low-level API: measure and finish every ``every``-th step, track the others."""
    for step in steps:
        batches = step_batches(generator)
        backward(model, opt, batches)
        if step % every == 0:
            measured = probe.measure(batches, step=step)
            opt.step()
            probe.finish(measured)
        else:
            probe.track(batches)
            opt.step()


def attached_steps(model, opt, probe, generator, steps):
    """The attached probe: the loop only hands over each step's batches."""
    for _ in steps:
        batches = step_batches(generator)
        backward(model, opt, batches)
        probe.observe(batches)
        opt.step()


def checkpoint(*states):
    """Through bytes, as a user's torch.save/torch.load would (weights_only: plain data and tensors)."""
    import io

    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("attached", [False, True], ids=["measure-finish", "attach"])
@pytest.mark.parametrize("head", ["frozen", "refit"])
def test_a_loop_checkpointed_after_step_2_resumes_to_the_uninterrupted_records(optimizer, attached, head):
    run = attached_steps if attached else explicit_steps

    def start(model, opt):
        refit = {"refit_head": model.task_head, "fit_batches": FIT} if head == "refit" else {}
        probe = new_probe(model, opt, **refit)
        return probe.attach(opt, every=2) if attached else probe

    model, opt = make(optimizer)
    whole = start(model, opt)
    run(model, opt, whole, torch.Generator().manual_seed(1), range(6))
    assert [r["step"] for r in whole.records] == [0, 2, 4]

    model, opt = make(optimizer)
    first = start(model, opt)
    generator = torch.Generator().manual_seed(1)
    run(model, opt, first, generator, range(3))  # steps 0, 1, 2
    saved = checkpoint(model.state_dict(), opt.state_dict(), first.state_dict(), generator.get_state())

    # A fresh process: model and optimizer made anew, their state loaded, then a fresh probe's.
    model, opt = make(optimizer)
    model_state, opt_state, probe_state, generator_state = saved
    model.load_state_dict(model_state)
    opt.load_state_dict(opt_state)
    resumed = start(model, opt)
    resumed.load_state_dict(probe_state)
    generator = torch.Generator()
    generator.set_state(generator_state)
    run(model, opt, resumed, generator, range(3, 6))
    assert resumed.records == whole.records
    assert resumed.report().to_dict() == whole.report().to_dict()
    assert ("downstream_fit" in whole.records[0]) == (head == "refit")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_attached_probe_records_what_measure_and_finish_record(optimizer):
    model, opt = make(optimizer)
    explicit = new_probe(model, opt)
    explicit_steps(model, opt, explicit, torch.Generator().manual_seed(1), range(5), every=2)
    model, opt = make(optimizer)
    seen = []
    attached = new_probe(model, opt, steps=5).attach(opt, every=3, on_record=seen.append)
    attached_steps(model, opt, attached, torch.Generator().manual_seed(1), range(5))
    # every=3 with steps=5: the first, the third and the last step.
    assert [r["step"] for r in attached.records] == [0, 3, 4] and seen == attached.records
    assert attached.records[0] == explicit.records[0]
    attached.detach()  # back to the low-level API
    explicit_steps(model, opt, attached, torch.Generator().manual_seed(2), [5], every=1)
    assert [r["step"] for r in attached.records] == [0, 3, 4, 5]


def test_an_attached_probe_refuses_what_would_give_wrong_records():
    model, opt = make("adam")
    probe = new_probe(model, opt).attach(opt, every=2)
    generator = torch.Generator().manual_seed(1)
    batches = step_batches(generator)
    backward(model, opt, batches)
    with pytest.raises(ProbeStateError, match="not called on an attached probe"):
        probe.measure(batches)
    with pytest.raises(ProbeStateError, match="handed no batches"):
        opt.step()
    probe.observe(batches)
    with pytest.raises(ProbeStateError, match="twice before optimizer.step"):
        probe.observe(batches)
    opt.step()
    assert len(probe.records) == 1
    backward(model, opt, step_batches(generator))  # step 1 is only tracked, but Adam needs it too
    with pytest.raises(ProbeStateError, match="handed no batches"):
        opt.step()
    with pytest.raises(InvalidParameterError, match="the optimizer the probe was made with"):
        new_probe(model, opt).attach(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ProbeStateError, match="already attached"):
        probe.attach()
    probe.detach()
    with pytest.raises(ProbeStateError, match="call attach"):
        probe.observe(batches)


def test_sgd_between_probes_needs_no_batches():
    model, opt = make("sgd")
    probe = new_probe(model, opt).attach(every=2)
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        batches = step_batches(generator)
        backward(model, opt, batches)
        if step != 1:
            probe.observe(batches)
        opt.step()
    assert [r["step"] for r in probe.records] == [0, 2]


def test_a_probe_made_after_adams_first_step_needs_the_earlier_probes_state():
    model, opt = make("adam")
    generator = torch.Generator().manual_seed(1)
    backward(model, opt, step_batches(generator))
    opt.step()
    late = new_probe(model, opt)
    batches = step_batches(generator)
    backward(model, opt, batches)
    with pytest.raises(ProbeStateError, match="load the state_dict of the probe that saw those steps"):
        late.measure(batches)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: {**s, "format": 0}, "not a TransferProbe state_dict"),
    (lambda s: {**s, "objectives": ["tokens"]}, "probes \\['tokens', 'pairs'\\]"),
    (lambda s: {**s, "shared": ["body.weight", "ghost.weight"]}, "no trainable parameter called: 'ghost.weight'"),
    (lambda s: {**s, "coalitions": None}, "under SGD"),
])
def test_a_state_that_does_not_fit_is_refused(edit, message):
    model, opt = make("adam")
    probe = new_probe(model, opt)
    explicit_steps(model, opt, probe, torch.Generator().manual_seed(1), range(1))
    fresh = new_probe(*make("adam"))
    with pytest.raises(InvalidParameterError, match=message):
        fresh.load_state_dict(edit(probe.state_dict()))
    sgd_model, sgd_opt = make("sgd")
    with pytest.raises(InvalidParameterError, match="under Adam"):
        new_probe(sgd_model, sgd_opt).load_state_dict(probe.state_dict())

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

    from two_processes import assert_close_reports, free_port, run_two_processes

    run_two_processes(_ddp_worker, free_port(), str(tmp_path))
    records = data_parallel_run()
    for rank in (0, 1):
        ranked = json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8"))
        assert_close_reports({"steps": records, "summary": {}}, {"steps": ranked, "summary": {}}, rtol=1e-9)
