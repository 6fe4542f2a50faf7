"""The data types that cross the plugin boundary.

Tensor bundles are ``NamedTuple``s so that ``torch.func`` transforms (``vmap``, ``grad``, ``jvp``)
can flatten them as pytrees; metadata and configuration are frozen dataclasses. Every tensor in a
batch has the batch dimension first, so a batch can be sliced per example and vmapped over.

Shapes: ``B`` batch size, ``T`` sequence length, ``H`` hidden size, ``V`` vocabulary size.

Longer than objreg's other modules on purpose: every type a plugin author meets is here, so the
whole data contract reads in one file (docs/hooks.md summarises it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from objreg.core.errors import InvalidParameterError, UnknownNameError

if TYPE_CHECKING:
    from objreg.core.model import Model

#: Label value that the loss ignores (the PyTorch / Hugging Face convention).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Vocabulary:
    """Size and special-token ids of a tokenizer's vocabulary.

    Objectives read special ids from here rather than hard-coding them, so they work with any
    tokenizer. ``sentinel_ids`` are the span sentinels (T5 ``<extra_id_k>``) in the order they are
    used: the first corrupted span gets ``sentinel_ids[0]``.
    """

    size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    special_ids: tuple[int, ...]
    sentinel_ids: tuple[int, ...] = ()
    #: Other named special tokens, e.g. ``{"[NLU]": 7}`` for UL2 mode tokens or FIM markers.
    named_ids: Mapping[str, int] = field(default_factory=dict, hash=False)
    #: Optional ``[V]`` tensor: how often each id occurs in the pre-training corpus (the
    #: ``inverse_frequency`` masking policy needs it). ``TokenizedCorpus.vocab`` fills it in.
    token_counts: torch.Tensor | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"):
            value = getattr(self, name)
            if not 0 <= value < self.size:
                raise InvalidParameterError(f"Vocabulary.{name}={value} is outside [0, {self.size})")
        others = {"special_ids": self.special_ids, "sentinel_ids": self.sentinel_ids,
                  "named_ids": tuple(dict(self.named_ids).values())}
        for name, ids in others.items():
            outside = [i for i in ids if not 0 <= i < self.size]
            if outside:
                raise InvalidParameterError(f"Vocabulary.{name} has ids outside [0, {self.size}): {outside}")
        object.__setattr__(self, "named_ids", MappingProxyType(dict(self.named_ids)))
        if self.token_counts is not None and tuple(self.token_counts.shape) != (self.size,):
            raise InvalidParameterError(
                f"Vocabulary.token_counts has shape {tuple(self.token_counts.shape)}; it needs one count per id, "
                f"shape ({self.size},)"
            )

    def special_id_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """All special ids as a 1-D long tensor (for ``torch.isin``)."""
        return torch.tensor(sorted(self.special_ids), dtype=torch.long, device=device)

    def normal_token_weights(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Shape ``[V]``: 1.0 for ordinary tokens, 0.0 for special ones.

        Sampling replacement tokens from these weights never draws a special token, a bug of
        several reference MLM implementations.
        """
        weights = torch.ones(self.size, device=device)
        weights[self.special_id_tensor(device)] = 0.0
        return weights


class TokenBatch(NamedTuple):
    """Tokenised text before corruption. Each row holds consecutive sentences of one document
    (or, when packed, of several documents), framed ``[CLS] ... [SEP]`` and right-padded.

    Attributes:
        input_ids: Shape ``[B, T]`` long. Token ids.
        is_padding: Shape ``[B, T]`` bool. True at padding positions.
        is_special: Shape ``[B, T]`` bool. True at special tokens, padding included.
        word_ids: Shape ``[B, T]`` long. Index of the word a token belongs to within its row,
            ``-1`` at special tokens. Tokens of one word share an id (whole-word masking).
        sentence_ids: Shape ``[B, T]`` long. Index of the sentence within its row, ``-1`` at
            special tokens and padding.
        document_ids: Shape ``[B, T]`` long. Document index, ``-1`` at padding. Constant along a row
            unless documents are packed.
        surprisal: Optional, shape ``[B, T]`` float. The model's surprisal of each token (nats),
            for the ``entropy`` masking policy: the masking objectives fill it in their
            ``objreg_prepare_batch`` hook (:func:`objreg.toolkit.surprisal.token_surprisal`).
            ``None`` when not computed.
    """

    input_ids: torch.Tensor
    is_padding: torch.Tensor
    is_special: torch.Tensor
    word_ids: torch.Tensor
    sentence_ids: torch.Tensor
    document_ids: torch.Tensor
    surprisal: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(None if t is None else t.to(device) for t in self))

    def select(self, index: torch.Tensor | slice) -> TokenBatch:
        """The examples at ``index`` (a slice or an index tensor) along the batch dimension."""
        return TokenBatch(*(None if t is None else t[index] for t in self))

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]


