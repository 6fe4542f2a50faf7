"""Where objreg caches derived files (the default corpus and its trained tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$OBJREG_CACHE_DIR``, else ``$XDG_CACHE_HOME/objreg``, else ``~/.cache/objreg``."""
    if os.environ.get("OBJREG_CACHE_DIR"):
        return Path(os.environ["OBJREG_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "objreg"
