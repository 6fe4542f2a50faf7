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

Traps handled:

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

This module loads the weights (refusing missing, mis-sized, pickled or damaged ones) and registers
the providers; the backbone wrappers, the mask and the determinism are in
:mod:`objreg.toolkit.hf_backbone`, and what is read from the directory besides the weights (its
architecture, its tokenizer as its users built it) in :mod:`objreg.toolkit.hf_directory`.

Written like a third-party plugin: it imports only the public ``objreg`` facade, its toolkit and torch.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

import objreg
from objreg import Vocabulary
from objreg.toolkit.hf_backbone import HFBackbone, import_transformers, quiet, wrap_model
from objreg.toolkit.hf_directory import architecture, check_directory, is_model_directory, load_tokenizer

#: ``--model random-init:DIR``: the directory's architecture and tokenizer with random weights, on purpose.
RANDOM_INIT = "random-init:"
#: The weights files transformers reads, in the order it looks for them.
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _claims(model: str) -> bool:
    """Whether ``model`` is ours: a model directory, or a path that should be one (a clear error
    then, rather than "unknown model")."""
    if model.startswith(RANDOM_INIT):
        return False  # the random-init provider's
    if is_model_directory(model):
        return True
    if "/" in model or (os.sep in model) or Path(model).expanduser().is_dir():
        check_directory(model)
    return False


def load_model(model: str, vocab: Vocabulary, config: Mapping[str, Any], generator: torch.Generator) -> HFBackbone:
    path, transformers, _, kind, kwargs = _open_directory(model, config)
    try:
        with quiet(transformers):
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
    backbone = wrap_model(loaded, kind, vocab)
    backbone.source = path
    return backbone


def _open_directory(directory: str, config: Mapping[str, Any]) -> tuple[Path, Any, Any, str, dict[str, Any]]:
    """A model directory's path, the transformers module, its config.json, its architecture and
    the keyword arguments every backbone of it is built with."""
    if config:
        raise objreg.InvalidParameterError(
            f"a Hugging Face model directory takes no model config overrides, got {', '.join(sorted(config))}"
        )
    path = check_directory(directory)
    transformers = import_transformers()
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
    with torch.random.fork_rng(), quiet(transformers):
        # transformers draws from the global generator: seeded from ours, and restored after.
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        loaded = transformers.AutoModel.from_config(hf_config, **kwargs)
    embedding_rows = loaded.get_input_embeddings().weight.shape[0]
    if vocab.size > embedding_rows:
        raise objreg.DataError(f"model directory {directory!r}: its tokenizer has {vocab.size} tokens but config.json "
                               f"only {embedding_rows} embeddings")
    backbone = wrap_model(loaded, kind, vocab)
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
