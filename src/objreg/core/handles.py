"""Handles on one objective or one downstream task with its parameters resolved.

The hook callers reach only that plugin (plus wrappers from non-objective plugins). Results are
checked, so a plugin that returns nothing or the wrong type is named with its hook and origin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from objreg.core.errors import InvalidParameterError, PluginError
from objreg.core.masks import AttentionMask, dense
from objreg.core.types import CorruptedBatch, HeadSpec, ModelOutputs, ObjectiveInfo, TaskData, TokenBatch, Vocabulary

if TYPE_CHECKING:
    from objreg.core.model import Model
    from objreg.core.tokenizer import Tokenizer


class _Handle:
    """What objectives and tasks share: the attention and the loss."""

    def __init__(self, info: ObjectiveInfo, params: Mapping[str, Any], hooks: Mapping[str, Any], origin: str):
        self.info = info
        self.name = info.name
        self.params = params
        self.origin = origin
        self._hooks = hooks

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {dict(self.params)})"

    def _problem(self, hook: str, what: str) -> PluginError:
        return PluginError([f"{self.info.kind} {self.name!r} ({self.origin}) {what} from {hook}"])

    @property
    def describes_attention(self) -> bool:
        """Whether the plugin implements ``objreg_attention_mask`` (required for ``custom``
        attention); without it the host builds the mask its ``ObjectiveInfo.attention`` declares."""
        impls = self._hooks["objreg_attention_mask"].get_hookimpls()
        return any(not (impl.wrapper or impl.hookwrapper) for impl in impls)

    def attention(self, batch: CorruptedBatch) -> AttentionMask | torch.Tensor:
        """The attention: the plugin's (``objreg_attention_mask``: an :class:`AttentionMask` or a
        dense bool ``[B, T, T]`` tensor, checked) or, where it implements no such hook, the
        :class:`AttentionMask` its ``ObjectiveInfo.attention`` declares (:meth:`declared_attention`);
        made causal for a task's rows built for a decoder-only model (:data:`CAUSAL`)."""
        mask = self._described_attention(batch) if self.describes_attention else self.declared_attention(batch)
        return _causal(mask) if CAUSAL in batch.extras else mask

    def _described_attention(self, batch: CorruptedBatch) -> AttentionMask | torch.Tensor:
        mask = self._hooks["objreg_attention_mask"](batch=batch, params=self.params)
        B, T = batch.input_ids.shape
        structured = isinstance(mask, AttentionMask) and mask.shape == (B, T, T)
        if structured or isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and tuple(mask.shape) == (B, T, T):
            return mask
        got = f"{tuple(mask.shape)} {getattr(mask, 'dtype', mask.__class__.__name__)}" if hasattr(mask, "shape") \
            else type(mask).__name__
        raise self._problem("objreg_attention_mask",
                            f"returned {got} instead of an AttentionMask or a bool [B, T, T] = [{B}, {T}, {T}] mask")

    def declared_attention(self, batch: CorruptedBatch) -> AttentionMask:
        """The mask ``ObjectiveInfo.attention`` declares, built from ``batch``: padding keys never
        attended, tokens only within their document (``document_ids``), and for ``prefix`` each
        row's prefix length from ``batch.extras["prefix_length"]`` (:data:`PREFIX_LENGTH`)."""
        pattern = self.info.pattern
        if pattern == "bidirectional":
            return AttentionMask.bidirectional(batch.is_padding, batch.document_ids)
        if pattern == "causal":
            return AttentionMask.causal(batch.is_padding, batch.document_ids)
        where = f"{self.info.kind} {self.name!r} ({self.origin})"
        if pattern == "prefix":
            if PREFIX_LENGTH not in batch.extras:
                raise PluginError([f"{where} declares prefix attention, but its batch has no extras[{PREFIX_LENGTH!r}] "
                                   f"(each row's prefix length, [B] long) to build the mask from: put it there, or "
                                   f"implement objreg_attention_mask"])
            return AttentionMask.prefix(batch.is_padding, batch.extras[PREFIX_LENGTH], batch.document_ids)
        raise PluginError([f"{where} declares custom attention ({self.info.attention!r}), which only its own "
                           f"objreg_attention_mask can describe, and implements none"])

    def attention_mask(self, batch: CorruptedBatch) -> torch.Tensor:
        """The attention as a dense bool ``[B, T, T]`` mask."""
        return dense(self.attention(batch))

    def loss(self, outputs: ModelOutputs, batch: CorruptedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per-sample losses ``[B]`` from ``outputs``; ``mask`` is the dense attention mask (built
        from ``batch`` when not given)."""
        if mask is None:
            mask = self.attention_mask(batch)
        loss = self._hooks["objreg_loss"](outputs=outputs, batch=batch, params=self.params, mask=mask,
                                          vocab=getattr(self, "vocab", None))
        B = batch.input_ids.shape[0]
        if not isinstance(loss, torch.Tensor) or tuple(loss.shape) != (B,):
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise self._problem("objreg_loss", f"returned {got} instead of per-sample losses of shape [{B}]")
        return loss

    def check_architecture(self, architecture: str) -> None:
        """Refuse, in one line, to run a causal or custom mask on an encoder-decoder
        (``Backbone.architecture``; docs/models.md). Cheap: run it before loading a model too."""
        if architecture == "encoder-decoder" and self.info.pattern in ("causal", "custom"):
            raise InvalidParameterError(
                f"{self.name!r} ({self.info.pattern} attention) does not run on an encoder-decoder model, whose encoder "
                f"is bidirectional and whose decoder reads a source; there use t5, bart, ul2 or prefix_lm (encoder and "
                f"decoder) or a bidirectional objective (the encoder alone), or load a decoder-only model"
            )

    def losses(self, model: Model, batch: CorruptedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The backbone pass and the loss: per-sample losses ``[B]`` of ``model`` on ``batch``.
        The pass is skipped for an objective that runs the backbone itself."""
        if mask is None:
            mask = self.attention_mask(batch)
        self.check_architecture(getattr(model, "architecture", "encoder"))
        hidden = None if self.info.runs_backbone else model.encode(batch.input_ids, mask, batch.position_ids)
        return self.loss(ModelOutputs(hidden, model), batch, mask)


class Objective(_Handle):
    """A pre-training objective: prepare, corrupt, attend, lose."""

    def __init__(self, info: ObjectiveInfo, params: Mapping[str, Any], hooks: Mapping[str, Any], origin: str,
                 vocab: Vocabulary | None):
        super().__init__(info, params, hooks, origin)
        self.vocab = vocab

    def _need_vocab(self) -> Vocabulary:
        if self.vocab is None:
            raise InvalidParameterError(f"objective {self.name!r} needs a vocabulary to corrupt: pass vocab=")
        if not isinstance(self.vocab, Vocabulary):
            raise InvalidParameterError(
                f"objective {self.name!r}: vocab must be an objreg.Vocabulary (tokenizer.vocab), got {type(self.vocab).__name__}"
            )
        return self.vocab

    @property
    def prepares(self) -> bool:
        """Whether the plugin prepares batches with the model (``objreg_prepare_batch``)."""
        return bool(self._hooks["objreg_prepare_batch"].get_hookimpls())

    @torch.no_grad()
    def prepare(self, batch: TokenBatch, model: Model) -> TokenBatch:
        """``batch`` with what corruption needs from the current ``model`` (the plugin's
        ``objreg_prepare_batch``; most objectives need nothing). ``model`` is put in eval mode for
        the call and given back in the mode it was in."""
        vocab = self._need_vocab()
        self._check_batch(batch, vocab, "prepare")
        if not self.prepares:
            return batch
        training = getattr(model, "training", False)
        if training:
            model.eval()
        try:
            result = self._hooks["objreg_prepare_batch"](batch=batch, model=model, params=self.params, vocab=vocab)
        finally:
            if training:
                model.train()
        if result is None:
            return batch
        if not isinstance(result, TokenBatch):
            raise self._problem("objreg_prepare_batch", f"returned {type(result).__name__} instead of a TokenBatch")
        return result

    def _check_batch(self, batch: TokenBatch, vocab: Vocabulary, what: str) -> None:
        """A :class:`TokenBatch` whose ids lie in this objective's vocabulary (one from another
        tokenizer would come back with ids beyond it, and index past the model's embeddings)."""
        if not isinstance(batch, TokenBatch):
            raise InvalidParameterError(
                f"objective {self.name!r}: {what} takes a TokenBatch (objreg.tokenize(texts)), got {type(batch).__name__}"
            )
        ids = batch.input_ids
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 2:
            got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise InvalidParameterError(f"objective {self.name!r}: the batch's input_ids must be a 2-D integer "
                                        f"tensor [B, T], got {got}")
        if ids.numel() == 0:
            raise InvalidParameterError(f"objective {self.name!r}: the batch is empty ({tuple(ids.shape)})")
        low, high = (int(x) for x in torch.aminmax(ids))  # one pass over the batch
        if low < 0 or high >= vocab.size:
            bad = high if high >= vocab.size else low
            raise InvalidParameterError(
                f"objective {self.name!r}: the batch holds token id {bad}, outside its vocabulary of {vocab.size} ids "
                f"(0..{vocab.size - 1}); tokenise with the tokenizer whose vocab the objective was given"
            )

    def corrupt(self, batch: TokenBatch, generator: torch.Generator) -> CorruptedBatch:
        vocab = self._need_vocab()
        self._check_batch(batch, vocab, "corrupt")
        if not isinstance(generator, torch.Generator):
            raise InvalidParameterError(
                f"objective {self.name!r}: corrupt draws from a torch.Generator, got {type(generator).__name__}"
            )
        result = self._hooks["objreg_corrupt"](batch=batch, generator=generator, params=self.params, vocab=vocab)
        if not isinstance(result, CorruptedBatch):
            raise self._problem("objreg_corrupt", f"returned {type(result).__name__} instead of a CorruptedBatch")
        if result.input_ids.shape[0] != batch.input_ids.shape[0]:
            raise self._problem(
                "objreg_corrupt",
                f"returned batch size {result.input_ids.shape[0]} for an input of {batch.input_ids.shape[0]}",
            )
        return result


#: The ``extras`` key of each row's prefix length (``[B]`` long) in the batch of an objective or
#: task that declares ``prefix`` attention: the host builds its mask from it.
PREFIX_LENGTH = "prefix_length"

#: The ``extras`` key that marks a task's rows as built for a decoder-only model (``[B]`` bool,
#: all True): the host then makes the task's attention causal (docs/models.md).
CAUSAL = "causal"


def _causal(mask: AttentionMask | torch.Tensor) -> AttentionMask | torch.Tensor:
    """``mask`` with no query attending a later key: a bidirectional :class:`AttentionMask`
    becomes the causal one (structured still), anything else a dense ``mask & lower triangle``."""
    if isinstance(mask, AttentionMask) and mask.pattern == "bidirectional":
        return AttentionMask.causal(mask.is_padding, mask.document_ids)
    dense_mask = dense(mask)
    T = dense_mask.shape[-1]
    return dense_mask & torch.ones(T, T, dtype=torch.bool, device=dense_mask.device).tril()


class Task(_Handle):
    """A downstream task: its fixed evaluation data, attention and loss.

    On a decoder-only model (a tokenizer whose ``architecture`` is ``"decoder"``) the task runs
    causally, as the model does: its rows carry :data:`CAUSAL` and its attention is intersected
    with the causal mask; a task that reads one summary state takes the last real token's
    (:func:`objreg.toolkit.heads.summary_states`)."""

    def task_data(
        self, source: str | None, documents: Sequence[Sequence[str]], tokenizer: Tokenizer, seq_len: int, limit: int
    ) -> TaskData:
        """The evaluation set and the task's heads, sized from it; ``limit`` (at most that many
        rows) is checked here, so no task plugin needs to."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidParameterError(f"task {self.name!r}: limit must be an integer of at least 1, got {limit!r}")
        result = self._hooks["objreg_task_data"](
            source=source, documents=documents, tokenizer=tokenizer, seq_len=seq_len, limit=limit, params=self.params
        )
        if isinstance(result, CorruptedBatch):
            result = TaskData(result)
        if not isinstance(result, TaskData) or not isinstance(result.batch, CorruptedBatch):
            raise self._problem("objreg_task_data", f"returned {type(result).__name__} instead of a TaskData")
        batch = result.batch
        if getattr(tokenizer, "architecture", "encoder") == "decoder":
            flag = torch.ones(batch.input_ids.shape[0], dtype=torch.bool, device=batch.input_ids.device)
            batch = batch._replace(extras={**batch.extras, CAUSAL: flag})
        return TaskData(batch, self._sized_heads(result.heads))

    def _sized_heads(self, sized: Sequence[HeadSpec]) -> tuple[HeadSpec, ...]:
        declared = {spec.name: spec for spec in self.info.heads}
        stray = [spec.name for spec in sized if spec.name not in declared]
        if stray:
            raise self._problem("objreg_task_data", f"sized heads {stray} its ObjectiveInfo does not declare")
        by_name = {spec.name: spec for spec in sized}
        return tuple(by_name.get(name, spec) for name, spec in declared.items())


    @property
    def has_metrics(self) -> bool:
        """Whether the task scores rows by its metric (``objreg_task_metrics``)."""
        return bool(self._hooks["objreg_task_metrics"].get_hookimpls())

    def require_metrics(self) -> None:
        """Refuse, in one line, a task that scores no metric."""
        if not self.has_metrics:
            raise InvalidParameterError(f"task {self.name!r} reports no metric (its plugin implements no "
                                        f"objreg_task_metrics), so it cannot be fine-tuned and scored")

    @torch.no_grad()
    def metrics(self, model: Model, batch: CorruptedBatch, with_loss: bool = False) -> dict[str, torch.Tensor]:
        """Metric name → per-row scores ``[B]`` of ``model`` on ``batch`` (``objreg_task_metrics``);
        the first name is the task's headline metric. ``with_loss``: the per-row task loss too,
        under ``loss``, from the same backbone pass.

        Raises:
            InvalidParameterError: the task implements no ``objreg_task_metrics``.
        """
        self.require_metrics()
        mask = self.attention_mask(batch)
        outputs = ModelOutputs(model.encode(batch.input_ids, mask, batch.position_ids), model)
        scores = self._hooks["objreg_task_metrics"](outputs=outputs, batch=batch, params=self.params)
        B = batch.input_ids.shape[0]
        if (not isinstance(scores, Mapping) or not scores or (with_loss and "loss" in scores)
                or any(not isinstance(v, torch.Tensor) or tuple(v.shape) != (B,) for v in scores.values())):
            raise self._problem("objreg_task_metrics", f"returned {type(scores).__name__} instead of a mapping of "
                                f"metric names (other than 'loss') to per-row scores of shape [{B}]")
        if with_loss:
            scores = {**scores, "loss": self.loss(outputs, batch, mask)}
        return {name: value.detach().float() for name, value in scores.items()}
