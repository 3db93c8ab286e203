"""st_gfn's adversarial games (AFlowNet setting): the engines, the exact tic-tac-toe oracle, the Connect-4
solver against an independent brute-force negamax, the AFlowNet residuals (zero on the closed-form flows,
positive when perturbed; reductions of the spectral loss), a short self-play run that learns, the Lightning
engine reproducing the plain loop, config errors, and the paper-scale DAG listing the game jobs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import job_counts, run_snakemake
from test_st_gfn import config_root

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.st_gfn.adversarial import (
    GameLoss,
    edb_loss,
    exact_log_flows,
    game_residuals,
    log_children,
    subtb_loss,
    tb_loss,
)
from paperflow.st_gfn.game_evaluation import evaluate_game, game_identity_gaps
from paperflow.st_gfn.game_training import Positions, make_game_net, optimal_fractions, train_game
from paperflow.st_gfn.games import (
    Connect4Solver,
    board_string,
    boards_from_strings,
    connect4_test_set,
    make_game,
    random_late_positions,
    tictactoe_oracle,
)
from paperflow.st_gfn.spectral import dc_only, spectral_loss_per_trajectory, tikhonov

ROOT = Path(__file__).resolve().parents[2]
TTT, C4 = make_game({"kind": "tictactoe"}), make_game({"kind": "connect4"})
MODEL = {"hidden": 32, "layers": 2}
TRAIN = {
    "lr": 1e-3,
    "lr_logz": 0.1,
    "epsilon": 0.1,
    "grad_clip": 1.0,
    "iterations": 1,
    "batch_size": 1,
    "engine": "loop",
}
TTT_SPEC = {
    "kind": "tictactoe",
    "lambd": 10.0,
    "sigma": 0.0,
    "iterations": 150,
    "batch_size": 64,
    "eval_every": 50,
    "eval_games": 200,
}


@pytest.fixture(scope="module")
def oracle() -> pd.DataFrame:
    return tictactoe_oracle()


def methods():
    return load_paper_config("st_gfn", "paper", ROOT)["methods"]


# --- engines ------------------------------------------------------------------------------------------------


def play(game, moves):
    board = game.initial(1)
    for m in moves:
        board = game.play(board, torch.tensor([m]))
    return board


@pytest.mark.parametrize(
    "moves, winner",
    [
        ([0, 0, 1, 1, 2, 2, 3], 1),  # horizontal, bottom row
        ([3, 4, 3, 4, 3, 4, 3], 1),  # vertical
        ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3], 1),  # diagonal rising to the right
        ([6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3], 1),  # diagonal rising to the left
        ([6, 0, 6, 1, 5, 2, 5, 3], -1),  # the second player, horizontal
        ([0, 0, 1, 1, 2, 2], 0),  # three in a row: no win yet
    ],
)
def test_connect4_win_detection_in_all_four_directions(moves, winner):
    board = play(C4, moves)
    assert int(C4.winner(board)[0]) == winner
    assert bool(C4.status(board)[0][0]) == (winner != 0)


def test_connect4_gravity_and_legal_moves():
    board = play(C4, [3] * 6)
    assert board[0, :, 3].tolist() == [-1, 1, -1, 1, -1, 1]  # stones stack from the bottom (row 5)
    assert C4.legal(board)[0].tolist() == [True, True, True, False, True, True, True]
    assert int(C4.to_move(board)[0]) == 1


def test_tictactoe_engine_batched_and_draw():
    draw = play(TTT, [0, 1, 2, 4, 3, 5, 7, 6, 8])  # x o x / x o o / o x x
    wins = play(TTT, [0, 3, 4, 5, 8])  # x on the main diagonal
    both = torch.cat([draw, wins])
    done, outcome = TTT.status(both)
    assert done.tolist() == [True, True] and outcome.tolist() == [0, 1]


# --- tic-tac-toe oracle ---------------------------------------------------------------------------------------


def test_tictactoe_oracle_counts_5478_positions_and_the_empty_board_is_a_draw(oracle):
    assert len(oracle) == 5478 and oracle["board"].is_unique
    empty = oracle.set_index("board").loc["." * 9]
    assert empty["value"] == 0 and empty["optimal"] == (1 << 9) - 1  # every first move keeps the draw
    assert int((~oracle["terminal"]).sum()) == 4520
    ends = oracle[oracle.terminal]["value"].value_counts().to_dict()
    assert ends == {1: 626, -1: 316, 0: 16}  # the 958 final positions: x wins, o wins, full-board draws


@pytest.mark.parametrize(
    "board, optimal, value",
    [
        ("xx.oo....", {2}, 1),  # x completes the top row
        ("x...o...x", {1, 3, 5, 7}, 0),  # o must play an edge: a corner loses to the fork
        ("....x....", {0, 2, 6, 8}, 0),  # against the centre, o must take a corner: an edge loses
    ],
)
def test_known_positions_have_the_expected_optimal_moves(oracle, board, optimal, value):
    row = oracle.set_index("board").loc[board]
    assert {a for a in range(9) if row["optimal"] >> a & 1} == optimal and row["value"] == value


# --- Connect-4 solver against brute force ---------------------------------------------------------------------


def brute_force(board: list[list[int]], mover: int) -> int:
    """Independent plain negamax (no pruning, no table) on a list-of-lists board: value for `mover`."""
    rows, cols = len(board), len(board[0])

    def wins(b, r, c, p):
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            n = 1
            for s in (1, -1):
                rr, cc = r + s * dr, c + s * dc
                while 0 <= rr < rows and 0 <= cc < cols and b[rr][cc] == p:
                    n, rr, cc = n + 1, rr + s * dr, cc + s * dc
            if n >= 4:
                return True
        return False

    def negamax(b, p):
        moves = [c for c in range(cols) if b[0][c] == 0]
        if not moves:
            return 0
        best = -1
        for c in moves:
            r = max(r for r in range(rows) if b[r][c] == 0)
            b[r][c] = p
            v = 1 if wins(b, r, c, p) else -negamax(b, -p)
            b[r][c] = 0
            best = max(best, v)
            if best == 1:
                break
        return best

    return negamax([row[:] for row in board], mover)


def test_connect4_solver_agrees_with_brute_force_negamax():
    solver = Connect4Solver()
    positions = random_late_positions(C4, 4, empty=7, seed=3)  # rejection sampling of 35-move games: ~3 s each
    for board in positions:
        mover = 1 if (board != 0).sum() % 2 == 0 else -1
        values = solver.move_values(board)
        for c, v in values.items():
            child = C4.play(torch.as_tensor(board)[None], torch.tensor([c]))
            won = int(C4.winner(child)[0]) == mover
            expected = 1 if won else -brute_force(child[0].tolist(), -mover)
            assert v == expected, (board_string(board), c)
    frame = connect4_test_set(4, empty=7, seed=3)
    assert len(frame) == 4 and (frame["optimal"] & ~frame["legal"] == 0).all() and (frame["optimal"] > 0).all()


# --- the AFlowNet objective -----------------------------------------------------------------------------------


def exact_policy_residuals(oracle, lambd, perturb=0.0, seed=0):
    """The residual of every (position, move) pair of tic-tac-toe under the closed-form flows and the policies
    they define (optionally with noise on the children's log flows): one-move games s -> s' with F(s') as target."""
    flows = exact_log_flows(TTT, lambd)
    rng = np.random.default_rng(seed)
    live = oracle[~oracle.terminal]
    boards = boards_from_strings(live["board"], TTT)
    legal = TTT.legal(boards)
    deltas = []
    for i, key in enumerate(live["board"]):
        board = boards[i : i + 1]
        mover = int(TTT.to_move(board)[0])
        moves = legal[i].nonzero().flatten()
        child = torch.tensor(
            [flows[board_string(TTT.play(board, m.reshape(1))[0].numpy())] for m in moves], dtype=torch.float64
        )
        child = child + perturb * torch.as_tensor(rng.standard_normal(len(moves)))
        log_p = torch.log_softmax(mover * child, 0)  # P_1 proportional to F(child); P_2 to 1 / F(child)
        log_f = torch.full((len(moves),), flows[key], dtype=torch.float64)
        log_n = torch.full_like(log_f, math.log(len(moves)))
        m = torch.full((len(moves),), mover)
        # one-step "games" from s to each child, with the child's flow as the terminal target
        deltas.append(
            game_residuals(
                log_p[None], log_n[None], m[None], log_f[None], torch.ones(len(moves), dtype=torch.long), child
            )[0]
        )
    return torch.cat(deltas)


def test_aflownet_residuals_vanish_on_the_closed_form_flows_and_not_when_perturbed(oracle):
    exact = exact_policy_residuals(oracle, lambd=2.0)
    assert exact.abs().max() < 1e-10
    perturbed = exact_policy_residuals(oracle, lambd=2.0, perturb=0.1)
    assert edb_loss(perturbed[:, None]) > 1e-3


def test_closed_form_on_a_two_move_tree():
    """First player picks a or b (2 moves), then the second picks one of two ends with log R_1 in {u, v}:
    F(a) = harmonic mean of e^u, e^v; Z = arithmetic mean of F(a), F(b); every game's TB and EDB residual is 0."""
    ends = {"a": (1.0, -1.0), "b": (0.0, 0.5)}
    f = {k: math.log(2 / (math.exp(-u) + math.exp(-v))) for k, (u, v) in ends.items()}
    log_z = math.log((math.exp(f["a"]) + math.exp(f["b"])) / 2)
    p1 = {k: math.exp(f[k]) / (math.exp(f["a"]) + math.exp(f["b"])) for k in ends}
    for k, (u, v) in ends.items():
        for end, other in ((u, v), (v, u)):
            p2 = math.exp(-end) / (math.exp(-end) + math.exp(-other))
            log_pf = torch.tensor([[math.log(p1[k])], [math.log(p2)]], dtype=torch.float64)
            log_n = torch.full((2, 1), math.log(2), dtype=torch.float64)
            movers = torch.tensor([[1], [-1]])
            flows = torch.tensor([[0.0], [f[k]]], dtype=torch.float64)
            delta = game_residuals(
                log_pf,
                log_n,
                movers,
                flows,
                torch.tensor([2]),
                torch.tensor([end], dtype=torch.float64),
                torch.tensor(log_z, dtype=torch.float64),
            )
            assert delta.abs().max() < 1e-12
            assert tb_loss(delta) < 1e-24 and subtb_loss(delta, torch.tensor([2]), 0.9) < 1e-24
            bad = game_residuals(
                log_pf,
                log_n,
                movers,
                flows,
                torch.tensor([2]),
                torch.tensor([end + 0.3], dtype=torch.float64),
                torch.tensor(log_z, dtype=torch.float64),
            )
            assert tb_loss(bad) == pytest.approx(0.09)


def test_exact_flows_play_minimax_for_large_lambda(oracle):
    """As lambda grows, the arithmetic / harmonic means tend to max / min: the closed-form AFlowNet policy's
    argmax move is optimal in every position."""
    flows = exact_log_flows(TTT, 20.0)
    live = oracle[~oracle.terminal].sample(300, random_state=0)
    for key, bits in zip(live["board"], live["optimal"]):
        board = boards_from_strings([key], TTT)
        mover = int(TTT.to_move(board)[0])
        moves = TTT.legal(board)[0].nonzero().flatten().tolist()
        child = [mover * flows[board_string(TTT.play(board, torch.tensor([m]))[0].numpy())] for m in moves]
        assert bits >> moves[int(np.argmax(child))] & 1


def test_spectral_loss_at_lam0_is_edb_and_dc_is_tb_on_self_play_residuals():
    gaps = game_identity_gaps(TTT, methods()["st_gfn"], MODEL, 10.0, 32, seed=0)
    assert gaps["lam0_db_gap"] < 1e-9 and gaps["dc_tb_gap"] < 1e-9
    assert gaps["filtered_db_gap"] > 1e-3 and gaps["filtered_tb_gap"] > 1e-3  # the claims' control: not identities
    delta = torch.randn(9, 5, dtype=torch.float64)
    lengths = torch.tensor([9, 5, 7, 6, 9])
    delta = torch.where(torch.arange(9)[:, None] < lengths[None], delta, torch.zeros_like(delta))
    lam0 = GameLoss(dict(methods()["st_gfn_lam0"]))
    assert float(lam0(delta, lengths)) == pytest.approx(float(edb_loss(delta)), rel=1e-12)
    assert float(GameLoss({"kind": "db"})(delta, lengths)) == float(edb_loss(delta))
    dc = spectral_loss_per_trajectory(delta, lengths, dc_only()) * lengths
    assert torch.allclose(dc, delta.sum(0) ** 2)
    assert spectral_loss_per_trajectory(delta, lengths, tikhonov(2.0)).sum() < (delta**2).sum()


def test_log_children_and_unknown_method_kind():
    legal = torch.tensor([[True, False, True], [False, False, False]])
    assert torch.allclose(log_children(legal), torch.tensor([math.log(2), 0.0]))
    with pytest.raises(ValueError, match="unknown method kind 'fm' for a game"):
        GameLoss({"kind": "fm"})


# --- training -----------------------------------------------------------------------------------------------


def test_short_self_play_improves_the_optimal_move_fraction(oracle):
    """150 iterations of 64 games (seconds): tb and st_gfn raise the argmax optimal-move fraction over the
    untrained policy (measured at iteration 0) and beat the random player more often than it beats them."""
    for name in ("tb", "st_gfn"):
        _, history, visits = train_game(TTT_SPEC, oracle, methods()[name], MODEL, TRAIN, seed=0, progress=False)
        tracked = history.dropna(subset=["optimal_argmax"])
        assert tracked.iteration.tolist() == [0, 50, 100, 149]
        assert tracked.optimal_argmax.iloc[-1] > tracked.optimal_argmax.iloc[0] + 0.05, (name, tracked)
        assert len(visits) == 150 * 64 and set(visits.outcome) <= {-1, 0, 1}


def test_lightning_game_job_reproduces_the_plain_loop_on_cpu(tmp_path, oracle):
    from paperflow.st_gfn.lightning import fit_one

    spec = dict(TTT_SPEC, iterations=6, batch_size=8, eval_every=3)
    method = methods()["st_gfn"]
    state, history, visits = train_game(spec, oracle, method, MODEL, TRAIN, seed=1, progress=False)
    l_state, l_history, l_visits, tracking = fit_one(
        spec, oracle, method, MODEL, dict(TRAIN, engine="lightning"), 1, run_dir=tmp_path, name="ttt-st_gfn"
    )
    pd.testing.assert_frame_equal(history, l_history)
    pd.testing.assert_frame_equal(visits, l_visits)
    assert all(torch.equal(state[k], l_state[k]) for k in state) and "csv" in tracking


def test_lightning_game_job_killed_mid_fit_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, oracle):
    """A game's run (GameRun: the optimal-move fractions, the games' outcomes, its reward-noise generator) killed
    in iteration 3 of 6 (a checkpoint after every batch, mid-epoch) and rerun trains only iterations 3-5 and ends
    with the uninterrupted run's weights, history and visits."""
    from test_st_gfn_tasks import Killed, _recorded_losses

    from paperflow.st_gfn.game_training import GameRun
    from paperflow.st_gfn.lightning import fit_one

    spec = dict(TTT_SPEC, iterations=6, batch_size=8, eval_every=2, sigma=0.5)
    calls, kill = _recorded_losses(monkeypatch, GameRun)

    def fit(folder):
        return fit_one(
            spec,
            oracle,
            methods()["st_gfn"],
            MODEL,
            dict(TRAIN, engine="lightning"),
            3,
            run_dir=tmp_path / "run",
            name="ttt",
            checkpoint_dir=folder,
            checkpoint_every_s=0.0,
        )

    state, history, visits, _ = fit(None)
    kill["at"] = (3, 3)
    with pytest.raises(Killed):
        fit(tmp_path / "ckpt")
    calls.clear()
    kill["at"] = None
    r_state, r_history, r_visits, _ = fit(tmp_path / "ckpt")
    assert calls == [(3, 3), (3, 4), (3, 5)]
    assert history.optimal_argmax.notna().sum() == 4  # iterations 0, 2, 4 and the last
    pd.testing.assert_frame_equal(history, r_history)
    pd.testing.assert_frame_equal(visits, r_visits)
    assert all(torch.equal(state[k], r_state[k]) for k in state)


def test_evaluation_rows_for_a_trained_run(tmp_path, oracle):
    spec = dict(TTT_SPEC, iterations=5, batch_size=8, eval_games=20)
    state, history, visits = train_game(spec, oracle, methods()["tb"], MODEL, TRAIN, seed=0, progress=False)
    torch.save({"seed0": state}, tmp_path / "tb.pt")
    metrics, pmfs = evaluate_game(
        TTT,
        spec,
        oracle,
        {"tb": methods()["tb"]},
        [("tb", 0, tmp_path / "tb.pt", visits, history)],
        MODEL,
        [0],
        {"loss_window": 3},
    )
    got = metrics.pivot_table(index="metric", columns="method", values="value")
    for name in ("random", "minimax"):
        rates = got.loc[[f"win_rate_vs_{name}", f"draw_rate_vs_{name}", f"loss_rate_vs_{name}"], "tb"]
        assert rates.sum() == pytest.approx(1.0)
    assert got.loc["win_rate_vs_minimax", "uniform"] == 0.0  # nobody beats the minimax player
    assert got.loc["optimal_sampled", "uniform"] == pytest.approx(0.58, abs=0.02)  # |optimal| / |legal|, averaged
    assert got.loc["lam0_db_gap", "identity"] < 1e-9 and pmfs.empty


def test_uniform_network_matches_the_uniform_optimal_fraction(oracle):
    net = make_game_net(TTT, {"kind": "db"}, MODEL)
    for p in net.policy.parameters():
        torch.nn.init.zeros_(p)
    positions = Positions(TTT, oracle)
    legal = TTT.legal(positions.boards)
    uniform = float((positions.optimal.sum(-1) / legal.sum(-1)).double().mean())
    assert optimal_fractions(net, positions)["optimal_sampled"] == pytest.approx(uniform, rel=1e-6)


# --- config and DAG -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["defaults"]["envs"]["tictactoe"].update(kind="chess"),
            r"allowed values: 'hypergrid', 'bitseq', 'geneset', 'tictactoe', 'connect4'",
        ),
        (lambda d: d["defaults"]["envs"]["tictactoe"].update(lambda_=1.0), r"lambda_"),
        (
            lambda d: d["defaults"]["envs"]["connect4"].pop("test_empty"),
            r"envs.connect4 \(kind connect4\) is missing key\(s\) test_empty",
        ),
        (
            lambda d: d["defaults"]["envs"]["tictactoe"].update(test_empty=10),
            r"envs.tictactoe \(kind tictactoe\) has game key\(s\) test_empty; a tictactoe env takes only: kind, sigma, lambd",
        ),
        (lambda d: d["paper"]["env_methods"].update(connect4=["db", "st_gfn"]), r"'tb' \(methods of connect4\)"),
    ],
    ids=["kind", "unknown-key", "missing", "foreign", "baseline"],
)
def test_game_config_errors_name_the_key_and_the_allowed_values(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        load_paper_config("st_gfn", "paper", config_root(tmp_path, edit))


def test_games_run_at_tiny_and_paper_scale_only():
    assert not {"tictactoe", "connect4"} & set(load_paper_config("st_gfn", "smoke", ROOT)["run_envs"])
    tiny = load_paper_config("st_gfn", "tiny", ROOT)  # tic-tac-toe at a toy budget: the workflow tests' end-to-end run
    assert "tictactoe" in tiny["run_envs"] and "connect4" not in tiny["run_envs"]
    cfg = load_paper_config("st_gfn", "paper", ROOT)
    assert {"tictactoe", "connect4"} <= set(cfg["run_envs"]) and cfg["resources"]["gpus"] == 1


def test_paper_dry_run_lists_the_game_jobs(dry_repo):
    proc = run_snakemake(dry_repo, "-n", "--config", "scale=paper", "papers=[st_gfn]", "--printshellcmds")
    cfg = load_paper_config("st_gfn", "paper", ROOT)
    n_train = sum(len(cfg["env_methods"][e]) for e in cfg["run_envs"])
    counts = job_counts(proc.stdout)
    assert counts["st_gfn_train"] == n_train and counts["st_gfn_evaluate"] == len(cfg["run_envs"])
    for env, methods_ in (("tictactoe", cfg["env_methods"]["tictactoe"]), ("connect4", cfg["env_methods"]["connect4"])):
        for m in methods_:
            assert f"results/paper/st_gfn/models/{env}/{m}.pt" in proc.stdout
        assert f"results/paper/st_gfn/eval/{env}/metrics.parquet" in proc.stdout
    train_blocks = [
        b for b in proc.stdout.split("\nrule ")[1:] if b.startswith("st_gfn_train") and "models/connect4" in b
    ]
    assert train_blocks and all("gpu=1" in b for b in train_blocks)
    smoke = job_counts(run_snakemake(dry_repo, "-n", "--config", "scale=smoke", "papers=[st_gfn]").stdout)
    smoke_cfg = load_paper_config("st_gfn", "smoke", ROOT)
    assert smoke["st_gfn_train"] == sum(len(smoke_cfg["env_methods"][e]) for e in smoke_cfg["run_envs"])
