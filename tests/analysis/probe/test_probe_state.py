"""``TransferProbe.load_state_dict`` refuses every state that is not of this probe, whole and
well-formed (``InvalidParameterError`` naming the key, before anything changes): another model's
shapes or dtypes under the same names, another measured set than ``shared=``, another optimizer
kind or settings, another head or fit set, tampered and partial states. A state that fits loads,
and the records go on as the uninterrupted probe's."""

from __future__ import annotations

import copy

import pytest
import torch
from probe_stand_ins import EVAL, FIT, WEIGHTS, Tiny, pair_loss, step_batches, task_loss, token_loss

import objreg
from objreg.core.errors import InvalidParameterError

LOSSES = {"tokens": token_loss, "pairs": pair_loss}
BODY = ["embed.weight", "body.weight", "body.bias"]


def make(optimizer="adam", dtype=torch.float64, width=None, **settings):
    torch.manual_seed(0)
    model = Tiny().to(dtype)
    if width is not None:  # the same names, other shapes
        model.body = torch.nn.Linear(model.body.in_features, model.body.out_features, bias=True).to(dtype)
        model.task_head = torch.nn.Linear(model.task_head.in_features, width).to(dtype)
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    trained = [p for n, p in model.named_parameters() if not n.startswith("task_head")]
    return model, kinds[optimizer](trained, lr=0.05, **settings)


def probe_of(model, opt, refit=True, fit=FIT, **options):
    extra = {"refit_head": model.task_head, "fit_batches": fit} if refit else {}
    return objreg.TransferProbe(model, LOSSES, task_loss, opt, eval_batches=EVAL, weights=WEIGHTS, **extra, **options)


