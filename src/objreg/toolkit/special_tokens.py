"""Which token of a released tokenizer plays each of objreg's roles, found by name.

objreg frames rows as ``[CLS] ... [SEP]``, pads, masks, and looks up span sentinels and named
markers (``[EOS]``, ``[FIM_PREFIX]``, ...). A tokenizer as its users built it has its own names
for these: BERT's ``[CLS]``/``[SEP]``/``[PAD]``/``[MASK]`` and ``[unusedN]``, GPT-2's single
``<|endoftext|>``, T5's ``</s>``/``<pad>``/``<unk>`` and ``<extra_id_N>``, StarCoder's
``<fim_prefix>``. Each role takes the first candidate the vocabulary holds; candidates ending in
``_token`` are the tokenizer's own settings (``special_tokens_map.json``,
``tokenizer_config.json``), the rest literal tokens. ``backend`` is a ``tokenizers.Tokenizer``
(anything with ``token_to_id``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

#: objreg's named markers, in the order they take the [unusedN] tokens after the sentinels.
NAMED_MARKERS = ("[EOS]", "[NLU]", "[NLG]", "[S2S]", "[FIM_PREFIX]", "[FIM_MIDDLE]", "[FIM_SUFFIX]", "[FIM_PAD]")
NUM_SENTINELS = 64
#: The candidates for each of objreg's roles, in order (module docstring).
ROLES: dict[str, tuple[str, ...]] = {
    "cls": ("cls_token", "[CLS]", "bos_token", "<s>", "eos_token", "<|endoftext|>", "</s>"),
    "sep": ("sep_token", "[SEP]", "eos_token", "</s>", "<|endoftext|>"),
    "pad": ("pad_token", "[PAD]", "<pad>", "eos_token", "<|endoftext|>"),
    "unk": ("unk_token", "[UNK]", "<unk>", "eos_token", "<|endoftext|>"),
    # No mask token of its own: the end-of-text token stands in (the built-in qa set's questions
    # need a placeholder), and objectives that insert masks refuse (masked_lm.require_mask_token).
    "mask": ("mask_token", "[MASK]", "<mask>", "eos_token", "</s>", "<|endoftext|>"),
}
#: Other names of the named markers in released tokenizers (StarCoder, Qwen / CodeLlama-style).
MARKER_ALIASES = {
    "[EOS]": ("eos_token", "<|endoftext|>", "</s>"),
    "[FIM_PREFIX]": ("<fim_prefix>", "<|fim_prefix|>"),
    "[FIM_MIDDLE]": ("<fim_middle>", "<|fim_middle|>"),
    "[FIM_SUFFIX]": ("<fim_suffix>", "<|fim_suffix|>"),
    "[FIM_PAD]": ("<fim_pad>", "<|fim_pad|>"),
}


def roles(backend: Any, settings: Mapping[str, str]) -> dict[str, str | None]:
    """The token of each of ``cls``, ``sep``, ``pad``, ``unk`` and ``mask`` (None: none found)."""
    return {role: pick(backend, candidates, settings) for role, candidates in ROLES.items()}


def pick(backend: Any, candidates: tuple[str, ...], settings: Mapping[str, str]) -> str | None:
    """The first candidate the vocabulary holds (``*_token``: the tokenizer's own setting)."""
    for candidate in candidates:
        token = settings.get(candidate) if candidate.endswith("_token") else candidate
        if token is not None and backend.token_to_id(token) is not None:
            return token
    return None


def sentinels(backend: Any) -> list[str]:
    """T5's ``<extra_id_0>``, ``<extra_id_1>``, ... as far as they go, else BERT's first 64
    ``[unusedN]``, else none."""
    t5 = list(itertools.takewhile(lambda t: backend.token_to_id(t) is not None,
                                  (f"<extra_id_{i}>" for i in itertools.count())))
    if t5:
        return t5
    unused = [f"[unused{i}]" for i in range(NUM_SENTINELS)]
    return unused if all(backend.token_to_id(t) is not None for t in unused) else []


def named(backend: Any, settings: Mapping[str, str]) -> dict[str, str]:
    """objreg's named markers: under their own names or a released alias, else the [unusedN]
    tokens after the 64 sentinels (BERT vocabularies), else left out."""
    unused = [f"[unused{i}]" for i in range(NUM_SENTINELS, NUM_SENTINELS + len(NAMED_MARKERS))]
    has_unused = all(backend.token_to_id(t) is not None for t in unused)
    found = {}
    for marker, spare in zip(NAMED_MARKERS, unused):
        token = pick(backend, (marker, *MARKER_ALIASES.get(marker, ())), settings)
        if token is None and has_unused:
            token = spare
        if token is not None:
            found[marker] = token
    return found
