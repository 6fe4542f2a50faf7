"""The library and probe API's table of what objreg cannot measure (issue 30), built as
``tests/test_bad_inputs.py`` is for the CLI: one row per case, by class of the issue, each with
one of three outcomes, never silent wrong numbers:

* :class:`Raises`: one clear error, of its type, in one line naming the culprit;
* :class:`Numbers`: what objreg gives equals an independent computation (float64 autograd on a
  copy of the model, a closed form, the expected label set);
* :class:`Flagged`: the record carries ``update.decomposition_flagged`` and the probe warned once,
  naming what it saw.

The classes: ``inputs`` (losses, batches, gradients and arguments the probe is handed), ``split``
(the step it split is not the step taken), ``hf`` (Hugging Face folders that are not what they
say), ``processes`` (ranks that disagree or stop), ``files`` (run and experiment directories),
``data`` (numeric labels) and ``smaller`` (one-line items). The tiny models cost microseconds to
build; the Hugging Face folder and the tokenizer are built once per module.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from probe_stand_ins import BATCH as B
from probe_stand_ins import EVAL, LENGTH, LOSSES, VOCAB, WEIGHTS, Tiny, make, pair_loss, task_loss, token_loss
from probe_stand_ins import batch as batch_of
from probe_stand_ins import step_batches as batches_from
from torch import nn

import objreg
from objreg.analysis.parallel import launch
from objreg.analysis.parallel.group import Group, ProcessGroup
from objreg.analysis.probe.split_check import TOLERANCE
from objreg.analysis.probe.writer import RunWriter
from objreg.analysis.run import analyze as analyze_module
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.rundir import LOCK_FILE, claim
from objreg.cli import make_cli
from objreg.core.errors import (
    DataError,
    DistributedError,
    InvalidParameterError,
    NonFiniteLossError,
    ObjregError,
    ProbeStateError,
    UnknownNameError,
)
from objreg.toolkit.classfiles import read_classification

SHARED = ["embed.weight", "body.weight", "body.bias"]
LR = 0.05  # the stand-ins' make() default
TEXT = "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof."


# -- the stand-ins (tests/analysis/probe_stand_ins.py) ------------------------------------------------


def step_batches(seed: int = 1) -> dict[str, dict[str, torch.Tensor]]:
    return batches_from(torch.Generator().manual_seed(seed))


def probe_of(model, opt, objectives=None, downstream=task_loss, eval_batches=EVAL, **options):
    return objreg.TransferProbe(model, objectives or dict(LOSSES), downstream, opt, eval_batches=eval_batches,
                                weights=options.pop("weights", WEIGHTS), **options)


def backward(model, opt, batches, weights=WEIGHTS, losses=LOSSES):
    opt.zero_grad()
    sum(w * losses[k](model, batches[k]).mean() for k, w in weights.items()).backward()


def one_step(probe, model, opt, batches=None, **measure):
    """The plain loop's step: backward, measure, optimizer step, finish."""
    batches = batches or step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches, **measure)
    opt.step()
    return probe.finish(measured)


def steps(probe, model, opt, count, **measure):
    return [one_step(probe, model, opt, step_batches(seed), **measure) for seed in range(1, count + 1)]


def mean_gradients(model, batches, shared=SHARED, losses=LOSSES):
    """Each objective's mean-loss gradient on the shared parameters, as a loop would hand them over."""
    params = dict(model.named_parameters())
    return {k: dict(zip(shared, torch.autograd.grad(losses[k](model, batches[k]).mean(), [params[n] for n in shared])))
            for k in losses}


def reference(model, batches, shared=SHARED, eval_batches=EVAL, downstream=task_loss, losses=LOSSES):
    """Independently, in float64 autograd on a copy of the model (eval mode): D, ‖∇D‖ and each
    objective's alignment dot ⟨g_k, ∇D⟩ (= the mean of the per-example dots)."""
    twin = copy.deepcopy(model).double().eval()
    params = dict(twin.named_parameters())
    wrt = [params[n] for n in shared]
    d = torch.cat([downstream(twin, {k: v for k, v in b.items()}) for b in eval_batches]).mean()
    grad_d = torch.cat([g.reshape(-1) for g in torch.autograd.grad(d, wrt)])
    out = {"D": float(d), "grad_norm": float(grad_d.norm())}
    for k, fn in losses.items():
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(fn(twin, batches[k]).mean(), wrt)])
        out[k] = float(g @ grad_d)
    return out


def against_reference(record, expected, rtol):
    """(name, got, expected, rtol) rows comparing a record with :func:`reference`."""
    rows = [("D", record["downstream_loss"], expected["D"], rtol),
            ("‖∇D‖", record["downstream_grad_norm"], expected["grad_norm"], rtol)]
    return rows + [(f"dot {k}", record["alignment"][k]["dot"], expected[k], rtol) for k in LOSSES]


# -- outcomes -------------------------------------------------------------------------------------------


@dataclass
class Raises:
    error: type[BaseException]
    texts: tuple[str, ...]

    def __init__(self, error: type[BaseException], *texts: str):
        self.error, self.texts = error, texts


@dataclass
class Flagged:
    texts: tuple[str, ...]

    def __init__(self, *texts: str):
        self.texts = texts


@dataclass
class Numbers:
    """The case returns rows ``(name, got, expected, rtol)`` (``rtol`` None: equal)."""


@dataclass
class Case:
    cls: str
    id: str
    run: Callable[[Any], Any]
    outcome: Raises | Flagged | Numbers = field(default_factory=Numbers)


CASES: list[Case] = []


