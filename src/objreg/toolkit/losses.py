"""Loss pieces shared by objectives and tasks: gather at fixed-size position lists, (smoothed)
negative log-likelihood, a stop-gradient KL, weighted means.

All are pure and transform-safe (fixed shapes, no ``.item()``), so losses built from them run under
``vmap``, ``jvp`` and double backward.
"""

from __future__ import annotations

import torch

from objreg.core.types import IGNORE_INDEX


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``hidden[b, positions[b, k]]``: ``[B, T, H]`` and ``[B, K]`` to ``[B, K, H]``."""
    return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def smoothed_nll(logits: torch.Tensor, targets: torch.Tensor, epsilon: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Per-position cross-entropy with label smoothing: ``(1-ε)(-log p_y) + ε · mean_v(-log p_v)``,
    the ``torch.nn.functional.cross_entropy(label_smoothing=ε)`` convention. ``logits`` ``[B, K, V]``,
    ``targets`` ``[B, K]`` (valid ids), ``epsilon`` a float or ``[B]``; returns ``[B, K]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, K)
    if isinstance(epsilon, float) and epsilon == 0.0:  # a Python constant, not a tensor value
        return nll
    eps = torch.as_tensor(epsilon, dtype=logits.dtype, device=logits.device)
    eps = eps[:, None] if eps.dim() == 1 else eps
    return (1 - eps) * nll + eps * -log_probs.mean(dim=-1)


def consistency_kl(logits: torch.Tensor, stopped_logits: torch.Tensor) -> torch.Tensor:
    """``KL(p ‖ sg[q]) = Σ_v p_v (log p_v − log q_v)`` per position, ``p = softmax(logits)``,
    ``q = softmax(stopped_logits)`` behind a true stop-gradient: no gradient (reverse or forward
    mode) reaches ``stopped_logits``. Shapes ``[..., V]`` to ``[...]``."""
    log_p = torch.log_softmax(logits, dim=-1)
    log_q = torch.log_softmax(stopped_logits.detach(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [B, K] over K with ``weights`` [B, K]; 0 for a row without weight."""
    weights = weights.to(values.dtype)
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)



def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token negative log-likelihood ``[B, T]``, 0 where the label is ``IGNORE_INDEX``, and the
    ``[B, T]`` bool of labelled positions. ``logits`` ``[B, T, V]``, ``labels`` ``[B, T]``.

    Written with ``log_softmax`` + ``gather`` and a mask (no boolean indexing), so it keeps fixed
    shapes under ``vmap``, ``jvp`` and double backward.
    """
    labelled = labels != IGNORE_INDEX  # (B, T)
    safe = torch.where(labelled, labels, 0)  # (B, T): any valid index; masked out below
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    nll = -log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return torch.where(labelled, nll, 0.0), labelled


def class_nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy ``[B]`` of ``logits`` ``[B, C]`` against class indices ``target`` ``[B]``."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, target[:, None]).squeeze(-1)


def label_nll(logits: torch.Tensor, target: torch.Tensor, labelled: torch.Tensor | None = None) -> torch.Tensor:
    """The downstream tasks' cross-entropy ``logsumexp(logits) - logits[target]`` over the classes
    (the last dimension), for heads sized to the data's classes.

    ``logits`` ``[B, C]`` and ``target`` ``[B]`` give ``[B]`` (one label per row: classification,
    ordering). ``logits`` ``[B, T, C]``, ``target`` ``[B, T]`` and ``labelled`` ``[B, T]`` bool give
    the mean over each row's labelled positions, ``[B]``, 0 for a row without one (one label per
    token: tagging); the target at an unlabelled position may be anything, e.g. ``IGNORE_INDEX``.
    """
    if labelled is None:
        return torch.logsumexp(logits, dim=-1) - logits.gather(-1, target[..., None]).squeeze(-1)
    safe = torch.where(labelled, target, 0)  # any valid class where unlabelled; masked out below
    picked = logits.gather(-1, safe[..., None]).squeeze(-1)  # (B, T)
    nll = torch.where(labelled, torch.logsumexp(logits, dim=-1) - picked, 0.0)  # (B, T)
    return nll.sum(dim=1) / labelled.sum(dim=1).clamp(min=1)  # (B,)
