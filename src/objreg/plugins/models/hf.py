"""Hugging Face models: ``--model DIR`` loads a local transformers model directory, offline.

The directory's encoder becomes the shared backbone (``backbone.*``, its pooler left out: the
objectives' heads pool for themselves) and its ``tokenizer.json`` the tokenizer; the host adds the
heads the objectives and the task declare (an ``lm`` head decodes with the checkpoint's input
embeddings, one Parameter counted once, whether or not the checkpoint has an MLM head). Needs the
``hf`` extra (``pip install 'objreg[hf]'``).

Three traps, handled here:

* transformers turns a 2-D padding mask into a 4-D one with code that breaks under ``vmap``; the
  backbone gets a ready 4-D additive mask (``[B, 1, T, T]``), which transformers passes through.
* SDPA and flash attention have no forward-mode derivative: the model is loaded with the
  ``eager`` attention, so ``jvp``, ``vmap`` and double backward all work.
* Dropout would make two forward passes differ (and break the Taylor check); every dropout
  probability is set to 0, as in the default backbone.

Models without ``[unusedN]`` tokens have no span sentinels or FIM/UL2 markers; objectives that
need them say so. On BERT vocabularies the first 64 ``[unusedN]`` tokens serve as sentinels and
the next ones as objreg's named markers (``[EOS]``, ``[NLU]``, ...): they are never produced by
the tokenizer, which is what a sentinel needs.

Written like a third-party plugin: it imports only the public ``objreg`` facade and torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

import objreg
from objreg import Vocabulary

#: objreg's named markers, in the order they take the [unusedN] tokens after the sentinels.
NAMED_MARKERS = ("[EOS]", "[NLU]", "[NLG]", "[S2S]", "[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]", "[FIM_PAD]")
NUM_SENTINELS = 64
SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
BERT_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "mask_token": "[MASK]"}


def is_model_directory(model: str) -> bool:
    """A local directory holding a transformers ``config.json``."""
    try:
        return (Path(model).expanduser() / "config.json").is_file()
    except (OSError, ValueError):
        return False


def _claims(model: str) -> bool:
    """Whether ``model`` is ours: a model directory, or a path that should be one (a clear error
    then, rather than "unknown model")."""
    if is_model_directory(model):
        return True
    if "/" in model or (os.sep in model) or Path(model).expanduser().is_dir():
        _check_directory(model)
    return False


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise objreg.DataError(
            "loading a Hugging Face model directory needs the transformers package: pip install 'objreg[hf]'"
        ) from e
    return transformers


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
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


def _check_directory(model: str) -> Path:
    path = Path(model).expanduser()
    if not path.is_dir():
        raise objreg.DataError(
            f"model directory {model!r} does not exist; give a local transformers model directory (with config.json) "
            f"or a model name (see `objreg list`)"
        )
    if not (path / "config.json").is_file():
        raise objreg.DataError(f"model directory {model!r} has no config.json: not a transformers model directory")
    return path


# -- tokenizer --------------------------------------------------------------------------------------


def _special_tokens(path: Path) -> dict[str, str]:
    """The five BERT-style special tokens from tokenizer_config.json / special_tokens_map.json."""
    found = dict(BERT_SPECIALS)
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise objreg.DataError(f"{file}: not valid JSON ({e})") from None
        for key in SPECIAL_KEYS:
            value = data.get(key)
            if isinstance(value, dict):  # {"content": "[PAD]", ...} in newer files
                value = value.get("content")
            if isinstance(value, str):
                found[key] = value
    return found


def load_tokenizer(model: str) -> objreg.Tokenizer:
    """The model directory's ``tokenizer.json``, with its truncation, padding and post-processor
    switched off: objreg frames rows itself."""
    from tokenizers import Tokenizer as Backend

    path = _check_directory(model)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise objreg.DataError(
            f"model directory {model!r} has no tokenizer.json (a fast tokenizer file); objreg reads the tokenizer "
            f"from it. Save one with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
        )
    try:
        backend = Backend.from_file(str(file))
    except Exception as e:  # the tokenizers library raises plain Exceptions for a bad file
        raise objreg.DataError(f"{file}: cannot be read as a tokenizer: {e}") from None
    backend.no_truncation()
    backend.no_padding()
    specials = _special_tokens(path)
    unused = [f"[unused{i}]" for i in range(NUM_SENTINELS + len(NAMED_MARKERS))]
    has_unused = all(backend.token_to_id(t) is not None for t in unused)
    return objreg.Tokenizer(
        backend,
        pad=specials["pad_token"],
        unk=specials["unk_token"],
        cls=specials["cls_token"],
        sep=specials["sep_token"],
        mask=specials["mask_token"],
        sentinels=unused[:NUM_SENTINELS] if has_unused else (),
        named=dict(zip(NAMED_MARKERS, unused[NUM_SENTINELS:])) if has_unused else {},
        name=f"{path.name} (tokenizer.json)",
    )


# -- model ------------------------------------------------------------------------------------------


class HFBackbone(nn.Module):
    """A transformers encoder as an :class:`objreg.Backbone`.

    Attributes:
        model: The transformers model (``AutoModel``, no pooler): the shared parameters.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        config = model.config
        self.model = model
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.num_layers = int(getattr(config, "num_hidden_layers", 1) or 1)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.layer_norm_eps = float(getattr(config, "layer_norm_eps", 1e-12))

    def input_embeddings(self) -> nn.Parameter:
        return self.model.get_input_embeddings().weight

    def position_embeddings(self) -> nn.Parameter | None:
        table = getattr(getattr(self.model, "embeddings", None), "position_embeddings", None)
        return table.weight if isinstance(table, nn.Embedding) else None

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | objreg.AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]``; ``attention_mask`` (bool ``[B, T, T]``, True: query ``i``
        may attend key ``j``, or structured) is handed to transformers as a 4-D additive mask."""
        if self.max_positions and input_ids.shape[-1] > self.max_positions:
            raise objreg.InvalidParameterError(
                f"sequence length {input_ids.shape[-1]} exceeds the model's max_position_embeddings="
                f"{self.max_positions}; use a smaller --seq-len"
            )
        attention_mask = objreg.masks.dense(attention_mask)
        dtype = self.input_embeddings().dtype
        # finfo.min, not -inf: a padding query with no allowed key gets a uniform row, not NaN. Both
        # values in the model's dtype (float64's minimum does not fit the default float32).
        zero = torch.zeros((), dtype=dtype, device=input_ids.device)
        floor = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=input_ids.device)
        additive = torch.where(attention_mask, zero, floor)[:, None]  # (B, 1, T, T)
        out = self.model(input_ids=input_ids, attention_mask=additive, position_ids=position_ids)
        return out.last_hidden_state  # (B, T, H)

    forward = encode


def load_model(model: str, vocab: Vocabulary, config: Mapping[str, Any], generator: torch.Generator) -> HFBackbone:
    if config:
        raise objreg.InvalidParameterError(
            f"a Hugging Face model directory takes no model config overrides, got {', '.join(sorted(config))}"
        )
    path = _check_directory(model)
    transformers = _transformers()
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise objreg.DataError(f"model directory {model!r}: cannot read config.json: {e}") from None
    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": "eager"}
    if hf_config.model_type in ("bert", "roberta", "xlm-roberta", "electra", "camembert"):
        kwargs["add_pooling_layer"] = False
    try:
        with _quiet(transformers):
            backbone = transformers.AutoModel.from_pretrained(str(path), **kwargs)
    except pickle.UnpicklingError as e:
        # torch.load(weights_only=True) refused a pickled object: say so in one line (its own
        # message is six, and ends in advice to turn the protection off).
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise objreg.DataError(
            f"model directory {model!r}: its pytorch_model.bin holds pickled Python objects{what} that objreg will not "
            f"load (unpickling can run code); save the model as safetensors (save_pretrained(DIR, "
            f"safe_serialization=True)) where you trust it"
        ) from None
    except (OSError, ValueError) as e:
        raise objreg.DataError(f"model directory {model!r}: cannot load the model: {' '.join(str(e).split())}") from None
    for module in backbone.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    embedding_rows = backbone.get_input_embeddings().weight.shape[0]
    if vocab.size > embedding_rows:
        raise objreg.DataError(
            f"model directory {model!r}: its tokenizer has {vocab.size} tokens but the model only {embedding_rows} "
            f"embeddings"
        )
    return HFBackbone(backbone.float())


# -- hooks ------------------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_register_models(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "model", "DIR", "a local Hugging Face transformers model directory (BERT-style encoders; needs objreg[hf])",
        load_model, accepts=_claims,
    ))


@objreg.hookimpl
def objreg_register_tokenizers(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "tokenizer", "DIR", "the model directory's own tokenizer.json", lambda model, corpus, cache_dir: load_tokenizer(model),
        accepts=_claims,
    ))
