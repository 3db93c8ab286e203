"""Self-play training on the games (AFlowNet setting): one network conditioned on the player to move gives
that player's policy and log flow; each iteration plays a batch of games against itself (epsilon-greedy),
computes the per-move residuals of `adversarial` and the method's loss. `GameRun` has the same interface as
`training.TrainingRun`, so the plain loop here and the Lightning module (`lightning.py`) drive both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from paperflow.core.seeding import seed_all
from paperflow.st_gfn.adversarial import GameLoss, first_player_flows, game_residuals, log_children, log_reward
from paperflow.st_gfn.envs import observed_log_reward
from paperflow.st_gfn.games import Game, bits_to_mask, boards_from_strings, make_game
from paperflow.st_gfn.models import optimizer, time_features_of
from paperflow.st_gfn.sequences import fourier_features, time_frequencies
from paperflow.st_gfn.settings import known_keys, known_method
from paperflow.st_gfn.training import NOISE_SEED_OFFSET, RunRecords

NEG = -1e9


class GameNet(nn.Module):
    """Input: the mover's stones, the opponent's stones, the mover's index, optional Fourier features of the
    move number (spec 2.1). Outputs: legal-masked policy logits and the mover's log flow g(s) (a separate MLP,
    as the flow estimator elsewhere in the project). `logZ` where the method puts log Z at s_0."""

    def __init__(self, game: Game, hidden: int, layers: int, time_features: int, with_log_z: bool) -> None:
        super().__init__()
        self.game = game
        if with_log_z:
            self.logZ = nn.Parameter(torch.tensor(0.0))
        self.register_buffer(
            "freqs", time_frequencies(time_features, game.n_cells) if time_features else torch.zeros(0)
        )
        width = 2 * game.n_cells + 1 + 2 * time_features
        self.policy = mlp(width, hidden, layers, game.n_actions)
        self.flow = mlp(width, hidden, layers, 1)

    def encode(self, boards: torch.Tensor) -> torch.Tensor:
        mover = self.game.to_move(boards)
        flat = boards.flatten(1)
        planes = [
            (flat == mover[:, None].to(flat.dtype)),
            (flat == -mover[:, None].to(flat.dtype)),
            (mover < 0)[:, None],
        ]
        x = torch.cat([p.to(torch.get_default_dtype()) for p in planes], dim=-1)
        if self.freqs.numel():
            x = torch.cat([x, fourier_features(self.game.stones(boards), self.freqs).to(x.dtype)], dim=-1)
        return x

    def forward(self, boards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked logits (B, A), mover's log flow (B,))."""
        x = self.encode(boards)
        logits = self.policy(x).masked_fill(~self.game.legal(boards), NEG)
        return logits, self.flow(x).squeeze(-1)


