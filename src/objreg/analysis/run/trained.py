"""The trained backbone a run leaves behind (``RUN/model``), and finding it again.

A run on a Hugging Face model directory (continued pre-training) ends by writing the backbone it
trained as a model directory of its own, ``RUN/model`` (:meth:`HFBackbone.save_pretrained`:
config, safetensors weights and the source's tokenizer files), written beside and then renamed
into place, so a directory named ``model`` is always whole. ``transformers.AutoModel`` and
objreg's ``--model`` read it; ``objreg finetune RUN`` finds it with :func:`resolve`, with the
run's settings (its pre-training corpus, which evaluation text must not be in).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from objreg.core.errors import DataError

MODEL = "model"
_PARTIAL = ".model.partial"


def can_save(model: nn.Module) -> bool:
    """Whether ``model``'s backbone can be written as a model directory (a Hugging Face one)."""
    return callable(getattr(getattr(model, "backbone", None), "save_pretrained", None))


def save_backbone(model: nn.Module, run_dir: Path) -> Path:
    """Write ``model``'s backbone to ``run_dir/model`` (module docstring); returns that path."""
    partial, final = run_dir / _PARTIAL, run_dir / MODEL
    for stale in (partial, final):
        if stale.is_symlink() or stale.is_file():
            stale.unlink()
        elif stale.exists():
            shutil.rmtree(stale)
    model.backbone.save_pretrained(partial)
    os.replace(partial, final)
    return final


@dataclass(frozen=True)
class Source:
    """A model to start from: ``model`` (a model name or directory, as ``--model`` takes it) and,
    for a run directory, the run's ``config.json`` (its settings)."""

    model: str
    run: dict[str, Any] | None = None


def resolve(path: str) -> Source:
    """``path`` as a model to start from: a run directory (``config.json`` of an objreg run) gives
    its ``model`` subdirectory and its settings; anything else is a model name or directory.

    Raises:
        DataError: a run directory that holds no trained model, or whose config cannot be read.
    """
    directory = Path(path).expanduser()
    config_file = directory / "config.json"
    if not (directory / "run.json").is_file() or not config_file.is_file():
        return Source(path)
    try:
        run = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"run directory {path!r}: cannot read its config.json ({e})") from None
    if not isinstance(run, dict) or "pretrain" not in run:
        return Source(path)  # a model directory that happens to hold a run.json
    trained = directory / MODEL
    if not (trained / "config.json").is_file():
        why = ("it did not finish" if not (directory / "report.json").is_file() else
               f"it trained the built-in model {run.get('model')!r}, which is not saved; continued pre-training "
               f"saves a Hugging Face model (--model DIR)")
        raise DataError(f"run directory {path!r} holds no trained model ({MODEL}/): {why}")
    return Source(str(trained), run)
