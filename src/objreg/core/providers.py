"""Models, corpora, tokenizers and head kinds that plugins register, in the manner of
simonw/llm's ``register(...)`` hooks: a plugin's ``objreg_register_models(register)`` calls
``register(Provider(...))`` once per model it offers. The registry owns every name: listings,
lookups and "unknown model" errors come from one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from objreg.core.model import Backbone
    from objreg.core.tokenizer import Tokenizer
    from objreg.core.types import Corpus, HeadSpec, Vocabulary

ProviderKind = Literal["model", "corpus", "tokenizer"]


# What the host passes a provider and what it gets back. Parameters are positional-only (the host
# passes them by position), so a provider may name its own as it likes.


class ModelLoader(Protocol):
    """``load`` of a ``model`` provider: the backbone ``name``, for ``vocab``, with the user's
    model options ``config``, every weight drawn from ``generator``."""

    def __call__(
        self, name: str, vocab: Vocabulary, config: dict[str, Any], generator: torch.Generator, /
    ) -> Backbone: ...


class CorpusLoader(Protocol):
    """``load`` of a ``corpus`` provider: the corpus ``name``, caching what it builds in ``cache_dir``."""

    def __call__(self, name: str, cache_dir: Path, /) -> Corpus: ...


class TokenizerLoader(Protocol):
    """``load`` of a ``tokenizer`` provider: the tokenizer for the model ``model`` (e.g. the
    checkpoint's own, or one trained on ``corpus``), caching what it builds in ``cache_dir``."""

    def __call__(self, model: str, corpus: Corpus, cache_dir: Path, /) -> Tokenizer: ...


class Accepts(Protocol):
    """``accepts`` of a provider for a family of names: whether its ``load`` handles ``name``."""

    def __call__(self, name: str, /) -> bool: ...


class HeadBuilder(Protocol):
    """``build`` of a head kind: the head module for ``spec`` on ``backbone``."""

    def __call__(self, spec: HeadSpec, backbone: Backbone, /) -> nn.Module: ...


@dataclass(frozen=True)
class Provider:
    """A model, corpus or tokenizer a plugin offers.

    Attributes:
        kind: ``model``, ``corpus`` or ``tokenizer``.
        name: The name users give (``--model default``), or a label for a family of names that
            ``accepts`` recognises (``DIR``, ``PATH``, ``hf:NAME``).
        description: One line for ``objreg list``.
        load: Builds the thing. Its arguments by kind (:class:`ModelLoader`,
            :class:`CorpusLoader`, :class:`TokenizerLoader`):
            ``model``: ``(name, vocab, config, generator) -> Backbone`` (weights drawn from
            ``generator`` only; ``config`` the user's model options);
            ``corpus``: ``(name, cache_dir) -> Corpus``;
            ``tokenizer``: ``(model, corpus, cache_dir) -> Tokenizer`` (the tokenizer for model
            ``model``, e.g. the checkpoint's own, or one trained on ``corpus``).
        accepts: For a family of names: ``accepts(name)`` says whether ``load`` handles ``name``.
            None: the provider answers to ``name`` exactly (or, with ``fallback``, to every name).
        fallback: Tried after every other provider of its kind (e.g. a tokenizer trained on the
            corpus, for any model without one of its own).
    """

    kind: ProviderKind
    name: str
    description: str
    load: ModelLoader | CorpusLoader | TokenizerLoader
    accepts: Accepts | None = None
    fallback: bool = False

    def handles(self, name: str) -> bool:
        if self.accepts is not None:
            return self.accepts(name)
        return self.fallback or name == self.name


@dataclass(frozen=True)
class HeadKind:
    """A kind of head (``HeadSpec.kind``) and how to build it on any backbone.

    Attributes:
        name: The kind, e.g. ``lm`` or ``generator``.
        description: One line: the head's input and output shapes.
        build: ``build(spec, backbone) -> nn.Module`` (:class:`HeadBuilder`): a head for ``spec`` (a
            :class:`objreg.HeadSpec` of this kind) on ``backbone`` (a :class:`objreg.Backbone`:
            ``hidden_size``, ``vocab_size``, ``num_layers``, ``layer_norm_eps``, its embeddings).
            The host builds it on the meta device, materialises it, calls its ``tie(backbone)``
            method if it has one (to share backbone Parameters, e.g. a tied LM decoder), then
            initialises every Parameter the head does not share with the backbone from the run's
            generator.
        needs_outputs: The spec must give ``num_outputs >= 1`` (classifiers, projections).
        linear: Names (inside the head module) of the parameters the head's output is affine in,
            the others held fixed: what a re-fitted downstream head solves for (its fit is then
            convex for a convex loss). ``None``: the head cannot be re-fitted (``objreg analyze
            --downstream-head refit`` refuses it as a downstream head).
    """

    name: str
    description: str
    build: HeadBuilder
    needs_outputs: bool = False
    linear: tuple[str, ...] | None = None
