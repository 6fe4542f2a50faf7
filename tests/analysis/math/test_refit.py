"""``D*``, the evaluation loss of a head re-fitted at the current backbone: its fit, its gradient
and its Hessian products against finite differences of the re-fitted loss itself (the head solved
again at every perturbed point), in float64, on the default model and on a Hugging Face encoder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import objreg
from objreg.analysis.math.downstream import Downstream
from objreg.analysis.math.functional import ObjectiveFunction, flat_dot, named_shared
from objreg.analysis.math.head_fit import HeadProblem, default_l2, fit_head
from objreg.analysis.math.refit import RefitDownstream, make_downstream
from objreg.analysis.run.config import AnalysisConfig
from objreg.analysis.run.prepare import prepare
from objreg.core.errors import InvalidParameterError

SMALL = dict(steps=1, batch_size=2, seq_len=32, eval_size=8, head_fit_size=16, dtype="float64")


def refit_setup(registry, downstream="qa", **settings):
    """A float64 model with its re-fitted downstream, as ``objreg analyze`` builds them."""
    config = AnalysisConfig(pretrain=("mlm",), downstream=downstream, **{**SMALL, **settings})
    stages = []
    trainer, _ = prepare(config, registry, objreg.cache_dir(), stages.append)
    assert isinstance(trainer.probe.downstream, RefitDownstream)
    assert "the downstream head is re-fitted at every probe, on 16 examples" in stages
    return trainer.model, trainer.probe.downstream


def point(model, downstream):
    return {n: p.detach().clone() for n, p in named_shared(model, downstream.shared).items()}


def unit_direction(shared, seed):
    generator = torch.Generator().manual_seed(seed)
    d = {n: torch.randn(t.shape, generator=generator, dtype=t.dtype) for n, t in shared.items()}
    norm = float(flat_dot(d, d)) ** 0.5
    return {n: t / norm for n, t in d.items()}


def d_star_along(model, downstream, theta, u):
    """``s ↦ D*(θ + s u)``, the head re-solved at every point (cold, from the zero head)."""
    params = named_shared(model, downstream.shared)

    def at(s: float) -> float:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(theta[n] + s * u[n])
        downstream.start = None
        value = downstream.loss(model)
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(theta[n])
        return value

    return at


def richardson(f, eps):
    """Central first and second differences at ``eps`` and ``eps/2``, combined to cancel the
    ``eps²`` term: errors of order ``eps⁴`` (``eps`` large enough that the second difference is
    not rounding: ``D*`` is exact to about 1e-15)."""
    def first(h):
        return (f(h) - f(-h)) / (2 * h)

    def second(h):
        return (f(h) - 2 * f(0.0) + f(-h)) / h**2

    return (4 * first(eps / 2) - first(eps)) / 3, (4 * second(eps / 2) - second(eps)) / 3


def check_against_differences(model, downstream, seeds=(1, 2), eps=2e-2, rtol=1e-5):
    theta = point(model, downstream)
    downstream.loss(model)
    directions = [unit_direction(theta, s) for s in seeds]
    gradient, products = downstream.curvature(model, theta).gradient_and_products(directions)
    for u, product in zip(directions, products):
        first, second = richardson(d_star_along(model, downstream, theta, u), eps)
        assert float(flat_dot(gradient, u)) == pytest.approx(first, rel=rtol, abs=1e-9)
        assert float(flat_dot(u, product)) == pytest.approx(second, rel=rtol * 10, abs=1e-7)
    # The Hessian is symmetric: uᵀ(H w) = wᵀ(H u).
    cross = float(flat_dot(directions[0], products[1])), float(flat_dot(directions[1], products[0]))
    assert cross[0] == pytest.approx(cross[1], rel=1e-8, abs=1e-10)


@pytest.mark.parametrize("task", ["qa", "classification"])
def test_gradient_and_hessian_equal_differences_of_the_refitted_loss(registry, task):
    model, downstream = refit_setup(registry, task)
    check_against_differences(model, downstream)


def test_on_a_hugging_face_encoder(registry, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer = objreg.default_tokenizer(registry)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab.size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path)
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    for task in ("qa", "classification"):
        model, downstream = refit_setup(registry, task, model=str(tmp_path))
        check_against_differences(model, downstream)


def test_the_feature_path_equals_the_whole_model_path(registry):
    """An objreg task's fit set is differentiated at the head (features computed once); a plain
    loss function's through the whole model: the same numbers."""
    model, downstream = refit_setup(registry, "qa")
    theta = point(model, downstream)
    downstream.loss(model)
    directions = [unit_direction(theta, s) for s in (3, 4, 5)]
    by_features = downstream.curvature(model, theta)
    whole = downstream.curvature(model, theta)
    whole.fit = [ObjectiveFunction(model, downstream.task, c, shared=[*theta, *downstream.head])
                 for c in downstream.fit_set.local_chunks]
    (g1, p1), (g2, p2) = by_features.gradient_and_products(directions), whole.gradient_and_products(directions)
    for a, b in [(g1, g2), *zip(p1, p2)]:
        assert float(flat_dot({n: a[n] - b[n] for n in a}, {n: a[n] - b[n] for n in a})) ** 0.5 <= 1e-10 * float(
            flat_dot(b, b)) ** 0.5


