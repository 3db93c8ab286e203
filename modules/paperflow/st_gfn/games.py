"""Two-player zero-sum board games for the adversarial task (spec sections 3-4, AFlowNet setting of
Jiralerspong et al., ICLR 2024): vectorised torch engines, the exact minimax oracle of tic-tac-toe and an
exact win/draw/loss solver for late Connect-4 positions.

Boards are (B, rows, cols) int8 tensors: +1 the first player's stones, -1 the second player's, 0 empty;
row 0 is the top. The player to move is +1 when the number of stones is even. Actions: the cell index
r * cols + c (tic-tac-toe) or the column (Connect-4, stones fall to the lowest empty row).
Outcomes and values are from the first player's perspective: +1 win, 0 draw, -1 loss.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from paperflow.st_gfn.settings import GAMES as GAME_KINDS  # the config's game kinds, defined once (torch-free)

SYMBOLS = {1: "x", -1: "o", 0: "."}


@dataclass(frozen=True)
class Game:
    """An m,n,k-game: `connect` in a row wins; `gravity` makes it Connect-4-like (actions are columns)."""

    name: str
    rows: int
    cols: int
    connect: int
    gravity: bool

    @property
    def n_actions(self) -> int:
        return self.cols if self.gravity else self.rows * self.cols

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    def initial(self, batch: int, device=None) -> torch.Tensor:
        return torch.zeros(batch, self.rows, self.cols, dtype=torch.int8, device=device)

    def stones(self, boards: torch.Tensor) -> torch.Tensor:
        return (boards != 0).flatten(1).sum(-1)

    def to_move(self, boards: torch.Tensor) -> torch.Tensor:
        """(B,) +1 where the first player moves, -1 where the second does."""
        return 1 - 2 * (self.stones(boards) % 2)

    def legal(self, boards: torch.Tensor) -> torch.Tensor:
        """(B, n_actions) legal moves (ignores whether the game is already over: see `status`)."""
        return boards[:, 0, :] == 0 if self.gravity else boards.flatten(1) == 0

    def play(self, boards: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The boards after the mover plays `actions` (B,); the moves must be legal."""
        out = boards.clone()
        batch = torch.arange(boards.shape[0], device=boards.device)
        if self.gravity:
            row = (boards[batch, :, actions] == 0).sum(-1) - 1  # lowest empty row of the column
            col = actions
        else:
            row, col = actions // self.cols, actions % self.cols
        out[batch, row, col] = self.to_move(boards).to(torch.int8)
        return out

    def winner(self, boards: torch.Tensor) -> torch.Tensor:
        """(B,) +1 / -1 where that player has `connect` stones in a row (any of the four directions), else 0."""
        x = boards.to(torch.float32)[:, None]
        k = self.connect
        kernels = [
            torch.ones(1, 1, 1, k),
            torch.ones(1, 1, k, 1),
            torch.eye(k)[None, None],
            torch.eye(k).flip(-1)[None, None],
        ]
        best, worst = [], []
        for kernel in kernels:
            if kernel.shape[-2] > self.rows or kernel.shape[-1] > self.cols:
                continue
            line = F.conv2d(x, kernel.to(device=x.device, dtype=x.dtype)).flatten(1)
            best.append(line.amax(-1))
            worst.append(line.amin(-1))
        first = torch.stack(best).amax(0) >= k
        second = torch.stack(worst).amin(0) <= -k
        return first.to(torch.int64) - second.to(torch.int64)

    def status(self, boards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(done, outcome): done where someone has won or the board is full; outcome +1 / 0 / -1."""
        outcome = self.winner(boards)
        full = ~self.legal(boards).any(-1)
        return (outcome != 0) | full, outcome

    def advance(
        self, boards: torch.Tensor, moves: torch.Tensor, done: torch.Tensor, outcomes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One move in every unfinished game of a batch: (boards, done, outcomes) after `moves`; finished
        games keep their board and outcome (their move is ignored)."""
        boards = torch.where(done[:, None, None], boards, self.play(boards, torch.where(done, 0, moves)))
        finished, result = self.status(boards)
        return boards, done | finished, torch.where(done, outcomes, result)


def make_game(spec: Mapping[str, Any]) -> Game:
    kind = spec["kind"]
    if kind == "tictactoe":
        return Game("tictactoe", 3, 3, 3, gravity=False)
    if kind == "connect4":
        return Game("connect4", 6, 7, 4, gravity=True)
    raise ValueError(f"unknown game kind {kind!r}; known: {', '.join(GAME_KINDS)}")


def board_string(board: np.ndarray) -> str:
    return "".join(SYMBOLS[int(v)] for v in np.asarray(board).ravel())


def boards_from_strings(strings, game: Game) -> torch.Tensor:
    codes = {"x": 1, "o": -1, ".": 0}
    values = [[codes[c] for c in s] for s in strings]
    return torch.tensor(values, dtype=torch.int8).reshape(-1, game.rows, game.cols)


def action_bits(mask: np.ndarray) -> np.ndarray:
    """(n, A) bool -> (n,) int64 bit masks (bit a set where action a is in the set)."""
    return (np.asarray(mask, dtype=np.int64) << np.arange(mask.shape[1])).sum(-1)


def bits_to_mask(bits, n_actions: int) -> torch.Tensor:
    return (torch.as_tensor(np.asarray(bits, dtype=np.int64))[:, None] >> torch.arange(n_actions)) & 1 == 1


# --- tic-tac-toe: exact minimax oracle over every reachable position ------------------------------------

LINES3 = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _ttt_winner(cells: tuple[int, ...]) -> int:
    for a, b, c in LINES3:
        if cells[a] != 0 and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return 0


def tictactoe_oracle() -> pd.DataFrame:
    """Every position reachable from the empty board by legal play (play stops at a win or a full board),
    with its minimax value (first player's perspective) and, where the game goes on, the bit mask of the
    optimal moves (those whose child has the mover's best value). 5,478 positions."""
    values: dict[tuple[int, ...], int] = {}
    optimal: dict[tuple[int, ...], int] = {}

    def solve(cells: tuple[int, ...]) -> int:
        if cells in values:
            return values[cells]
        won = _ttt_winner(cells)
        moves = [i for i in range(9) if cells[i] == 0]
        if won or not moves:
            values[cells], optimal[cells] = won, 0
            return won
        mover = 1 if sum(c != 0 for c in cells) % 2 == 0 else -1
        child = {m: solve(cells[:m] + (mover,) + cells[m + 1 :]) for m in moves}
        best = max(child.values()) if mover == 1 else min(child.values())
        values[cells] = best
        optimal[cells] = sum(1 << m for m, v in child.items() if v == best)
        return best

    solve((0,) * 9)
    cells = sorted(values)
    boards = np.array(cells, dtype=np.int8)
    return pd.DataFrame(
        {
            "board": [board_string(b) for b in boards],
            "to_move": np.where((boards != 0).sum(1) % 2 == 0, 1, -1),
            "value": [values[c] for c in cells],
            "terminal": [optimal[c] == 0 for c in cells],
            "optimal": [optimal[c] for c in cells],
            "legal": action_bits(boards == 0),
        }
    )


# --- Connect-4: exact win/draw/loss negamax with alpha-beta and a transposition table -------------------

C4_ROWS, C4_COLS = 6, 7
H1 = C4_ROWS + 1  # bits per column (a sentinel bit on top)
BOTTOM = sum(1 << (c * H1) for c in range(C4_COLS))
TOP = [1 << (C4_ROWS - 1 + c * H1) for c in range(C4_COLS)]
ORDER = [3, 2, 4, 1, 5, 0, 6]  # centre columns first


def _drop(mask: int, col: int) -> int:
    """The bit of the stone played in column `col` of the bitboard `mask` (its lowest empty cell)."""
    return (mask + (1 << (col * H1))) & ~mask & (((1 << C4_ROWS) - 1) << (col * H1))


def _aligned(bits: int) -> bool:
    for shift in (1, H1, H1 - 1, H1 + 1):  # vertical, horizontal, the two diagonals
        m = bits & (bits >> shift)
        if m & (m >> (2 * shift)):
            return True
    return False


def to_bitboard(board: np.ndarray) -> tuple[int, int, int]:
    """(stones of the player to move, all stones, number of stones) of a 6x7 board (row 0 at the top)."""
    board = np.asarray(board)
    mover = 1 if (board != 0).sum() % 2 == 0 else -1
    current = mask = 0
    for c in range(C4_COLS):
        for r in range(C4_ROWS):
            if board[r, c] != 0:
                bit = 1 << (c * H1 + C4_ROWS - 1 - r)
                mask |= bit
                if board[r, c] == mover:
                    current |= bit
    return current, mask, int((board != 0).sum())


class Connect4Solver:
    """Game-theoretic value (+1 / 0 / -1 for the player to move) of a Connect-4 position by negamax with
    alpha-beta pruning on the three values and a transposition table. Exact, but pure Python: practical
    for positions with up to about 20 empty cells (the test set's late-game positions), not the opening."""

    def __init__(self) -> None:
        self.table: dict[int, tuple[int, int]] = {}  # key -> (value, flag: 0 exact, 1 lower, -1 upper)
        self.nodes = 0

    def value(self, current: int, mask: int, moves: int, alpha: int = -1, beta: int = 1) -> int:
        self.nodes += 1
        playable = [c for c in ORDER if not mask & TOP[c]]
        for c in playable:  # an immediate win
            if _aligned(current | _drop(mask, c)):
                return 1
        if moves >= C4_ROWS * C4_COLS - 1:  # the last stone cannot win (checked above): a draw
            return 0
        key = current + mask
        if key in self.table:
            v, flag = self.table[key]
            if flag == 0 or (flag == 1 and v >= beta) or (flag == -1 and v <= alpha):
                return v
        a0, best = alpha, -2
        for c in playable:
            v = -self.value(current ^ mask, mask | _drop(mask, c), moves + 1, -beta, -alpha)
            best = max(best, v)
            alpha = max(alpha, v)
            if alpha >= beta:
                break
        self.table[key] = (best, 1 if best >= beta else (-1 if best <= a0 else 0))
        return best

    def move_values(self, board: np.ndarray) -> dict[int, int]:
        """Value of each legal move for the player to move (+1 win, 0 draw, -1 loss)."""
        current, mask, moves = to_bitboard(board)
        out = {}
        for c in range(C4_COLS):
            if mask & TOP[c]:
                continue
            move = _drop(mask, c)
            if _aligned(current | move):
                out[c] = 1
            elif moves + 1 == C4_ROWS * C4_COLS:
                out[c] = 0
            else:
                out[c] = -self.value(current ^ mask, mask | move, moves + 1)
        return out


def random_late_positions(game: Game, n: int, empty: int, seed: int) -> list[np.ndarray]:
    """n distinct non-terminal positions with `empty` empty cells, from uniformly random play (seeded)."""
    rng = random.Random(seed)
    seen, out = set(), []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n:
            raise RuntimeError(f"could not draw {n} distinct positions with {empty} empty cells")
        board = game.initial(1)
        ok = True
        for _ in range(game.n_cells - empty):
            moves = game.legal(board)[0].nonzero().flatten().tolist()
            board = game.play(board, torch.tensor([rng.choice(moves)]))
            if bool(game.status(board)[0][0]):
                ok = False
                break
        key = board_string(board[0].numpy())
        if ok and key not in seen:
            seen.add(key)
            out.append(board[0].numpy())
    return out


def connect4_test_set(n: int, empty: int, seed: int) -> pd.DataFrame:
    """Late-game Connect-4 positions with the solver's value of every legal move; `optimal` is the bit mask
    of the moves with the best win/draw/loss value."""
    game = make_game({"kind": "connect4"})
    solver = Connect4Solver()
    rows = []
    for board in random_late_positions(game, n, empty, seed):
        values = solver.move_values(board)  # for the player to move
        best = max(values.values())
        to_move = 1 if (board != 0).sum() % 2 == 0 else -1
        rows.append(
            {
                "board": board_string(board),
                "to_move": to_move,
                "value": to_move * best,
                "terminal": False,
                "optimal": sum(1 << c for c, v in values.items() if v == best),
                "legal": sum(1 << c for c in values),
                "move_values": " ".join(f"{c}:{v}" for c, v in sorted(values.items())),
            }
        )
    return pd.DataFrame(rows)


def reference_positions(spec: Mapping[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """What preprocess writes for a game env: the tic-tac-toe oracle (every reachable position) or the
    Connect-4 test set, and a description of it."""
    if spec["kind"] == "tictactoe":
        frame = tictactoe_oracle()
        return frame, {"positions": "every reachable tic-tac-toe position (exact minimax oracle)"}
    frame = connect4_test_set(int(spec["test_positions"]), int(spec["test_empty"]), int(spec["test_seed"]))
    return frame, {
        "positions": f"{len(frame)} Connect-4 positions with {spec['test_empty']} empty cells from random "
        f"play (seed {spec['test_seed']}), solved exactly (win/draw/loss negamax)"
    }
