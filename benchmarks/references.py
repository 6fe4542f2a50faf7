"""The reference corruptions the harness compares objreg with, where the reference is not an
installable package: T5's span corruption as Hugging Face's example collator runs it, BART's noise
as fairseq's ``DenoisingDataset`` applies it row by row, and ELECTRA's masking and generator
sampling. Each is written here from the published algorithm, step for step, in the execution model
of the original (per-row numpy for T5's noise mask and for fairseq's per-item noise, whole-batch
tensor operations for ELECTRA's TensorFlow code), so that what is timed is what those pipelines do.

* :class:`HFT5SpanCorruption`: ``FlaxDataCollatorForT5MLM`` of HF's
  ``examples/flax/language-modeling/run_t5_mlm_flax.py`` (the PyTorch example has the same numpy
  logic), with ``np.bincount`` for ``jax.ops.segment_sum`` (same result; if anything it helps HF).
* :class:`FairseqDenoising`: ``fairseq/data/denoising_dataset.py``'s ``__getitem__`` per row
  (sentence permutation at full stops, whole-word span masking with Poisson span lengths and
  zero-length spans as insertions, insertion noise, rotation) and its collater's padding, in numpy.
* :class:`ElectraMasking`: ``google-research/electra`` ``pretrain/pretrain_helpers.py``:
  ``mask`` (``max_predictions_per_seq`` positions drawn per row from a categorical over the
  candidates, with replacement; 85% of them ``[MASK]``) and ``sample_from_softmax`` (Gumbel-max
  over the generator's logits), written with torch tensor operations over the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# -- T5 span corruption (Hugging Face's example collator) -------------------------------------------


def compute_input_and_target_lengths(
    inputs_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """HF run_t5_mlm_flax.py ``compute_input_and_target_lengths`` (a copy of T5's
    ``random_spans_helper``): raw tokens per row such that the corrupted input is ``inputs_length``."""

    def _tokens_length_to_inputs_length_targets_length(tokens_length: int) -> tuple[int, int]:
        num_noise_tokens = int(round(tokens_length * noise_density))
        num_nonnoise_tokens = tokens_length - num_noise_tokens
        num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
        return num_nonnoise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1

    tokens_length = inputs_length
    while _tokens_length_to_inputs_length_targets_length(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs_length, targets_length = _tokens_length_to_inputs_length_targets_length(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def shift_tokens_right(input_ids: np.ndarray, pad_token_id: int, decoder_start_token_id: int) -> np.ndarray:
    """transformers' numpy ``shift_tokens_right`` (modeling_flax_t5.py)."""
    shifted_input_ids = np.zeros_like(input_ids)
    shifted_input_ids[:, 1:] = input_ids[:, :-1]
    shifted_input_ids[:, 0] = decoder_start_token_id
    return np.where(shifted_input_ids == -100, pad_token_id, shifted_input_ids)


