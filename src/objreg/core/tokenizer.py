"""What core and the plugins' hooks need of a tokenizer: the :class:`Tokenizer` Protocol.

objreg's tokenizer (``objreg.Tokenizer``, in ``objreg.toolkit.tokenizer``) satisfies it. Core
names only this Protocol, so the contract does not depend on the toolkit above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from objreg.core.types import TokenBatch, Vocabulary


@runtime_checkable
class Tokenizer(Protocol):
    """A tokenizer as ``objreg_task_data`` receives it.

    Attributes:
        vocab: Its vocabulary's size and special-token ids.
        name: Shown in reports.
        architecture: The architecture of the model it came with (``encoder``, ``decoder`` or
            ``encoder-decoder``, as ``Backbone.architecture``): a task's rows built with a
            decoder-only model's tokenizer are read causally (docs/models.md).
    """

    vocab: Vocabulary
    name: str
    architecture: str

    def encode_sentences(self, sentences: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Token ids and word ids (within the sentence) of each sentence, no special tokens."""
        ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` (no special tokens) and each one's character offsets in it."""
        ...

    def batch_from_documents(self, documents: Sequence[Sequence[str]], seq_len: int) -> TokenBatch:
        """One row per document (its sentences), framed ``[CLS] ... [SEP]``, at most ``seq_len``
        long, right-padded."""
        ...

    def batch_from_texts(self, texts: Sequence[str], seq_len: int | None = None) -> TokenBatch:
        """One row per text, split into sentences; ``seq_len=None`` fits the longest text."""
        ...
