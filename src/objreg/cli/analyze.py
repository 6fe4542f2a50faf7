"""``objreg analyze``: parse options, call ``objreg.analyze``, render the report. No math here.

While it runs, stderr shows its progress (:mod:`objreg.cli.progress`); Ctrl-C and SIGTERM stop
it cleanly and say how to resume it (:mod:`objreg.cli.interrupt`). The report goes to stdout:
tables at their natural width where stdout is not a terminal, numbers never cut
(:mod:`objreg.cli.render`); ``--json`` prints the report alone. Third-party objectives go through
the contract suite's cheap checks first (the library's, :mod:`objreg.analysis.run.contract`), and a
failure is one warning line.

Under ``torchrun`` every process runs the command (the library shares the work between them);
only the first (``RANK`` 0) prints, as only it writes ``--out``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Console
from rich.measure import Measurement

import objreg
from objreg.analysis.run.config import FROZEN_WARMUP_STEPS
from objreg.analysis.run.naming import command_line
from objreg.cli import assessment, options, render, threads
from objreg.cli.interrupt import Interrupts, Stopped, distributed, exit_code, stopped_message
from objreg.cli.options import RegistryOption, choices, default
from objreg.cli.progress import TRAINING, RunDisplay, cosine_text

if TYPE_CHECKING:
    from objreg.analysis.records import StepRecord


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
@click.option("--pretrain", default=None, metavar="OBJ,...", cls=RegistryOption, describe=options.describe_pretrain,
              fallback="Comma-separated pre-training objectives, e.g. mlm,sop (required); `objreg list` names them.")
@click.option("--downstream", default=None, metavar="TASK", cls=RegistryOption,
              describe=options.describe_downstream,
              fallback=f"Downstream task; `objreg list` names them {default('downstream')}.")
@click.option("--weights", default=None, metavar="OBJ=W,...",
              help="Base objective weights, e.g. mlm=1,sop=0.5 (default: 1 each).")
@click.option("--schedule", default=None, metavar="[OBJ=]SHAPE,...",
              help="How each weight changes over the run (weight × shape): constant, linear[:START:END], "
                   "cosine[:START:END] (both default 1→0) or step:AT[:BEFORE:AFTER] (default 1, 0); an entry "
                   "without OBJ= applies to the rest, e.g. 'mlm=linear:1:0,sop=step:8:0:1' or 'cosine'; or "
                   "adaptive[:RULE] alone: every weight set from the latest probe, RULE quadratic (the optimum of "
                   "the quadratic model in the trust region, the default) or tartan (a META-TARTAN-style "
                   "multiplicative update), the total weight kept (default: constant).")
@click.option("--trust-radius", type=float, default=None, metavar="R",
              help="How far the counterfactual best weights, and adaptive:quadratic's weights per probe, may move "
                   "from the weights used: each by at most R × the total weight (a run's counterfactual: R over "
                   f"√(probed steps)) {default('trust_radius')}.")
@click.option("--adaptive-rate", type=float, default=None, metavar="RATE",
              help=f"adaptive:tartan's largest change of a log-weight per probe {default('adaptive_rate')}.")
@click.option("--adaptive-smoothing", type=float, default=None, metavar="S",
              help="Share of the past an adaptive rule keeps when it averages the probes, in [0, 1) "
                   f"{default('adaptive_smoothing')}.")
@click.option("--min-weight", type=float, default=None, metavar="W",
              help=f"Smallest weight an adaptive rule or the counterfactual optimum picks {default('min_weight')}.")
@click.option("--max-weight", type=float, default=None, metavar="W",
              help="Largest weight an adaptive rule or the counterfactual optimum picks (default: the total weight).")
@click.option("--steps", type=int, default=None, help=f"Training steps {default('steps')}.")
@click.option("--lr", type=float, default=None, help=f"Learning rate {default('lr')}.")
@click.option("--optimizer", default=None, metavar="NAME", help=choices("optimizer", "The optimizer"))
@click.option("--batch-size", type=int, default=None, help=f"Examples per objective per step {default('batch_size')}.")
@click.option("--seq-len", type=int, default=None, help=f"Tokens per row {default('seq_len')}.")
@click.option("--seed", type=int, default=None, help=f"Random seed {default('seed')}.")
@click.option("--device", default=None, metavar="DEVICE", help=choices("device", "Where to compute"))
@click.option("--dtype", default=None, metavar="NAME", help=choices("dtype", "Floating-point type"))
@click.option("--corpus", default=None, metavar="NAME|PATH", cls=RegistryOption, describe=options.describe_corpus,
              fallback=f"Pre-training text; `objreg list` names the forms {default('corpus')}.")
@click.option("--downstream-data", default=None, metavar="PATH",
              help="The task's data, in a format --downstream names for it, e.g. SQuAD JSON for qa (default: the "
                   "task's built-in set, from held-out corpus documents).")
@click.option("--model", default=None, metavar="NAME|DIR", cls=RegistryOption, describe=options.describe_model,
              fallback=f"The backbone; `objreg list` names them {default('model')}.")
@click.option("--probe-every", type=int, default=None,
              help=f"Probe alignment every N steps, and always the first and the last {default('probe_every')}.")
@click.option("--eval-size", type=int, default=None,
              help=f"Downstream examples whose loss is D {default('eval_size')}.")
@click.option("--downstream-head", default=None, metavar="HOW",
              help=choices("downstream_head", "What D's downstream head is"))
@click.option("--head-warmup-steps", type=int, default=None,
              help=f"With --downstream-head frozen: linear-probe steps fitting the head first, 0 for none "
                   f"(default: {FROZEN_WARMUP_STEPS}).")
@click.option("--head-fit-size", type=int, default=None,
              help="Examples that fit the downstream head, apart from the evaluation set (default: 256 with a "
                   "re-fitted head, 1024 with a frozen one).")
@click.option("--per-sample-method", default=None, metavar="METHOD",
              help=choices("per_sample_method", "How the per-example dots ⟨∇ℓ_i, ∇D⟩ are taken"))
@click.option("--hvp-method", default=None, metavar="METHOD",
              help=choices("hvp_method", "How Hessian-vector products of D are taken"))
@click.option("--char-noise", type=float, default=None, metavar="RATE",
              help=f"Character noise (insert/delete/substitute) on the pre-training text before tokenising, a rate "
                   f"in [0, 1] {default('char_noise')}.")
@click.option("--spectrum", type=int, default=None, metavar="K",
              help="Also compute the top K eigenvalues of the downstream Hessian (Lanczos) at the first and last "
                   f"step, with each objective's alignment to the eigenvectors (costs tens of HVPs) "
                   f"{default('spectrum')}.")
@click.option("--attribution-top", type=int, default=None, metavar="N",
              help=f"List the N most helpful and most harmful pre-training examples {default('attribution_top')}.")
@click.option("--param", "params", multiple=True, metavar="OBJ.NAME=VALUE",
              help="An objective's or the task's parameter (`objreg show OBJ` lists them), repeatable (default: "
                   "each parameter's reference default).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Write config.json, steps.jsonl, report.json, report.csv and PNG plots here, and a checkpoint "
                   "after every step, which makes the run resumable (default: write nothing).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=1, metavar="N",
              help="With --out or --resume: write the checkpoint after every N-th step and the last, not after each "
                   "(a checkpoint under Adam holds several copies of the model: docs/performance.md); an "
                   "interrupted run resumes from the last one and recomputes the steps after it to the same result "
                   "(default: 1). Also beside --resume.")
@click.option("--resume", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Continue the interrupted run written with --out DIR from its last finished step, with the "
                   "settings in DIR/config.json (no other run option with it); ends as an uninterrupted run would "
                   "(default: start a new run).")
@click.option("--threads", "thread_count", type=click.IntRange(min=1, max=threads.MAX_THREADS), default=None,
              metavar="N",
              help="CPU threads torch computes with (default: auto: the CPUs this process may use less the "
                   "one-minute load average, at least 1; or OMP_NUM_THREADS where it is set). Also beside --resume.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON on stdout and nothing else (on stderr only warnings and errors, and "
                   "a live progress bar where stderr is a terminal).")
@click.pass_context
def analyze(
    ctx: click.Context, pretrain: str | None, downstream: str | None, params: tuple[str, ...], out_dir: str | None,
    resume: str | None, checkpoint_every: int, thread_count: int | None, as_json: bool, **settings_given: Any,
) -> None:
    """Train on a weighted mix of pre-training objectives and measure how each one's gradient
    aligns with the downstream task's gradient, how the updates meet the downstream curvature, and
    how well the first- and second-order Taylor predictions match the change that happened.

    Progress goes to stderr: a live display on a terminal, plain lines otherwise. Ctrl-C stops
    after the step in flight (twice: at once) and prints the command that resumes the run.
    """
    settings = {k: v for k, v in settings_given.items() if v is not None}
    objective_params = _parse_params(params)
    if objective_params:
        settings["objective_params"] = objective_params
    if resume is not None:
        from objreg.analysis.run.resume import refuse_settings_beside_resume  # the run's modules, as resuming loads

        given = [f"--{k.replace('_', '-')}" for k in settings] + ["--param"] * bool(params)
        given += [o for o, v in (("--pretrain", pretrain), ("--downstream", downstream), ("--out", out_dir)) if v]
        refuse_settings_beside_resume(given, "--resume")
        settings = {"resume": resume, "checkpoint_every": checkpoint_every}
        names, out_dir = None, resume
    elif not pretrain:
        raise objreg.InvalidParameterError("no pre-training objective given: name at least one, e.g. --pretrain mlm,sop")
    else:
        names = [p.strip() for p in pretrain.split(",") if p.strip()]
        settings["out_dir"] = out_dir
        settings["checkpoint_every"] = checkpoint_every
    registry = render.registry(ctx)
    settings["registry"] = registry
    chosen = threads.for_this_machine(thread_count)
    if not _prints():
        with threads.using(chosen), command_line():
            objreg.analyze(names, downstream, **settings)
        return
    # Bad settings fail here, in milliseconds and in one line, before any progress is shown.
    with command_line():
        config = _checked_config(names, downstream, settings, resume, registry)
    total = config.steps
    errors = render.console(stderr=True)
    # With --json, stderr carries only warnings and errors, but a terminal gets a live bar (which
    # leaves nothing behind), so that a long run shows it is alive.
    display = RunDisplay(errors, total, live=errors.is_terminal, lines=not as_json) \
        if not as_json or errors.is_terminal else None
    notify = display.notify if display is not None else (lambda message: click.echo(message, err=True))
    interrupts = Interrupts(notify, installed=not distributed())

    def on_status(message: str) -> None:
        interrupts.training = message == TRAINING
        if display is not None:
            display.status(message)

    finished = [0]

    def on_step(step: int, record: StepRecord | None) -> None:
        finished[0] = step + 1
        if display is not None:
            display.step(step, record)
        interrupts.after_step(step, total)

    if display is not None:
        display.event(f"computing with {chosen.describe()}; --threads N to change")
    try:
        with interrupts, display or nullcontext(), threads.using(chosen), command_line():
            report = objreg.analyze(names, downstream, on_step=on_step, on_status=on_status, **settings)
    except Stopped as stop:
        click.echo(stopped_message(stop, out_dir, finished[0], total), err=True)
        ctx.exit(exit_code(stop))
    if as_json:
        click.echo(report.to_json())
        return
    console = render.console()
    _render(report.to_dict(), console, chosen.describe())
    if out_dir:
        trained = " and the trained model in model/" if (Path(out_dir) / "model").is_dir() else ""
        console.print(f"Wrote {out_dir}/: report.json, report.csv, steps.jsonl, config.json and PNG plots{trained}",
                      markup=False)


def _checked_config(names: list[str] | None, downstream: str | None, settings: dict[str, Any], resume: str | None,
                    registry: objreg.Registry) -> objreg.AnalysisConfig:
    """The run's settings, checked as ``objreg.analyze`` checks them (names, parameters, device)."""
    from objreg.analysis.run.prepare import check  # the trainer's modules: loaded when a run starts
    from objreg.analysis.run.resume import resumed_config
    from objreg.analysis.run.validation import check_directory_argument

    if resume is not None:
        check_directory_argument("resume", resume)  # before Path() turns '' into '.'
        config = resumed_config(Path(resume), [])
    else:
        given = {k: v for k, v in settings.items() if k not in ("out_dir", "registry", "checkpoint_every")}
        config = objreg.AnalysisConfig(pretrain=tuple(names or ()), downstream=downstream or "qa", **given)
    check(config, registry)
    return config


