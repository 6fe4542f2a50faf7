"""Hugging Face models: ``--model DIR`` loads a local transformers model directory, offline.

Three architecture families (docs/models.md), read from ``config.json``:

* **encoders** (BERT, RoBERTa, ...): the encoder is the shared backbone, its pooler left out;
* **decoder-only causal LMs** (GPT-2, Llama, Mistral, ...): the decoder stack (``AutoModel``,
  no LM head) is the backbone and runs whatever mask an objective gives it, as a 4-D mask: causal
  for ``clm``, the permuted causal mask of ``fim``, prefix masks for ``prefix_lm``/``ul2``/``t5``,
  bidirectional for ``mlm``; downstream tasks run causally;
* **encoder-decoders** (T5, BART): the corrupted input goes to the encoder and the target, shifted
  right behind the model's ``decoder_start_token_id``, to the decoder
  (:mod:`objreg.toolkit.encoder_decoder`).

The host adds the heads the objectives and the task declare (an ``lm`` head decodes with the
checkpoint's input embeddings, one Parameter counted once). Needs the ``hf`` extra
(``pip install 'objreg[hf]'``).

Traps handled here:

* transformers turns a 2-D padding mask into a 4-D one with code that breaks under ``vmap``; the
  backbone gets a ready 4-D additive mask (``[B, 1, T, T]``), which transformers passes through
  (and which replaces a decoder's own causal mask).
* SDPA and flash attention have no forward-mode derivative: the model is loaded with the
  ``eager`` attention, so ``jvp``, ``vmap`` and double backward all work.
* Dropout (modules, and the float rates BART and Llama apply functionally) would make two
  forward passes differ and break the Taylor check: all are set to 0, as in the default backbone.
* An embedding's ``padding_idx`` drops that row's gradient in reverse mode only: where the id is
  a real token (BART's pad id 1 is a BERT vocabulary's first ``[unusedN]``, a span sentinel),
  backward and forward-mode derivatives would disagree. ``padding_idx`` is cleared (the forward
  pass is the same; padding positions never reach a loss, so their rows get no gradient anyway).

The tokenizer is the directory's ``tokenizer.json`` as its users built it (:func:`load_tokenizer`,
:mod:`objreg.toolkit.special_tokens`):
BERT's specials where it has them, else the GPT-2/T5 ones (``<|endoftext|>``, ``</s>``, ``<pad>``);
span sentinels from T5's ``<extra_id_N>`` or BERT's first 64 ``[unusedN]``; objreg's named markers
(``[EOS]``, ``[FIM_PREFIX]``, ...) under their own names, StarCoder's/Qwen's FIM names, or the
next ``[unusedN]``. Objectives that need a token the tokenizer lacks say so, with the fix, before
the model is loaded.

Written like a third-party plugin: it imports only the public ``objreg`` facade, its toolkit and torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

import objreg
from objreg import Vocabulary
from objreg.toolkit import encoder_decoder, special_tokens

SETTING_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")
#: ``--model random-init:DIR``: the directory's architecture and tokenizer with random weights, on purpose.
RANDOM_INIT = "random-init:"
#: The weights files transformers reads, in the order it looks for them.
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
#: A tokenizer.json larger than this is refused before the tokenizers library reads it (the largest
#: published ones are tens of MiB; a file of gigabytes makes the library abort the process).
MAX_TOKENIZER_BYTES = 256 * 2**20
#: The tokenizer files of a model directory, copied beside a saved backbone.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "added_tokens.json")
#: Float dropout rates some transformers modules apply functionally (BART, Llama).
DROPOUT_ATTRIBUTES = ("dropout", "attention_dropout", "activation_dropout", "layerdrop")


def is_model_directory(model: str) -> bool:
    """A local directory holding a transformers ``config.json``."""
    try:
        return (Path(model).expanduser() / "config.json").is_file()
    except (OSError, ValueError):
        return False


def _claims(model: str) -> bool:
    """Whether ``model`` is ours: a model directory, or a path that should be one (a clear error
    then, rather than "unknown model")."""
    if model.startswith(RANDOM_INIT):
        return False  # the random-init provider's
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


def _settings(path: Path) -> dict[str, str]:
    """The directory's own special-token settings (``pad_token``, ``eos_token``, ...)."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise objreg.DataError(f"{file}: not valid JSON ({e})") from None
        for key in SETTING_KEYS:
            value = data.get(key)
            if isinstance(value, dict):  # {"content": "[PAD]", ...} in newer files
                value = value.get("content")
            if isinstance(value, str):
                found[key] = value
    return found


