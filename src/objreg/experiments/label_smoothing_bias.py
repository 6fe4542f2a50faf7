"""Label smoothing bias: with smoothing ε the optimum's marginal moves toward uniform by ε(1/V − π_i).

**Claim.** Training with label-smoothed cross-entropy (``(1−ε)(−log q_y) + ε · mean_v(−log q_v)``,
the ``torch.nn.functional.cross_entropy(label_smoothing=ε)`` convention that ``objreg.toolkit.losses``
uses) on data whose labels have the marginal ``π`` drives the predicted distribution to
``q = (1−ε)π + ε/V``: each class is shifted by ``q_i − π_i = ε(1/V − π_i)``, frequent classes
down, rare ones up. Source: Szegedy et al. 2016 (Rethinking the Inception Architecture, label
smoothing); Müller et al. 2019 (When Does Label Smoothing Help?), as stated in issue 9.

**Setting.** ``V = 20`` classes with a Zipf marginal ``π_i ∝ 1/i``. Per seed, ``N`` labels are
drawn from ``π`` (quick: 200,000 and 8 seeds; full: 1,000,000 and 32 seeds), and a softmax over
free logits (the model of the marginal: no input) is fitted to them by minimising the mean of
the project's smoothed NLL (:func:`objreg.toolkit.losses.smoothed_nll`) to convergence (L-BFGS,
float64), for ``ε ∈ {0.05, 0.1, 0.2, 0.3}``.

**Measured.** Per seed and ε, the least-squares slope of ``q_i − π_i`` against ``1/V − π_i``
over the classes (both sum to 0 over ``i``, so the fit needs no intercept), with ``π`` the *true*
marginal: the sampling error of the empirical marginal is the noise. Reported per ε: the mean
slope over seeds with its Student-t 95% interval, the regression's standard error, and the
largest gap between the fitted ``q`` and ``(1−ε)π̂ + ε/V`` for the sample's own marginal ``π̂``
(how far the optimiser is from the exact optimum).

**Verdict.** Per ε, the relative deviation ``slope/ε − 1`` with its interval; ``confirmed`` when
every ε's interval lies within ±10%, ``refuted`` when some ε's interval lies wholly outside,
``inconclusive`` otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from objreg.analysis.stats import mean_ci95
from objreg.experiments import _support
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, ExperimentResult, Setting, save_figure
from objreg.toolkit.losses import smoothed_nll

NAME = "label-smoothing-bias"
CLAIM = ("With label smoothing epsilon the optimal predicted marginal is (1-epsilon) pi + epsilon/V: each class "
         "moves toward uniform by epsilon (1/V - pi_i).")
#: Equivalence margin on the relative deviation of the fitted slope from ε.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    classes: int = 20
    exponent: float = 1.0
    samples: int = 200_000
    seeds: int = 8
    epsilons: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)


QUICK = Config(samples=200_000, seeds=8)
FULL = Config(samples=1_000_000, seeds=32)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def _run(config: Config, setting: Setting) -> ExperimentResult:
    V = config.classes
    pi = zipf_marginal(V, config.exponent)
    slopes = np.zeros((len(config.epsilons), config.seeds))
    errors = np.zeros_like(slopes)
    gaps = np.zeros_like(slopes)
    example = {}
    for s in range(config.seeds):
        setting.status(f"seed {s + 1} of {config.seeds}: drawing {config.samples} labels and fitting")
        generator = torch.Generator().manual_seed(setting.seed * 1000 + s)
        counts = torch.bincount(torch.multinomial(pi, config.samples, replacement=True, generator=generator),
                                minlength=V).double()
        empirical = counts / counts.sum()
        for e, epsilon in enumerate(config.epsilons):
            q = fit_marginal(empirical, epsilon)
            slopes[e, s], errors[e, s] = slope(q - pi, 1 / V - pi)
            gaps[e, s] = float((q - ((1 - epsilon) * empirical + epsilon / V)).abs().max())
            if s == 0:
                example[epsilon] = (q - pi).tolist()
    figures = measure(config, slopes, errors, gaps)
    verdict, reason = decide(figures)
    plots = [_plot(pi, example, figures, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            {**asdict(config), "seed": setting.seed, "quick": setting.quick,
                             "marginal": [float(p) for p in pi]}, plots)


def zipf_marginal(classes: int, exponent: float) -> torch.Tensor:
    """``π_i ∝ i^-exponent``, float64."""
    p = torch.arange(1, classes + 1, dtype=torch.float64) ** -exponent
    return p / p.sum()


def smoothed_loss(logits: torch.Tensor, marginal: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The mean smoothed NLL over labels with distribution ``marginal``: ``Σ_y marginal_y · ℓ_ε(logits, y)``,
    each ``ℓ_ε`` from :func:`objreg.toolkit.losses.smoothed_nll` (the same value as averaging over the
    labels one by one)."""
    V = logits.shape[-1]
    per_label = smoothed_nll(logits.expand(1, V, V), torch.arange(V)[None, :], float(epsilon))  # (1, V)
    return (marginal * per_label[0]).sum()


