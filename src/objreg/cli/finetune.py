"""``objreg finetune``: parse options, call ``objreg.finetune``, render the metric with its interval.
No math here.

Progress with an ETA goes to stderr; the table to stdout, or the report alone with ``--json``.
``--out DIR`` writes ``finetune.json`` (the report) and ``predictions.jsonl`` (one line per held-out
row and fold), atomically, never through a link and never over an earlier result; the directory is
checked before any work.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

import objreg
from objreg.cli import render, threads
from objreg.cli.analyze import _parse_params
from objreg.cli.analyze import analyze as _analyze
from objreg.cli.progress import clock_text

#: analyze's options the fine-tune takes as they are.
SHARED_OPTIONS = ("downstream", "downstream_data", "device", "seed", "thread_count")
OUTPUTS = ("finetune.json", "predictions.jsonl")
DEFAULTS = objreg.FineTuneSchedule()


def _shared(command: click.Command) -> click.Command:
    by_name = {p.name: p for p in _analyze.params}
    command.params[1:1] = [by_name[name] for name in SHARED_OPTIONS]
    return command


@_shared
@click.command()
@click.argument("model", metavar="MODEL_OR_RUN")
@click.option("--eval-data", default=None, metavar="PATH",
              help="Held-out rows in a file of their own: train on all of --downstream-data, score on these "
                   "(default: cross-validation over --downstream-data).")
@click.option("--folds", type=int, default=5, show_default=True, help="Cross-validation folds (without --eval-data).")
@click.option("--seeds", type=int, default=1, show_default=True,
              help="Seeds from --seed on; each draws its own folds, heads and batch order.")
@click.option("--epochs", type=int, default=DEFAULTS.epochs, show_default=True, help="Passes over the training rows.")
@click.option("--lr", type=float, default=DEFAULTS.lr, show_default=True, help="AdamW learning rate (constant).")
@click.option("--batch-size", type=int, default=DEFAULTS.batch_size, show_default=True, help="Rows per step.")
@click.option("--weight-decay", type=float, default=DEFAULTS.weight_decay, show_default=True, help="AdamW weight decay.")
@click.option("--seq-len", type=int, default=128, show_default=True, help="Longest row in tokens.")
@click.option("--param", "params", multiple=True, metavar="TASK.NAME=VALUE", help="A task parameter, e.g. qa.doc_stride=64 (default: the task's own).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Write finetune.json and predictions.jsonl (per held-out row and fold) here (default: write nothing).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout and nothing else.")
@click.pass_context
def finetune(ctx: click.Context, model: str, eval_data: str | None, folds: int, seeds: int, epochs: int, lr: float,
             batch_size: int, weight_decay: float, seq_len: int, params: tuple[str, ...], out_dir: str | None,
             as_json: bool, thread_count: int | None, downstream: str | None, downstream_data: str | None,
             device: str | None, seed: int | None) -> None:
    """Fine-tune MODEL_OR_RUN (a model name, a Hugging Face model directory, or the --out directory
    of an `objreg analyze` run of continued pre-training) on a downstream task and report the
    task's metric on held-out rows, with a 95% interval over seeds (one seed: over folds), beside
    the linear probe's D* and metric on the same splits."""
    schedule = objreg.FineTuneSchedule(epochs=epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay)
    task = downstream or "classification"
    out = _checked_out(out_dir) if out_dir is not None else None
    errors = render.console(stderr=True)
    chosen = threads.for_this_machine(thread_count)
    timing = {"label": None, "last": 0.0, "steps": 0, "seconds": 0.0}

    def on_status(message: str) -> None:
        if not as_json:
            errors.print(f"[{clock_text(time.monotonic() - begun)}] {message}", markup=False, soft_wrap=True)

    def on_progress(done: int, total: int, label: str) -> None:
        # The rate counts training steps only: a unit's first step follows its probe, not a step.
        now = time.monotonic()
        if timing["label"] == label:
            timing["steps"] += 1
            timing["seconds"] += now - timing["last"]
        timing["label"], timing["last"] = label, now
        if as_json or not timing["steps"] or (done % max(1, total // 20) and done != total):
            return
        rate = timing["seconds"] / timing["steps"]
        errors.print(f"[{clock_text(now - begun)}] {label}: step {done}/{total}, {rate:.2f} s/step, "
                     f"ETA {clock_text(rate * (total - done))} of training", markup=False, soft_wrap=True)

    begun = time.monotonic()
    if not as_json:
        on_status(f"computing with {chosen.describe()}; --threads N to change")
    with threads.using(chosen):
        report = objreg.finetune(model, task, downstream_data, eval_data=eval_data, folds=folds, seeds=seeds,
                                 seed=0 if seed is None else seed, schedule=schedule, seq_len=seq_len,
                                 params=_parse_params(params).get(task), device=device or "auto",
                                 registry=render.registry(ctx), on_progress=on_progress, on_status=on_status)
    if out is not None:
        _write(out, report)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    console = render.console()
    _render(report.to_dict(), console)
    if out is not None:
        console.print(f"Wrote {out_dir}/: {', '.join(OUTPUTS)}", markup=False)


def _checked_out(out_dir: str) -> Path:
    """The output directory, made and checked before any work: no earlier result, no link in
    place of an output."""
    from objreg.analysis.run.validation import check_directory_argument

    check_directory_argument("out_dir", out_dir)
    out = Path(out_dir)
    for name in OUTPUTS:
        if (out / name).is_symlink():
            raise objreg.InvalidParameterError(f"--out {out_dir!r}: {name} is a symbolic link; objreg writes no "
                                               f"result through a link: remove it, or choose another directory")
        if (out / name).exists():
            raise objreg.InvalidParameterError(f"--out {out_dir!r} already holds {name} of an earlier fine-tune; "
                                               f"choose another directory or remove it")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".objreg-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise objreg.DataError(f"cannot write to --out {out_dir!r}: {e.strerror or e}") from None
    return out


def _write(out: Path, report: objreg.FineTuneReport) -> None:
    from objreg.toolkit.atomic import atomic_file

    with atomic_file(out / "predictions.jsonl", "w") as f:
        for row in report.predictions:
            f.write(json.dumps(row) + "\n")
    with atomic_file(out / "finetune.json", "w") as f:
        json.dump(report.to_dict(), f, indent=2, allow_nan=False)


def _render(report: dict[str, Any], console: Any) -> None:
    setting = report["setting"]
    split = (f"{setting['folds']}-fold cross-validation" if setting["folds"] else f"held out: {setting['eval_data']}")
    render.fields(console, ["objreg finetune", f"model={report['model']}", f"downstream={report['downstream']}",
                            split, f"seeds={setting['seeds']}", f"epochs={setting['epochs']} lr={setting['lr']:g} "
                            f"batch={setting['batch_size']}", f"{report['timing']['wall_s']:.0f} s"], style="bold")
    table = render.table("Held-out metric (95% interval)", "", "measure", "mean", "95% interval", "over",
                         numbers=("mean", "95% interval"))
    for kind, label in (("finetune", "fine-tuned"), ("probe", "linear probe")):
        for name, s in report["summary"][kind].items():
            table.add_row(label, "D*" if name == "d_star" else name.replace("_", " "), f"{s['mean']:.4g}", f"[{s['ci95'][0]:.4g}, {s['ci95'][1]:.4g}]",
                          s["interval_over"])
            label = ""
    render.show(console, table)
    render.prose(console, "fine-tuned: backbone + task head trained on the training rows; linear probe: the head's "
                 "linear part re-fitted on the frozen backbone's features (D*: its held-out loss, as in objreg "
                 "analyze); loss: mean held-out cross-entropy", style="dim")
    if report["pretraining"]:
        p = report["pretraining"]
        render.prose(console, f"continued pre-training: {','.join(p['pretrain'])} on {p['corpus']} for {p['steps']} "
                     f"steps ({p['optimizer']}, lr {p['lr']:g}) from {p['model']}")
