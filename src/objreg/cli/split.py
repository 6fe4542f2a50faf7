"""``objreg split``: a classification file's rows split into train and held-out files, with the
training rows' text as a corpus (for task-adaptive pre-training). No logic here beyond parsing:
:func:`objreg.toolkit.splits.split_classification_file` does the work."""

from __future__ import annotations

import click


@click.command()
@click.argument("data", metavar="DATA")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Where to write train.EXT, heldout.EXT and train.txt (none may exist).")
@click.option("--held-out", type=float, default=1 / 3, show_default="1/3", help="Share of the rows held out.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the rows' order.")
def split(data: str, out_dir: str, held_out: float, seed: int) -> None:
    """Split DATA (a GLUE-style TSV or JSONL classification file) into rows to train on and rows
    held out, and write the training rows' text as a corpus: pre-train on train.txt (objreg
    analyze --corpus), fine-tune on train.EXT and score on heldout.EXT (objreg finetune --eval-data)."""
    from objreg.toolkit.splits import split_classification_file

    files = split_classification_file(data, out_dir, held_out=held_out, seed=seed)
    click.echo(f"Wrote {files.train} ({files.train_rows} rows), {files.heldout} ({files.heldout_rows} rows) and "
               f"{files.text} (the training rows' text)")