def fit_marginal(marginal: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The softmax over free logits minimising :func:`smoothed_loss` (L-BFGS to convergence, float64)."""
    logits = torch.zeros(marginal.shape[-1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([logits], lr=1.0, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                                  history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = smoothed_loss(logits, marginal, epsilon)
        loss.backward()
        return loss

    optimizer.step(closure)
    return torch.softmax(logits.detach(), dim=-1)


def slope(y: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """Least-squares slope of ``y`` on ``x`` through the origin and its standard error."""
    x, y = x.double(), y.double()
    b = float((x * y).sum() / (x * x).sum())
    residual = y - b * x
    se = float(((residual**2).sum() / (len(x) - 1) / (x * x).sum()).sqrt())
    return b, se


def measure(config: Config, slopes: np.ndarray, errors: np.ndarray, gaps: np.ndarray) -> dict:
    figures: dict = {"per_epsilon": []}
    for e, epsilon in enumerate(config.epsilons):
        mean, low, high = mean_ci95(slopes[e])
        figures["per_epsilon"].append({
            "epsilon": epsilon, "slope": mean, "ci95": [low, high],
            "relative_deviation": mean / epsilon - 1, "relative_ci95": [low / epsilon - 1, high / epsilon - 1],
            "regression_se_mean": float(errors[e].mean()),
            "seed_sd": float(slopes[e].std(ddof=1)) if config.seeds > 1 else 0.0,
            "max_gap_to_exact_optimum": float(gaps[e].max()),
        })
    figures["tolerance"] = TOLERANCE
    return figures


def decide(figures: dict) -> tuple[str, str]:
    verdicts = [
        _support.equivalence_verdict(*row["relative_ci95"], -TOLERANCE, TOLERANCE) for row in figures["per_epsilon"]
    ]
    if REFUTED in verdicts:
        verdict = REFUTED
    elif all(v == CONFIRMED for v in verdicts):
        verdict = CONFIRMED
    else:
        verdict = INCONCLUSIVE
    parts = [f"eps {row['epsilon']:g}: slope {row['slope']:.4f} [{row['ci95'][0]:.4f}, {row['ci95'][1]:.4f}]"
             for row in figures["per_epsilon"]]
    reason = (f"fitted slope of (q - pi) on (1/V - pi) vs epsilon (margin ±{TOLERANCE:.0%} relative): "
              + "; ".join(parts))
    return verdict, reason


def _plot(pi: torch.Tensor, example: dict, figures: dict, setting: Setting) -> str:
    """``q_i − π_i`` against ``1/V − π_i`` for each ε (first seed), with the lines of slope ε."""
    from matplotlib.figure import Figure

    V = len(pi)
    x = (1 / V - pi).numpy()
    figure = Figure(figsize=(7, 4))
    ax = figure.add_subplot()
    grid = np.linspace(x.min(), x.max(), 2)
    for row, color in zip(figures["per_epsilon"], ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
        epsilon = row["epsilon"]
        label = rf"$\epsilon$ = {epsilon:g}: fitted slope {row['slope']:.4f}"
        ax.scatter(x, example[epsilon], s=14, color=color, label=label)
        ax.plot(grid, epsilon * grid, color=color, linewidth=0.8, linestyle="--")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel(r"$1/V - \pi_i$")
    ax.set_ylabel(r"$q_i - \pi_i$")
    ax.set_title(r"Fitted marginal under label smoothing (dashed: slope $\epsilon$)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
