"""What used to end a probed loop in an internal error now gives the right numbers or one clear
error: a float32 model fed float inputs under the default float64 ``eval_dtype`` (``D`` equals a
float64 evaluation of the same inputs), a NaN in the fixed sets, a label outside the head's
classes, ``D*`` undefined mid-run, and a step a GradScaler skips (the probe skips it too)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import objreg
from objreg.core.errors import InvalidParameterError, NonFiniteLossError, ProbeStateError


class Features(nn.Module):
    """A model fed float features (no embedding): what a float32 loop hands over as float32."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)
        self.aux = nn.Linear(6, 2)

    def hidden(self, x):
        return torch.tanh(self.body(x))


def aux_loss(model, batch):
    return F.cross_entropy(model.aux(model.hidden(batch["x"])), batch["y"] % 2, reduction="none")


def task_loss(model, batch):
    return F.cross_entropy(model.head(model.hidden(batch["x"])), batch["y"], reduction="none")


def sample(seed, n, classes=3, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=generator).to(dtype),
            "y": torch.randint(classes, (n,), generator=generator)}


def build(dtype=torch.float32):
    torch.manual_seed(0)
    model = Features().to(dtype)
    return model, torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("head")], lr=0.1)


def one_step(model, opt, probe, batch):
    opt.zero_grad()
    aux_loss(model, batch).mean().backward()
    measured = probe.measure({"aux": batch})
    opt.step()
    return probe.finish(measured)


def float64_loss(model, batches):
    """``D`` by an independent float64 evaluation: the model and the inputs widened."""
    wide = copy.deepcopy(model).double()
    total = sum(task_loss(wide, {"x": b["x"].double(), "y": b["y"]}).sum() for b in batches)
    return float(total) / sum(len(b["y"]) for b in batches)


@pytest.mark.parametrize("eval_batches", [[sample(1, 9)], [sample(1, 9), sample(2, 5)]], ids=["one batch", "two"])
def test_a_float32_model_fed_float_inputs_gives_the_float64_d(eval_batches):
    model, opt = build()
    probe = objreg.TransferProbe(model, {"aux": aux_loss}, task_loss, opt, eval_batches=eval_batches)
    before = float64_loss(model, eval_batches)
    record = one_step(model, opt, probe, sample(3, 8))
    assert record["downstream_loss"] == pytest.approx(before, rel=1e-12)
    assert record["downstream_loss_after"] == pytest.approx(float64_loss(model, eval_batches), rel=1e-12)


def test_a_float32_model_fed_float_inputs_refits_its_head_on_the_float64_copy():
    model, opt = build()
    probe = objreg.TransferProbe(model, {"aux": aux_loss}, task_loss, opt, eval_batches=[sample(1, 9)],
                                 fit_batches=[sample(4, 16)], refit_head=model.head)
    record = one_step(model, opt, probe, sample(3, 8))
    # The same probe on the model made float64 by hand (inputs too) gives the same D* to rounding.
    wide, wide_opt = build(torch.float64)
    wide.load_state_dict({k: v.double() for k, v in build()[0].state_dict().items()})

    def widen(batch):
        return {"x": batch["x"].double(), "y": batch["y"]}

    reference = objreg.TransferProbe(wide, {"aux": aux_loss}, task_loss, wide_opt, eval_batches=[widen(sample(1, 9))],
                                     fit_batches=[widen(sample(4, 16))], refit_head=wide.head)
    expected = one_step(wide, wide_opt, reference, widen(sample(3, 8)))
    assert record["downstream_loss"] == pytest.approx(expected["downstream_loss"], rel=1e-10)


def _poisoned(seed, n, where, value):
    batch = sample(seed, n, dtype=torch.float64)
    batch["x"][where] = value
    return batch


