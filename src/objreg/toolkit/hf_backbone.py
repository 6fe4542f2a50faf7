"""A Hugging Face transformers model as objreg's backbone: :class:`HFBackbone` (an encoder or a
decoder-only causal LM) and :class:`HFEncoderDecoderBackbone` (T5, BART: the ``[source ; target]``
rows of :mod:`objreg.toolkit.encoder_decoder` through the real encoder and decoder), each handed a
ready 4-D additive mask (``[B, 1, T, T]``: transformers' own 2-D-to-4-D conversion breaks under
``vmap``, and a 4-D mask replaces a decoder's causal one), made deterministic (every dropout rate
0, ``padding_idx`` cleared, so reverse- and forward-mode derivatives agree) by :func:`wrap_model`,
and saved as a transformers model directory with its source's tokenizer files. Also the
transformers import with the ``hf`` extra's hint and :func:`quiet` loading; the ``hf`` model plugin
(:mod:`objreg.plugins.models.hf`) loads the models.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from objreg.core.errors import DataError, InvalidParameterError
from objreg.core.masks import AttentionMask, dense
from objreg.core.types import Vocabulary
from objreg.toolkit import encoder_decoder

#: The tokenizer files of a model directory, copied beside a saved backbone.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "added_tokens.json")
#: Float dropout rates some transformers modules apply functionally (BART, Llama).
DROPOUT_ATTRIBUTES = ("dropout", "attention_dropout", "activation_dropout", "layerdrop")


def import_transformers() -> Any:
    """The transformers module, or a DataError naming the extra that installs it."""
    try:
        import transformers
    except ImportError as e:
        raise DataError(
            "loading a Hugging Face model directory needs the transformers package: pip install 'objreg[hf]'"
        ) from e
    return transformers


@contextlib.contextmanager
def quiet(transformers: Any) -> Iterator[None]:
    """No progress bar or load report on the terminal (the pooler the checkpoint has and we leave
    out is reported as "unexpected"); the caller's logging settings are restored afterwards."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``[B, T, S]`` (True: may attend) as the 4-D additive mask ``[B, 1, T, S]``. A finite
    floor, not -inf: a query with no allowed key gets a uniform row, not NaN. The floor fits the
    model's dtype and float32 alike (Llama's eager attention takes its softmax in float32, where
    float64's minimum would become -inf)."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    floor = torch.full((), max(torch.finfo(dtype).min, torch.finfo(torch.float32).min), dtype=dtype,
                       device=mask.device)
    return torch.where(mask, zero, floor)[:, None]


class HFBackbone(nn.Module):
    """A transformers encoder or decoder-only model as an :class:`objreg.Backbone`.

    Attributes:
        model: The transformers model (``AutoModel``: no pooler, no LM head): the shared parameters.
        architecture: ``encoder`` or ``decoder``; both run the mask they are given
            (``encoder-decoder``: :class:`HFEncoderDecoderBackbone`).
    """

    def __init__(self, model: nn.Module, architecture: str = "encoder"):
        super().__init__()
        config = model.config
        self.model = model
        self.architecture = architecture
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.num_layers = int(getattr(config, "num_hidden_layers", 1) or 1)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.layer_norm_eps = _layer_norm_eps(config)
        self.source: Path | None = None  # the directory it was loaded from (its tokenizer files)

    def input_embeddings(self) -> nn.Parameter:
        return self.model.get_input_embeddings().weight

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write the backbone as a transformers model directory: ``config.json`` and safetensors
        weights (``save_pretrained``; the config as loaded, so the dropout rates zeroed for the
        analysis are saved as they were) and the source directory's tokenizer files, so
        ``AutoModel.from_pretrained`` and objreg's ``--model`` read it. Heads (objreg's) and the
        pooler (left out at loading) are not part of it."""
        target = Path(directory)
        with quiet(import_transformers()):
            self.model.save_pretrained(str(target), safe_serialization=True)
        source = getattr(self, "source", None)
        if source is not None:
            for name in TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copyfile(source / name, target / name)

    def position_embeddings(self) -> nn.Parameter | None:
        table = getattr(getattr(self.model, "embeddings", None), "position_embeddings", None)  # BERT
        table = getattr(self.model, "wpe", table)  # GPT-2
        return table.weight if isinstance(table, nn.Embedding) else None

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]``; ``attention_mask`` (bool ``[B, T, T]``, True: query ``i``
        may attend key ``j``, or structured) is handed to transformers as a 4-D additive mask."""
        _check_length(input_ids, self.max_positions)
        additive = _additive(dense(attention_mask), self.input_embeddings().dtype)  # (B, 1, T, T)
        out = self.model(input_ids=input_ids, attention_mask=additive, position_ids=position_ids)
        return out.last_hidden_state  # (B, T, H)

    forward = encode


class HFEncoderDecoderBackbone(HFBackbone):
    """A transformers encoder-decoder (T5, BART) as an :class:`objreg.Backbone` whose ``encode``
    runs ``[source ; target]`` rows through the real encoder and decoder
    (:mod:`objreg.toolkit.encoder_decoder`); position ids are the model's own (from 0 in each).

    Attributes:
        model: The transformers model (``AutoModel``: encoder, decoder and their shared
            embeddings, no LM head): the shared parameters.
        start_id: The decoder's start token (``config.decoder_start_token_id``, else the pad id).
    """

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__(model, "encoder-decoder")
        start = getattr(model.config, "decoder_start_token_id", None)
        self.start_id = int(pad_id if start is None else start)

    def position_embeddings(self) -> nn.Parameter | None:
        return None  # T5: relative positions; BART: offset tables, one per stack

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` in the prefix-LM layout (``position_ids`` are not used)."""
        _check_length(input_ids, self.max_positions)
        dtype = self.input_embeddings().dtype
        parts = encoder_decoder.split(input_ids, dense(attention_mask), self.start_id)
        encoded = self.model.get_encoder()(
            input_ids=input_ids, attention_mask=_additive(parts.encoder_mask, dtype)
        ).last_hidden_state  # (B, T, H)
        decoded = self.model.get_decoder()(
            input_ids=parts.decoder_ids, attention_mask=_additive(parts.decoder_mask, dtype),
            encoder_hidden_states=encoded, encoder_attention_mask=_additive(parts.cross_mask, dtype),
        ).last_hidden_state  # (B, T, H)
        return encoder_decoder.merge(encoded, decoded, parts)

    forward = encode


def _layer_norm_eps(config: Any) -> float:
    for name in ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps"):  # BERT, GPT-2 / T5, Llama
        value = getattr(config, name, None)
        if isinstance(value, float):
            return value
    return 1e-5


def _check_length(input_ids: torch.Tensor, max_positions: int) -> None:
    if max_positions and input_ids.shape[-1] > max_positions:
        raise InvalidParameterError(
            f"sequence length {input_ids.shape[-1]} exceeds the model's max_position_embeddings={max_positions}; "
            f"use a smaller --seq-len"
        )


def _deterministic(model: nn.Module) -> None:
    """No dropout, and no ``padding_idx`` (module docstring)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(module, nn.Embedding):
            module.padding_idx = None
        for name in DROPOUT_ATTRIBUTES:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def wrap_model(loaded: nn.Module, kind: str, vocab: Vocabulary) -> HFBackbone:
    """The loaded transformers model as objreg's backbone: deterministic, in float32."""
    _deterministic(loaded)
    loaded = loaded.float()
    if kind == "encoder-decoder":
        return HFEncoderDecoderBackbone(loaded, vocab.pad_id)
    return HFBackbone(loaded, kind)
