"""``objreg corrupt NAME --text ...``: see what an objective does to real text.

Tokenises the texts with the tokenizer of ``--model`` (default: objreg's default tokenizer; a
Hugging Face directory's own ``tokenizer.json``), exactly as ``objreg analyze --model`` builds its
rows, corrupts them with a seeded generator and shows the model input, the labels, the extras and
the attention mask, token by token (``--json`` adds the token ids). Labels are shown by what they
are (``ObjectiveInfo.label_kind``): token ids as tokens, class targets as numbers.
"""

from __future__ import annotations

from typing import Any

import click
import torch

import objreg
from objreg.cli import render
from objreg.toolkit import noise, selection

#: The mask grid shows at most this many positions: wider grids wrap and become unreadable.
MASK_GRID_LIMIT = 48
#: Extras longer than this are cut short on the terminal (JSON always has them whole).
EXTRAS_LIMIT = 16


def parse_params(raw: tuple[str, ...], info: objreg.ObjectiveInfo) -> dict[str, str]:
    """``("mask_prob=0.3", ...)`` -> ``{"mask_prob": "0.3"}``. Values stay strings: the registry
    checks names and coerces values against the objective's declared parameters."""
    allowed = ", ".join(p.name for p in info.params) or "(none)"
    params: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise objreg.InvalidParameterError(
                f"--param {item!r} is not key=value; parameters of {info.name!r}: {allowed}"
            )
        params[key.strip()] = value.strip()
    return params


def _tokens_or_none(tokenizer: objreg.Tokenizer, labels: list[int]) -> list[str | None]:
    strings = tokenizer.tokens([0 if label == objreg.IGNORE_INDEX else label for label in labels])
    return [None if label == objreg.IGNORE_INDEX else s for label, s in zip(labels, strings)]


def label_kind(declared: str, labels: torch.Tensor, vocab: objreg.Vocabulary) -> str:
    """``tokens`` or ``classes``: as declared, or for ``auto`` from the values (class targets when
    every label is a special token's id, which no token-predicting objective has)."""
    if declared != "auto":
        return declared
    given = labels[labels != objreg.IGNORE_INDEX]
    if given.numel() and bool(torch.isin(given, vocab.special_id_tensor().to(given.device)).all()):
        return "classes"
    return "tokens"


def corruption_rows(
    tokenizer: objreg.Tokenizer, batch: objreg.TokenBatch, corrupted: objreg.CorruptedBatch, mask: torch.Tensor,
    kind: str = "tokens",
) -> list[dict[str, Any]]:
    """One dict per row with every field as plain lists (what ``--json`` prints). Rows keep their
    padding so that positions line up with the attention mask. ``kind``: the labels are token ids
    (shown as tokens) or ``classes`` (shown as numbers)."""
    rows = []
    for b in range(batch.batch_size):
        labels = corrupted.labels[b].tolist()
        rows.append({
            "original": tokenizer.tokens(batch.input_ids[b]),
            "original_ids": batch.input_ids[b].tolist(),
            "input": tokenizer.tokens(corrupted.input_ids[b]),
            "input_ids": corrupted.input_ids[b].tolist(),
            "labels": _tokens_or_none(tokenizer, labels) if kind == "tokens" else
            [None if label == objreg.IGNORE_INDEX else label for label in labels],
            "attention_mask": mask[b].int().tolist(),
            "extras": {name: value[b].tolist() for name, value in sorted(corrupted.extras.items())},
        })
    return rows


@click.command()
@click.argument("name")
@click.option("--text", "texts", multiple=True, required=True, metavar="TEXT",
              help="A text to corrupt; repeat for several rows.")
@click.option("--seed", default=0, show_default=True, help="Seed of the corruption's random generator.")
@click.option("--param", "raw_params", multiple=True, metavar="KEY=VALUE",
              help="Override a parameter of the objective (see `objreg show NAME`); repeatable (default: the "
                   "objective's reference defaults).")
@click.option("--seq-len", type=click.IntRange(min=3), default=None,
              help="Truncate rows to this many tokens [default: fit the longest text].")
@click.option("--model", default="default", show_default=True, metavar="NAME|DIR",
              help="The model whose tokenizer builds the rows, as `objreg analyze --model` takes it: a name or a "
                   "local Hugging Face model directory (its tokenizer.json).")
