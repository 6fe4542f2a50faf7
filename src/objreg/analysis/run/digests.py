"""Content hashes (SHA-256) of what a run reads, for its fingerprint
(:mod:`objreg.analysis.run.fingerprint`): a corpus's documents, a batch's tensors, a file, a
directory's files, a text, and a plugin's source. Each hash names its kind and version in its
first bytes, so two kinds of input never share a hash.
"""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path
from typing import Any

import torch


def documents_digest(documents: Any) -> str:
    """SHA-256 of a corpus's documents (sentence and document boundaries included)."""
    digest = hashlib.sha256(b"objreg-corpus-v1\n")
    for document in documents:
        for sentence in document:
            digest.update(sentence.encode("utf-8", "surrogatepass"))
            digest.update(b"\x1f")
        digest.update(b"\x1e")
    return digest.hexdigest()


def tensors_digest(batch: Any, extra: str = "") -> str:
    """SHA-256 of a batch's tensors (each field's name, dtype, shape and values)."""
    digest = hashlib.sha256(b"objreg-batch-v1\n" + extra.encode())
    fields = batch._asdict() if hasattr(batch, "_asdict") else dict(vars(batch))
    extras = fields.pop("extras", {}) or {}
    for name, value in [*sorted(fields.items()), *sorted((f"extras.{k}", v) for k, v in extras.items())]:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
            digest.update(tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.float().numpy().tobytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_digest(path: Path) -> str:
    """SHA-256 over the names and contents of the regular files directly in ``path``."""
    digest = hashlib.sha256(b"objreg-directory-v1\n")
    for entry in sorted(path.iterdir()):
        if entry.is_file():
            digest.update(entry.name.encode("utf-8", "surrogatepass") + b"\0" + file_digest(entry).encode() + b"\n")
    return digest.hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def source_digest(plugin: Any) -> str:
    module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
    path = getattr(module, "__file__", None)
    try:
        return file_digest(Path(path)) if path else "unknown"
    except OSError:
        return "unknown"