class HFT5SpanCorruption:
    """``FlaxDataCollatorForT5MLM.__call__`` and helpers from HF's run_t5_mlm_flax.py, same numpy
    logic (global ``np.random`` included); ``vocab_size``/``eos_token_id`` stand for its tokenizer."""

    def __init__(
        self,
        vocab_size: int,
        eos_token_id: int,
        pad_token_id: int,
        noise_density: float,
        mean_noise_span_length: float,
        input_length: int,
        target_length: int,
    ):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.decoder_start_token_id = pad_token_id
        self.noise_density = noise_density
        self.mean_noise_span_length = mean_noise_span_length
        self.input_length = input_length
        self.target_length = target_length

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, np.ndarray]:
        batch = {k: np.array([examples[i][k] for i in range(len(examples))]) for k, v in examples[0].items()}
        input_ids = batch["input_ids"]
        batch_size, expandend_input_length = input_ids.shape
        mask_indices = np.asarray([self.random_spans_noise_mask(expandend_input_length) for i in range(batch_size)])
        labels_mask = ~mask_indices
        input_ids_sentinel = self.create_sentinel_ids(mask_indices.astype(np.int8))
        labels_sentinel = self.create_sentinel_ids(labels_mask.astype(np.int8))
        batch["input_ids"] = self.filter_input_ids(input_ids, input_ids_sentinel)
        batch["labels"] = self.filter_input_ids(input_ids, labels_sentinel)
        if batch["input_ids"].shape[-1] != self.input_length:
            raise ValueError(f"input length {batch['input_ids'].shape[-1]}, expected {self.input_length}")
        if batch["labels"].shape[-1] != self.target_length:
            raise ValueError(f"target length {batch['labels'].shape[-1]}, expected {self.target_length}")
        batch["decoder_input_ids"] = shift_tokens_right(batch["labels"], self.pad_token_id, self.decoder_start_token_id)
        return batch

    def create_sentinel_ids(self, mask_indices: np.ndarray) -> np.ndarray:
        start_indices = mask_indices - np.roll(mask_indices, 1, axis=-1) * mask_indices
        start_indices[:, 0] = mask_indices[:, 0]
        sentinel_ids = np.where(start_indices != 0, np.cumsum(start_indices, axis=-1), start_indices)
        sentinel_ids = np.where(sentinel_ids != 0, (sentinel_ids + self.vocab_size - 1), 0)
        sentinel_ids -= mask_indices - start_indices
        return sentinel_ids

    def filter_input_ids(self, input_ids: np.ndarray, sentinel_ids: np.ndarray) -> np.ndarray:
        batch_size = input_ids.shape[0]
        input_ids_full = np.where(sentinel_ids != 0, sentinel_ids, input_ids)
        input_ids = input_ids_full[input_ids_full > 0].reshape((batch_size, -1))
        return np.concatenate([input_ids, np.full((batch_size, 1), self.eos_token_id, dtype=np.int32)], axis=-1)

    def random_spans_noise_mask(self, length: int) -> np.ndarray:
        orig_length = length
        num_noise_tokens = int(np.round(length * self.noise_density))
        num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
        num_noise_spans = int(np.round(num_noise_tokens / self.mean_noise_span_length))
        num_noise_spans = max(num_noise_spans, 1)
        num_nonnoise_tokens = length - num_noise_tokens

        def _random_segmentation(num_items: int, num_segments: int) -> np.ndarray:
            mask_indices = np.arange(num_items - 1) < (num_segments - 1)
            np.random.shuffle(mask_indices)
            first_in_segment = np.pad(mask_indices, [[1, 0]])
            segment_id = np.cumsum(first_in_segment)
            return np.bincount(segment_id)  # jax.ops.segment_sum(np.ones_like(segment_id), segment_id)

        noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans)
        nonnoise_span_lengths = _random_segmentation(num_nonnoise_tokens, num_noise_spans)
        interleaved_span_lengths = np.reshape(
            np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2]
        )
        span_starts = np.cumsum(interleaved_span_lengths)[:-1]
        span_start_indicator = np.zeros((length,), dtype=np.int8)
        span_start_indicator[span_starts] = True
        span_num = np.cumsum(span_start_indicator)
        is_noise = np.equal(span_num % 2, 1)
        return is_noise[:orig_length]


# -- BART denoising, row by row (fairseq's DenoisingDataset) ----------------------------------------


