"""The plain training loop (paperflow.core.loop) on least squares, where every step is known in closed
form, and the seeding helper (paperflow.core.seeding)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from paperflow.core.loop import run_loop
from paperflow.core.seeding import seed_all


def least_squares(seed: int = 0, n: int = 20, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g, dtype=torch.float64)
    b = torch.randn(n, generator=g, dtype=torch.float64)
    x = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    return a, b, x


def mse(a, b, x):
    return ((a @ x - b) ** 2).mean()


def gradient(a, b, x):
    """d/dx mean((Ax - b)^2) = 2/n A^T (Ax - b)."""
    return 2.0 / len(b) * a.T @ (a @ x - b)


def test_one_step_is_a_gradient_step_and_the_record_is_the_loss_before_it():
    a, b, x = least_squares()
    x0 = x.detach().clone()
    rows = run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.1), 1)
    torch.testing.assert_close(x.detach(), x0 - 0.1 * gradient(a, b, x0))
    assert rows == [{"step": 0, "loss": float(mse(a, b, x0))}]


def test_the_loop_reaches_the_least_squares_optimum():
    a, b, x = least_squares()
    rows = run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.2), 500)
    optimum = torch.linalg.lstsq(a, b).solution
    torch.testing.assert_close(x.detach(), optimum, atol=1e-8, rtol=0)
    losses = [r["loss"] for r in rows]
    assert [r["step"] for r in rows] == list(range(500)) and losses[-1] < losses[0]
    assert all(later <= earlier + 1e-15 for earlier, later in zip(losses, losses[1:]))  # convex, small step


def test_clipping_caps_the_gradient_norm_before_the_step():
    a, b, x = least_squares()
    x0 = x.detach().clone()
    g = gradient(a, b, x0)
    clip = 0.1 * float(g.norm())
    run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.5), 1, grad_clip=clip)
    torch.testing.assert_close(x.detach(), x0 - 0.5 * g * clip / (float(g.norm()) + 1e-6))  # torch's eps
    # a norm above the gradient's leaves the step as it is
    _, _, y = least_squares()
    run_loop(lambda i: mse(a, b, y), torch.optim.SGD([y], lr=0.5), 1, grad_clip=10 * float(g.norm()))
    torch.testing.assert_close(y.detach(), x0 - 0.5 * g)


def test_clipping_covers_only_the_parameters_it_is_given():
    a, b, x = least_squares()
    free = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    g = gradient(a, b, x.detach())
    loss = lambda i: mse(a, b, x) + mse(a, b, free)
    run_loop(loss, torch.optim.SGD([x, free], lr=0.5), 1, grad_clip=1e-3, clip_parameters=[x])
    torch.testing.assert_close(free.detach(), -0.5 * g)
    assert float((x.detach() / 0.5).norm()) == pytest.approx(1e-3, rel=1e-3)


def test_grad_clip_must_be_a_positive_norm():
    a, b, x = least_squares()
    with pytest.raises(ValueError, match="grad_clip = 0"):
        run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.1), 1, grad_clip=0)


def test_the_scheduler_steps_after_every_optimizer_step():
    a, b, x = least_squares()
    opt = torch.optim.SGD([x], lr=0.1)
    expected = x.detach().clone()
    for k in range(3):
        expected = expected - 0.1 * 0.5**k * gradient(a, b, expected)
    run_loop(lambda i: mse(a, b, x), opt, 3, scheduler=torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5))
    torch.testing.assert_close(x.detach(), expected)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_logs_are_recorded_beside_the_loss_and_on_step_sees_each_record():
    a, b, x = least_squares()
    seen = []

    def step(i):
        loss = mse(a, b, x)
        return loss, {"x_norm": x.detach().norm(), "iteration": i}

    rows = run_loop(step, torch.optim.SGD([x], lr=0.1), 3, on_step=seen.append)
    assert seen == rows and [set(r) for r in rows] == [{"step", "loss", "x_norm", "iteration"}] * 3
    assert rows[0]["x_norm"] == 0.0 and rows[2]["iteration"] == 2.0


def test_the_progress_bar_is_quiet_off_a_terminal(capsys):
    a, b, x = least_squares()
    run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.1), 3, desc="quiet")
    assert "quiet" not in capsys.readouterr().err
    run_loop(lambda i: mse(a, b, x), torch.optim.SGD([x], lr=0.1), 3, desc="shown", progress=True)
    assert "shown" in capsys.readouterr().err


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_seed_all_makes_every_generator_repeat():
    seed_all(3)
    first = draws()
    seed_all(3)
    assert draws() == first
    seed_all(4)
    assert all(x != y for x, y in zip(draws(), first))


def test_seed_all_can_leave_torch_alone():
    torch.manual_seed(11)
    expected = float(torch.rand(1))
    torch.manual_seed(11)
    seed_all(3, torch=False)
    assert float(torch.rand(1)) == expected


def test_a_seeded_loop_repeats_bit_for_bit():
    def fit(seed):
        seed_all(seed)
        a, b, x = least_squares(seed)
        drop = lambda i: mse(a, b, torch.nn.functional.dropout(x, 0.5))  # draws from the global torch stream
        rows = run_loop(drop, torch.optim.SGD([x], lr=0.1), 20)
        return x.detach().clone(), [r["loss"] for r in rows]

    (x1, l1), (x2, l2), (x3, _) = fit(0), fit(0), fit(1)
    assert torch.equal(x1, x2) and l1 == l2 and not torch.equal(x1, x3)


def test_manual_mode_records_the_steps_own_updates_and_never_backpropagates():
    # A zeroth-order step (two-point SPSA on a quadratic) makes its own update; the loop only records it.
    torch.manual_seed(0)
    x = torch.tensor([3.0, -2.0])
    seen = []

    def step(i):
        with torch.no_grad():
            u = torch.randn(2)
            g = (((x + 1e-3 * u) ** 2).sum() - ((x - 1e-3 * u) ** 2).sum()) / 2e-3 * u
            x.sub_(0.05 * g)
            value = float((x**2).sum())
        seen.append(value)
        return value, {"norm_u": u.norm()}

    rows = run_loop(step, None, 200, on_step=lambda r: None)
    assert [r["loss"] for r in rows] == seen
    assert [r["step"] for r in rows] == list(range(200))
    assert rows[-1]["loss"] < 1e-3 * rows[0]["loss"]
    assert all(r["norm_u"] > 0 for r in rows)


@pytest.mark.parametrize("kwargs", [{"grad_clip": 1.0}, {"scheduler": object()}])
def test_manual_mode_refuses_clipping_and_schedulers(kwargs):
    with pytest.raises(ValueError, match=f"manual mode.*{next(iter(kwargs))}"):
        run_loop(lambda i: 0.0, None, 1, **kwargs)