NOT_FINITE = {
    "a NaN in the fit set": ({"fit_batches": [_poisoned(4, 16, (3, 1), float("nan"))]}, r"fit_batches\[0\]"),
    "an inf in the fit set's second batch": ({"fit_batches": [sample(4, 8, dtype=torch.float64),
                                                              _poisoned(5, 8, (0, 0), float("inf"))]},
                                             r"fit_batches\[1\]"),
    "a NaN in the evaluation set": ({"eval_batches": [_poisoned(1, 9, (2, 2), float("nan"))]}, r"eval_batches\[0\]"),
    "a -inf in the evaluation set's second batch": ({"eval_batches": [sample(1, 9, dtype=torch.float64),
                                                                      _poisoned(2, 5, (4, 3), float("-inf"))]},
                                                    r"eval_batches\[1\]"),
}


@pytest.mark.parametrize("case", list(NOT_FINITE), ids=list(NOT_FINITE))
def test_a_fixed_set_that_is_not_finite_is_refused_naming_it(case):
    change, where = NOT_FINITE[case]
    model, opt = build(torch.float64)
    options = {"eval_batches": [sample(1, 9, dtype=torch.float64)], "fit_batches": [sample(4, 16, dtype=torch.float64)],
               "refit_head": model.head, **change}
    with pytest.raises(InvalidParameterError, match=where + " holds a NaN or infinite value"):
        objreg.TransferProbe(model, {"aux": aux_loss}, task_loss, opt, **options)


def _labels(batch, labels):
    return {**batch, "y": torch.tensor(labels)}


BAD_SETS = {
    "a fit label above the classes": ("fit_batches", lambda: [_labels(sample(4, 4, dtype=torch.float64), [0, 1, 5, 2])],
                                      r"fails on fit_batches\[0\]: IndexError"),
    "a negative fit label": ("fit_batches", lambda: [_labels(sample(4, 4, dtype=torch.float64), [0, -1, 1, 2])],
                             r"fails on fit_batches\[0\]: IndexError"),
    "an evaluation label above the classes": ("eval_batches",
                                              lambda: [sample(1, 4, dtype=torch.float64),
                                                       _labels(sample(2, 3, dtype=torch.float64), [3, 0, 1])],
                                              r"fails on eval_batches\[1\]: IndexError"),
    "a fit batch without its labels": ("fit_batches", lambda: [{"x": sample(4, 4, dtype=torch.float64)["x"]}],
                                       r"fails on fit_batches\[0\]: KeyError"),
}


@pytest.mark.parametrize("case", list(BAD_SETS), ids=list(BAD_SETS))
def test_a_set_the_downstream_loss_cannot_read_is_one_line_naming_the_batch(case):
    key, batches, message = BAD_SETS[case]
    model, opt = build(torch.float64)
    options = {"eval_batches": [sample(1, 9, dtype=torch.float64)], "fit_batches": [sample(4, 16, dtype=torch.float64)],
               "refit_head": model.head, key: batches()}
    with pytest.raises(InvalidParameterError, match=message) as error:
        objreg.TransferProbe(model, {"aux": aux_loss}, task_loss, opt, **options)
    assert "\n" not in str(error.value)


def test_d_star_undefined_mid_run_is_a_non_finite_loss_error():
    from objreg.analysis.math.downstream import Downstream
    from objreg.analysis.math.functional import CallableLoss, named_shared
    from objreg.analysis.math.refit import RefitDownstream

    model, _ = build(torch.float64)
    loss = CallableLoss("downstream", task_loss, role="downstream loss")
    fit = Downstream.of_batches(loss, [sample(4, 16, dtype=torch.float64)])
    refit = RefitDownstream.of_batches(loss, [sample(1, 9, dtype=torch.float64)], head=("head.weight", "head.bias"),
                                       fit_set=fit)
    refit.shared = ("body.weight", "body.bias")
    with torch.no_grad():
        model.body.weight.fill_(float("inf"))  # the backbone diverged: every feature NaN
    shared = {n: p.detach() for n, p in named_shared(model, refit.shared).items()}
    with pytest.raises(NonFiniteLossError, match="D\\* is undefined here"):
        refit.curvature(model, shared)