class FairseqDenoising:
    """BART's noise as fairseq applies it: each row on its own (``__getitem__``), then padded into
    a batch (the collater). Rows are ``bos ... eos`` id arrays; sentences end at ``full_stop``
    (fairseq: the end-of-sentence id, or ``'13'`` for GPT-2 BPE), and the row's last text token
    counts as one. ``word_start[v]`` says whether vocabulary entry ``v`` starts a word
    (``mask_whole_words``). Defaults: the BART-large recipe, as objreg's ``bart``."""

    def __init__(
        self,
        vocab_size: int,
        mask_id: int,
        pad_id: int,
        full_stop: int,
        word_start: np.ndarray,
        mask: float = 0.3,
        mask_random: float = 0.1,
        poisson_lambda: float = 3.0,
        replace_length: int = 1,
        permute_sentences: float = 1.0,
        rotate: float = 0.0,
        insert: float = 0.0,
        seed: int = 0,
    ):
        self.vocab_size, self.mask_id, self.pad_id, self.full_stop = vocab_size, mask_id, pad_id, full_stop
        self.word_start = word_start.astype(np.int64)
        self.mask, self.mask_random, self.replace_length = mask, mask_random, replace_length
        self.permute, self.rotate, self.insert = permute_sentences, rotate, insert
        # Span lengths: Poisson(lambda) probabilities for k = 0, 1, ... until they fall below 1e-7.
        probabilities, k = [], 0
        while True:
            probabilities.append(math.exp(-poisson_lambda) * poisson_lambda**k / math.factorial(k))
            if probabilities[-1] < 1e-7 or k >= 127:
                break
            k += 1
        self.span_p = np.asarray(probabilities) / sum(probabilities)
        self.rng = np.random.default_rng(seed)

    def __call__(self, rows: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        sources, targets = [], []
        for row in rows:
            source = row.copy()
            if self.permute > 0:
                source = self.permute_sentences(source)
            if self.mask > 0:
                source = self.whole_word_mask(source)
            if self.insert > 0:
                source = self.insertion_noise(source, self.insert)
            if self.rotate > 0 and self.rng.random() < self.rotate:
                source = self.rolling_noise(source)
            sources.append(source)
            targets.append(row)
        return {"source": self.pad(sources), "target": self.pad(targets)}

    def pad(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        out = np.full((len(rows), max(len(r) for r in rows)), self.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out

    def permute_sentences(self, source: np.ndarray) -> np.ndarray:
        stops = source == self.full_stop
        stops[-2] = True  # the last text token ends a sentence
        ends = np.flatnonzero(stops[1:] & ~stops[:-1]) + 2  # one past each sentence's last stop
        n = len(ends)
        count = math.ceil(n * self.permute)
        chosen = self.rng.permutation(n)[:count]
        order = np.arange(n)
        order[chosen] = chosen[self.rng.permutation(count)]
        starts = np.concatenate([[1], ends[:-1]])
        out = source.copy()
        pieces = [source[starts[i] : ends[i]] for i in order]
        body = np.concatenate(pieces) if pieces else source[1:1]
        out[1 : 1 + len(body)] = body
        return out

    def word_starts(self, source: np.ndarray) -> np.ndarray:
        starts = self.word_start[source]
        starts[0] = 0
        starts[-1] = 0
        return starts

    def whole_word_mask(self, source: np.ndarray) -> np.ndarray:
        is_start = self.word_starts(source)
        budget = math.ceil(is_start.sum() * self.mask)
        if budget == 0:
            return source
        lengths = self.rng.choice(len(self.span_p), size=budget, p=self.span_p)
        total = np.cumsum(lengths)
        while total[-1] < budget:
            lengths = np.concatenate([lengths, self.rng.choice(len(self.span_p), size=budget, p=self.span_p)])
            total = np.cumsum(lengths)
        last = int(np.searchsorted(total, budget))  # the first span that reaches the budget
        lengths = lengths[: last + 1].copy()
        lengths[last] = budget - (0 if last == 0 else total[last - 1])
        inserts = int((lengths == 0).sum())
        lengths = lengths[lengths > 0]
        spans = len(lengths)
        if spans == 0:
            return self.insertion_noise(source, inserts / len(source))
        candidates = np.flatnonzero(is_start)
        index = candidates[self.rng.permutation(len(candidates))[:spans]]
        lengths = lengths[: len(index)]
        randomised = self.rng.random(len(index)) < self.mask_random
        keep = np.ones(len(source), dtype=bool)
        is_start[-1] = 255  # a long "word" at the end, so no span runs past the row
        if self.replace_length == 0:
            keep[index] = False
        else:
            source[index] = self.mask_id
            source[index[randomised]] = self.rng.integers(1, self.vocab_size, size=int(randomised.sum()))
        lengths = lengths - 1
        while len(index):
            lengths = lengths - is_start[index + 1]
            going = lengths >= 0
            index, randomised, lengths = index[going] + 1, randomised[going], lengths[going]
            if self.replace_length != -1:
                keep[index] = False
            else:
                source[index] = self.mask_id
                source[index[randomised]] = self.rng.integers(1, self.vocab_size, size=int(randomised.sum()))
        source = source[keep]
        if inserts > 0:
            source = self.insertion_noise(source, inserts / len(source))
        return source

    def insertion_noise(self, tokens: np.ndarray, p: float) -> np.ndarray:
        if p == 0.0:
            return tokens
        n_tokens = len(tokens)
        n = math.ceil(n_tokens * p)
        slots = self.rng.permutation(n_tokens + n - 2)[:n] + 1
        noise = np.zeros(n_tokens + n, dtype=bool)
        noise[slots] = True
        out = np.full(n + n_tokens, -1, dtype=np.int64)
        n_random = math.ceil(n * self.mask_random)
        out[slots[n_random:]] = self.mask_id
        out[slots[:n_random]] = self.rng.integers(1, self.vocab_size, size=n_random)
        out[~noise] = tokens
        return out

    def rolling_noise(self, tokens: np.ndarray) -> np.ndarray:
        offset = int(self.rng.integers(1, max(1, len(tokens) - 1) + 1))
        return np.concatenate([tokens[:1], tokens[offset:-1], tokens[1:offset], tokens[-1:]])


# -- ELECTRA: masking and generator sampling --------------------------------------------------------


class ElectraMasking:
    """ELECTRA's ``pretrain_helpers.mask`` and ``sample_from_softmax`` over a padded batch, as whole-
    batch tensor operations (the TensorFlow original's execution model).

    ``mask``: ``N = max_predictions`` positions per row drawn from a categorical over the row's
    candidates (ordinary tokens) with replacement; the first ``max(1, min(N, round(n · 0.15)))``
    count (``masked_lm_weights``), the rest point at position 0; 85% of the counted positions
    become ``[MASK]``. ``sample``: Gumbel-max over ``logits`` ``[B, N, V]`` (``-1000`` on the
    original token when ``disallow_correct``), the sampled ids scattered into the input.
    """

    def __init__(self, mask_id: int, special_ids: Sequence[int], vocab_size: int, max_predictions: int,
                 mask_prob: float = 0.15, seed: int = 0):
        self.mask_id, self.max_predictions, self.mask_prob = mask_id, max_predictions, mask_prob
        self.special = torch.zeros(vocab_size, dtype=torch.bool)
        self.special[list(special_ids)] = True
        self.generator = torch.Generator().manual_seed(seed)

    def mask(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> dict[str, Any]:
        B, L = input_ids.shape
        N = self.max_predictions
        candidates = (~self.special[input_ids]) & input_mask.bool()
        num_tokens = input_mask.float().sum(dim=-1)
        num_to_predict = torch.clamp(torch.round(num_tokens * self.mask_prob).long(), max=N).clamp(min=1)
        weights = (torch.arange(N)[None, :] < num_to_predict[:, None]).float()
        sample_prob = candidates.float()
        sample_prob = sample_prob / sample_prob.sum(dim=-1, keepdim=True)
        positions = torch.multinomial(sample_prob, N, replacement=True, generator=self.generator)  # (B, N)
        positions = positions * weights.long()
        ids = input_ids.gather(1, positions) * weights.long()
        use_mask = (torch.rand(B, N, generator=self.generator) < 0.85).long()
        replace_positions = positions * use_mask
        masked = input_ids.scatter(1, replace_positions, torch.full((B, N), self.mask_id))
        # scatter_update: writing position 0 (the unused slots) must leave [CLS] as it was
        masked[:, 0] = input_ids[:, 0]
        return {"input_ids": masked, "masked_lm_positions": positions, "masked_lm_ids": ids,
                "masked_lm_weights": weights}

    def sample(self, masked: dict[str, Any], logits: torch.Tensor, disallow_correct: bool = False) -> torch.Tensor:
        """Generator samples at the masked positions, scattered into the input ``[B, L]``."""
        if disallow_correct:
            logits = logits - 1000.0 * torch.nn.functional.one_hot(masked["masked_lm_ids"], logits.shape[-1])
        uniform = torch.rand(logits.shape, generator=self.generator)
        gumbel = -torch.log(-torch.log(uniform + 1e-9) + 1e-9)
        sampled = torch.argmax(torch.softmax(logits + gumbel, dim=-1), dim=-1)  # (B, N)
        weights = masked["masked_lm_weights"].long()
        fake = masked["input_ids"].scatter(1, masked["masked_lm_positions"] * weights, sampled * weights)
        fake[:, 0] = masked["input_ids"][:, 0]
        return fake