def steps(model, opt, probe, count, seed=1, skip=0):
    """``count`` probed steps on the batches of ``seed``'s stream, after its first ``skip`` steps' batches."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(skip):
        step_batches(generator)
    for _ in range(count):
        batches = step_batches(generator)
        opt.zero_grad()
        sum(w * LOSSES[k](model, batches[k]).mean() for k, w in WEIGHTS.items()).backward()
        measured = probe.measure(batches)
        opt.step()
        probe.finish(measured)


@pytest.fixture(scope="module")
def saved():
    """The state after two steps under Adam with a re-fitted head."""
    model, opt = make()
    probe = probe_of(model, opt)
    steps(model, opt, probe, 2)
    return probe.state_dict()


def edited(state, path, value):
    """``state`` with the value at ``path`` (keys, then a last key) replaced, or removed (``...``)."""
    state = copy.deepcopy(state)
    where = state
    for key in path[:-1]:
        where = where[key]
    if value is ...:
        del where[path[-1]]
    else:
        where[path[-1]] = value(where[path[-1]]) if callable(value) else value
    return state


def first_mask(state):
    return next(iter(state["coalitions"]["exp_avg"]))


TAMPERED = {
    "a key missing": (("records",), ..., "partial: it lacks 'records'"),
    "the head's state missing": (("downstream",), ..., "partial: it lacks 'downstream'"),
    "the optimizer's settings missing": (("optimizer",), ..., "partial: it lacks 'optimizer'"),
    "objectives not a list": (("objectives",), 7, "'objectives' must be a list"),
    "shared empty": (("shared",), [], "'shared' must be a non-empty list"),
    "shared a string": (("shared",), "body.weight", "'shared' must be a non-empty list"),
    "shared repeated": (("shared",), ["body.weight", "body.weight"], "'shared' must be a non-empty list of distinct"),
    "a layout of another shape": (("parameters", "body.weight"), [[7, 6], "float64"], "'parameters' has 'body.weight'"),
    "a layout of another dtype": (("parameters", "body.bias"), [[6], "float32"], "'parameters' has 'body.bias'"),
    "a layout missing": (("parameters",), {}, "'parameters' must give the shape and dtype"),
    "records not records": (("records",), [1, 2], "'records' must be a list of step records"),
    "next step negative": (("next_step",), -1, "'next_step' must be a step count"),
    "next step a string": (("next_step",), "2", "'next_step' must be a step count"),
    "steps seen a bool": (("steps_seen",), True, "'steps_seen' must be a step count"),
    "tracked at a float": (("tracked_at",), 1.5, "'tracked_at' must be None or a step"),
    "attribution malformed": (("attribution",), [[1, 2]], "'attribution' must be a list of"),
    "hvp method not a name": (("hvp_method",), None, "'hvp_method' must be a method's name"),
    "methods used not names": (("methods_used",), [1], "'methods_used' must be a list"),
    "coalitions without moments": (("coalitions", "exp_avg"), ..., "'coalitions' must hold the players"),
    "coalition steps not counts": (("coalitions", "steps", "body.weight"), -3, "'coalitions' steps must be"),
    "a moment of another shape": (None, "exp_avg shape", "'coalitions' exp_avg of coalition"),
    "a negative second moment": (None, "exp_avg_sq negative", "no Adam moment has"),
    "a NaN moment": (None, "exp_avg nan", "no Adam moment has"),
    "a head start of other classes": (("downstream", "start", "task_head.weight"),
                                      torch.zeros(5, 6, dtype=torch.float64),
                                      "'downstream.start' holds 'task_head.weight' of shape \\[5, 6\\]"),
    "a head start with NaN": (("downstream", "start", "task_head.bias"),
                              torch.full((3,), float("nan"), dtype=torch.float64),
                              "'downstream.start' holds 'task_head.bias' with infinite or NaN"),
    "a head start of other parameters": (("downstream", "start"), {"task_head.weight": torch.zeros(3, 6)},
                                         "'downstream.start' has the head parameters"),
    "a head start that is not a tensor": (("downstream", "start", "task_head.bias"), [0.0, 0.0, 0.0],
                                          "not a floating tensor"),
    "a hint of another size": (("downstream", "hint"), torch.eye(4, dtype=torch.float64), "'downstream.hint' must be"),
    "a hint with NaN": (("downstream", "hint"), lambda h: h * float("nan"), "'downstream.hint' holds infinite"),
    "a hint without a start": (("downstream", "start"), None, "'downstream.hint' must be"),
    "another fit set": (("downstream", "fit"), "0" * 64, "'downstream.fit' is of another fit set"),
    "the head's state not a mapping": (("downstream",), [1], "'downstream' must hold the re-fitted head's"),
}


def _special(state, how):
    mask = first_mask(state)
    if how == "exp_avg shape":
        return edited(state, ("coalitions", "exp_avg", mask, "body.weight"), torch.zeros(2, 2, dtype=torch.float64))
    if how == "exp_avg_sq negative":
        return edited(state, ("coalitions", "exp_avg_sq", mask, "body.weight"), lambda t: -t - 1)
    return edited(state, ("coalitions", "exp_avg", mask, "body.bias"), lambda t: t * float("nan"))


@pytest.mark.parametrize("case", list(TAMPERED), ids=list(TAMPERED))
def test_a_tampered_or_partial_state_is_refused_naming_the_key(saved, case):
    path, value, message = TAMPERED[case]
    state = _special(saved, value) if path is None else edited(saved, path, value)
    model, opt = make()
    probe = probe_of(model, opt)
    before = probe.state_dict()
    with pytest.raises(InvalidParameterError, match=message) as error:
        probe.load_state_dict(state)
    assert "\n" not in str(error.value)
    after = probe.state_dict()  # nothing changed
    assert after["records"] == before["records"] and after["next_step"] == before["next_step"]


OTHER = {
    "another model's shapes under the same names": (lambda: make(width=5), {}, "'downstream.start' holds"),
    "another model's dtype": (lambda: make(dtype=torch.float32), {}, "'parameters' has 'embed.weight'"),
    "an AdamW probe": (lambda: make("adamw"), {}, "under Adam; this probe's optimizer is AdamW"),
    "other betas": (lambda: make(betas=(0.8, 0.99)), {}, "'optimizer' has betas=\\[0.9, 0.999\\]"),
    "another eps": (lambda: make(eps=1e-6), {}, "'optimizer' has eps=1e-08"),
    "weight decay": (lambda: make(weight_decay=0.01), {}, "'optimizer' has weight_decay=0"),
    "an SGD probe": (lambda: make("sgd"), {}, "under Adam"),
    "shared= another set": (make, {"shared": ["body.weight", "body.bias"]}, "this probe was given shared="),
    "shared= one of the set": (make, {"shared": ["embed.weight"]}, "this probe was given shared="),
    "shared= a larger set": (make, {"shared": BODY + ["token_head.weight"]}, "this probe was given shared="),
    "a frozen head": (make, {"refit": False}, "re-fitted downstream head; this probe's is frozen"),
    "another fit set": (make, {"fit": FIT[:1]}, "'downstream.fit' is of another fit set"),
    "the fit set in another order": (make, {"fit": FIT[::-1]}, "'downstream.fit' is of another fit set"),
}


@pytest.mark.parametrize("case", list(OTHER), ids=list(OTHER))
def test_a_state_of_another_probe_is_refused(saved, case):
    build, options, message = OTHER[case]
    model, opt = build()
    with pytest.raises(InvalidParameterError, match=message):
        probe_of(model, opt, **options).load_state_dict(saved)


def test_a_state_that_fits_goes_on_as_the_uninterrupted_probe():
    model, opt = make()
    whole = probe_of(model, opt)
    steps(model, opt, whole, 4)
    model, opt = make()
    first = probe_of(model, opt)
    steps(model, opt, first, 2)
    state = first.state_dict()
    model_state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    model, opt = make()
    model.load_state_dict(model_state)
    opt.load_state_dict(opt_state)
    resumed = probe_of(model, opt, shared=state["shared"])  # the same set given explicitly loads too
    resumed.load_state_dict(state)
    steps(model, opt, resumed, 2, skip=2)  # the loop's batches of steps 0 and 1 are already taken
    assert [r["downstream_loss"] for r in resumed.records] == pytest.approx(
        [r["downstream_loss"] for r in whole.records], rel=1e-10)
    assert resumed.records[-1]["alignment"]["tokens"]["dot"] == pytest.approx(
        whole.records[-1]["alignment"]["tokens"]["dot"], rel=1e-8)
