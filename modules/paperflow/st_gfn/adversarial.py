"""The AFlowNet objective (Jiralerspong et al., ICLR 2024, section 3) on two-player zero-sum games, as
per-move residuals that the project's losses reuse.

Rewards: R_1(x) = exp(lambda * o(x)) for the first player, R_2 = exp(-lambda * o) = 1 / R_1 for the second
(o = +1 / 0 / -1). With n(s) the number of legal moves, the trajectory-level AFlowNet balance of the first
player is

    Z * prod_{t: first moves} n(s_t) P_1(s_{t+1}|s_t) = R_1(x) * prod_{t: second moves} n(s_t) P_2(s_{t+1}|s_t)

(the second player's balance is the same equation with Z_2 = 1 / Z, R_2 = 1 / R_1, so one equation trains
both). With state flows F(s) from the first player's perspective, log F(s_0) := log Z and log F(x) := log R_1,
the per-move (expected detailed balance) residuals that telescope to it are

    delta_t = log F(s_t) + m_t [log P_{m_t}(s_{t+1}|s_t) + log n(s_t)] - log F(s_{t+1}),   m_t = +1 / -1
    (the mover: +1 first player, -1 second).

Zero residuals mean: at the first player's states F(s) is the arithmetic mean of the children's flows and
P_1 is proportional to them; at the second player's states F(s) is their harmonic mean and P_2 is
proportional to 1 / F(child). As lambda grows the two means tend to max and min: minimax.
A network conditioned on the player to move gives the mover's log flow g(s); the first player's log flow
is m * g(s) (zero-sum: F_2 = 1 / F_1).

Losses of a batch (mean over games): TB = (sum_t delta_t)^2 (AFlowNet TB), EDB = sum_t delta_t^2,
SubTB(lambda) over every sub-trajectory, and the spectral loss (spec 2.2) of the delta sequence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from paperflow.st_gfn.games import Game, board_string
from paperflow.st_gfn.spectral import make_filter, reduce_trajectories, spectral_loss_per_trajectory

OBJECTIVES = ("tb", "db", "subtb", "st_gfn")


def first_player_flows(mover_log_flow: torch.Tensor, movers: torch.Tensor) -> torch.Tensor:
    """log F_1(s) = m * g(s): the mover's log flow turned to the first player's perspective."""
    return movers.to(mover_log_flow.dtype) * mover_log_flow


def game_residuals(
    log_pf: torch.Tensor,
    log_n: torch.Tensor,
    movers: torch.Tensor,
    log_flow: torch.Tensor,
    lengths: torch.Tensor,
    log_reward: torch.Tensor,
    log_z: torch.Tensor | None = None,
) -> torch.Tensor:
    """delta (T, B) of the module docstring, zero beyond each game's length. Inputs (T, B): the log
    probability of the played move under the mover's policy, log n(s_t), the mover (+1 / -1), log F_1(s_t)
    (first player's perspective); (B,): lengths, the terminal log R_1. `log_z` replaces log F_1(s_0)."""
    steps = torch.arange(log_pf.shape[0], device=log_pf.device)[:, None]
    mask = steps < lengths[None, :]
    flows = log_flow
    if log_z is not None:
        flows = torch.cat([log_z.reshape(1, 1).expand(1, flows.shape[1]).to(flows.dtype), flows[1:]], dim=0)
    nxt = torch.cat([flows[1:], torch.zeros_like(flows[:1])], dim=0)
    is_last = steps == (lengths - 1)[None, :]
    nxt = torch.where(is_last, log_reward[None, :].to(flows.dtype).expand_as(nxt), nxt)
    delta = flows + movers.to(flows.dtype) * (log_pf + log_n) - nxt
    return torch.where(mask, delta, torch.zeros_like(delta))


def tb_loss(delta: torch.Tensor) -> torch.Tensor:
    return (delta.sum(0) ** 2).mean()


def edb_loss(delta: torch.Tensor) -> torch.Tensor:
    return (delta**2).sum(0).mean()


def subtb_loss(delta: torch.Tensor, lengths: torch.Tensor, lamda: float) -> torch.Tensor:
    """SubTB(lambda), geometric_within: per game, sum over 0 <= i < j <= n of lambda^(j-i) (sum_{i<=t<j} delta_t)^2
    divided by the sum of the weights; mean over games."""
    cum = torch.cat([torch.zeros_like(delta[:1]), delta.cumsum(0)], dim=0)  # (T+1, B)
    idx = torch.arange(cum.shape[0], device=delta.device)
    span = idx[None, :] - idx[:, None]  # j - i
    valid = (span[..., None] > 0) & (idx[None, :, None] <= lengths[None, None, :])
    weight = torch.where(
        valid, lamda ** span[..., None].to(delta.dtype), torch.zeros((), dtype=delta.dtype, device=delta.device)
    )
    sq = (cum[None, :, :] - cum[:, None, :]) ** 2
    return ((weight * sq).sum((0, 1)) / weight.sum((0, 1))).mean()


class GameLoss(nn.Module):
    """The method's loss on the residuals: tb, db (EDB), subtb or st_gfn (the spectral loss)."""

    def __init__(self, method: Mapping[str, Any]) -> None:
        super().__init__()
        self.kind = method["kind"]
        if self.kind not in OBJECTIVES:
            raise ValueError(f"unknown method kind {self.kind!r} for a game; known: {', '.join(OBJECTIVES)}")
        self.lamda = float(method["lamda"]) if self.kind == "subtb" else None
        if self.kind == "st_gfn":
            self.weight = make_filter(
                method["filter"], lam=float(method["lam"]), omega_c=float(method["omega_c"]), order=int(method["order"])
            )
            self.pad_to_max, self.length_weighting = bool(method["pad_to_max"]), bool(method["length_weighting"])

    @staticmethod
    def uses_log_z(method: Mapping[str, Any]) -> bool:
        """TB (and st_gfn with s0_flow logz) put log Z at s_0; DB, SubTB and st_gfn logf the flow estimator."""
        return method["kind"] == "tb" or (method["kind"] == "st_gfn" and method["s0_flow"] == "logz")

    def forward(self, delta: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.kind == "tb":
            return tb_loss(delta)
        if self.kind == "db":
            return edb_loss(delta)
        if self.kind == "subtb":
            return subtb_loss(delta, lengths, self.lamda)
        per_game = spectral_loss_per_trajectory(delta, lengths, self.weight, self.pad_to_max)
        return reduce_trajectories(per_game, lengths, self.length_weighting)


def log_reward(outcome: torch.Tensor, lambd: float) -> torch.Tensor:
    """log R_1(x) = lambda * o(x) (first player's perspective)."""
    return lambd * outcome.to(torch.get_default_dtype())


def log_children(legal: torch.Tensor) -> torch.Tensor:
    """log n(s) from a legal-move mask (..., A); 0 where no move is legal (steps beyond the game)."""
    return torch.log(legal.sum(-1).clamp_min(1).to(torch.get_default_dtype()))


def exact_log_flows(game: Game, lambd: float) -> dict[str, float]:
    """The unique zero-residual flows of a small game by recursion over its positions (tic-tac-toe: every
    reachable one): log F_1(x) = lambda * o(x) at the end of a game; at the first player's states the log of the
    arithmetic mean of the children's flows, at the second player's the log of their harmonic mean."""
    memo: dict[str, float] = {}

    def solve(board: torch.Tensor) -> float:
        key = board_string(board[0].numpy())
        if key in memo:
            return memo[key]
        done, outcome = game.status(board)
        if bool(done[0]):
            memo[key] = lambd * float(outcome[0])
            return memo[key]
        moves = game.legal(board)[0].nonzero().flatten()
        children = torch.tensor([solve(game.play(board, m.reshape(1))) for m in moves], dtype=torch.float64)
        sign = float(game.to_move(board)[0])  # +1: arithmetic mean; -1: harmonic mean
        memo[key] = sign * float(torch.logsumexp(sign * children, 0) - math.log(len(moves)))
        return memo[key]

    solve(game.initial(1))
    return memo