def _scaled_loop(steps, skipped, accumulate_at=None):
    """Attached under a CPU GradScaler; the gradient made infinite on the ``skipped`` steps."""
    from probe_stand_ins import EVAL, LOSSES, WEIGHTS, make, step_batches
    from probe_stand_ins import task_loss as stand_in_task

    model, opt = make("sgd")
    probe = objreg.TransferProbe(model, LOSSES, stand_in_task, opt, eval_batches=EVAL, weights=WEIGHTS).attach(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    generator = torch.Generator().manual_seed(1)
    taken = 0
    for step in range(steps):
        batches = step_batches(generator)
        opt.zero_grad()
        scaler.scale(sum(w * LOSSES[k](model, batches[k]).mean() for k, w in WEIGHTS.items())).backward()
        if step in skipped:
            model.body.weight.grad[1, 2] = float("inf")
        scaler.unscale_(opt)
        probe.observe(batches)
        if step == accumulate_at:
            probe.observe(batches)
        before = model.body.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        taken += not torch.equal(before, model.body.weight)
    return probe, taken


@pytest.mark.parametrize("skipped", [{1}, {0}, {1, 2}, {3}], ids=["one", "the first", "two in a row", "the last"])
def test_a_step_a_grad_scaler_skips_is_skipped_by_the_probe_too(skipped):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe, taken = _scaled_loop(5, skipped)
    assert taken == 5 - len(skipped)
    # One record per step the optimizer took (a skip at the last step leaves an observation unused).
    assert len(probe.records) == taken and [r["step"] for r in probe.records] == list(range(taken))
    assert sum("was skipped" in str(w.message) for w in caught) == 1  # warned once


def test_two_observations_of_finite_gradients_are_still_refused():
    with pytest.raises(ProbeStateError, match="the gradients of the first were finite"):
        _scaled_loop(3, set(), accumulate_at=1)


def _diverging_step(how):
    """One measured SGD step on the stand-in after which D is not finite, for one cause."""
    from probe_stand_ins import EVAL, LOSSES, WEIGHTS, make, step_batches
    from probe_stand_ins import task_loss as stand_in_task

    model, opt = make("sgd", lr=1.0 if how != "lr" else 1e300)
    probe = objreg.TransferProbe(model, LOSSES, stand_in_task, opt, eval_batches=EVAL, weights=WEIGHTS)
    batches = step_batches(torch.Generator().manual_seed(1))
    opt.zero_grad()
    sum(w * LOSSES[k](model, batches[k]).mean() for k, w in WEIGHTS.items()).backward()
    measured = probe.measure(batches)
    if how == "nan gradient":
        model.body.weight.grad[0, 1] = float("nan")  # what a log(0) in the backward leaves
    elif how == "inf gradient":
        model.body.weight.grad[0, 0], model.body.weight.grad[0, 1] = float("inf"), -float("inf")  # inf − inf ahead
    elif how == "nan weight":  # a weight broken by the loop itself, its gradient finite
        opt.step()
        with torch.no_grad():
            model.body.bias[0] = float("nan")
        return probe, measured, True
    opt.step()
    return probe, measured, False


@pytest.mark.parametrize("how, cause", [
    ("nan gradient", "gradient of 'body.weight' was not finite .* the learning rate is not the cause"),
    ("inf gradient", "gradient of 'body.weight' was not finite .* the learning rate is not the cause"),
    ("lr", "the weights are finite, so the loss returns NaN or inf there .*, or the step diverged; try a smaller "
           "learning rate"),
    ("nan weight", "made 'body.bias' infinite or NaN from a finite gradient"),
])
def test_a_step_that_breaks_d_names_its_cause(how, cause):
    probe, measured, _ = _diverging_step(how)
    with pytest.raises(NonFiniteLossError, match="is not finite after step 0 .*" + cause) as error:
        probe.finish(measured)
    assert "\n" not in str(error.value)