class CorruptedBatch(NamedTuple):
    """What an objective feeds the model and its loss.

    Attributes:
        input_ids: Shape ``[B, T]`` long. The corrupted input (the length may differ from the
            uncorrupted batch, e.g. T5 concatenates ``[corrupted input ; target]``).
        labels: Shape ``[B, T]`` long. Token-level targets, ``IGNORE_INDEX`` where there is none.
            Objectives whose target is not per token (SOP, NSP) leave them all ``IGNORE_INDEX`` and
            put their targets in ``extras``.
        is_padding: Shape ``[B, T]`` bool. True at padding.
        position_ids: Shape ``[B, T]`` long. Positions, restarting at each packed document.
        document_ids: Shape ``[B, T]`` long. Document index per token, ``-1`` at padding; the
            attention mask keeps documents apart.
        extras: Objective-specific tensors, each with batch dimension ``B`` first, e.g.
            ``{"order_label": [B]}`` or ``{"masked_positions": [B, K]}``.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    is_padding: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    extras: dict[str, torch.Tensor]

    def to(self, device: torch.device | str) -> CorruptedBatch:
        fields = [t.to(device) for t in self[:5]]
        return CorruptedBatch(*fields, {k: v.to(device) for k, v in self.extras.items()})

    def select(self, index: torch.Tensor | slice) -> CorruptedBatch:
        """The examples at ``index`` (a slice or an index tensor) along the batch dimension."""
        fields = [t[index] for t in self[:5]]
        return CorruptedBatch(*fields, {k: v[index] for k, v in self.extras.items()})

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]


class ModelOutputs(NamedTuple):
    """What ``objreg_loss`` receives.

    Attributes:
        hidden: Shape ``[B, T, H]``. The backbone's final hidden states for the corrupted batch
            under the objective's attention mask; ``None`` for an objective that declares
            ``ObjectiveInfo.runs_backbone`` (the host then skips its pass).
        model: The :class:`objreg.Model`: ``model.heads[name]`` is the head the objective declared;
            ``model.encode(input_ids, attention_mask, position_ids)`` runs the backbone (again).
            Calling them inside ``objreg_loss`` is transform-safe: the analysis swaps the
            parameters functionally around the whole call.
    """

    hidden: torch.Tensor | None
    model: Model


@dataclass(frozen=True)
class HeadSpec:
    """A head an objective or task needs on top of the shared backbone.

    Attributes:
        name: The key in ``model.heads``; non-empty, without ``.``.
        kind: A registered head kind (``objreg list`` shows them): built-in ``lm`` (tied LM head,
            ``[..., H] -> [..., V]``), ``classifier`` (``[B, T, H] -> [B, num_outputs]`` from the
            first token), ``span`` (``[B, T, H] -> [B, T, 2]``), ``token_classifier``
            (``[..., H] -> [..., num_outputs]``), ``projection`` (``[B, T, H] -> [B, num_outputs]``);
            plugins add kinds with ``objreg_register_heads`` (rtd's ``generator``).
        num_outputs: Outputs for kinds that need a size. A task may leave it 0 in its
            ``ObjectiveInfo`` and size the head from its data (:class:`TaskData`).

    Two objectives that declare the same name and spec share the head.
    """

    name: str
    kind: str
    num_outputs: int = 0


_PARAM_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class Param:
    """One parameter of an objective: name, default (from the reference implementation), type,
    help text, and optional bounds or choices. ``coerce`` turns CLI strings into the type."""

    name: str
    default: Any
    help: str
    type: type = float
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in _PARAM_TYPES:
            raise InvalidParameterError(f"Param {self.name!r}: type must be one of bool, int, float, str")

    def coerce(self, value: Any, owner: str = "") -> Any:
        where = f"{owner}: " if owner else ""
        try:
            if self.type is bool and not isinstance(value, (bool, str)):
                if value not in (0, 1):  # bool(0.5) would silently be True
                    raise ValueError(value)
                result: Any = bool(value)
            elif self.type is bool and isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                result = lowered in ("true", "1", "yes")
            elif self.type is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            else:
                result = self.type(value)
        except (TypeError, ValueError):
            raise InvalidParameterError(
                f"{where}parameter {self.name!r} must be {self.type.__name__}, got {value!r}"
            ) from None
        if isinstance(result, float) and not math.isfinite(result):
            raise InvalidParameterError(f"{where}parameter {self.name!r} must be finite, got {value!r}")
        if self.choices is not None and result not in self.choices:
            allowed = ", ".join(map(str, self.choices))
            raise InvalidParameterError(f"{where}parameter {self.name!r} must be one of {allowed}, got {value!r}")
        if self.low is not None and result < self.low or self.high is not None and result > self.high:
            raise InvalidParameterError(
                f"{where}parameter {self.name!r} must lie in [{self.low}, {self.high}], got {value!r}"
            )
        return result


ObjectiveKind = Literal["pretrain", "downstream"]


#: What an objective's labels can be (``ObjectiveInfo.label_kind``).
LABEL_KINDS = ("auto", "tokens", "classes")


@dataclass(frozen=True)
class ObjectiveInfo:
    """What an objective (or downstream task) is, returned by ``objreg_objective_info``.

    Attributes:
        name: Registration name, e.g. ``"mlm"``; must equal the plugin's registration
            (entry-point) name.
        description: One line for ``objreg list``.
        kind: ``"pretrain"`` for objectives, ``"downstream"`` for tasks.
        attention: The attention pattern its mask follows: ``"bidirectional"``, ``"causal"``,
            ``"prefix"`` (bidirectional over a prefix, causal after it) or ``"custom"``; the
            contract suite checks the mask against it. Any other value counts as ``"custom"``.
        heads: Heads the loss uses.
        params: Every parameter, with its reference default.
        references: Papers and reference implementations.
        batch_coupled: True when ``ℓ_i`` depends on other examples of the batch (in-batch
            negatives); per-sample quantities are then derivatives of ``ℓ_i`` on the whole batch.
        min_seq_len: Shortest sequence length the objective can work with.
        min_sentences: Sentences a row needs (SOP/NSP need 2).
        runs_backbone: True when ``objreg_loss`` runs the backbone itself (``model.encode``) and
            never reads ``outputs.hidden``: the host then skips its own pass and hands ``None``.
        label_kind: What ``CorruptedBatch.labels`` holds where it is not ``IGNORE_INDEX``, for
            display (``objreg corrupt``): ``"tokens"`` (token ids to predict), ``"classes"``
            (class indices per position, e.g. replaced or not) or ``"auto"`` (decided from the
            values: classes when every label is the id of a special token).
    """

    name: str
    description: str
    kind: ObjectiveKind = "pretrain"
    attention: str = "bidirectional"
    heads: tuple[HeadSpec, ...] = ()
    params: tuple[Param, ...] = ()
    references: tuple[str, ...] = ()
    batch_coupled: bool = False
    min_seq_len: int = 4
    min_sentences: int = 1
    runs_backbone: bool = False
    label_kind: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in ("pretrain", "downstream"):
            raise InvalidParameterError(f"ObjectiveInfo {self.name!r}: kind must be 'pretrain' or 'downstream'")
        if self.label_kind not in LABEL_KINDS:
            raise InvalidParameterError(
                f"ObjectiveInfo {self.name!r}: label_kind must be one of {', '.join(LABEL_KINDS)}, got {self.label_kind!r}"
            )
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise InvalidParameterError(f"ObjectiveInfo {self.name!r}: duplicate parameter names {names}")

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    @property
    def pattern(self) -> str:
        """``attention`` as one of ``bidirectional``, ``causal``, ``prefix``, ``custom``."""
        return self.attention if self.attention in ("bidirectional", "causal", "prefix") else "custom"

    def resolve_params(self, overrides: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        """Defaults updated with ``overrides``; every override is checked and coerced.

        Raises:
            UnknownNameError: an override names no parameter of this objective.
            InvalidParameterError: a value of the wrong type or out of range.
        """
        by_name = {p.name: p for p in self.params}
        resolved = self.defaults()
        for key, value in (overrides or {}).items():
            if key not in by_name:
                raise UnknownNameError(f"parameter of {self.name!r}", key, by_name)
            resolved[key] = by_name[key].coerce(value, owner=self.name)
        return MappingProxyType(resolved)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["params"] = [
            {**dataclasses.asdict(p), "type": p.type.__name__, "choices": list(p.choices) if p.choices else None}
            for p in self.params
        ]
        return data


@dataclass(frozen=True)
class Corpus:
    """Plain-text documents, each a sequence of sentences.

    Attributes:
        name: What the user asked for (``"default"`` or a path).
        documents: Documents as tuples of sentences, in a fixed order.
        description: One line saying where the text came from.
    """

    name: str
    documents: tuple[tuple[str, ...], ...]
    description: str = ""

    @property
    def num_sentences(self) -> int:
        return sum(len(d) for d in self.documents)

    def split(self, heldout_every: int = 10) -> tuple[Corpus, Corpus]:
        """Deterministic split into (pre-training, held-out): every ``heldout_every``-th document is
        held out, e.g. for building a downstream set the model never pre-trains on."""
        train = tuple(d for i, d in enumerate(self.documents) if i % heldout_every != heldout_every - 1)
        heldout = tuple(d for i, d in enumerate(self.documents) if i % heldout_every == heldout_every - 1)
        return (
            Corpus(self.name, train, self.description),
            Corpus(f"{self.name} (held out)", heldout, self.description),
        )


class TaskData(NamedTuple):
    """A downstream task's evaluation data, as ``objreg_task_data`` returns it.

    Attributes:
        batch: The whole set as one :class:`CorruptedBatch`.
        heads: The task's heads sized from this data (e.g. a classifier with as many outputs as
            the data has labels); they replace the ``ObjectiveInfo.heads`` of the same name.
    """

    batch: CorruptedBatch
    heads: tuple[HeadSpec, ...] = ()
