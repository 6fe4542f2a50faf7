"""Loss pieces: smoothed NLL and the stop-gradient KL."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from objreg.toolkit import losses


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5])
def test_smoothed_nll_matches_the_closed_form(epsilon):
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 4, 11, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 11, (3, 4), generator=g)
    got = losses.smoothed_nll(logits, targets, epsilon)
    for b in range(3):
        for k in range(4):
            z = logits[b, k]
            log_p = z - math.log(sum(math.exp(float(v)) for v in z))
            want = -(1 - epsilon) * float(log_p[targets[b, k]]) - epsilon / 11 * float(log_p.sum())
            assert abs(float(got[b, k]) - want) < 1e-12
    torch.testing.assert_close(got, F.cross_entropy(logits.transpose(1, 2), targets, reduction="none",
                                                    label_smoothing=epsilon))
    per_row = losses.smoothed_nll(logits, targets, torch.tensor([0.0, epsilon, 1.0], dtype=torch.float64))
    torch.testing.assert_close(per_row[1], got[1])
    torch.testing.assert_close(per_row[2], -torch.log_softmax(logits[2], -1).mean(-1))


def test_consistency_kl_matches_a_loop_and_stops_the_gradient():
    g = torch.Generator().manual_seed(9)
    live = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    stopped = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    kl = losses.consistency_kl(live, stopped)
    values = kl.detach()
    for b in range(2):
        for k in range(3):
            p, q = torch.softmax(live[b, k], -1).tolist(), torch.softmax(stopped[b, k], -1).tolist()
            assert abs(float(values[b, k]) - sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))) < 1e-12
    grad_live, grad_stopped = torch.autograd.grad(kl.sum(), [live, stopped], allow_unused=True, materialize_grads=True)
    assert torch.equal(grad_stopped, torch.zeros_like(stopped)) and grad_live.abs().sum() > 0
    # Forward mode too (the analysis uses jvp): a tangent on the stopped side changes nothing.
    _, tangent = torch.func.jvp(lambda s: losses.consistency_kl(live.detach(), s), (stopped.detach(),),
                                (torch.randn(2, 3, 7, generator=g, dtype=torch.float64),))
    assert torch.equal(tangent, torch.zeros_like(tangent))


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_smoothed_nll_optimum_is_the_smoothed_marginal(epsilon):
    # Label smoothing's optimum over free logits (Szegedy et al. 2016, §7): the labels' marginal π
    # moved toward uniform, q = (1−ε)π + ε/V. Fitted by L-BFGS in float64, compared with the closed form.
    V = 12
    pi = 1 / torch.arange(1, V + 1, dtype=torch.float64)
    pi = pi / pi.sum()
    logits = torch.zeros(V, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([logits], lr=1.0, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                                  history_size=20, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        per_label = losses.smoothed_nll(logits.expand(1, V, V), torch.arange(V)[None, :], epsilon)  # (1, V)
        loss = (pi * per_label[0]).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    torch.testing.assert_close(torch.softmax(logits.detach(), -1), (1 - epsilon) * pi + epsilon / V, atol=1e-8, rtol=0)