def architecture(path: Path) -> str:
    """``encoder``, ``decoder`` (a decoder-only causal LM) or ``encoder-decoder``, from config.json
    (transformers' own tables: a model type with a causal-LM class and no masked-LM class is a
    decoder)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise objreg.DataError(f"model directory {str(path)!r}: cannot read config.json: not valid JSON ({e})") from None
    if config.get("is_encoder_decoder"):
        return "encoder-decoder"
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:
        return "encoder"
    model_type = config.get("model_type")
    if model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "encoder-decoder"
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "decoder"
    return "encoder"


def load_tokenizer(model: str) -> objreg.Tokenizer:
    """The model directory's ``tokenizer.json`` with its truncation, padding and post-processor
    switched off (objreg frames rows itself), each role played by the token the module docstring
    names; ``architecture`` from config.json."""
    from tokenizers import Tokenizer as Backend

    path = _check_directory(model)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise objreg.DataError(
            f"model directory {model!r} has no tokenizer.json (a fast tokenizer file); objreg reads the tokenizer "
            f"from it. Save one with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
        )
    _check_tokenizer_size(file)
    try:
        backend = Backend.from_file(str(file))
    except Exception as e:  # the tokenizers library raises plain Exceptions for a bad file
        raise objreg.DataError(f"{file}: cannot be read as a tokenizer: {e}") from None
    backend.no_truncation()
    backend.no_padding()
    settings = _settings(path)
    roles = special_tokens.roles(backend, settings)
    if None in roles.values():
        raise objreg.DataError(
            f"{file}: no token to start and end rows with (it has none of [CLS]/[SEP], <s>/</s>, <|endoftext|> or a "
            f"bos/eos token); give the tokenizer one, e.g. tokenizer.add_special_tokens({{'eos_token': '</s>'}}), "
            f"resize the model's embeddings and save both to {model}"
        )
    return objreg.Tokenizer(
        backend, **roles, sentinels=special_tokens.sentinels(backend), named=special_tokens.named(backend, settings),
        name=f"{path.name} (tokenizer.json)", architecture=architecture(path),
    )


def _check_tokenizer_size(file: Path) -> None:
    size = file.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise objreg.DataError(f"{file}: {size / 2**20:,.0f} MiB is too large for a tokenizer.json (at most "
                               f"{MAX_TOKENIZER_BYTES // 2**20} MiB): not a tokenizer file, or a damaged one")


# -- model ------------------------------------------------------------------------------------------


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
        with _quiet(_transformers()):
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
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | objreg.AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]``; ``attention_mask`` (bool ``[B, T, T]``, True: query ``i``
        may attend key ``j``, or structured) is handed to transformers as a 4-D additive mask."""
        _check_length(input_ids, self.max_positions)
        additive = _additive(objreg.masks.dense(attention_mask), self.input_embeddings().dtype)  # (B, 1, T, T)
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
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | objreg.AttentionMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` in the prefix-LM layout (``position_ids`` are not used)."""
        _check_length(input_ids, self.max_positions)
        dtype = self.input_embeddings().dtype
        parts = encoder_decoder.split(input_ids, objreg.masks.dense(attention_mask), self.start_id)
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
        raise objreg.InvalidParameterError(
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


def load_model(model: str, vocab: Vocabulary, config: Mapping[str, Any], generator: torch.Generator) -> HFBackbone:
    path, transformers, _, kind, kwargs = _open_directory(model, config)
    try:
        with _quiet(transformers):
            # Every size mismatch and missing tensor reported (not raised or silently initialised at random):
            # _check_weights refuses them in one line.
            loaded, loading = transformers.AutoModel.from_pretrained(
                str(path), output_loading_info=True, ignore_mismatched_sizes=True, local_files_only=True, **kwargs)
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
    except Exception as e:  # the safetensors library raises its own error for a truncated or damaged file
        if not _damaged_file(e):
            raise
        raise objreg.DataError(f"model directory {model!r}: its weights file {_weights_file(path)} cannot be read "
                               f"({' '.join(str(e).split())}): truncated or damaged; save the model again") from None
    _check_weights(model, path, loaded, loading)
    embedding_rows = loaded.get_input_embeddings().weight.shape[0]
    if vocab.size > embedding_rows:
        raise objreg.DataError(
            f"model directory {model!r}: its tokenizer has {vocab.size} tokens but the model only {embedding_rows} "
            f"embeddings; resize them (model.resize_token_embeddings(len(tokenizer))) and save the model to {model}"
        )
    backbone = _backbone(loaded, kind, vocab)
    backbone.source = path
    return backbone


def _open_directory(directory: str, config: Mapping[str, Any]) -> tuple[Path, Any, Any, str, dict[str, Any]]:
    """A model directory's path, the transformers module, its config.json, its architecture and
    the keyword arguments every backbone of it is built with."""
    if config:
        raise objreg.InvalidParameterError(
            f"a Hugging Face model directory takes no model config overrides, got {', '.join(sorted(config))}"
        )
    path = _check_directory(directory)
    transformers = _transformers()
    _check_model_type(directory, path, transformers)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise objreg.DataError(f"model directory {directory!r}: cannot read config.json: "
                               f"{' '.join(str(e).split())}") from None
    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    if hf_config.model_type in ("bert", "roberta", "xlm-roberta", "electra", "camembert"):
        kwargs["add_pooling_layer"] = False
    return path, transformers, hf_config, architecture(path), kwargs


def _check_model_type(directory: str, path: Path, transformers: Any) -> None:
    """config.json's ``model_type`` must be one this transformers knows (its own error is three
    sentences of advice on upgrading and custom code, which objreg never runs)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # AutoConfig says what is wrong with the file
    if model_type is None:
        raise objreg.DataError(f"model directory {directory!r}: config.json names no model_type (every transformers "
                               f"model's config.json does: save it with save_pretrained(DIR))")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise objreg.DataError(f"model directory {directory!r}: config.json's model_type {model_type!r} is not one "
                               f"transformers {transformers.__version__} knows (a newer model, or a custom one whose "
                               f"code objreg does not run)")


def _backbone(loaded: nn.Module, kind: str, vocab: Vocabulary) -> HFBackbone:
    """The loaded transformers model as objreg's backbone: deterministic, in float32."""
    _deterministic(loaded)
    loaded = loaded.float()
    if kind == "encoder-decoder":
        return HFEncoderDecoderBackbone(loaded, vocab.pad_id)
    return HFBackbone(loaded, kind)


def _weights_file(path: Path) -> str:
    return next((name for name in WEIGHTS_FILES if (path / name).is_file()), "(none)")


def _damaged_file(error: Exception) -> bool:
    """A weights file that cannot be read: safetensors' header or torch's zip archive broken."""
    return type(error).__name__ == "SafetensorError" or (
        isinstance(error, RuntimeError) and any(m in str(error) for m in ("PytorchStreamReader", "zip archive")))


def _check_weights(model: str, path: Path, loaded: nn.Module, loading: Mapping[str, Any]) -> None:
    """Every backbone tensor must come from the weights file, at the size config.json gives it:
    transformers would otherwise initialise the missing ones at random, and objreg would analyse
    a random model under the checkpoint's name.

    Raises:
        DataError: tensors missing from the file, or of other sizes, named with their count.
    """
    file = _weights_file(path)
    total = len(loaded.state_dict())
    mismatched = sorted(loading.get("mismatched_keys") or [])
    if mismatched:
        key, found, wanted = mismatched[0]
        raise objreg.DataError(
            f"model directory {model!r}: {len(mismatched)} of {total} backbone tensors in its weights file {file} "
            f"have other sizes than config.json gives them (first: {key} is {list(found)} in the file, "
            f"{list(wanted)} by config.json); give the weights and the config.json of one model")
    missing = sorted(loading.get("missing_keys") or [])
    if missing:
        shown = ", ".join(missing[:3]) + (", …" if len(missing) > 3 else "")
        raise objreg.DataError(
            f"model directory {model!r}: {len(missing)} of {total} backbone tensors are missing from its weights file "
            f"{file} ({shown}), so they would be initialised at random; give the weights that match config.json, or "
            f"--model {RANDOM_INIT}{model} to start from random weights on purpose")


def load_random_model(model: str, vocab: Vocabulary, config: Mapping[str, Any], generator: torch.Generator
                      ) -> HFBackbone:
    """``random-init:DIR``: the architecture of DIR's config.json with random weights (drawn from
    ``generator``), the weights file left unread."""
    directory = model[len(RANDOM_INIT):]
    _, transformers, hf_config, kind, kwargs = _open_directory(directory, config)
    with torch.random.fork_rng(), _quiet(transformers):
        # transformers draws from the global generator: seeded from ours, and restored after.
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        loaded = transformers.AutoModel.from_config(hf_config, **kwargs)
    embedding_rows = loaded.get_input_embeddings().weight.shape[0]
    if vocab.size > embedding_rows:
        raise objreg.DataError(f"model directory {directory!r}: its tokenizer has {vocab.size} tokens but config.json "
                               f"only {embedding_rows} embeddings")
    backbone = _backbone(loaded, kind, vocab)
    backbone.source = Path(directory).expanduser()
    return backbone


def _random_init(model: str) -> bool:
    return model.startswith(RANDOM_INIT)


# -- hooks ------------------------------------------------------------------------------------------


@objreg.hookimpl
def objreg_register_models(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "model", "DIR", "a local Hugging Face transformers model directory (encoders, decoder-only causal LMs, "
        "encoder-decoders; needs objreg[hf])",
        load_model, accepts=_claims,
    ))
    register(objreg.Provider(
        "model", "random-init:DIR", "the architecture of a Hugging Face model directory with random weights, on "
        "purpose (its weights file is not read; needs objreg[hf])",
        load_random_model, accepts=_random_init,
    ))


@objreg.hookimpl
def objreg_register_tokenizers(register: Callable[[objreg.Provider], None]) -> None:
    register(objreg.Provider(
        "tokenizer", "DIR", "the model directory's own tokenizer.json", lambda model, corpus, cache_dir: load_tokenizer(model),
        accepts=_claims,
    ))
    register(objreg.Provider(
        "tokenizer", "random-init:DIR", "the model directory's own tokenizer.json",
        lambda model, corpus, cache_dir: load_tokenizer(model[len(RANDOM_INIT):]), accepts=_random_init,
    ))
