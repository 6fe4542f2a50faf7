"""``objreg analyze``: parse options, call ``objreg.analyze``, render the report. No math here.

Under ``torchrun`` every process runs the command (the library shares the work between them);
only the first (``RANK`` 0) prints, as only it writes ``--out``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import objreg
from objreg.cli import render

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(objreg.AnalysisConfig) if f.default is not dataclasses.MISSING}


def _default(name: str) -> str:
    return f"(default: {_DEFAULTS[name]})"


def _parse_params(items: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``("mlm.mask_prob=0.2", ...)`` → ``{"mlm": {"mask_prob": "0.2"}}``."""
    params: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        objective, dot, name = key.partition(".")
        if not sep or not dot or not objective or not name:
            raise objreg.InvalidParameterError(
                f"malformed --param {item!r}: expected OBJECTIVE.PARAM=VALUE, e.g. mlm.mask_prob=0.2"
            )
        params.setdefault(objective.strip(), {})[name.strip()] = value.strip()
    return params


@click.command()
@click.option("--pretrain", default=None, help="Comma-separated pre-training objectives, e.g. mlm,sop (required).")
@click.option("--downstream", default=None, help="Downstream task (default: qa).")
@click.option("--weights", default=None, help="Base objective weights, e.g. mlm=1,sop=0.5 (default 1 each).")
@click.option("--schedule", default=None, metavar="[OBJ=]SHAPE,...",
              help="How each weight changes over the run (weight × shape): constant, linear[:START:END], "
                   "cosine[:START:END] (both default 1→0) or step:AT[:BEFORE:AFTER] (default 1, 0); an entry "
                   "without OBJ= applies to the rest, e.g. 'mlm=linear:1:0,sop=step:8:0:1' or 'cosine'.")
@click.option("--steps", type=int, default=None, help=f"Training steps {_default('steps')}.")
@click.option("--lr", type=float, default=None, help=f"Learning rate {_default('lr')}.")
@click.option("--optimizer", default=None, help=f"sgd, adam or adamw {_default('optimizer')}.")
@click.option("--batch-size", type=int, default=None, help=f"Examples per objective per step {_default('batch_size')}.")
@click.option("--seq-len", type=int, default=None, help=f"Tokens per row {_default('seq_len')}.")
@click.option("--seed", type=int, default=None, help=f"Random seed {_default('seed')}.")
@click.option("--device", default=None, help=f"auto, cpu or cuda[:N] {_default('device')}.")
@click.option("--dtype", default=None, help=f"float32 or float64 {_default('dtype')}.")
@click.option("--corpus", default=None, help=f"'default' or a text/JSONL file or directory {_default('corpus')}.")
@click.option("--downstream-data", default=None, help="The task's data file (e.g. SQuAD JSON); default: built-in set.")
@click.option("--model", default=None, help=f"Model name {_default('model')}.")
@click.option("--probe-every", type=int, default=None, help=f"Probe alignment every N steps {_default('probe_every')}.")
@click.option("--eval-size", type=int, default=None, help=f"Downstream evaluation examples {_default('eval_size')}.")
@click.option("--head-warmup-steps", type=int, default=None,
              help=f"Linear-probe steps fitting the downstream head first {_default('head_warmup_steps')}.")
@click.option("--head-fit-size", type=int, default=None,
              help=f"Examples that fit the downstream head, apart from the evaluation set {_default('head_fit_size')}.")
@click.option("--per-sample-method", default=None,
              help=f"auto, jvp, double_backward, vmap or loop {_default('per_sample_method')}.")
@click.option("--hvp-method", default=None,
              help=f"auto, forward_over_reverse or double_backward {_default('hvp_method')}.")
@click.option("--char-noise", type=float, default=None, metavar="RATE",
              help="Character noise (insert/delete/substitute) on the pre-training text before tokenising.")
@click.option("--spectrum", type=int, default=None, metavar="K",
              help="Also compute the top K eigenvalues of the downstream Hessian (Lanczos) at the first and last "
                   "step, with each objective's alignment to the eigenvectors (costs tens of HVPs).")
@click.option("--attribution-top", type=int, default=None, metavar="N",
              help=f"List the N most helpful and most harmful pre-training examples {_default('attribution_top')}.")
@click.option("--param", "params", multiple=True, metavar="OBJ.NAME=VALUE", help="Objective parameter, repeatable.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write config.json, steps.jsonl, report.json, report.csv and PNG plots here.")
@click.option("--resume", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Continue the interrupted run written with --out DIR from its last finished step, with the "
                   "settings in DIR/config.json (no other run option with it); ends as an uninterrupted run would.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout and nothing else.")
