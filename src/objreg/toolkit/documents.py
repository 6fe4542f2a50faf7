"""Reading the documents of a task's text corpus (:func:`read_documents`): a text or JSONL file or a
directory of them, read by the registered corpus providers exactly as ``--corpus`` reads it, so a
task (``ordering``) sees the same documents, sentence-split the same way, as pre-training would.
"""

from __future__ import annotations

from pathlib import Path

from objreg.core.errors import DataError


def read_documents(source: str, what: str) -> list[tuple[str, ...]]:
    """The documents of a text or JSONL file or a directory of them (or any other corpus name),
    read by the registered corpus providers exactly as ``--corpus`` reads it."""
    from objreg.core.registry import Registry  # the registry loads the plugins, which import this module
    from objreg.toolkit.cache import cache_dir

    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"{what} {source} does not exist; give a plain-text file (documents separated by blank "
            f'lines, or one per line), a JSONL file with a "text" field, or a directory of them'
        )
    return [tuple(doc) for doc in Registry.load().load_corpus(str(path), cache_dir()).documents]
