"""What objreg reads from a local Hugging Face transformers model directory besides its weights:
whether a path is one (:func:`is_model_directory`, :func:`check_directory`), its architecture
from ``config.json`` (:func:`architecture`), and its tokenizer (:func:`load_tokenizer`): the
directory's ``tokenizer.json`` as its users built it (:mod:`objreg.toolkit.special_tokens`),
BERT's specials where it has them, else the GPT-2/T5 ones (``<|endoftext|>``, ``</s>``,
``<pad>``); span sentinels from T5's ``<extra_id_N>`` or BERT's first 64 ``[unusedN]``; objreg's
named markers (``[EOS]``, ``[FIM_PREFIX]``, ...) under their own names, StarCoder's/Qwen's FIM
names, or the next ``[unusedN]``. Objectives that need a token the tokenizer lacks say so, with
the fix, before the model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from objreg.core.errors import DataError
from objreg.toolkit import special_tokens
from objreg.toolkit.tokenizer import Tokenizer

#: The special-token settings a directory's tokenizer files may give (special_tokens_map.json, tokenizer_config.json).
SETTING_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")

#: A tokenizer.json larger than this is refused before the tokenizers library reads it (the largest
#: published ones are tens of MiB; a file of gigabytes makes the library abort the process).
MAX_TOKENIZER_BYTES = 256 * 2**20


def is_model_directory(model: str) -> bool:
    """A local directory holding a transformers ``config.json``."""
    try:
        return (Path(model).expanduser() / "config.json").is_file()
    except (OSError, ValueError):
        return False


def check_directory(model: str) -> Path:
    """``model`` as a path to a directory holding a ``config.json``; a DataError saying which is missing otherwise."""
    path = Path(model).expanduser()
    if not path.is_dir():
        raise DataError(
            f"model directory {model!r} does not exist; give a local transformers model directory (with config.json) "
            f"or a model name (see `objreg list`)"
        )
    if not (path / "config.json").is_file():
        raise DataError(f"model directory {model!r} has no config.json: not a transformers model directory")
    return path


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
            raise DataError(f"{file}: not valid JSON ({e})") from None
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
        raise DataError(f"model directory {str(path)!r}: cannot read config.json: not valid JSON ({e})") from None
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


def load_tokenizer(model: str) -> Tokenizer:
    """The model directory's ``tokenizer.json`` with its truncation, padding and post-processor
    switched off (objreg frames rows itself), each role played by the token the module docstring
    names; ``architecture`` from config.json."""
    from tokenizers import Tokenizer as Backend

    path = check_directory(model)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise DataError(
            f"model directory {model!r} has no tokenizer.json (a fast tokenizer file); objreg reads the tokenizer "
            f"from it. Save one with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
        )
    _check_tokenizer_size(file)
    try:
        backend = Backend.from_file(str(file))
    except Exception as e:  # the tokenizers library raises plain Exceptions for a bad file
        raise DataError(f"{file}: cannot be read as a tokenizer: {e}") from None
    backend.no_truncation()
    backend.no_padding()
    settings = _settings(path)
    roles = special_tokens.roles(backend, settings)
    if None in roles.values():
        raise DataError(
            f"{file}: no token to start and end rows with (it has none of [CLS]/[SEP], <s>/</s>, <|endoftext|> or a "
            f"bos/eos token); give the tokenizer one, e.g. tokenizer.add_special_tokens({{'eos_token': '</s>'}}), "
            f"resize the model's embeddings and save both to {model}"
        )
    return Tokenizer(
        backend, **roles, sentinels=special_tokens.sentinels(backend), named=special_tokens.named(backend, settings),
        name=f"{path.name} (tokenizer.json)", architecture=architecture(path),
    )


def _check_tokenizer_size(file: Path) -> None:
    size = file.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise DataError(f"{file}: {size / 2**20:,.0f} MiB is too large for a tokenizer.json (at most "
                               f"{MAX_TOKENIZER_BYTES // 2**20} MiB): not a tokenizer file, or a damaged one")