@click.pass_context
def analyze(
    ctx: click.Context, pretrain: str | None, downstream: str | None, params: tuple[str, ...], out_dir: str | None,
    resume: str | None, as_json: bool, **options: Any,
) -> None:
    """Train on a weighted mix of pre-training objectives and measure how each one's gradient
    aligns with the downstream task's gradient, how the updates meet the downstream curvature, and
    how well the first- and second-order Taylor predictions match the change that happened."""
    settings = {k: v for k, v in options.items() if v is not None}
    objective_params = _parse_params(params)
    if objective_params:
        settings["objective_params"] = objective_params
    if resume is not None:
        given = [f"--{k.replace('_', '-')}" for k in settings] + ["--param"] * bool(params)
        given += [o for o, v in (("--pretrain", pretrain), ("--downstream", downstream), ("--out", out_dir)) if v]
        if given:
            raise objreg.InvalidParameterError(
                f"--resume takes every setting from DIR/config.json; drop {', '.join(given)}"
            )
        settings = {"resume": resume}
        names, out_dir = None, resume
    elif not pretrain:
        raise objreg.InvalidParameterError("no pre-training objective given: name at least one, e.g. --pretrain mlm,sop")
    else:
        names = [p.strip() for p in pretrain.split(",") if p.strip()]
        settings["out_dir"] = out_dir
    settings["registry"] = render.registry(ctx)
    if not _prints():
        objreg.analyze(names, downstream, **settings)
        return
    console = Console(stderr=True)
    if as_json:
        report = objreg.analyze(names, downstream, **settings)
        click.echo(report.to_json())
        return
    # Off where stderr is no terminal (logs, CI): there it would only add stray lines.
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task("preparing", total=None)

        def on_status(message: str) -> None:
            progress.update(bar, description=message)

        def on_step(step: int, record: dict[str, Any] | None) -> None:
            total = None if resume else options["steps"] or _DEFAULTS["steps"]
            progress.update(bar, completed=step + 1, total=total, description="training with probes")

        report = objreg.analyze(names, downstream, on_step=on_step, on_status=on_status, **settings)
    _render(report.to_dict(), render.console())
    if out_dir:
        render.console().print(
            f"Wrote {out_dir}/: report.json, report.csv, steps.jsonl, config.json and PNG plots", markup=False
        )


