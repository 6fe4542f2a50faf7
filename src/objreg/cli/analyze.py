"""``objreg analyze``: parse options, call ``objreg.analyze``, render the report. No math here."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
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
@click.option("--pretrain", required=True, help="Comma-separated pre-training objectives, e.g. mlm,sop.")
@click.option("--downstream", default="qa", show_default=True, help="Downstream task.")
@click.option("--weights", default=None, help="Objective weights, e.g. mlm=1,sop=0.5 (default 1 each).")
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
@click.option("--param", "params", multiple=True, metavar="OBJ.NAME=VALUE", help="Objective parameter, repeatable.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write config.json, steps.jsonl and report.json here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout and nothing else.")
@click.pass_context
def analyze(
    ctx: click.Context, pretrain: str, downstream: str, params: tuple[str, ...], out_dir: str | None, as_json: bool,
    **options: Any,
) -> None:
    """Train on a weighted mix of pre-training objectives and measure how each one's gradient
    aligns with the downstream task's gradient."""
    settings = {k: v for k, v in options.items() if v is not None}
    objective_params = _parse_params(params)
    if objective_params:
        settings["objective_params"] = objective_params
    settings["registry"] = render.registry(ctx)
    names = [p.strip() for p in pretrain.split(",") if p.strip()]
    console = Console(stderr=True)
    if as_json:
        report = objreg.analyze(names, downstream, out_dir=out_dir, **settings)
        click.echo(report.to_json())
        return
    # Off where stderr is no terminal (logs, CI): there it would only add stray lines.
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task("preparing", total=None)

        def on_status(message: str) -> None:
            progress.update(bar, description=message)

        def on_step(step: int, record: dict[str, Any] | None) -> None:
            progress.update(bar, completed=step + 1, total=options["steps"] or _DEFAULTS["steps"],
                            description="training with probes")

        report = objreg.analyze(names, downstream, out_dir=out_dir, on_step=on_step, on_status=on_status, **settings)
    _render(report.to_dict(), render.console())
    if out_dir:
        render.console().print(f"Wrote {out_dir}/report.json, steps.jsonl and config.json")


def _render(report: dict[str, Any], console: Console) -> None:
    config, summary = report["config"], report["summary"]
    console.print(
        f"[bold]objreg analyze[/bold]  pretrain={','.join(report['pretrain'])}  downstream={report['downstream']}  "
        f"model={config['model']} ({config['shared_parameters']:,} shared parameters)  device={config['device']}  "
        f"optimizer={config['optimizer']} lr={config['lr']}  steps={config['steps']}"
    )
    table = Table(title="Alignment with the downstream gradient (mean over probes)")
    # Each objective's share of the predicted improvement is exact only for plain SGD.
    shares = config["optimizer"] == "sgd"
    columns = ["objective", "weight", "dot ⟨∇L,∇D⟩", "95% CI", "cosine", "conflicting", "‖∇L‖"]
    for column in columns + (["predicted gain"] if shares else []):
        table.add_column(column, justify="right" if column != "objective" else "left")
    for name, a in summary["alignment"].items():
        row = [
            name, f"{config['weights'][name]:g}", f"{a['dot']:.4g}", f"[{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]",
            f"{a['cosine']:+.3f}", f"{a['conflict_fraction']:.0%}", f"{a['grad_norm']:.3g}",
        ]
        table.add_row(*row, *([f"{a['first_order_contribution']:+.4g}"] if shares else []))
    console.print(table)
    error = summary["taylor_relative_error"]
    console.print(
        f"downstream loss {summary['initial_downstream_loss']:.4f} → {summary['final_downstream_loss']:.4f}; "
        f"first-order predicted improvement {summary['predicted_improvement']:.4g}, "
        f"actual {summary['actual_improvement']:.4g}"
        + (f" (relative error {error:.1%})" if error is not None else "")
    )