def _prints() -> bool:
    """Whether this process prints: the only one (a stray ``RANK`` without ``WORLD_SIZE`` > 1 is
    ignored, as the library ignores it), or the first of those torchrun started."""
    return not distributed() or os.environ.get("RANK", "0").strip() in ("", "0")


def _render(report: dict[str, Any], console: Console, threads_used: str | None = None) -> None:
    config, summary = report["config"], report["summary"]
    _render_header(report, console, threads_used)
    numbers = ("dot ⟨∇L,∇D⟩", "95% CI", "cosine", "conflict", "‖∇L‖", "pred. 1st+2nd")
    table = render.table("Alignment with the downstream gradient (over probes)", "objective", *numbers,
                         numbers=numbers, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    weighted = _weighted(config["weights"], summary["weights_by_step"])
    for name, a in summary["alignment"].items():
        table.add_row(
            render.text(name + (f" ×{_weight(config['weights'][name], summary['weights_by_step'].get(name, []))}"
                                if weighted else "")),
            f"{a['dot']:.4g}", f"[{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]", cosine_text(a['cosine']),
            f"{a['conflict_fraction']:.0%}", f"{a['grad_norm']:.3g}",
            f"{a.get('predicted_contribution', a['first_order_contribution']):+.4g}",
        )
    render.show(console, table)
    render.prose(console, "dot: mean over probes, t interval over probes; cosine: Σ dot / √(Σ‖∇L‖² Σ‖∇D‖²) over "
                 "probes, the sign of dot" + ("; ×w: the objective's weight (first → last step)" if weighted else "")
                 + "; pred.: the improvement of D (+: D fell) from the objective's part of the step, its first-order "
                 "term and its share of the second-order term, summed over probes", style="dim")
    _render_interaction(report["pretrain"], summary["second_order"], console)
    _render_taylor(summary, console)
    _render_spectrum(summary.get("spectrum") or [], console)
    _render_attribution(summary.get("attribution"), console)
    render.prose(console, f"downstream loss D: {summary['initial_downstream_loss']:.4f} → "
                 f"{summary['final_downstream_loss']:.4f} over {config['steps']} steps")
    best = (summary.get("counterfactual") or {}).get("best")
    if best is not None and len(report["pretrain"]) > 1:  # one objective has no other weights to compare
        used = summary["counterfactual"]["used"]["first_plus_second_order"]
        weights = ", ".join(f"{k}={v:.3g}" for k, v in best["weights"].items())
        still = "; D would still rise" if best["first_plus_second_order"] < 0 else ""
        render.prose(console, f"counterfactual: best constant weights in the trust region {weights}, predicted "
                     f"improvement {best['first_plus_second_order']:.4g} against {used:.4g} with the weights used "
                     f"({summary['counterfactual']['optimizer_model'].split(':')[0]} model{still})")
        scope = summary["counterfactual"].get("scope")
        if scope:
            render.prose(console, f"a local estimate: {scope['note']}", first="  ", indent="  ", style="dim")
    adaptive = summary.get("adaptive")
    if adaptive:
        render.prose(console, f"adaptive:{adaptive['rule']}: predicted improvement "
                     f"{adaptive['predicted_improvement']:.4g} against "
                     f"{adaptive['best_constant_predicted_improvement']:.4g} for the best constant weights "
                     f"({'beat' if adaptive['beat_best_constant'] else 'did not beat'} them, by the run's local "
                     f"model)")
        if adaptive["warning"]:
            render.prose(console, f"warning: {adaptive['warning']}")
    regime = summary.get("taylor_regime") or {"inside": True}
    if not regime["inside"]:
        render.prose(console, f"warning: outside the Taylor regime at {len(regime['steps_outside'])} of "
                     f"{summary['probes']} probed steps (the second-order term made the prediction worse); lower "
                     f"--lr (docs/analysis.md)")
    for heading, items in assessment.assess(report):
        console.print(heading, markup=False, style="bold")
        for item in items:
            render.prose(console, item, first="- ", indent="  ")


def _render_header(report: dict[str, Any], console: Console, threads_used: str | None) -> None:
    """``objreg analyze``, where it ran and what it ran, packed into the console's width."""
    config = report["config"]
    device = f"{config['device']}, {threads_used}" if threads_used and config["device"] == "cpu" else config["device"]
    parts = ["objreg analyze", f"device={device}", f"pretrain={','.join(report['pretrain'])}",
             f"downstream={report['downstream']}", f"model={config['model']} ({config['shared_parameters']:,} shared "
             f"parameters)", f"optimizer={config['optimizer']} lr={config['lr']}", f"steps={config['steps']}"]
    specs = config.get("schedule") or {}
    adaptive = {spec for spec in specs.values() if str(spec).startswith("adaptive")}
    if adaptive:
        parts.append(f"schedule={adaptive.pop()}")
    elif any(spec != "constant" for spec in specs.values()):
        parts.append("schedule=" + ",".join(f"{k}={v}" for k, v in specs.items() if v != "constant"))
    render.fields(console, parts, style="bold")


def _weighted(weights: dict[str, float], by_step: dict[str, list[float]]) -> bool:
    """Whether any weight is other than 1 at some step (a column of ones says nothing)."""
    return any(w != 1 for w in weights.values()) or any(v != 1 for values in by_step.values() for v in values)


def _weight(base: float, by_step: list[float]) -> str:
    """``1``, or ``1→0`` where a schedule moves it (first → last step)."""
    if by_step and (by_step[0] != base or by_step[-1] != base):
        return f"{by_step[0]:g}→{by_step[-1]:g}"
    return f"{base:g}"


def _secondary(title: str, *columns: str, numbers: tuple[str, ...]) -> Any:
    """A table without side walls, a rule under its header."""
    return render.table(title, *columns, numbers=numbers, box=box.SIMPLE, show_edge=False)


def _render_interaction(names: list[str], pairs: dict[str, float], console: Console) -> None:
    title = "Second-order interaction S_ij = g_iᵀ H_D g_j (mean over probes)"
    values = {(a, b): pairs[f"{a},{b}" if i <= j else f"{b},{a}"] for i, a in enumerate(names)
              for j, b in enumerate(names)}
    table = _secondary(title, "", *names, numbers=tuple(names))
    for a in names:
        table.add_row(render.text(a), *[f"{values[a, b]:.4g}" for b in names])
    wide = console.options.update_width(render.UNBOUNDED_WIDTH)
    if Measurement.get(console, wide, table).maximum <= console.width:
        render.show(console, table)
        return
    # Too many objectives for a matrix on this terminal: the pairs of its upper triangle, as lines.
    console.print(title, markup=False)
    render.fields(console, [f"{a},{b} {values[a, b]:.4g}" for i, a in enumerate(names) for b in names[i:]])


def _render_taylor(summary: dict[str, Any], console: Console) -> None:
    probes = summary["probes"]
    numbers = ("improvement", "relative error", "r / ρ vs actual")
    table = _secondary(f"Taylor prediction vs what happened (sums over {probes} probed steps)", "term", *numbers,
                       numbers=numbers)
    correlation = summary["correlation"]
    table.add_row("first order  −Σ ∇D·Δθ", f"{summary['first_order_term']:+.4g}",
                  _percent(summary["first_order_relative_error"]), _pair(correlation["first_order"]))
    table.add_row("second order  −Σ ½ ΔθᵀH_DΔθ", f"{summary['second_order_term']:+.4g}", "", "")
    table.add_row("predicted (first + second)", f"{summary['predicted_improvement']:+.4g}",
                  _percent(summary["taylor_relative_error"]), _pair(correlation["first_plus_second_order"]))
    table.add_row("actual  −Σ ΔD", f"{summary['actual_improvement']:+.4g}", "", "")
    for part, value in summary["contributions"]["first_order"].items():
        if part not in summary["alignment"]:  # the optimizer's own parts (momentum, weight decay)
            table.add_row(render.text(f"  of which first order from {part}"), f"{value:+.4g}", "", "")
    render.show(console, table)
    legend = ("improvement: the drop of D (negative: D rose); relative error: |predicted − actual| / |actual|; "
              "r / ρ: Pearson and Spearman correlation of predicted and actual changes over the probed steps")
    if summary["taylor_relative_error"] is None:
        scaled = summary["taylor_error"]["scaled"]
        legend += ("; n/a: the steps' actual changes cancel over the run (or are within rounding), so an error "
                   "relative to their sum says nothing; relative to Σ|∇D·Δθ| the errors are "
                   f"{_percent(scaled['first_order'])} (first order) and {_percent(scaled['first_plus_second_order'])} "
                   "(with second order)")
    render.prose(console, legend, style="dim")
    render.prose(console, f"Update split: {summary['update_rule']}")


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _pair(values: dict[str, float | None]) -> str:
    return " / ".join("n/a" if values[k] is None else f"{values[k]:+.3f}" for k in ("pearson", "spearman"))


def _render_spectrum(spectra: list[dict[str, Any]], console: Console) -> None:
    if not spectra:
        return
    names = list(spectra[0]["alignment"])
    cosines = tuple(f"|cos| {name}" for name in [*names, "∇D"])
    # The eigenvalues wrap between numbers, never inside one.
    table = _secondary("Top eigenvalues of H_D, and |cos| of each gradient with the top eigenvector", "step",
                       "eigenvalues", *cosines, numbers=("step", *cosines))
    for entry in spectra:
        cosines = [abs(entry["alignment"][n][0]) for n in names] + [abs(entry["downstream_alignment"][0])]
        table.add_row(str(entry["step"]), ", ".join(f"{v:.4g}" for v in entry["eigenvalues"]),
                      *[f"{c:.3f}" for c in cosines])
    render.show(console, table)


def _render_attribution(attribution: dict[str, Any] | None, console: Console) -> None:
    if not attribution or not (attribution["helpful"] or attribution["harmful"]):
        return
    for title, entries in (("helped", attribution["helpful"]), ("hurt", attribution["harmful"])):
        if not entries:
            continue
        render.prose(console, f"Pre-training examples that {title} the downstream task most (first-order "
                     f"improvement, of {attribution['examples']} scored):")
        for e in entries:
            line = f"  {e['score']:>+10.3g}  {e['objective']:<8} step {','.join(map(str, e['steps'])):<5} "
            # A terminal line ends where the terminal does (the text cut short); a file gets it whole.
            room = max(console.width - len(line), 30)
            text = e["text"] if len(e["text"]) <= room else e["text"][: room - 1] + "…"
            console.print(line + text, markup=False, highlight=False)