def test_the_fit_is_the_optimum_an_independent_solver_finds(registry):
    """Newton's head against L-BFGS (scipy) on the same penalised fit loss, and λ = 1/n."""
    scipy_optimize = pytest.importorskip("scipy.optimize")
    model, downstream = refit_setup(registry, "classification")
    downstream.loss(model)
    fit = downstream.last_fit
    assert downstream.l2 == default_l2(downstream.fit_set.size) == 1 / downstream.fit_set.size
    problem = HeadProblem(model, downstream.task, downstream.fit_set.local_chunks, downstream.head)
    shapes = {n: fit.head[n].shape for n in downstream.head}
    sizes = [torch.Size(s).numel() for s in shapes.values()]

    def objective(x):
        tensor = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        head = dict(zip(shapes, (t.view(s) for t, s in zip(tensor.split(sizes), shapes.values()))))
        value = problem.total(head) / downstream.fit_set.size + downstream.l2 / 2 * (tensor @ tensor)
        (grad,) = torch.autograd.grad(value, tensor)
        return float(value), grad.numpy()

    solved = scipy_optimize.minimize(objective, torch.zeros(sum(sizes), dtype=torch.float64).numpy(), jac=True,
                                     method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10_000})
    newton = torch.cat([fit.head[n].reshape(-1) for n in downstream.head])
    assert torch.allclose(newton, torch.tensor(solved.x), rtol=1e-5, atol=1e-6)
    assert fit.gradient_norm < 1e-10


def test_a_separable_fit_set_stays_finite(registry):
    """Every fit example classified perfectly by some direction: without λ the optimum is at
    infinity; with λ = 1/n it is finite and Newton reaches it."""
    torch.manual_seed(0)
    head = nn.Linear(2, 2).double()
    features = torch.randn(8, 2, dtype=torch.float64)
    labels = (features[:, 0] > 0).long()  # separable by the first feature

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = head

    def loss(model, batch):
        return nn.functional.cross_entropy(model.head(batch["x"]), batch["y"], reduction="none")

    model = Model()
    problem = HeadProblem(model, objreg_callable(loss), [{"x": features, "y": labels}], ("head.weight", "head.bias"))
    start = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    fit = fit_head(problem, start, 8, default_l2(8))
    assert fit.gradient_norm < 1e-12 and all(torch.isfinite(t).all() for t in fit.head.values())
    assert float(fit.head["head.weight"].abs().max()) < 100


def objreg_callable(fn):
    from objreg.analysis.math.functional import CallableLoss

    return CallableLoss("downstream", fn)


def test_a_head_that_is_not_linear_in_what_is_refitted_is_refused():
    """Two stacked linear maps re-fitted together: the fit loss is not convex in them (at the zero
    start the Hessian is indefinite), which the fit refuses in one line."""
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.outer = nn.Linear(3, 3).double(), nn.Linear(3, 2).double()

    def loss(model, batch):
        return nn.functional.cross_entropy(model.outer(model.inner(batch["x"])), batch["y"], reduction="none")

    model = Model()
    names = ("inner.weight", "outer.weight")
    problem = HeadProblem(model, objreg_callable(loss), [{"x": torch.randn(6, 3, dtype=torch.float64),
                                                          "y": torch.tensor([0, 1, 0, 1, 1, 0])}], names)
    start = {n: torch.zeros_like(dict(model.named_parameters())[n]) for n in names}
    start["inner.weight"] = torch.eye(3, dtype=torch.float64)
    with pytest.raises(InvalidParameterError, match="not convex in its parameters"):
        fit_head(problem, start, 6, 1e-3)