@click.option("--char-noise", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
              help="Character noise rate applied to the texts before tokenising (insert/delete/substitute).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def corrupt(
    ctx: click.Context, name: str, texts: tuple[str, ...], seed: int, raw_params: tuple[str, ...],
    seq_len: int | None, model: str, char_noise: float, as_json: bool,
) -> None:
    """Corrupt TEXTs with objective NAME and show input, labels and attention mask."""
    from objreg.analysis.run.validation import MAX_SEED, check_integer

    check_integer("seed", seed, 0, MAX_SEED)  # the generator takes 64 bits at most; runs take 32
    registry = render.registry(ctx)
    # Check the name (unknown, or a downstream task) before the slower tokenizer loading.
    info = registry.get(name).info
    params = parse_params(raw_params, info)
    tokenizer = _tokenizer(registry, model)
    if char_noise > 0:
        # Its own stream: the corruption below draws the same numbers with or without noise.
        texts = tuple(noise.char_noise(list(texts), char_noise, torch.Generator().manual_seed(seed + 1)))
    batch = objreg.tokenize(list(texts), seq_len, tokenizer)
    # Token frequencies for the inverse_frequency policy, counted on the texts themselves.
    objective = registry.get(name, vocab=selection.vocab_with_counts(tokenizer.vocab, batch), **params)
    objective.check_architecture(getattr(tokenizer, "architecture", "encoder"))
    corrupted = objective.corrupt(batch, torch.Generator().manual_seed(seed))
    mask = objective.attention_mask(corrupted)
    kind = label_kind(info.label_kind, corrupted.labels, tokenizer.vocab)
    rows = corruption_rows(tokenizer, batch, corrupted, mask, kind)
    if as_json:
        # Compact: indented, the masks alone would run to thousands of lines.
        render.echo_json({"objective": name, "seed": seed, "params": dict(objective.params), "label_kind": kind,
                          "rows": rows}, indent=None)
        return
    console = render.console()
    settings = ", ".join(f"{k}={v}" for k, v in objective.params.items()) or "no parameters"
    render.prose(console, f"{name} (seed {seed}; {settings})", style="bold", indent="  ")
    # The terminal view hides padding; JSON keeps it so positions line up with the mask.
    original_padding, input_padding = batch.is_padding.tolist(), corrupted.is_padding.tolist()
    for b, row in enumerate(rows):
        _print_row(console, b, row, original_padding[b], input_padding[b], kind)
    _print_mask(console, rows[0], input_padding[0])


def _tokenizer(registry: objreg.Registry, model: str) -> objreg.Tokenizer:
    """The tokenizer ``objreg analyze --model MODEL`` uses on the default corpus."""
    if model == "default":
        return objreg.default_tokenizer(registry=registry)
    cache = objreg.cache_dir()
    return registry.load_tokenizer(model, registry.load_corpus("default", cache), cache)


def _print_row(
    console: Any, b: int, row: dict[str, Any], original_padding: list[bool], input_padding: list[bool], kind: str,
) -> None:
    original = [t for t, pad in zip(row["original"], original_padding) if not pad]
    inputs = [t for t, pad in zip(row["input"], input_padding) if not pad]
    labels = [label for label, pad in zip(row["labels"], input_padding) if not pad]
    grid = render.table(f"Row {b}", "pos", "original", "input", "label" if kind == "tokens" else "label (class)")
    for i in range(max(len(original), len(inputs))):
        before = original[i] if i < len(original) else ""
        after = inputs[i] if i < len(inputs) else ""
        label = labels[i] if i < len(labels) else None
        grid.add_row(
            render.text(i, "dim"),
            render.text(before),
            render.text(after, "bold red" if after != before else ""),
            render.text("·" if label is None else label, "green" if label is not None else "dim"),
        )
    render.show(console, grid)
    for name, values in row["extras"].items():
        long = isinstance(values, list) and len(values) > EXTRAS_LIMIT
        shown = [*values[:EXTRAS_LIMIT], "..."] if long else values
        console.print(render.text(f"  {name}: {shown}"))


def _print_mask(console: Any, row: dict[str, Any], input_padding: list[bool]) -> None:
    positions = [i for i, pad in enumerate(input_padding) if not pad]
    # As many positions as fit the terminal's width (a row is 17 columns of labels, then 2 a position).
    shown = positions[: max(8, min(MASK_GRID_LIMIT, (console.width - 17) // 2))]
    note = f" (first {len(shown)} of {len(positions)} positions)" if len(shown) < len(positions) else ""
    console.print(render.text(f"Attention mask of row 0{note}", "bold"))
    console.print(render.text("rows are queries, columns keys; ■ may attend, · may not", "dim"))
    for i in shown:
        cells = " ".join("■" if row["attention_mask"][i][j] else "·" for j in shown)
        console.print(render.text(f"{i:>3} {row['input'][i][:12]:<12} {cells}"))