def case(cls: str, id: str, outcome: Raises | Flagged | Numbers | None = None):
    def register(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
        CASES.append(Case(cls, id, run, outcome or Numbers()))
        return run

    return register


def add(cls: str, id: str, run: Callable[[Any], Any], outcome: Raises | Flagged | Numbers | None = None) -> None:
    CASES.append(Case(cls, id, run, outcome or Numbers()))


# == 1. inputs: the probe trusts nothing it is handed =====================================================

#: What a broken loss function returns instead of one loss per example, from the right losses ``l``
#: ([B]): the name, the function, and what the message must say it returned.
RETURNS: list[tuple[str, Callable[[torch.Tensor], Any], str]] = [
    ("per-token [B, T]", lambda l: l[:, None].expand(-1, LENGTH), "shape [{B}, 5] (one value per token"),
    ("[B, 1]", lambda l: l[:, None], "shape [{B}, 1]"),
    ("batch mean", lambda l: l.mean(), "shape [] (a single number"),
    ("batch sum", lambda l: l.sum(), "shape [] (a single number"),
    ("one row too many", lambda l: torch.cat([l, l[:1]]), "shape [{B1}] (not one value per example"),
    ("one row short", lambda l: l[:-1], "shape [{Bm}] (not one value per example"),
    ("rows repeated", lambda l: l.repeat(2), "shape [{B2}]"),
    ("first row only", lambda l: l[:1], "shape [1]"),
    ("per-token logits [B, T, V]", lambda l: l[:, None, None].expand(-1, LENGTH, VOCAB), "shape [{B}, 5, 11]"),
    ("int64", lambda l: l.long(), "a torch.int64 tensor"),
    ("int32", lambda l: l.int(), "a torch.int32 tensor"),
    ("bool", lambda l: l > 1, "a torch.bool tensor"),
    ("complex", lambda l: l.to(torch.complex128), "a torch.complex128 tensor"),
    ("a float", lambda l: float(l.mean()), "it returned float"),
    ("None", lambda l: None, "it returned NoneType"),
    ("a list", lambda l: l.tolist(), "it returned list"),
    ("a numpy array", lambda l: l.detach().numpy(), "it returned ndarray"),
    ("a tuple", lambda l: (l, l), "it returned tuple"),
    ("a dict", lambda l: {"loss": l}, "it returned dict"),
]


def _returning(base: Callable, change: Callable) -> Callable:
    def broken(model, batch):
        return change(base(model, batch))

    return broken


def _objective_returns(change: Callable) -> Callable[[Any], Any]:
    def run(c):
        model, opt = make()
        probe = probe_of(model, opt, objectives={"tokens": _returning(token_loss, change), "pairs": pair_loss})
        return one_step(probe, model, opt)

    return run


def _downstream_returns(change: Callable) -> Callable[[Any], Any]:
    def run(c):
        model, opt = make()
        return probe_of(model, opt, downstream=_returning(task_loss, change))

    return run


for name, change, said in RETURNS:
    objective_said = said.format(B=B, B1=B + 1, Bm=B - 1, B2=2 * B)
    add("inputs", f"objective returns {name}", _objective_returns(change),
        Raises(InvalidParameterError, "objective 'tokens' (_returning.<locals>.broken)",
               f"must return one loss per example, a floating tensor of shape [{B}]", objective_said))
    downstream_said = said.format(B=12, B1=13, Bm=11, B2=24)
    add("inputs", f"downstream returns {name}", _downstream_returns(change),
        Raises(InvalidParameterError, "the downstream loss (_returning.<locals>.broken)",
               "must return one loss per example, a floating tensor of shape [12]", downstream_said))


def _per_token_with_gradients(method: str) -> Callable[[Any], Any]:
    """The loop hands its gradients over, so the first call of the loss is the per-sample method's own."""

    def run(c):
        model, opt = make()
        per_token = _returning(token_loss, lambda l: l[:, None].expand(-1, LENGTH))
        probe = probe_of(model, opt, objectives={"tokens": per_token, "pairs": pair_loss}, shared=SHARED,
                         per_sample_method=method)
        batches = step_batches()
        backward(model, opt, batches)
        return probe.measure(batches, gradients=mean_gradients(model, batches))

    return run


for method in ("ghost", "jvp", "double_backward", "vmap", "loop"):
    add("inputs", f"per-token loss reached first by per_sample_method={method}", _per_token_with_gradients(method),
        Raises(InvalidParameterError, "objective 'tokens'", "must return one loss per example", "one value per token"))


def _nan_where(rows: torch.Tensor, value: float) -> Callable:
    def change(l):
        return torch.where(rows[: l.shape[0]], torch.full_like(l, value), l)

    return change


for name, rows, value, count in [
    ("NaN in one example", torch.arange(B) == 3, float("nan"), 1),
    ("NaN everywhere", torch.ones(B, dtype=torch.bool), float("nan"), B),
    ("+inf in two examples", torch.arange(B) < 2, float("inf"), 2),
    ("-inf in one example", torch.arange(B) == 7, float("-inf"), 1),
]:
    add("inputs", f"objective loss with {name}", _objective_returns(_nan_where(rows, value)),
        Raises(InvalidParameterError, "objective 'tokens'", f"returned a non-finite loss ({value}) for {count} of {B} "
               f"examples at step 0"))

for name, value in [("NaN", float("nan")), ("+inf", float("inf"))]:
    add("inputs", f"downstream loss with {name} on its first batch",
        _downstream_returns(_nan_where(torch.arange(12) == 0, value)),
        Raises(InvalidParameterError, "the downstream loss", f"returned a non-finite loss ({value}) for 1 of 12",
               "on the first evaluation batch"))


def _switch(base: Callable, state: dict) -> Callable:
    def fn(model, batch):
        losses = base(model, batch)
        return losses * float("nan") if state["bad"] else losses

    return fn


@case("inputs", "objective loss turning NaN at a later measure",
      Raises(InvalidParameterError, "objective 'pairs' (_switch.<locals>.fn) returned a non-finite loss", "at step 2"))
def _later_nan(c):
    state = {"bad": False}
    model, opt = make()
    probe = probe_of(model, opt, objectives={"tokens": token_loss, "pairs": _switch(pair_loss, state)})
    steps(probe, model, opt, 2)
    state["bad"] = True
    return one_step(probe, model, opt, step_batches(3))


@case("inputs", "downstream loss NaN only on a later evaluation batch",
      Raises(InvalidParameterError, "the downstream loss (_nan_second_chunk.<locals>.fn) is not finite at step 0 "
             "(D = nan)"))
def _nan_second_chunk(c):
    model, opt = make()

    def fn(m, batch):
        losses = task_loss(m, batch)
        return losses * float("nan") if batch["ids"].shape[0] == 5 else losses

    return one_step(probe_of(model, opt, downstream=fn), model, opt)


@case("inputs", "downstream loss turning NaN at a later measure",
      Raises(NonFiniteLossError, "the downstream loss (_switch.<locals>.fn) is not finite after step 1"))
def _later_downstream_nan(c):
    state = {"bad": False}
    model, opt = make()
    probe = probe_of(model, opt, downstream=_switch(task_loss, state))
    steps(probe, model, opt, 1)
    state["bad"] = True
    return one_step(probe, model, opt, step_batches(2))


@case("inputs", "downstream loss NaN after the step",
      Raises(NonFiniteLossError, "the downstream loss (_switch.<locals>.fn) is not finite after step 0"))
def _nan_after_step(c):
    state = {"bad": False}
    model, opt = make()
    probe = probe_of(model, opt, downstream=_switch(task_loss, state))
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    opt.step()
    state["bad"] = True
    return probe.finish(measured)


@case("inputs", "objective loss detached from the parameters",
      Raises(InvalidParameterError, "objective 'tokens' (_returning.<locals>.broken) does not depend on the shared "
             "parameters"))
def _detached_objective(c):
    return _objective_returns(lambda l: l.detach())(c)


add("inputs", "downstream loss detached from the parameters", _downstream_returns(lambda l: l.detach()),
    Raises(InvalidParameterError, "the downstream loss reaches none of the trainable parameters", "torch.no_grad()"))


@case("inputs", "bf16 autocast in the loop: measured in the model's dtype")
def _bf16_autocast(c):
    model, opt = make(dtype=torch.float32)
    probe = probe_of(model, opt)
    batches = step_batches()
    expected = reference(model, batches)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        backward(model, opt, batches)
        measured = probe.measure(batches)
    opt.step()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        record = probe.finish(measured)
    # The probe's numbers are the model's own; the step the loop took used bf16 gradients, which the
    # float32 split does not add up to: said so, not hidden.
    return [*against_reference(record, expected, 1e-4),
            ("flagged", record["update"].get("decomposition_flagged"), True, None),
            ("warned", any(".grad is not the weighted sum" in str(w.message) for w in said), True, None)]


@case("inputs", "fp16 autocast in the loop: measured in the model's dtype")
def _fp16_autocast(c):
    model, opt = make(dtype=torch.float32)
    probe = probe_of(model, opt, shared=SHARED)
    batches = step_batches()
    expected = reference(model, batches)
    backward(model, opt, batches)
    gradients = mean_gradients(model, batches)  # the loop's own, handed over
    with torch.autocast("cpu", dtype=torch.float16):
        measured = probe.measure(batches, gradients=gradients, losses={"tokens": 1.0, "pairs": 1.0})
    opt.step()
    record = probe.finish(measured)
    return against_reference(record, expected, 1e-4)


@case("inputs", "a torch.compile'd model is probed through its own module")
def _compiled(c):
    model, opt = make()
    compiled = torch.compile(model)
    probe = objreg.TransferProbe(compiled, dict(LOSSES), task_loss, opt, eval_batches=EVAL, weights=WEIGHTS)
    batches = step_batches()
    expected = reference(model, batches)
    record = one_step(probe, model, opt, batches)
    return [*against_reference(record, expected, 1e-10),
            ("shared names", sorted(probe.shared_parameters), sorted(SHARED), None)]


@case("inputs", "the probe holds a compiled model's own module")
def _nested_wrappers(c):
    model, opt = make()
    probe = objreg.TransferProbe(torch.compile(model), dict(LOSSES), task_loss, opt, eval_batches=EVAL,
                                 weights=WEIGHTS)
    return [("the probe's model", probe.model is model, True, None)]


for id, eval_batches, texts in [
    ("a 0-row evaluation batch", [batch_of(torch.Generator().manual_seed(3), 3, 0)],
     ("eval_batches[0] has no rows",)),
    ("a 0-row evaluation batch after a good one", [EVAL[0], batch_of(torch.Generator().manual_seed(3), 3, 0)],
     ("eval_batches[1] has no rows",)),
    ("an evaluation batch on another device", [{k: v.to("meta") for k, v in EVAL[0].items()}],
     ("eval_batches[0] is on meta but the model on cpu",)),
    ("an evaluation batch without tensors", [{"ids": [[1, 2]], "y": [0]}],
     ("a batch must hold at least one tensor",)),
    ("no evaluation batches", [], ("eval_batches is empty",)),
    ("eval_batches None", None, ("eval_batches is required",)),
]:
    add("inputs", id, lambda c, e=eval_batches: probe_of(*make(), eval_batches=e), Raises(InvalidParameterError, *texts))


def _measure_with(**given) -> Callable[[Any], Any]:
    def run(c):
        model, opt = make()
        probe = probe_of(model, opt, shared=SHARED)
        batches = given.pop("batches", None) or step_batches()
        backward(model, opt, step_batches())
        gradients = given.pop("gradients", None)
        if callable(gradients):
            gradients = gradients(mean_gradients(model, step_batches()))
        return probe.measure(batches, gradients=gradients, **given)

    return run


def _edit(objective: str, name: str, value: Callable) -> Callable:
    def change(gradients):
        gradients[objective][name] = value(gradients[objective][name])
        return gradients

    return change


for id, batches, texts in [
    ("a 0-row objective batch", {**step_batches(), "tokens": batch_of(torch.Generator().manual_seed(4), VOCAB, 0)},
     ("batches['tokens'] has no rows",)),
    ("an objective batch on another device",
     {**step_batches(), "pairs": {k: v.to("meta") for k, v in step_batches()["pairs"].items()}},
     ("batches['pairs'] is on meta but the model on cpu",)),
    ("batches missing an objective", {"tokens": step_batches()["tokens"]}, ("batches must map every objective",)),
    ("batches naming an unknown objective", {**step_batches(), "sop": step_batches()["pairs"]},
     ("batches must map every objective",)),
    ("batches a list", [step_batches()["tokens"]], ("batches must map every objective", "got list")),
]:
    add("inputs", id, _measure_with(batches=batches), Raises(InvalidParameterError, *texts))

for id, gradients, texts in [
    ("gradients a list", lambda g: [g["tokens"]], ("gradients must map every objective", "got list")),
    ("gradients missing an objective", lambda g: {"tokens": g["tokens"]}, ("gradients must map every objective",)),
    ("gradients of an unknown objective", lambda g: {**g, "sop": g["pairs"]}, ("gradients must map every objective",)),
    ("gradients of an objective an int", lambda g: {**g, "tokens": 3}, ("gradients['tokens'] must be a dict", "int")),
    ("gradients empty for an objective", lambda g: {**g, "pairs": {}},
     ("gradients['pairs'] lacks 3 of the 3 shared parameters",)),
    ("gradients missing a parameter", lambda g: {**g, "tokens": {"embed.weight": g["tokens"]["embed.weight"]}},
     ("gradients['tokens'] lacks 2 of the 3 shared parameters", "'body.weight'")),
    ("a gradient of the wrong shape", _edit("tokens", "body.weight", lambda t: t[:3]),
     ("gradients['tokens']['body.weight'] must be a floating tensor of the parameter's shape [6, 6]", "[3, 6]")),
    ("an integer gradient", _edit("pairs", "body.bias", lambda t: t.long()), ("torch.int64 tensor",)),
    ("a gradient that is a list", _edit("pairs", "body.bias", lambda t: t.tolist()),
     ("gradients['pairs']['body.bias'] must be a floating tensor", "got list")),
    ("a NaN gradient", _edit("tokens", "embed.weight", lambda t: t * float("nan")),
     ("gradients['tokens']['embed.weight'] is not finite",)),
    ("an infinite gradient", _edit("pairs", "body.weight", lambda t: t / 0.0), ("is not finite (NaN or inf)",)),
    ("a gradient on another device", _edit("tokens", "body.bias", lambda t: t.to("meta")),
     ("gradients['tokens']['body.bias'] is on meta, the parameter on cpu",)),
]:
    add("inputs", id, _measure_with(gradients=gradients), Raises(InvalidParameterError, *texts))

for id, losses, texts in [
    ("losses NaN", {"tokens": float("nan"), "pairs": 1.0}, ("losses['tokens'] must be a finite number",)),
    ("losses infinite", {"tokens": 1.0, "pairs": float("inf")}, ("losses['pairs'] must be a finite number",)),
    ("losses a string", {"tokens": "2.3", "pairs": 1.0}, ("losses['tokens'] must be a finite number", "'2.3'")),
    ("losses missing an objective", {"tokens": 1.0}, ("losses must map every objective",)),
    ("losses a list", [1.0, 2.0], ("losses must map every objective", "got list")),
]:
    add("inputs", id, _measure_with(gradients=lambda g: g, losses=losses), Raises(InvalidParameterError, *texts))

for id, weights, texts in [
    ("weights missing an objective", {"tokens": 1.0}, ("weights must give one weight per objective",)),
    ("weights naming an unknown objective", {**WEIGHTS, "sop": 1.0}, ("weights must give one weight per objective",)),
    ("weights NaN", {"tokens": float("nan"), "pairs": 1.0}, ("weights must be finite numbers; tokens is not",)),
    ("weights infinite", {"tokens": 1.0, "pairs": float("-inf")}, ("weights must be finite numbers; pairs is not",)),
    ("weights a string", {"tokens": "1", "pairs": 1.0}, ("weights must be numbers; 'tokens' is str",)),
    ("weights None", {"tokens": None, "pairs": 1.0}, ("weights must be numbers; 'tokens' is NoneType",)),
    ("weights a bool", {"tokens": True, "pairs": 1.0}, ("weights must be numbers; 'tokens' is bool",)),
]:
    add("inputs", f"measure: {id}", _measure_with(weights=weights), Raises(InvalidParameterError, *texts))

for id, step, texts in [("step negative", -1, ("step must be an integer ≥ 0", "-1")),
                        ("step a float", 2.5, ("step must be an integer ≥ 0", "2.5")),
                        ("step a string", "3", ("step must be an integer ≥ 0", "'3'"))]:
    add("inputs", f"measure: {id}", _measure_with(step=step), Raises(InvalidParameterError, *texts))


@case("inputs", "numbers as numpy scalars and one-element tensors are taken")
def _scalar_kinds(c):
    model, opt = make()
    probe = probe_of(model, opt, weights={"tokens": np.float64(1.0), "pairs": torch.tensor(0.5)})
    batches = step_batches()
    expected = reference(model, batches)
    backward(model, opt, batches)
    measured = probe.measure(batches, losses={"tokens": torch.tensor(2.0), "pairs": np.float32(1.5)},
                             gradients=mean_gradients(model, batches))
    opt.step()
    record = probe.finish(measured)
    return [*against_reference(record, expected, 1e-10), ("weights", record["weights"], WEIGHTS, None),
            ("losses", record["losses"], {"tokens": 2.0, "pairs": 1.5}, None)]


@case("inputs", "report() before any record", Raises(ProbeStateError, "report() summarises the finished records",
                                                      "there are none yet"))
def _report_early(c):
    return probe_of(*make()).report()


def _construct(**change) -> Callable[[Any], Any]:
    def run(c):
        model, opt = make(**change.pop("make", {}))
        arguments = {"model": model, "objectives": dict(LOSSES), "downstream": task_loss, "optimizer": opt,
                     "eval_batches": EVAL, "weights": WEIGHTS, **change}
        return objreg.TransferProbe(arguments.pop("model"), arguments.pop("objectives"), arguments.pop("downstream"),
                                    arguments.pop("optimizer"), **arguments)

    return run


for id, change, texts in [
    ("shared D never reaches", {"shared": ["token_head.weight", "pair_head.bias"]},
     ("the downstream loss reaches none of the 2 shared parameters", "'token_head.weight'")),
    ("shared the optimizer does not hold", {"shared": ["body.weight", "task_head.weight"]},
     ("shared names 1 parameters the optimizer does not update: 'task_head.weight'",)),
    ("shared filter selecting none", {"shared": lambda n, p: False}, ("no shared parameters",)),
    ("shared a string", {"shared": "body.weight"}, ("shared must be a list of parameter names",)),
    ("shared an unknown name", {"shared": ["body.weight", "nope"]}, ("no trainable parameter called: 'nope'",)),
    ("model not a module", {"model": "tiny"}, ("model must be a torch.nn.Module",)),
    ("optimizer not an optimizer", {"optimizer": object()}, ("optimizer must be a torch.optim.Optimizer",)),
    ("objectives empty", {"objectives": {}}, ("objectives must be a non-empty mapping",)),
    ("an objective that is not callable", {"objectives": {"tokens": 3}}, ("objective 'tokens' must be a per-sample",)),
    ("downstream not callable", {"downstream": 5}, ("downstream must be a per-sample loss",)),
    ("batch_coupled naming no objective", {"batch_coupled": ["sop"]}, ("batch_coupled names ['sop']",)),
    ("per_sample_method unknown", {"per_sample_method": "magic"}, ("per_sample_method must be one of",)),
    ("hvp_method unknown", {"hvp_method": "fd"}, ("hvp_method must be one of",)),
    ("eval_dtype an integer dtype", {"eval_dtype": torch.int64}, ("eval_dtype must be a floating torch.dtype",)),
    ("SGD with momentum", {"make": {"momentum": 0.9}}, ("plain SGD only",)),
    ("SGD with weight decay", {"make": {"weight_decay": 0.1}}, ("plain SGD only",)),
    ("Adam with amsgrad", {"make": {"optimizer": "adam", "amsgrad": True}}, ("without amsgrad or maximize",)),
    ("Adam maximizing", {"make": {"optimizer": "adam", "maximize": True}}, ("without amsgrad or maximize",)),
    ("an optimizer it cannot split", {"make": {"cls": torch.optim.RMSprop}}, ("cannot split the step of RMSprop",)),
]:
    add("inputs", f"TransferProbe: {id}", _construct(**change), Raises(InvalidParameterError, *texts))


@case("inputs", "attach: every 0", Raises(InvalidParameterError, "every must be a positive integer, got 0"))
def _attach_every(c):
    return probe_of(*make()).attach(every=0)


@case("inputs", "attach: another optimizer",
      Raises(InvalidParameterError, "attach() takes the optimizer the probe was made with"))
def _attach_other(c):
    model, opt = make()
    return probe_of(model, opt).attach(torch.optim.SGD(model.parameters(), lr=0.1))


@case("inputs", "load_state_dict: not a state", Raises(InvalidParameterError, "not a TransferProbe state_dict"))
def _bad_state(c):
    return probe_of(*make()).load_state_dict({"format": 99})


# == 2. split: the step the probe split is not the step the optimizer took ==================================


def _flag_run(optimizer="sgd", strict=False, **make_options) -> Callable[[Callable], Callable[[Any], Any]]:
    """A case whose loop body ``body(model, opt, probe)`` returns the record(s)."""

    def wrap(body: Callable) -> Callable[[Any], Any]:
        def run(c):
            model, opt = make(optimizer, **make_options)
            return body(model, opt, probe_of(model, opt, strict=strict))

        return run

    return wrap


@case("split", "the loop's weights differ from the probe's", Flagged("the step's parts miss Δθ by", "other weights"))
@_flag_run()
def _other_weights(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches, weights={"tokens": 0.5, "pairs": 1.0})
    measured = probe.measure(batches)
    opt.step()
    return probe.finish(measured)


@case("split", "Adam: the loop's weights differ from the probe's",
      Flagged("the optimizer's .grad is not the weighted sum of the objectives' gradients"))
@_flag_run("adam")
def _adam_other_weights(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches, weights={"tokens": 0.2, "pairs": 1.0})
    measured = probe.measure(batches)
    opt.step()
    return probe.finish(measured)


def _micro_batches(model, opt, probe):
    """Gradient accumulation: two micro-batches stepped together, the probe handed the first."""
    first, second = step_batches(1), step_batches(2)
    backward(model, opt, first)
    sum(w * LOSSES[k](model, second[k]).mean() for k, w in WEIGHTS.items()).backward()
    measured = probe.measure(first)
    opt.step()
    return probe.finish(measured)


add("split", "one micro-batch of several (SGD)", _flag_run()(_micro_batches), Flagged("the step's parts miss Δθ by",
                                                                                        "micro-batch"))
add("split", "one micro-batch of several (AdamW)", _flag_run("adamw")(_micro_batches),
    Flagged("the optimizer's .grad is not the weighted sum", "micro-batch"))


@case("split", "dropout in the loop's backward", Flagged("the step's parts miss Δθ by", "dropout"))
@_flag_run(dropout=0.5)
def _dropout(model, opt, probe):
    torch.manual_seed(3)
    return one_step(probe, model, opt)


class DoubledSGD(torch.optim.SGD):
    """An SGD subclass whose own step takes twice torch's."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-2 * group["lr"])


class LoggingSGD(torch.optim.SGD):
    """An SGD subclass that adds nothing to torch's step."""

    def step(self, closure=None):
        return super().step(closure)


add("split", "an SGD subclass with its own step", _flag_run(cls=DoubledSGD)(lambda m, o, p: one_step(p, m, o)),
    Flagged("DoubledSGD overrides step(), and the probe splits the step of torch.optim.SGD"))


@case("split", "an SGD subclass that keeps torch's step is not flagged")
def _logging_sgd(c):
    model, opt = make(cls=LoggingSGD)
    probe = probe_of(model, opt)
    batches = step_batches()
    expected = reference(model, batches)
    record = one_step(probe, model, opt, batches)
    return [*against_reference(record, expected, 1e-10), ("flagged", "decomposition_flagged" in record["update"],
                                                          False, None)]


@case("split", "a step that raised does not upset the count of later steps")
def _raised_step(c):
    model, opt = make("adam")
    probe = probe_of(model, opt).attach(every=1)
    batches = step_batches()
    backward(model, opt, batches)
    try:
        opt.step()  # no observe(): refused inside the step's hooks
        refused = False
    except ProbeStateError:
        refused = True
    expected = reference(model, batches)
    probe.observe(batches)
    opt.step()
    record = probe.records[0]
    return [("refused", refused, True, None), *against_reference(record, expected, 1e-10),
            ("flagged", "decomposition_flagged" in record["update"], False, None)]


@case("split", ".grad zeroed between the backward and measure",
      Flagged("the optimizer's .grad is zero on every shared parameter"))
@_flag_run()
def _zeroed(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    measured = probe.measure(batches)
    opt.step()
    return probe.finish(measured)


@case("split", "zero_grad() between measure and the step", Flagged("while the parameters did not move"))
@_flag_run()
def _grads_dropped(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    opt.zero_grad()
    opt.step()
    return probe.finish(measured)


@case("split", "finish() without an optimizer step",
      Flagged("0 optimizer steps were taken between measure() and finish()"))
@_flag_run()
def _no_step(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    return probe.finish(probe.measure(batches))


@case("split", "finish() after two optimizer steps",
      Flagged("2 optimizer steps were taken between measure() and finish()"))
@_flag_run()
def _two_steps(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    opt.step()
    backward(model, opt, step_batches(2))
    opt.step()
    return probe.finish(measured)


@case("split", "Adam: finish() after two optimizer steps", Flagged("2 optimizer steps"))
@_flag_run("adam")
def _adam_two_steps(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    opt.step()
    opt.step()
    return probe.finish(measured)


@case("split", "a learning-rate scheduler stepped before the optimizer", Flagged("the step's parts miss Δθ by"))
@_flag_run()
def _scheduler_first(model, opt, probe):
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    scheduler.step()  # the classic mistake: the step below takes the new rate
    opt.step()
    return probe.finish(measured)


@case("split", "parameters changed outside the optimizer before finish", Flagged("the step's parts miss Δθ by"))
@_flag_run()
def _outside(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    measured = probe.measure(batches)
    opt.step()
    with torch.no_grad():
        model.body.weight.mul_(0.99)  # a hand-made decay
    return probe.finish(measured)


@case("split", "a flagged loop warns once and flags every record", Flagged("the step's parts miss Δθ by"))
@_flag_run()
def _warn_once(model, opt, probe):
    records = []
    for seed in (1, 2, 3):
        batches = step_batches(seed)
        backward(model, opt, batches, weights={"tokens": 0.1, "pairs": 1.0})
        measured = probe.measure(batches)
        opt.step()
        records.append(probe.finish(measured))
    return records


@case("split", "attached: the loop's weights differ from the probe's", Flagged("the step's parts miss Δθ by"))
@_flag_run()
def _attached(model, opt, probe):
    seen = []
    probe.attach(on_record=seen.append)
    batches = step_batches()
    backward(model, opt, batches, weights={"tokens": 0.2, "pairs": 1.0})
    probe.observe(batches)
    opt.step()
    return seen[0]


@case("split", "strict: the loop's weights differ from the probe's",
      Raises(ProbeStateError, "the split of step 0 does not describe the step the optimizer took"))
@_flag_run(strict=True)
def _strict_weights(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches, weights={"tokens": 0.5, "pairs": 1.0})
    measured = probe.measure(batches)
    opt.step()
    return probe.finish(measured)


@case("split", "strict: finish() without an optimizer step", Raises(ProbeStateError, "0 optimizer steps"))
@_flag_run(strict=True)
def _strict_no_step(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    return probe.finish(probe.measure(batches))


@case("split", "measure() twice before the step", Raises(ProbeStateError, "measure() was called twice before "
                                                                           "optimizer.step()"))
@_flag_run()
def _two_measures(model, opt, probe):
    batches = step_batches()
    backward(model, opt, batches)
    probe.measure(batches)
    return probe.measure(batches)


def _between_steps(change: Callable[[Tiny], None]) -> Callable[[Any], Any]:
    def run(c):
        model, opt = make()
        probe = probe_of(model, opt)
        steps(probe, model, opt, 1)
        change(model)
        return one_step(probe, model, opt, step_batches(2))

    return run


for id, change, said in [
    ("a shared parameter frozen between steps", lambda m: m.body.weight.requires_grad_(False),
     "shared parameter 'body.weight' was frozen (requires_grad=False)"),
    ("a shared parameter replaced between steps",
     lambda m: setattr(m.body, "weight", nn.Parameter(m.body.weight.detach().clone())),
     "shared parameter 'body.weight' was replaced by another tensor"),
    ("a shared parameter removed between steps", lambda m: setattr(m.body, "bias", None),
     "shared parameter 'body.bias' was removed from the model"),
    ("the embedding frozen between steps", lambda m: m.embed.requires_grad_(False),
     "shared parameter 'embed.weight' was frozen"),
]:
    add("split", id, _between_steps(change), Raises(ProbeStateError, said, "make a new TransferProbe"))


@case("split", "Adam: a shared parameter frozen before track()", Raises(ProbeStateError, "'body.bias' was frozen"))
def _frozen_before_track(c):
    model, opt = make("adam")
    probe = probe_of(model, opt)
    steps(probe, model, opt, 1)
    model.body.bias.requires_grad_(False)
    return probe.track(step_batches(2))


@case("split", "a parameter unfrozen after the default shared set was chosen",
      Raises(ProbeStateError, "parameter 'body.bias' was unfrozen after the probe was made", "pass shared="))
def _unfrozen_default(c):
    model, opt = make()
    model.body.bias.requires_grad_(False)
    probe = probe_of(model, opt)
    steps(probe, model, opt, 1)
    model.body.bias.requires_grad_(True)
    return one_step(probe, model, opt, step_batches(2))


@case("split", "a parameter outside an explicit shared set unfrozen later is not flagged")
def _unfrozen(c):
    model, opt = make()
    model.pair_head.bias.requires_grad_(False)
    probe = probe_of(model, opt, shared=SHARED)
    steps(probe, model, opt, 1)
    model.pair_head.bias.requires_grad_(True)
    batches = step_batches(2)
    expected = reference(model, batches)
    record = one_step(probe, model, opt, batches)
    return [*against_reference(record, expected, 1e-10),
            ("residual below the tolerance", record["update"]["decomposition_residual"] < TOLERANCE, True, None),
            ("flagged", "decomposition_flagged" in record["update"], False, None)]


for optimizer in ("sgd", "adam", "adamw"):
    @case("split", f"{optimizer}: a plain loop is measured exactly and not flagged")
    def _plain(c, optimizer=optimizer):
        model, opt = make(optimizer)
        probe = probe_of(model, opt)
        rows = []
        for seed in (1, 2):
            batches = step_batches(seed)
            expected = reference(model, batches)
            record = one_step(probe, model, opt, batches)
            rows += against_reference(record, expected, 1e-10)
            rows.append(("residual", record["update"]["decomposition_residual"] < 1e-12, True, None))
            if optimizer == "sgd":
                rows += [(f"first order {k}", record["update"]["first_order"][k], -LR * WEIGHTS[k] * expected[k], 1e-10)
                         for k in LOSSES]
        return rows


@case("split", "a loop loss scaled by a constant is split exactly (as clipping rescales)")
def _scaled(c):
    model, opt = make()
    probe = probe_of(model, opt)
    batches = step_batches()
    expected = reference(model, batches)
    backward(model, opt, batches, weights={k: 3 * w for k, w in WEIGHTS.items()})
    measured = probe.measure(batches)
    opt.step()
    record = probe.finish(measured)
    return [*against_reference(record, expected, 1e-10),
            *[(f"first order {k}", record["update"]["first_order"][k], -3 * LR * WEIGHTS[k] * expected[k], 1e-10)
              for k in LOSSES]]


@case("split", "gradient clipping is split by what the optimizer steps on")
def _clipped(c):
    model, opt = make()
    probe = probe_of(model, opt)
    batches = step_batches()
    expected = reference(model, batches)
    backward(model, opt, batches)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    measured = probe.measure(batches)
    opt.step()
    record = probe.finish(measured)
    return [*against_reference(record, expected, 1e-10),
            ("residual", record["update"]["decomposition_residual"] < 1e-9, True, None)]


# == 3. hf: Hugging Face folders that are not what they say ==================================================


def _hf_load(path: Path | str, registry: objreg.Registry) -> Any:
    tokenizer = registry.load_tokenizer(str(path), None, Path("."))
    return registry.load_model(str(path), tokenizer.vocab, (), {}, torch.Generator().manual_seed(0))


def _hf_variant(change: Callable[[dict], dict] | None = None, damage: Callable[[Path], None] | None = None):
    def run(c):
        where = c.tmp / "model"
        shutil.copytree(c.env.bert, where)
        if change is not None:
            st = pytest.importorskip("safetensors.torch")
            tensors = st.load_file(str(c.env.bert / "model.safetensors"))
            st.save_file(change(dict(tensors)), str(where / "model.safetensors"), metadata={"format": "pt"})
        if damage is not None:
            damage(where)
        return _hf_load(where, c.env.registry)

    return run


def _cut(share: float) -> Callable[[Path], None]:
    def damage(where: Path) -> None:
        data = (where / "model.safetensors").read_bytes()
        (where / "model.safetensors").write_bytes(data[: int(len(data) * share)])

    return damage


def _without(*parts: str) -> Callable[[dict], dict]:
    return lambda t: {k: v for k, v in t.items() if not any(part in k for part in parts)}


def _resized(name: str, rows: int) -> Callable[[dict], dict]:
    def change(t):
        t[name] = t[name][:rows].clone()
        return t

    return change


for id, run, texts in [
    ("a layer missing from the weights", _hf_variant(_without(".layer.1.")),
     ("16 of 37 backbone tensors are missing from its weights file model.safetensors", "encoder.layer.1.",
      "random-init:")),
    ("the embeddings missing from the weights", _hf_variant(_without("embeddings.")),
     ("5 of 37 backbone tensors are missing", "embeddings.LayerNorm.bias")),
    ("one tensor missing from the weights", _hf_variant(_without("encoder.layer.0.output.dense.bias")),
     ("1 of 37 backbone tensors are missing", "encoder.layer.0.output.dense.bias")),
    ("an empty weights file", _hf_variant(lambda t: {}), ("37 of 37 backbone tensors are missing",)),
    ("a vocabulary of other size", _hf_variant(_resized("embeddings.word_embeddings.weight", 50)),
     ("1 of 37 backbone tensors in its weights file model.safetensors have other sizes",
      "embeddings.word_embeddings.weight is [50, 16] in the file")),
    ("positions of other size", _hf_variant(_resized("embeddings.position_embeddings.weight", 64)),
     ("embeddings.position_embeddings.weight is [64, 16] in the file, [128, 16] by config.json",)),
    ("a weights file cut in half", _hf_variant(damage=_cut(0.5)),
     ("its weights file model.safetensors cannot be read", "truncated or damaged")),
    ("a weights file cut to its header", _hf_variant(damage=_cut(0.01)), ("model.safetensors cannot be read",)),
    ("a weights file of zero bytes", _hf_variant(damage=_cut(0.0)), ("model.safetensors cannot be read",)),
    ("a weights file of garbage", _hf_variant(damage=lambda w: (w / "model.safetensors").write_bytes(b"\x10" + b"\0" * 7
                                                                                                    + b"{garbage")),
     ("model.safetensors cannot be read",)),
    ("random-init of a directory that does not exist", lambda c: _hf_load("random-init:/no/such/model", c.env.registry),
     ("model directory '/no/such/model' does not exist",)),
]:
    add("hf", id, run, Raises(DataError, *texts))


@case("hf", "a GPT-2 weights file under a BERT config.json",
      Raises(DataError, "37 of 37 backbone tensors are missing from its weights file model.safetensors"))
def _gpt2_weights(c):
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    where = c.tmp / "model"
    shutil.copytree(c.env.bert, where)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(vocab_size=200, n_embd=16, n_layer=1, n_head=2,
                                                           n_positions=64))
    st.save_file({k: v.contiguous() for k, v in gpt2.state_dict().items()}, str(where / "model.safetensors"),
                 metadata={"format": "pt"})
    return _hf_load(where, c.env.registry)


@case("hf", "a tokenizer.json of a gigabyte", Raises(DataError, "1,024 MiB is too large for a tokenizer.json"))
def _huge_tokenizer(c):
    where = c.tmp / "model"
    shutil.copytree(c.env.bert, where)
    with open(where / "tokenizer.json", "r+b") as f:
        f.truncate(2**30)  # sparse: no disk used
    return c.env.registry.load_tokenizer(str(where), None, Path("."))


@case("hf", "a matching directory loads every tensor of its file")
def _matching(c):
    st = pytest.importorskip("safetensors.torch")
    loaded = _hf_load(c.env.bert, c.env.registry).backbone.model.state_dict()
    saved = st.load_file(str(c.env.bert / "model.safetensors"))
    return [(name, torch.equal(loaded[name], tensor.float()), True, None) for name, tensor in sorted(saved.items())[:6]]


@case("hf", "random-init: random weights on purpose, from the run's generator")
def _random_init(c):
    st = pytest.importorskip("safetensors.torch")
    where = c.tmp / "model"
    shutil.copytree(c.env.bert, where)
    (where / "model.safetensors").write_bytes(b"not read")  # random-init never reads the weights file
    first = _hf_load(f"random-init:{where}", c.env.registry).backbone.model.state_dict()
    again = _hf_load(f"random-init:{where}", c.env.registry).backbone.model.state_dict()
    saved = st.load_file(str(c.env.bert / "model.safetensors"))
    name = "embeddings.word_embeddings.weight"
    return [("the same draw twice", all(torch.equal(first[k], again[k]) for k in first), True, None),
            ("not the file's weights", torch.equal(first[name], saved[name]), False, None)]


# == 4. processes that disagree or stop ======================================================================


class ThreeRanks(Group):
    """A stand-in for three processes whose settings were gathered: what each would hand over."""

    world_size = 3

    def __init__(self, every: list[dict[str, str]]):
        self.every = every

    def gather_objects(self, obj: Any) -> list[Any]:
        assert obj == self.every[0]
        return self.every


def _settings(**change) -> dict[str, str]:
    config = AnalysisConfig(pretrain=("mlm", "sop"), **{k: v for k, v in change.items() if k not in ("out", "resume")})
    return analyze_module._settings_of(config, change.get("out"), change.get("resume"))


def _disagree(others: list[dict]) -> Callable[[Any], Any]:
    def run(c):
        return launch.check_same_settings(ThreeRanks([_settings(), *[_settings(**o) for o in others]]), _settings())

    return run


for id, others, texts in [
    ("rank 1 with another seed", [{"seed": 1}, {}], ("process rank 1 was started with seed (--seed) 1 but rank 0 with 0",)),
    ("rank 2 with another seed", [{}, {"seed": 5}], ("process rank 2 was started with seed (--seed) 5",)),
    ("another corpus", [{"corpus": "/data/other.txt"}, {}], ('corpus (--corpus) "/data/other.txt" but rank 0 with '
                                                             '"default"',)),
    ("another learning rate", [{"lr": 0.1}, {}], ("lr (--lr) 0.1 but rank 0 with 0.005",)),
    ("another optimizer", [{}, {"optimizer": "adamw"}], ('optimizer (--optimizer) "adamw"',)),
    ("another weight", [{"weights": {"mlm": 1.0, "sop": 0.5}}, {}], ("weights (--weights)",)),
    ("only rank 1 given --out", [{"out": "/tmp/run"}, {}], ('out_dir (--out) "/tmp/run" but rank 0 with not given',)),
    ("another --out", [{}, {"out": "/tmp/elsewhere"}], ("rank 2 was started with out_dir (--out)",)),
    ("another objective parameter", [{"objective_params": {"mlm": {"mask_prob": 0.3}}}, {}], ("objective_params "
                                                                                              "(--param)",)),
    ("another --steps", [{"steps": 3}, {"steps": 3}], ("rank 1 was started with steps (--steps) 3 but rank 0 with 6",)),
]:
    add("processes", id, _disagree(others), Raises(DistributedError, *texts, "every process torchrun starts must be "
                                                                           "given the same settings"))


@case("processes", "a setting one rank lacks", Raises(DistributedError, "rank 1 was started with extra 1 but rank 0 "
                                                                        "with (not given)"))
def _extra_key(c):
    mine = _settings()
    return launch.check_same_settings(ThreeRanks([mine, {**mine, "extra": "1"}, mine]), mine)


@case("processes", "ranks with the same settings agree")
def _agree(c):
    mine = _settings(seed=3)
    launch.check_same_settings(ThreeRanks([mine, _settings(seed=3), _settings(seed=3)]), mine)
    schedule_one, schedule_two = _settings(schedule=_constant), _settings(schedule=_constant)
    return [("the same callable schedule is the same setting", schedule_one == schedule_two, True, None)]


def _constant(t: int, steps: int) -> float:
    return 1.0


@case("processes", "a stray RANK without WORLD_SIZE is one process, which prints")
def _stray_rank(c):
    from objreg.cli.analyze import _prints

    c.monkeypatch.delenv("WORLD_SIZE", raising=False)
    c.monkeypatch.setenv("RANK", "1")
    return [("group", type(launch.from_environment("cpu", {"RANK": "1", "LOCAL_RANK": "1"})), Group, None),
            ("printed", _prints(), True, None)]


add("processes", "WORLD_SIZE not a number", lambda c: launch.from_environment("cpu", {"WORLD_SIZE": "two"}),
    Raises(InvalidParameterError, "environment variable WORLD_SIZE must be an integer, got 'two'"))
add("processes", "WORLD_SIZE 2 without the rest of torchrun's variables",
    lambda c: launch.from_environment("cpu", {"WORLD_SIZE": "2", "RANK": "0"}),
    Raises(InvalidParameterError, "WORLD_SIZE=2 is set but LOCAL_RANK, MASTER_ADDR, MASTER_PORT is not"))


def _lost(rank: int, world: int, message: str) -> Callable[[Any], Any]:
    def run(c):
        group = ProcessGroup(rank, world, "gloo", torch.device("cpu"))

        def broken(*args, **kwargs):
            raise RuntimeError(message)

        c.monkeypatch.setattr(torch.distributed, "all_reduce", broken)
        c.monkeypatch.setattr(torch.distributed, "all_gather", broken)
        c.monkeypatch.setattr(torch.distributed, "broadcast", broken)
        c.monkeypatch.setattr(torch.distributed, "broadcast_object_list", broken)
        c.monkeypatch.setattr(torch.distributed, "all_gather_object", broken)
        return group.all_reduce_sum(torch.ones(2))

    return run


GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
for id, rank, world, message, texts in [
    ("a peer that died (two processes)", 0, 2, GLOO_CLOSED,
     ("process rank 0 lost the other processes in a collective: rank 1 stopped or failed first", "Connection closed")),
    ("a peer that died, seen by rank 1", 1, 2, GLOO_CLOSED, ("process rank 1 lost", "rank 0 stopped or failed first")),
    ("a peer that died (four processes)", 2, 4, GLOO_CLOSED, ("one of ranks 0, 1, 3 stopped or failed first",)),
    ("a collective that timed out", 0, 2, "Timed out waiting 1800000ms for recv operation to complete",
     ("rank 1 stopped or failed first", "Timed out")),
]:
    add("processes", id, _lost(rank, world, message), Raises(DistributedError, *texts))

add("processes", "an error that is not a lost peer passes unchanged",
    _lost(0, 2, "DefaultCPUAllocator: can't allocate memory"), Raises(RuntimeError, "can't allocate memory"))


# == 5. files: run and experiment directories ===============================================================


@case("files", "experiment --out holding an earlier result",
      Raises(InvalidParameterError, "already holds an experiment's result (result.json)"))
def _earlier_result(c):
    out = c.tmp / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text("")
    (out / "result.json").write_text("{}")
    return objreg.experiments.run(c.env.stand_in, quick=True, out_dir=out)


@case("files", "experiment --out holding someone else's result",
      Raises(InvalidParameterError, "holds files objreg did not write there (result.json)"))
def _foreign_result(c):
    out = c.tmp / "out"
    out.mkdir()
    (out / "result.json").write_text('{"mine": true}')
    return objreg.experiments.run(c.env.stand_in, quick=True, out_dir=out)


@case("files", "experiment --out in use by another process",
      Raises(InvalidParameterError, "is in use by another objreg experiment"))
def _experiment_locked(c):
    out = c.tmp / "out"
    out.mkdir()
    holder = _hold_lock(out)
    try:
        return objreg.experiments.run(c.env.stand_in, quick=True, out_dir=out)
    finally:
        holder.kill()
        holder.wait()


@case("files", "experiment --out: a second run is refused, the first result kept")
def _second_experiment(c):
    out = c.tmp / "out"
    first = objreg.experiments.run(c.env.stand_in, quick=True, out_dir=out)
    kept = (out / "result.json").read_text()
    try:
        objreg.experiments.run(c.env.stand_in, quick=True, seed=5, out_dir=out)
        refused = False
    except InvalidParameterError:
        refused = True
    return [("refused", refused, True, None), ("result kept", (out / "result.json").read_text(), kept, None),
            ("first verdict", json.loads(kept)["verdict"], first.verdict, None)]


@case("files", "experiment --all: every directory checked before the first runs",
      Raises(InvalidParameterError, "already holds an experiment's result"))
def _all_checked(c):
    last = objreg.experiments.names()[-1]
    (c.tmp / "all" / last).mkdir(parents=True)
    (c.tmp / "all" / last / LOCK_FILE).write_text("")
    (c.tmp / "all" / last / "result.json").write_text("{}")
    return objreg.experiments.run_all(c.tmp / "all", quick=True)


def _hold_lock(directory: Path) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(directory / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
    """)
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def _linked(name: str, resume: bool = False) -> Callable[[Any], Any]:
    def run(c):
        out, outside = c.tmp / "run", c.tmp / "outside.txt"
        out.mkdir()
        if name != LOCK_FILE:
            (out / LOCK_FILE).write_text("")
        outside.write_text("someone's notes\n")
        (out / name).symlink_to(outside)
        try:
            return claim(out, resume=resume)
        finally:
            assert outside.read_text() == "someone's notes\n"

    return run


for name in ("steps.jsonl", "config.json", "checkpoint.pt", "report.json"):
    add("files", f"a fresh run where {name} is a symbolic link", _linked(name),
        Raises(InvalidParameterError, f"{name} is a symbolic link", "objreg writes no file of a run through a link"))
add("files", "a resume where steps.jsonl is a symbolic link", _linked("steps.jsonl", resume=True),
    Raises(InvalidParameterError, "steps.jsonl is a symbolic link"))
add("files", "a run directory whose lock file is a symbolic link", _linked(LOCK_FILE),
    Raises(InvalidParameterError, ".objreg.lock is a symbolic link"))


@case("files", "steps.jsonl turned into a symbolic link during a run",
      Raises(DataError, "steps.jsonl' is a symbolic link: objreg writes no run file through a link"))
def _append_through_link(c):
    writer = RunWriter(c.tmp / "run")
    writer.start_steps()
    outside = c.tmp / "outside.txt"
    outside.write_text("kept\n")
    writer.steps_path.unlink()
    writer.steps_path.symlink_to(outside)
    try:
        return writer.append_step({"step": 0})
    finally:
        assert outside.read_text() == "kept\n"


@case("files", "starting steps.jsonl replaces a link, never writes through it")
def _start_replaces(c):
    outside = c.tmp / "outside.txt"
    outside.write_text("kept\n")
    (c.tmp / "run").mkdir()
    (c.tmp / "run" / "steps.jsonl").symlink_to(outside)
    writer = RunWriter(c.tmp / "run")
    writer.start_steps()
    writer.append_step({"step": 0})
    return [("outside file", outside.read_text(), "kept\n", None),
            ("steps.jsonl a file", writer.steps_path.is_symlink(), False, None),
            ("its line", writer.steps_path.read_text(), '{"step": 0}\n', None)]


@case("files", "resume after a plugin's code changed under the same version",
      Raises(DataError, "the code of plugin 'edited-model' (edited-dist 1.0) changed since the run started"))
def _edited_plugin(c):
    module = c.tmp / "edited_model_plugin.py"
    module.write_text(textwrap.dedent("""
        import objreg
        from objreg.plugins.models import transformer

        TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}

        @objreg.hookimpl
        def objreg_register_models(register):
            def load(name, vocab, config, generator):
                return transformer.build_backbone(transformer.build_config("default", vocab.size, TINY), generator)

            register(objreg.Provider("model", "edited", "a one-layer Transformer", load))
    """))
    sys.path.insert(0, str(c.tmp))
    try:
        import edited_model_plugin

        def registry():
            pm = objreg.get_plugin_manager(load_entrypoints=False)
            pm.register_plugin(edited_model_plugin, "edited-model", "edited-dist 1.0")
            return objreg.Registry(pm)

        out = c.tmp / "run"
        with pytest.raises(_Stop):
            objreg.analyze("mlm", "qa", registry=registry(), model="edited", out_dir=out, on_step=_stop_at_0,
                           cache=c.env.cache, **SMALL)
        module.write_text(module.read_text() + "# an edit that keeps the version\n")
        return objreg.analyze(resume=out, registry=registry(), cache=c.env.cache)
    finally:
        sys.path.remove(str(c.tmp))
        sys.modules.pop("edited_model_plugin", None)


SMALL = dict(steps=2, batch_size=4, seq_len=32, eval_size=4, head_fit_size=8)


class _Stop(Exception):
    pass


def _stop_at_0(step: int, record: Any) -> None:
    raise _Stop


# == 6. data: labels that are the same number ================================================================


def _labels_case(id: str, lines: list[str], expected_labels: list[str], classes: list[str], suffix: str = ".tsv",
                 labels: str = "") -> None:
    def run(c):
        path = c.tmp / f"data{suffix}"
        path.write_text("\n".join(lines) + "\n")
        records, found = read_classification(path, labels=labels)
        return [("classes", found, classes, None), ("labels", [r.label for r in records], expected_labels, None)]

    add("data", id, run)


TSV = ["sentence\tlabel"]
_labels_case("0/00/1/1.0 in a TSV file are two classes", TSV + ["a good film\t0", "a bad film\t00", "fine\t1",
                                                                  "awful\t1.0"], ["0", "0", "1", "1"], ["0", "1"])
_labels_case("+1/-0 in a TSV file", TSV + ["a\t+1", "b\t-0", "c\t1"], ["1", "0", "1"], ["0", "1"])
_labels_case("1e0 and 10e-1 are 1", TSV + ["a\t1e0", "b\t10e-1", "c\t2"], ["1", "1", "2"], ["1", "2"])
_labels_case("0.50 and .5 are one class", TSV + ["a\t0.50", "b\t.5", "c\t0.25"], ["0.5", "0.5", "0.25"],
             ["0.25", "0.5"])
_labels_case("JSON integers and strings of the same number",
             ['{"text": "a", "label": 1}', '{"text": "b", "label": "01"}', '{"text": "c", "label": 0}',
              '{"text": "d", "label": "0.0"}'], ["1", "1", "0", "0"], ["0", "1"], suffix=".jsonl")
_labels_case("word labels are kept as they are", TSV + ["a\tpositive", "b\tnegative", "c\tPositive"],
             ["positive", "negative", "Positive"], ["Positive", "negative", "positive"])
_labels_case("word and number labels together", TSV + ["a\tpositive", "b\t1", "c\t01"], ["positive", "1", "1"],
             ["1", "positive"])
_labels_case("the labels parameter spelt otherwise than the file", TSV + ["a\t0", "b\t1"], ["0", "1"], ["0", "1"],
             labels="00,01")
_labels_case("a label like nan or 1_000 is a word", TSV + ["a\tnan", "b\t1_000", "c\tnan"], ["nan", "1_000", "nan"],
             ["1_000", "nan"])
_labels_case("a number too large to write out stays short", TSV + ["a\t1e999999999", "b\t0"], ["1E999999999", "0"],
             ["0", "1E999999999"])


@case("data", "the labels parameter missing a number the file holds",
      Raises(DataError, "label '2' is not in the labels parameter (0, 1)"))
def _unlisted(c):
    path = c.tmp / "data.tsv"
    path.write_text("\n".join(TSV + ["a\t0", "b\t1.0", "c\t2"]) + "\n")
    return read_classification(path, labels="0,1")


# == 7. smaller: one line each ===============================================================================


def _cli(*args: str, plugins: Callable[[], Any] | None = None) -> Any:
    cli = make_cli(plugins or (lambda: objreg.get_plugin_manager(load_entrypoints=False)))
    return CliRunner().invoke(cli, list(args))


def _one_line_error(*args: str) -> Callable[[Any], Any]:
    def run(c):
        result = _cli(*args)
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        if result.exit_code == 1 and len(errors) == 1 and "Traceback" not in result.output:
            raise InvalidParameterError(errors[0])
        return [("exit code", result.exit_code, 1, None), ("output", result.output, "one Error: line", None)]

    return run


for seed, texts in [(str(2**64), ("seed must be at most 4,294,967,295", "18,446,744,073,709,551,616")),
                    (str(10**30), ("seed must be at most",)),
                    ("-1", ("seed must be an integer ≥ 0, got -1",))]:
    add("smaller", f"objreg corrupt --seed {seed}", _one_line_error("corrupt", "mlm", "--text", TEXT, "--seed", seed),
        Raises(InvalidParameterError, *texts))


class EscapingObjective:
    """An installed objective whose description tries to retitle the terminal and hide text."""

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="esc", description="innocent\x1b]0;owned\x07\x1b[8m hidden\x1b[0m")

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator):
        raise NotImplementedError

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        raise NotImplementedError

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        raise NotImplementedError


def _escaping_plugins() -> Any:
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register_plugin(EscapingObjective(), "esc", "esc-dist\x1b[2J 1.0")
    return pm


@case("smaller", "terminal escapes in a plugin's description and origin reach objreg list as text")
def _list_escapes(c):
    result = _cli("list", plugins=_escaping_plugins)
    listed = json.loads(_cli("list", "--json", plugins=_escaping_plugins).output)
    esc = next(o for o in listed["objectives"] if o["name"] == "esc")
    return [("exit code", result.exit_code, 0, None), ("no escape character", "\x1b" in result.output, False, None),
            ("shown as text", "innocent\\x1b]0;owned\\x07" in result.output, True, None),
            ("JSON keeps the value", esc["description"], "innocent\x1b]0;owned\x07\x1b[8m hidden\x1b[0m", None)]


class ItemLoss:
    """An objective whose loss calls .item() (breaks the contract's per-sample checks)."""

    def __init__(self):
        from objreg.plugins.objectives import mlm

        self.mlm = mlm

    @objreg.hookimpl
    def objreg_objective_info(self):
        return objreg.ObjectiveInfo(name="itemloss", description="mlm whose loss calls .item()",
                                    heads=self.mlm.objreg_objective_info().heads)

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator):
        return self.mlm.objreg_corrupt(batch, generator, **{p.name: p.default
                                                             for p in self.mlm.objreg_objective_info().params})

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        return self.mlm.objreg_attention_mask(batch)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        losses = self.mlm.objreg_loss(outputs, batch)
        return losses * (1.0 + 0.0 * float(losses.sum().item()))


@case("smaller", "objreg.analyze runs the contract's cheap checks the CLI runs",
      Raises(InvalidParameterError, "holds files objreg did not write there"))
def _contract_checks(c):
    pm = objreg.get_plugin_manager(load_entrypoints=False)
    pm.register(ItemLoss(), name="itemloss")
    foreign = c.tmp / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.warns(UserWarning, match=r"objective 'itemloss' \(registered at run time\) fails \d+ check\(s\) of "
                                         r"the plugin contract"):
        return objreg.analyze("itemloss", "qa", registry=objreg.Registry(pm), out_dir=foreign, cache=c.env.cache,
                              **SMALL)


# -- running a case ---------------------------------------------------------------------------------------


class Env:
    """What several cases share, built once per module on first use."""

    def __init__(self, factory: pytest.TempPathFactory):
        self.factory = factory

    @cached_property
    def registry(self) -> objreg.Registry:
        return objreg.Registry.load(load_entrypoints=False)

    @cached_property
    def cache(self) -> Path:
        return self.factory.mktemp("cache")

    @cached_property
    def bert(self) -> Path:
        """A tiny BERT directory (two layers, 37 tensors) with its own tokenizer.json."""
        transformers = pytest.importorskip("transformers")
        from objreg.toolkit.wordpiece import train_wordpiece

        path = self.factory.mktemp("bert")
        tokenizer = train_wordpiece([TEXT] * 20, vocab_size=200, name="tiny")
        config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=128)
        torch.manual_seed(0)
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
        tokenizer.backend.save(str(path / "tokenizer.json"))
        return path

    @cached_property
    def stand_in(self) -> str:
        """An experiment that draws one number per seed (registered under its name while the module runs)."""
        import types

        from objreg.experiments import EXPERIMENTS, base

        module = types.ModuleType("objreg_api_suite_experiment")
        module.NAME, module.CLAIM, module.SOURCE, module.RULE = "suite-draw", "a draw", "the suite", "above 0"

        def run(setting):
            effect = 1.0 + float(torch.randn(1, generator=torch.Generator().manual_seed(setting.seed)))
            verdict = base.verdict_from_interval(effect - 0.1, effect + 0.1)
            return base.ExperimentResult("suite-draw", module.CLAIM, verdict, f"draw {effect:.3f}", {"effect": effect})

        module.run = run
        sys.modules[module.__name__] = module
        EXPERIMENTS["suite-draw"] = module.__name__
        return "suite-draw"


@dataclass
class Context:
    env: Env
    tmp: Path
    monkeypatch: pytest.MonkeyPatch


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    made = Env(tmp_path_factory)
    yield made
    if "stand_in" in vars(made):
        from objreg.experiments import EXPERIMENTS

        EXPERIMENTS.pop("suite-draw", None)
        sys.modules.pop("objreg_api_suite_experiment", None)


def _split_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("TransferProbe: the split")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.cls}: {c.id}")
def test_api_bad_input(case: Case, env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    context = Context(env, tmp_path, monkeypatch)
    outcome = case.outcome
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if isinstance(outcome, Raises):
            with pytest.raises(outcome.error) as raised:
                case.run(context)
            line = str(raised.value)
            assert "\n" not in line, line
            for text in outcome.texts:
                assert text in line, line
            if outcome.error is not RuntimeError:
                assert isinstance(raised.value, ObjregError | UnknownNameError), type(raised.value)
            return
        result = case.run(context)
    if isinstance(outcome, Flagged):
        records = result if isinstance(result, list) else [result]
        for record in records:
            assert record["update"]["decomposition_flagged"] is True, record["update"]
            assert list(record["update"]).index("decomposition_flagged") == \
                list(record["update"]).index("decomposition_residual") + 1
        said = _split_warnings(caught)
        assert len(said) == 1, said  # once per probe
        for text in outcome.texts:
            assert text in said[0], said[0]
        return
    assert not _split_warnings(caught), _split_warnings(caught)
    assert result, "a Numbers case returns the rows it compares"
    for name, got, expected, rtol in result:
        if rtol is None:
            assert got == expected, (name, got, expected)
        else:
            assert got == pytest.approx(expected, rel=rtol, abs=1e-15), (name, got, expected)


def test_the_suite_covers_every_class_with_at_least_150_cases() -> None:
    counts: dict[str, int] = {}
    for c in CASES:
        counts[c.cls] = counts.get(c.cls, 0) + 1
    assert len(CASES) >= 150, counts
    assert set(counts) == {"inputs", "split", "hf", "processes", "files", "data", "smaller"}, counts
    assert len({(c.cls, c.id) for c in CASES}) == len(CASES), "case ids repeat"
    kinds = {type(c.outcome).__name__ for c in CASES}
    assert kinds == {"Raises", "Numbers", "Flagged"}, kinds