def test_every_objective_set_starts_from_the_same_d_star(registry):
    """The backbone and the downstream head come from their own streams, and the first fit from
    the zero head: mlm and sop (different heads, drawn before the task's) see the same D*₀."""
    values = []
    for pretrain in (["mlm"], ["sop"], ["mlm", "sop", "rtd"]):
        config = AnalysisConfig(pretrain=tuple(pretrain), downstream="classification", **SMALL)
        trainer, _ = prepare(config, registry, objreg.cache_dir())
        values.append(trainer.probe.downstream.loss(trainer.model))
    assert values[0] == values[1] == values[2]


def test_a_frozen_head_is_the_frozen_downstream(registry):
    config = AnalysisConfig(pretrain=("mlm",), downstream="qa", downstream_head="frozen", **SMALL)
    trainer, report_config = prepare(config, registry, objreg.cache_dir())
    assert type(trainer.probe.downstream) is Downstream
    assert report_config["downstream_head"] == "frozen" and "head_warmup" in report_config
    with pytest.raises(InvalidParameterError, match="downstream_head must be one of refit, frozen"):
        AnalysisConfig(pretrain=("mlm",), downstream_head="thawed")


def test_make_downstream_builds_d_or_d_star_with_the_fit_sets_chunking(registry):
    """The one builder: no head gives ``D`` (a frozen head), a head gives ``D*`` on the fit set,
    chunked by the fit options; the user's own batches are used as given."""
    model, built = refit_setup(registry, "qa")
    frozen = make_downstream(built.task, built.batch)
    assert type(frozen) is Downstream and frozen.evaluation_dtype == torch.float64
    refit = make_downstream(built.task, built.batch, head=built.head, fit=built.fit_set.batch, fit_chunk_size=3,
                            fit_chunk_tokens=10_000)
    assert isinstance(refit, RefitDownstream) and refit.head == built.head
    assert refit.fit_set.chunk_size == 3 and refit.fit_set.chunk_tokens == 10_000
    assert max(c.batch_size for c in refit.fit_set.chunks) <= 3 < refit.fit_set.size
    batches = [torch.ones(2, 3), torch.zeros(1, 3)]
    user = make_downstream(objreg_callable(lambda model, batch: batch.sum(1)), batches)
    assert type(user) is Downstream and user.chunks == batches and user.size == 3


def test_no_module_builds_d_but_through_make_downstream():
    """``Downstream`` and ``RefitDownstream`` are constructed in math/downstream.py and
    math/refit.py only: every other module (the run, the screen, the probe, the experiments)
    builds ``D`` with :func:`make_downstream`."""
    source = Path(objreg.__file__).parent
    builders = {source / "analysis" / "math" / "downstream.py", source / "analysis" / "math" / "refit.py"}
    found = []
    for path in sorted(source.rglob("*.py")):
        if path in builders:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                owner = node.func.value if isinstance(node.func, ast.Attribute) else None
                if name in ("Downstream", "RefitDownstream") or (
                        name == "of_batches" and getattr(owner, "id", "") in ("Downstream", "RefitDownstream")):
                    found.append(f"{path.relative_to(source)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize("path", ["features", "whole model"])
def test_dots_equal_the_products_dotted_afterwards(registry, path):
    """gradient_and_dots (no whole product held) against gradient_and_products's products dotted
    afterwards, on both paths: the same gradient and dots to rounding, and kept entries the products'."""
    model, downstream = refit_setup(registry, "qa")
    theta = point(model, downstream)
    downstream.loss(model)
    directions = [unit_direction(theta, s) for s in (3, 4, 5)]
    curvature = downstream.curvature(model, theta)
    if path == "whole model":
        curvature.fit = [ObjectiveFunction(model, downstream.task, c, shared=[*theta, *downstream.head])
                         for c in downstream.fit_set.local_chunks]
    some = sorted(theta)[:2]
    against = [[directions[1], directions[2]], [directions[0]], [{n: directions[0][n] for n in some}]]
    gradient, products = curvature.gradient_and_products(directions)
    gradient_d, dots, kept = curvature.gradient_and_dots(directions, against, keep=some)
    for n in gradient:
        assert torch.allclose(gradient_d[n], gradient[n], rtol=1e-12, atol=1e-15)
    for k, vectors in enumerate(against):
        for j, a in enumerate(vectors):
            expected = float(sum((a[n] * products[k][n]).sum() for n in a))
            assert float(dots[k, j]) == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert all(torch.allclose(kept[k][n], products[k][n], rtol=1e-9, atol=1e-13) for n in some)
