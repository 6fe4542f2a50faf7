"""The probe on a Hugging Face model with transformers' default attention (SDPA): measured through
SDPA's math kernel, with the records of the same model under eager attention; attention the probe
cannot differentiate is refused when the probe is made."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jvp

import objreg
from objreg.analysis.probe.attention import derivable_attention

transformers = pytest.importorskip("transformers")

VOCAB = 64


class Classified(nn.Module):
    """A tiny GPT-2 LM with a three-class head on its last state (the downstream task)."""

    def __init__(self, attention: str | None):
        super().__init__()
        torch.manual_seed(0)
        extra = {} if attention is None else {"attn_implementation": attention}
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                         bos_token_id=0, eos_token_id=0, **extra)
        self.lm = transformers.GPT2LMHeadModel(config)
        self.task = nn.Linear(32, 3)


def next_token_loss(model, batch):
    logits = model.lm(batch["ids"]).logits[:, :-1]
    losses = F.cross_entropy(logits.reshape(-1, VOCAB), batch["ids"][:, 1:].reshape(-1), reduction="none")
    return losses.view(len(batch["ids"]), -1).mean(1)


def task_loss(model, batch):
    hidden = model.lm.transformer(batch["ids"]).last_hidden_state[:, -1]
    return F.cross_entropy(model.task(hidden), batch["label"], reduction="none")


def sample(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {"ids": torch.randint(VOCAB, (n, 10), generator=generator), "label": torch.randint(3, (n,), generator=generator)}


def numbers(record) -> dict[str, float]:
    """Every number of a record that the model's attention could change, by path."""
    out = {"D": record["downstream_loss"], "D after": record["downstream_loss_after"], "actual": record["actual_delta"],
           **{f"predicted {k}": v for k, v in record["predicted_delta"].items()},
           **{f"S {k}": v for k, v in record["second_order"].items()}}
    for name, a in record["alignment"].items():
        out.update({f"{name} {k}": a[k] for k in ("dot", "cosine", "conflict_fraction", "grad_norm")})
    return out


def probed(attention: str | None, per_sample_method: str, hvp_method: str, spy: list[bool]):
    """Two probed SGD steps of the model; ``spy`` collects, per SDPA call, whether a fused kernel was allowed."""
    model = Classified(attention)
    model.train()  # the loop trains with dropout; the probe measures in eval mode
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    probe = objreg.TransferProbe(model, {"next": next_token_loss}, task_loss, optimizer, eval_batches=sample(16, g),
                                 per_sample_method=per_sample_method, hvp_method=hvp_method).attach(optimizer)
    for _ in range(2):
        batch = sample(6, g)
        optimizer.zero_grad()
        next_token_loss(model, batch).mean().backward()
        probe.observe({"next": batch})
        spy.clear()
        optimizer.step()
    return probe


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[bool]:
    """Whether a fused kernel (flash, memory-efficient) was allowed at each SDPA call made while probing."""
    calls: list[bool] = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def test_a_default_model_uses_sdpa_whose_fused_kernel_has_no_forward_mode(sdpa_calls):
    model = Classified(None).eval()
    assert model.lm.config._attn_implementation == "sdpa"
    ids = torch.randint(VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    params = {n: p.detach() for n, p in model.lm.named_parameters()}
    tangents = {n: torch.ones_like(p) for n, p in params.items()}

    def hidden(p):
        return functional_call(model.lm.transformer, {k.removeprefix("transformer."): v for k, v in p.items()
                                                      if k.startswith("transformer.")}, (ids,)).last_hidden_state

    with pytest.raises(NotImplementedError, match="forward AD"):
        jvp(hidden, (params,), (tangents,))
    with derivable_attention():
        _, derivative = jvp(hidden, (params,), (tangents,))
    assert torch.isfinite(derivative).all() and sdpa_calls


@pytest.mark.parametrize(("per_sample_method", "hvp_method"), [("auto", "auto"), ("jvp", "forward_over_reverse")])
def test_the_probe_measures_sdpa_with_the_records_of_eager_attention(per_sample_method, hvp_method, sdpa_calls):
    sdpa = probed(None, per_sample_method, hvp_method, sdpa_calls)
    assert sdpa_calls and not any(sdpa_calls)  # SDPA ran, each time with its math kernel alone
    eager = probed("eager", per_sample_method, hvp_method, sdpa_calls)
    assert not sdpa_calls  # eager attention never calls SDPA
    assert sdpa.engine.methods_used == eager.engine.methods_used
    assert len(sdpa.records) == len(eager.records) == 2
    for ours, theirs in zip(sdpa.records, eager.records):
        a, b = numbers(ours), numbers(theirs)
        assert a.keys() == b.keys() and abs(a["next dot"]) > 0
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key


def test_attention_the_probe_cannot_differentiate_is_refused_when_it_is_made():
    model = nn.Linear(4, 4)
    inner = nn.Linear(4, 4)
    inner.config = SimpleNamespace(_attn_implementation="flash_attention_2")
    model.add_module("inner", inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(objreg.InvalidParameterError) as refused:
        objreg.TransferProbe(model, {"a": lambda m, b: m(b).sum(1)}, lambda m, b: m(b).sum(1), optimizer,
                             eval_batches=torch.ones(2, 4))
    message = str(refused.value)
    assert "\n" not in message
    assert "attn_implementation='flash_attention_2'" in message and 'attn_implementation="eager"' in message