def mlp(width: int, hidden: int, layers: int, out: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for i in range(layers):
        mods += [nn.Linear(width if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(hidden, out))


def make_game_net(game: Game, method: Mapping[str, Any], model: Mapping[str, Any]) -> GameNet:
    known_method(method)
    known_keys("model", model)
    return GameNet(
        game,
        int(model["hidden"]),
        int(model["layers"]),
        time_features_of(method),
        GameLoss.uses_log_z(method),
    )


@dataclass
class Games:
    """A batch of finished games: states s_0..s_{T-1} (T, B, rows, cols), moves (T, B), legal masks (T, B, A),
    movers (T, B), lengths (B,), outcomes (B,) (first player's perspective)."""

    states: torch.Tensor
    actions: torch.Tensor
    legal: torch.Tensor
    movers: torch.Tensor
    lengths: torch.Tensor
    outcomes: torch.Tensor


def sample_moves(logits: torch.Tensor, legal: torch.Tensor, epsilon: float) -> torch.Tensor:
    """A move from (1 - epsilon) softmax(logits) + epsilon uniform over the legal moves."""
    probs = torch.softmax(logits, -1)
    if epsilon > 0:
        uniform = legal.to(probs.dtype) / legal.sum(-1, keepdim=True).clamp_min(1)
        probs = (1 - epsilon) * probs + epsilon * uniform
    return torch.multinomial(probs, 1).squeeze(-1)


def self_play(game: Game, net: GameNet, n: int, epsilon: float, device=None) -> Games:
    boards = game.initial(n, device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    outcomes = torch.zeros(n, dtype=torch.long, device=device)
    states, actions, legals, movers = [], [], [], []
    with torch.no_grad():
        for _ in range(game.n_cells):
            legal = game.legal(boards) & ~done[:, None]
            logits, _ = net(boards)
            move = sample_moves(logits, legal | done[:, None], epsilon)
            states.append(boards)
            actions.append(move)
            legals.append(legal)
            movers.append(game.to_move(boards))
            lengths += (~done).long()
            boards, done, outcomes = game.advance(boards, move, done, outcomes)
            if bool(done.all()):
                break
    return Games(torch.stack(states), torch.stack(actions), torch.stack(legals), torch.stack(movers), lengths, outcomes)


def residuals_of(net: GameNet, games: Games, log_r: torch.Tensor) -> torch.Tensor:
    """delta (T, B) of `adversarial.game_residuals` with the network's current policy and flows (with grad)."""
    t, b = games.actions.shape
    logits, g = net(games.states.flatten(0, 1))
    log_pf = torch.log_softmax(logits, -1).gather(-1, games.actions.flatten()[:, None]).squeeze(-1).reshape(t, b)
    log_flow = first_player_flows(g.reshape(t, b), games.movers)
    log_z = getattr(net, "logZ", None)
    return game_residuals(log_pf, log_children(games.legal), games.movers, log_flow, games.lengths, log_r, log_z)


class Positions:
    """Reference positions (the tic-tac-toe oracle's non-terminal positions, or the Connect-4 test set) with
    their optimal-move masks, on a device."""

    def __init__(self, game: Game, target: pd.DataFrame, device=None) -> None:
        rows = target[~target["terminal"].astype(bool)]
        self.boards = boards_from_strings(rows["board"], game).to(device)
        self.optimal = bits_to_mask(rows["optimal"].to_numpy(), game.n_actions).to(device)

    def __len__(self) -> int:
        return len(self.boards)


def optimal_fractions(net: GameNet, positions: Positions) -> dict[str, float]:
    """Spec 8 for games: the fraction of positions whose argmax move is optimal, and the expected fraction
    whose sampled move is (the policy's mass on the optimal moves, averaged over positions)."""
    with torch.no_grad():
        logits, _ = net(positions.boards)
        probs = torch.softmax(logits, -1)
        argmax = positions.optimal.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)
        return {
            "optimal_argmax": float(argmax.double().mean()),
            "optimal_sampled": float((probs * positions.optimal).sum(-1).double().mean()),
        }


class GameRun(RunRecords):
    """One run's per-iteration work and records (the games' `TrainingRun`): self-play, the observed log
    reward lambda * o (+ log-space noise sigma), the loss; every `eval_every` iterations the optimal-move
    fractions on the reference positions. Build it right after the network (the torch seed set before both)."""

    def __init__(
        self,
        game: Game,
        spec: Mapping[str, Any],
        method: Mapping[str, Any],
        net: GameNet,
        train: Mapping[str, Any],
        seed: int,
        target: pd.DataFrame,
    ) -> None:
        self.game, self.net, self.seed = game, net, seed
        self.device = next(net.parameters()).device
        self.lambd, self.sigma, self.epsilon = float(spec["lambd"]), float(spec["sigma"]), float(train["epsilon"])
        self.batch, self.n_iterations = int(spec["batch_size"]), int(spec["iterations"])
        self.eval_every = int(spec["eval_every"])
        self.objective = GameLoss(method)
        self.noise = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET)
        self.positions = Positions(game, target, self.device)
        self.losses = np.full(self.n_iterations, np.nan)
        self.tracked: dict[str, np.ndarray] = {
            k: np.full(self.n_iterations, np.nan) for k in ("optimal_argmax", "optimal_sampled")
        }
        self.visited: list[dict[str, np.ndarray]] = []

    def loss(self, it: int) -> torch.Tensor:
        if it % self.eval_every == 0 or it == self.n_iterations - 1:
            for k, v in optimal_fractions(self.net, self.positions).items():
                self.tracked[k][it] = v
        games = self_play(self.game, self.net, self.batch, self.epsilon, self.device)
        log_r = observed_log_reward(log_reward(games.outcomes, self.lambd), self.sigma, self.noise)
        self.visited.append({"outcome": games.outcomes.cpu().numpy(), "length": games.lengths.cpu().numpy()})
        return self.objective(residuals_of(self.net, games, log_r), games.lengths)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["tracked"] = {k: torch.from_numpy(v.copy()) for k, v in self.tracked.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        for k, v in state["tracked"].items():
            self.tracked[k][:] = v.numpy()

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "iteration": np.arange(self.n_iterations),
                "seed": self.seed,
                "loss": self.losses,
                "beta": 0.0,
                **self.tracked,
            }
        )


def train_game(
    spec: Mapping[str, Any],
    target: pd.DataFrame,
    method: Mapping[str, Any],
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    seed: int,
    progress: bool | None = None,
):
    """Self-play training of one method with one seed in a plain torch loop (CPU scales).
    Returns (state_dict, history, visits: the outcome and length of every training game)."""
    known_keys("train", train)
    seed_all(seed)
    game = make_game(spec)
    net = make_game_net(game, method, model)
    opt = optimizer(net, train["lr"], train["lr_logz"])
    run = GameRun(game, spec, method, net, train, seed, target)
    run.fit(net, opt, float(train["grad_clip"]), f"{spec['kind']} {method['kind']} seed {seed}", progress)
    return net.state_dict(), run.history(), run.visits()