def _prints() -> bool:
    """Whether this process prints: the only one, or the first of those torchrun started."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _render(report: dict[str, Any], console: Console) -> None:
    config, summary = report["config"], report["summary"]
    console.print(
        f"[bold]objreg analyze[/bold]  pretrain={','.join(report['pretrain'])}  downstream={report['downstream']}  "
        f"model={config['model']} ({config['shared_parameters']:,} shared parameters)  device={config['device']}  "
        f"optimizer={config['optimizer']} lr={config['lr']}  steps={config['steps']}"
    )
    table = Table(title="Alignment with the downstream gradient (mean over probes)")
    columns = ["objective", "weight", "dot ⟨∇L,∇D⟩", "95% CI", "cosine", "conflicting", "‖∇L‖", "predicted gain"]
    for column in columns:
        table.add_column(column, justify="right" if column != "objective" else "left")
    for name, a in summary["alignment"].items():
        table.add_row(
            name, _weight(config["weights"][name], summary["weights_by_step"].get(name, [])), f"{a['dot']:.4g}",
            f"[{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]", f"{a['cosine']:+.3f}", f"{a['conflict_fraction']:.0%}",
            f"{a['grad_norm']:.3g}", f"{a['first_order_contribution']:+.4g}",
        )
    console.print(table)
    _render_interaction(report["pretrain"], summary["second_order"], console)
    _render_taylor(summary, console)
    _render_spectrum(summary.get("spectrum") or [], console)
    _render_attribution(summary.get("attribution"), console)
    first, both = summary["first_order_relative_error"], summary["taylor_relative_error"]
    console.print(
        f"downstream loss {summary['initial_downstream_loss']:.4f} → {summary['final_downstream_loss']:.4f}; "
        f"first-order predicted improvement {summary['first_order_term']:.4g}, "
        f"with second order {summary['predicted_improvement']:.4g}, actual {summary['actual_improvement']:.4g}"
        + (f" (relative error {first:.1%} → {both:.1%})" if first is not None and both is not None else "")
    )
    regime = summary.get("taylor_regime") or {"inside": True}
    if not regime["inside"]:
        console.print(f"warning: outside the Taylor regime at {len(regime['steps_outside'])} of {summary['probes']} "
                      f"probed steps (the second-order term made the prediction worse); lower --lr "
                      f"(docs/analysis.md)", markup=False)


def _weight(base: float, by_step: list[float]) -> str:
    """``1``, or ``1→0`` where a schedule moves it (first → last step)."""
    if by_step and (by_step[0] != base or by_step[-1] != base):
        return f"{by_step[0]:g}→{by_step[-1]:g}"
    return f"{base:g}"


def _render_interaction(names: list[str], pairs: dict[str, float], console: Console) -> None:
    # Secondary tables use a box without side walls: only the alignment table's rows start with │.
    table = Table(title="Second-order interaction S_ij = g_iᵀ H_D g_j (mean over probes)", box=box.SIMPLE,
                  show_edge=False)
    table.add_column("")
    for name in names:
        table.add_column(name, justify="right")
    for i, a in enumerate(names):
        table.add_row(a, *[f"{pairs[f'{a},{b}' if i <= j else f'{b},{a}']:.4g}" for j, b in enumerate(names)])
    console.print(table)


def _render_taylor(summary: dict[str, Any], console: Console) -> None:
    probes = summary["probes"]
    table = Table(title=f"Taylor prediction vs what happened (sums over {probes} probed steps; improvement = drop of D)",
                  box=box.SIMPLE, show_edge=False)
    table.add_column("term")
    table.add_column("improvement", justify="right")
    table.add_column("relative error", justify="right")
    table.add_column("Pearson r / Spearman ρ vs actual, over steps", justify="right")
    correlation = summary["correlation"]
    table.add_row("first order  −Σ ∇D·Δθ", f"{summary['first_order_term']:+.4g}",
                  _percent(summary["first_order_relative_error"]), _pair(correlation["first_order"]))
    table.add_row("second order  −Σ ½ ΔθᵀH_DΔθ", f"{summary['second_order_term']:+.4g}", "", "")
    table.add_row("predicted (first + second)", f"{summary['predicted_improvement']:+.4g}",
                  _percent(summary["taylor_relative_error"]), _pair(correlation["first_plus_second_order"]))
    table.add_row("actual  −Σ ΔD", f"{summary['actual_improvement']:+.4g}", "", "")
    for part, value in summary["contributions"]["first_order"].items():
        if part not in summary["alignment"]:  # the optimizer's own parts (momentum, weight decay)
            table.add_row(f"  of which first order from {part}", f"{value:+.4g}", "", "")
    console.print(table)
    console.print(f"Update split: {summary['update_rule']}", markup=False)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _pair(values: dict[str, float | None]) -> str:
    return " / ".join("n/a" if values[k] is None else f"{values[k]:+.3f}" for k in ("pearson", "spearman"))


def _render_spectrum(spectra: list[dict[str, Any]], console: Console) -> None:
    if not spectra:
        return
    table = Table(title="Top eigenvalues of H_D, and |cos| of each gradient with the top eigenvector",
                  box=box.SIMPLE, show_edge=False)
    table.add_column("step", justify="right")
    table.add_column("eigenvalues", justify="left")
    names = list(spectra[0]["alignment"])
    for name in [*names, "∇D"]:
        table.add_column(f"|cos| {name}", justify="right")
    for entry in spectra:
        cosines = [abs(entry["alignment"][n][0]) for n in names] + [abs(entry["downstream_alignment"][0])]
        table.add_row(str(entry["step"]), ", ".join(f"{v:.4g}" for v in entry["eigenvalues"]),
                      *[f"{c:.3f}" for c in cosines])
    console.print(table)


def _render_attribution(attribution: dict[str, Any] | None, console: Console) -> None:
    if not attribution or not (attribution["helpful"] or attribution["harmful"]):
        return
    for title, entries in (("helped", attribution["helpful"]), ("hurt", attribution["harmful"])):
        if not entries:
            continue
        console.print(f"Pre-training examples that {title} the downstream task most (first-order improvement, "
                      f"of {attribution['examples']} scored):", markup=False)
        for e in entries:
            text = e["text"] if len(e["text"]) <= 90 else e["text"][:89] + "…"
            steps = ",".join(map(str, e["steps"]))
            console.print(f"  {e['score']:>+10.3g}  {e['objective']:<8} step {steps:<5} {text}", markup=False,
                          highlight=False)
