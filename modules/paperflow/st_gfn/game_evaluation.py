"""Game metrics of spec section 8: the fraction of reference positions whose argmax (and sampled) move is
optimal, win / draw / loss rates against fixed opponents (uniform random; for tic-tac-toe also a minimax
player that picks uniformly among the oracle's optimal moves), and the same-batch loss identities on the
game residuals. Rows go into the same long metrics table as the other envs' (method, seed, metric, value)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.st_gfn.adversarial import log_reward
from paperflow.st_gfn.evaluation import EVAL_SEED_OFFSET, UNIFORM, identity_rows
from paperflow.st_gfn.game_training import GameNet, Positions, make_game_net, optimal_fractions, residuals_of, self_play
from paperflow.st_gfn.games import Game, bits_to_mask, boards_from_strings
from paperflow.st_gfn.identities import FILTERED_LAM
from paperflow.st_gfn.models import time_features_of
from paperflow.st_gfn.spectral import dc_only, spectral_loss_per_trajectory, tikhonov

Agent = Callable[[torch.Tensor], torch.Tensor]  # boards -> moves


def uniform_agent(game: Game) -> Agent:
    def act(boards: torch.Tensor) -> torch.Tensor:
        legal = game.legal(boards)
        return torch.multinomial(legal.to(torch.float32) + (~legal.any(-1, keepdim=True)).float(), 1).squeeze(-1)

    return act


def policy_agent(net: GameNet) -> Agent:
    """Moves sampled from the trained policy (epsilon = 0)."""

    def act(boards: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.multinomial(torch.softmax(net(boards)[0], -1), 1).squeeze(-1)

    return act


class OracleTable:
    """Optimal-move masks of every tic-tac-toe position, looked up by the base-3 code of the board."""

    def __init__(self, game: Game, oracle: pd.DataFrame) -> None:
        self.game = game
        self.powers = 3 ** torch.arange(game.n_cells)
        rows = oracle[~oracle["terminal"].astype(bool)]
        boards = boards_from_strings(rows["board"], game)
        self.table = torch.zeros(3**game.n_cells, game.n_actions, dtype=torch.bool)
        self.table[self.code(boards)] = bits_to_mask(rows["optimal"].to_numpy(), game.n_actions)

    def code(self, boards: torch.Tensor) -> torch.Tensor:
        return ((boards.flatten(1).long() + 1) * self.powers.to(boards.device)).sum(-1)

    def agent(self) -> Agent:
        """A minimax player: uniformly among the optimal moves."""

        def act(boards: torch.Tensor) -> torch.Tensor:
            optimal = self.table.to(boards.device)[self.code(boards)]
            optimal = optimal | ~optimal.any(-1, keepdim=True)  # finished games: any move (ignored)
            return torch.multinomial(optimal.float(), 1).squeeze(-1)

        return act


def play_match(game: Game, first: Agent, second: Agent, n: int) -> torch.Tensor:
    """Outcomes (first player's perspective) of n games of `first` against `second`."""
    boards = game.initial(n)
    done = torch.zeros(n, dtype=torch.bool)
    outcome = torch.zeros(n, dtype=torch.long)
    while not bool(done.all()):
        mover = game.to_move(boards)
        moves = torch.where(mover > 0, first(boards), second(boards))
        boards, done, outcome = game.advance(boards, moves, done, outcome)
    return outcome


def match_rates(game: Game, agent: Agent, opponent: Agent, n: int, name: str) -> dict[str, float]:
    """Win / draw / loss rates of `agent` over n games as the first player and n as the second."""
    as_first = play_match(game, agent, opponent, n)
    as_second = -play_match(game, opponent, agent, n)
    results = torch.cat([as_first, as_second]).double()
    return {
        f"win_rate_vs_{name}": float((results > 0).double().mean()),
        f"draw_rate_vs_{name}": float((results == 0).double().mean()),
        f"loss_rate_vs_{name}": float((results < 0).double().mean()),
    }


def game_identity_gaps(
    game: Game, method: Mapping[str, Any], model: Mapping[str, Any], lambd: float, batch: int, seed: int
) -> dict[str, float]:
    """On one self-play batch of a fresh network (float64): |L_ST(lam = 0) - EDB| and |n L_ST(DC) - TB| per game
    (spec 7 (ii) on the game residuals), the largest gap over the batch; `filtered_*` the same gaps with the
    Tikhonov filter at identities.FILTERED_LAM in their place (the claims' control, not identities)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        # the method's time features with log Z at s_0 (TB's parameterisation), whatever the method's kind
        net = GameNet(game, int(model["hidden"]), int(model["layers"]), time_features_of(method), with_log_z=True)
        games = self_play(game, net, batch, 0.0)
        delta = residuals_of(net, games, log_reward(games.outcomes, lambd)).detach()
    finally:
        torch.set_default_dtype(default)
    lengths = games.lengths
    lam0 = spectral_loss_per_trajectory(delta, lengths, tikhonov(0.0))
    dc = spectral_loss_per_trajectory(delta, lengths, dc_only()) * lengths.to(delta.dtype)
    edb = (delta**2).sum(0)
    tb = delta.sum(0) ** 2
    filtered = spectral_loss_per_trajectory(delta, lengths, tikhonov(FILTERED_LAM))
    return {
        "lam0_db_gap": float((lam0 - edb).abs().max()),
        "dc_tb_gap": float((dc - tb).abs().max()),
        "filtered_db_gap": float((filtered - edb).abs().max()),
        "filtered_tb_gap": float((filtered * lengths.to(delta.dtype) - tb).abs().max()),
    }


def game_run_metrics(
    game: Game,
    net: GameNet,
    positions: Positions,
    oracle: OracleTable | None,
    history: pd.DataFrame,
    n_games: int,
    loss_window: int,
) -> dict[str, float]:
    values = optimal_fractions(net, positions)
    values.update(match_rates(game, policy_agent(net), uniform_agent(game), n_games, "random"))
    if oracle is not None:
        values.update(match_rates(game, policy_agent(net), oracle.agent(), n_games, "minimax"))
    losses = history.sort_values("iteration")["loss"].to_numpy()
    values["loss_std_last"] = float(np.std(losses[-min(loss_window, len(losses)) :], ddof=1))
    return values


def evaluate_game(
    game: Game,
    spec: Mapping[str, Any],
    target: pd.DataFrame,
    methods: Mapping[str, Mapping[str, Any]],
    runs: Iterable[tuple[str, int, str, pd.DataFrame, pd.DataFrame]],
    model: Mapping[str, Any],
    seeds: Iterable[int],
    cfg: Mapping[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The long metrics table of a game env (and an empty pmf table: a game has no target distribution).
    Rows for every (method, seed), the uniform policy, and the identities (with their filtered control)."""
    positions = Positions(game, target)
    oracle = OracleTable(game, target) if spec["kind"] == "tictactoe" else None
    n_games, window = int(spec["eval_games"]), int(cfg["loss_window"])
    rows = []
    for method, seed, ckpt, _visits, history in runs:
        net = make_game_net(game, methods[method], model)
        net.load_state_dict(torch.load(ckpt, map_location="cpu")[f"seed{seed}"])
        net.eval()
        torch.manual_seed(seed + EVAL_SEED_OFFSET)
        values = game_run_metrics(game, net, positions, oracle, history, n_games, window)
        rows += [{"method": method, "seed": seed, "metric": k, "value": v} for k, v in values.items()]
    for seed in seeds:
        torch.manual_seed(seed + EVAL_SEED_OFFSET)
        legal = game.legal(positions.boards)
        values = {"optimal_sampled": float((positions.optimal.sum(-1) / legal.sum(-1)).double().mean())}
        values.update(match_rates(game, uniform_agent(game), uniform_agent(game), n_games, "random"))
        if oracle is not None:
            values.update(match_rates(game, uniform_agent(game), oracle.agent(), n_games, "minimax"))
        rows += [{"method": UNIFORM, "seed": seed, "metric": k, "value": v} for k, v in values.items()]
        gaps = game_identity_gaps(
            game, methods[next(iter(methods))], model, float(spec["lambd"]), 16, seed + EVAL_SEED_OFFSET
        )
        rows += identity_rows(gaps, seed)
    return pd.DataFrame(rows), pd.DataFrame()
