"""A task file split into rows to train on and rows held out, and the training rows' text as a
corpus: what task-adaptive pre-training needs (pre-train on the training rows' text, fine-tune on
them, score on the held-out rows, whose text is never pre-trained on).

Classification files only (GLUE-style TSV with a header, or JSONL: one record a line, read by
:func:`objreg.toolkit.classfiles.read_classification`). Rows that share text (an RTE premise paired
with several hypotheses, a repeated sentence: :func:`objreg.toolkit.overlap.text_groups` on their
lower-cased words) go to the same side, so no held-out row's text is in the training text. Groups
are taken in an order from the ``data_split`` stream of the seed until the held-out side has its
share of the rows. Each output file keeps the input's lines byte for byte (a TSV's header first).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from objreg.core.errors import DataError, InvalidParameterError
from objreg.toolkit.atomic import atomic_file
from objreg.toolkit.classfiles import read_classification
from objreg.toolkit.overlap import text_groups
from objreg.toolkit.randomness import stream
from objreg.toolkit.taskfiles import is_jsonl

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class SplitFiles:
    """The files :func:`split_classification_file` wrote."""

    train: Path
    heldout: Path
    text: Path
    train_rows: int
    heldout_rows: int


def split_classification_file(path: str | Path, out_dir: str | Path, held_out: float = 1 / 3, seed: int = 0
                              ) -> SplitFiles:
    """Write ``train.EXT`` and ``heldout.EXT`` (the rows of ``path``, ``held_out`` of them held out)
    and ``train.txt`` (the training rows' text, one document a row, its texts as sentences) into
    ``out_dir``; refuses to overwrite any of them.

    Raises:
        InvalidParameterError: ``held_out`` outside (0, 1), or a split that leaves a side empty.
        DataError: an unreadable file, or an output that exists already.
    """
    if not (isinstance(held_out, (int, float)) and 0 < held_out < 1):
        raise InvalidParameterError(f"the held-out share must lie strictly between 0 and 1, got {held_out!r}")
    path, out = Path(path), Path(out_dir)
    records, _ = read_classification(path)
    lines = [line + "\n" for line in path.read_text(encoding="utf-8").split("\n")]  # as read_lines counts them
    held = math.ceil(held_out * len(records))
    if not 0 < held < len(records):
        raise InvalidParameterError(f"{path}: {len(records)} rows cannot be split with {held_out:g} held out "
                                    f"(each side needs a row)")
    suffix = path.suffix or ".tsv"
    train_file, heldout_file, text_file = out / f"train{suffix}", out / f"heldout{suffix}", out / "train.txt"
    for file in (train_file, heldout_file, text_file):
        if file.exists() or file.is_symlink():
            raise DataError(f"{file} exists already: choose another directory (objreg overwrites no split)")
    members: dict[int, list[int]] = {}
    for row, group in enumerate(text_groups([_WORD.findall(f"{r.text} {r.pair or ''}".lower()) for r in records])):
        members.setdefault(group, []).append(row)
    held_rows: list[int] = []
    for group in torch.randperm(len(members), generator=stream(seed, "data_split")).tolist():
        if len(held_rows) >= held:
            break
        held_rows += members[group]
    if len(held_rows) == len(records):
        raise InvalidParameterError(f"{path}: its rows share text so widely that no split keeps the held-out rows' "
                                    f"text out of the training rows")
    chosen = set(held_rows)
    parts = {heldout_file: sorted(chosen), train_file: [i for i in range(len(records)) if i not in chosen]}
    header = [] if is_jsonl(path, "classification data file", "") else [lines[0]]
    out.mkdir(parents=True, exist_ok=True)
    for file, chosen in parts.items():
        with atomic_file(file, "w") as f:
            f.writelines([*header, *(lines[records[i].line - 1] for i in chosen)])
    documents = ["\n".join(t for t in (records[i].text, records[i].pair) if t) for i in parts[train_file]]
    with atomic_file(text_file, "w") as f:
        f.write("\n\n".join(documents) + "\n")
    return SplitFiles(train_file, heldout_file, text_file, len(parts[train_file]), len(parts[heldout_file]))

