"""The ask-then-answer tutoring environment (spec section 4, smoke stand-in; section 11's filler tokens and ex-ante
labels) and its batched multi-turn rollout through the kit's sampler.

An episode hides digits a, b, c. The user opens with `USER GOAL a= <a> F F AST` (F a random filler word); the
assistant speaks up to `MAX_TURNS` turns, each `um`* (0-4 fillers) then one action and `EOT`:
`ASK_A`, `ASK_B`, `ASK_C` or `ANS <d>`. The seeded user answers ASK_B with `b= <b>` with probability
`P_REVEAL` (`DUNNO` otherwise), ASK_A with `a= <a>`, ASK_C with `c= <c>` (a distractor). The episode ends at ANS
(success iff d = (a + b) mod 10), at a malformed turn, or after the last turn. Every random draw of the user is
fixed per episode in `Tasks` (its uniforms), so an evaluation on the same tasks sees the same user.

The history is one token sequence with `response_mask` = 1 on the assistant's tokens (EOT included); the role word
`AST` and the user's words have mask 0, so each assistant turn is one maximal run of 1s (spec section 9).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np
import torch

from paperflow.core.lm.sampling import repack_left, sample
from paperflow.itpo.budget import MAX_FILLERS, MAX_TURNS, TURN_TOKENS

DIGITS = tuple(str(d) for d in range(10))
USER_FILLERS = ("F1", "F2", "F3")
FILLER = "um"
ACTIONS = ("ASK_A", "ASK_B", "ASK_C", "ANS")
WORDS = (*DIGITS, "a=", "b=", "c=", "USER", "GOAL", "AST", *ACTIONS, "DUNNO", "EOT", *USER_FILLERS, FILLER)
P_REVEAL = 0.75
TOKEN_COST = 0.01  # length-cost weight per assistant token (spec section 4: token_amount weight)


@lru_cache(maxsize=1)
def tokenizer():
    """The kit's word-level tokenizer over the environment's words (specials pad/bos/eos/unk first)."""
    from paperflow.core.lm.tokenizer import word_level_tokenizer

    return word_level_tokenizer(WORDS)


def ids() -> dict[str, int]:
    return tokenizer().get_vocab()


@dataclass(frozen=True)
class Tasks:
    """Hidden tasks with their user's random draws: one row per episode."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    fillers: np.ndarray  # [N, 2] user filler indices of the opening turn
    reveal: np.ndarray  # [N, MAX_TURNS] bool: would the user reveal b if asked for it at turn k
    goal: str = "sum"  # the answer: "sum" = (a + b) mod 10 (spec), "b" = b itself (smoke; README, deviations)

    def target(self, i: int) -> int:
        return int((self.a[i] + self.b[i]) % 10) if self.goal == "sum" else int(self.b[i])

    def __len__(self) -> int:
        return len(self.a)

    def repeat(self, n: int, rng: np.random.Generator) -> Tasks:
        """Each task n times in a row (a group of rollouts of one prompt), the user's reveal draws fresh per row."""
        rep = lambda x: np.repeat(x, n, axis=0)
        reveal = rng.random((len(self) * n, MAX_TURNS)) < P_REVEAL
        return Tasks(rep(self.a), rep(self.b), rep(self.c), rep(self.fillers), reveal, self.goal)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "a": self.a,
                "b": self.b,
                "c": self.c,
                **{f"filler{j}": self.fillers[:, j] for j in range(2)},
                **{f"reveal{k}": self.reveal[:, k] for k in range(MAX_TURNS)},
                "goal": self.goal,
            }
        )

    @staticmethod
    def from_frame(frame) -> Tasks:
        return Tasks(
            frame["a"].to_numpy(int),
            frame["b"].to_numpy(int),
            frame["c"].to_numpy(int),
            np.stack([frame[f"filler{j}"].to_numpy(int) for j in range(2)], 1),
            np.stack([frame[f"reveal{k}"].to_numpy(bool) for k in range(MAX_TURNS)], 1),
            str(frame["goal"].iloc[0]),
        )


GOALS = ("sum", "b")


def draw_tasks(n: int, rng: np.random.Generator, goal: str = "sum") -> Tasks:
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r} is not one of {GOALS}")
    return Tasks(
        rng.integers(0, 10, n),
        rng.integers(0, 10, n),
        rng.integers(0, 10, n),
        rng.integers(0, len(USER_FILLERS), (n, 2)),
        rng.random((n, MAX_TURNS)) < P_REVEAL,
        goal,
    )


def opening(tasks: Tasks, i: int) -> list[str]:
    f = [USER_FILLERS[j] for j in tasks.fillers[i]]
    return ["USER", "GOAL", "a=", DIGITS[tasks.a[i]], *f, "AST"]


def user_reply(action: str, tasks: Tasks, i: int, turn: int) -> list[str]:
    """The user's words after an ASK (the next assistant role word included)."""
    if action == "ASK_B":
        said = ["b=", DIGITS[tasks.b[i]]] if tasks.reveal[i, turn] else ["DUNNO"]
    elif action == "ASK_A":
        said = ["a=", DIGITS[tasks.a[i]]]
    else:
        said = ["c=", DIGITS[tasks.c[i]]]
    return ["USER", *said, "AST"]


def parse_turn(words: list[str]) -> tuple[str, int | None]:
    """(action, digit) of one assistant turn's words: fillers, then ASK_x or ANS <d>, then EOT; anything else is
    ("INVALID", None)."""
    k = 0
    while k < len(words) and words[k] == FILLER:
        k += 1
    rest = words[k:]
    if len(rest) == 2 and rest[0] in ("ASK_A", "ASK_B", "ASK_C") and rest[1] == "EOT":
        return rest[0], None
    if len(rest) == 3 and rest[0] == "ANS" and rest[1] in DIGITS and rest[2] == "EOT":
        return "ANS", int(rest[1])
    return "INVALID", None


# ---- ex-ante turn values (spec section 11): exact Q-values of the environment by enumeration ----

ACTION_TOKENS = {"ASK_A": 2, "ASK_B": 2, "ASK_C": 2, "ANS": 3}  # action words + EOT (fillers excluded)


@cache
def optimal_value(turn: int, knows_b: bool) -> float:
    """V*(turn, knows_b): the optimal expected success minus the length cost of the action words, from the start
    of assistant turn `turn` (0-based) with b known or not; 0 once the turns are spent."""
    if turn >= MAX_TURNS:
        return 0.0
    actions = [("ASK_A", None), ("ASK_B", None), ("ASK_C", None), ("ANS", "right"), ("ANS", "wrong")]
    return max(q_value(turn, knows_b, a, d) for a, d in actions)


def q_value(turn: int, knows_b: bool, action: str, answer: str | None = None) -> float:
    """Q*(state, action) in the environment's information state. An answer is "right" or "wrong" when b is known;
    with b unknown the assistant can only guess, and its answer is worth the guess's 1/10 ex ante whatever the
    digit (the turn's value cannot depend on b, which the assistant never saw)."""
    if action == "INVALID":
        return 0.0
    cost = TOKEN_COST * ACTION_TOKENS[action]
    if action == "ANS":
        success = (1.0 if answer == "right" else 0.0) if knows_b else 0.1
        return success - cost
    if action == "ASK_B" and not knows_b:
        nxt = P_REVEAL * optimal_value(turn + 1, True) + (1 - P_REVEAL) * optimal_value(turn + 1, False)
    else:
        nxt = optimal_value(turn + 1, knows_b)
    return nxt - cost


def useful_ex_ante(turn: int, knows_b: bool, action: str, answer: str | None = None) -> bool:
    """A turn is useful iff it raises the optimal expected success over a stalling turn (ASK_A: a is already
    known, so it reveals nothing) in the same state: Q*(s, a) > Q*(s, stall) (spec section 11)."""
    if action == "INVALID":
        return False
    return q_value(turn, knows_b, action, answer) > q_value(turn, knows_b, "ASK_A") + 1e-9


# ---- batched multi-turn rollouts ----


@dataclass
class Episodes:
    """Finished episodes, one left-padded run of real tokens per row (`repack_left`), scored by the kit's
    `sequence_logprobs` directly."""

    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L]
    response_mask: torch.Tensor  # [N, L] 1 on assistant tokens
    success: np.ndarray  # [N] float, 1 iff a correct ANS
    turns: list[list[dict]] = field(default_factory=list)  # per row: action, digit, tokens, labels per turn

    @property
    def assistant_tokens(self) -> np.ndarray:
        return self.response_mask.sum(1).numpy().astype(float)

    @property
    def length_cost(self) -> np.ndarray:
        """token_amount_weighted: -TOKEN_COST per assistant token."""
        return -TOKEN_COST * self.assistant_tokens


def _block(rows: list[list[int]], n: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max([len(r) for r in rows] + [1])
    block = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            block[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
    return block, mask


def repack_with_response(history, mask, response, pad: int):
    """`repack_left` of a history with holes, its response mask carried along."""
    return repack_left(history, mask, pad, response)


@torch.no_grad()
def rollout(model, tasks: Tasks, temperature: float, generator: torch.Generator | None) -> Episodes:
    """Every episode of `tasks` played to its end, all rows sampled together turn by turn (KV-cached within a
    turn). Between turns each live row's history (turn completions padded after EOT, user replies appended) is
    repacked into one left-padded run for the next turn's prompt."""
    tok, v = tokenizer(), ids()
    words = {i: w for w, i in v.items()}
    pad, n = tok.pad_token_id, len(tasks)
    history, mask = _block([[tok.bos_token_id] + [v[w] for w in opening(tasks, i)] for i in range(n)], n, pad)
    response = torch.zeros_like(mask)
    live = np.ones(n, bool)
    knows_b = np.zeros(n, bool)
    success = np.zeros(n)
    turns: list[list[dict]] = [[] for _ in range(n)]
    was_training = model.training
    model.eval()
    for turn in range(MAX_TURNS):
        rows = np.flatnonzero(live)
        if rows.size == 0:
            break
        ctx, ctx_mask = repack_left(history[rows], mask[rows], pad)
        out = sample(
            model,
            ctx,
            ctx_mask,
            max_new_tokens=TURN_TOKENS,
            temperature=temperature,
            generator=generator,
            eos_token_id=v["EOT"],
            pad_token_id=pad,
        )
        said: list[list[int]] = [[] for _ in range(n)]
        replies: list[list[int]] = [[] for _ in range(n)]
        for j, i in enumerate(rows):
            got = out.completion_ids[j][out.completion_mask[j].bool()].tolist()
            said[i] = got
            action, digit = parse_turn([words.get(t, tok.unk_token) for t in got])
            right = digit is not None and digit == tasks.target(i)
            answer = ("right" if right else "wrong") if action == "ANS" else None
            revealed = action == "ASK_B" and bool(tasks.reveal[i, turn]) and not knows_b[i]
            turns[i].append(
                {
                    "turn": turn,
                    "action": action,
                    "digit": digit,
                    "tokens": len(got),
                    "knows_b": bool(knows_b[i]),
                    "useful": useful_ex_ante(turn, bool(knows_b[i]), action, answer),
                    "q_gain": q_value(turn, bool(knows_b[i]), action, answer)
                    - q_value(turn, bool(knows_b[i]), "ASK_A"),
                    # spec section 4's reply-dependent label (reported beside the ex-ante one)
                    "useful_after_reply": bool(revealed or (action == "ANS" and right)),
                }
            )
            if action == "ANS":
                success[i] = float(right)
                live[i] = False
            elif action == "INVALID" or turn == MAX_TURNS - 1:
                live[i] = False
            else:
                knows_b[i] |= action == "ASK_B" and bool(tasks.reveal[i, turn])
                replies[i] = [v[w] for w in user_reply(action, tasks, i, turn)]
        said_ids, said_mask = _block(said, n, pad)
        reply_ids, reply_mask = _block(replies, n, pad)
        history = torch.cat([history, said_ids, reply_ids], 1)
        mask = torch.cat([mask, said_mask, reply_mask], 1)
        response = torch.cat([response, said_mask, torch.zeros_like(reply_mask)], 1)
    model.train(was_training)
    input_ids, attention_mask, response_mask = repack_with_response(history, mask, response, pad)
    return Episodes(input_ids, attention_mask, response_mask, success, turns)


def demo(rng: np.random.Generator, goal: str, practice: bool = False) -> tuple[list[str], list[int]]:
    """One SFT demonstration (spec section 7, sft_init) with its assistant mask: in half the demos the assistant
    guesses at once; in the other half it asks a random question, then answers correctly if it knows a and b, or
    guesses. Each assistant turn opens with 0-4 fillers (section 11).

    `practice`: an addition drill, an ASK_B demo that the user answers with b, with the mask on the answer turn
    only. Its answer follows the same conditional law as in the demos (the correct sum once a and b are known), so
    it teaches adding without changing how often the policy asks (README, deviations)."""
    task = draw_tasks(1, rng, goal)
    if practice:
        task = Tasks(task.a, task.b, task.c, task.fillers, np.ones_like(task.reveal), goal)
    words = ["<bos>", *opening(task, 0)]
    mask = [0] * len(words)

    def say(turn_words: list[str]) -> None:
        fill = [FILLER] * int(rng.integers(0, MAX_FILLERS + 1))
        said = fill + turn_words + ["EOT"]
        words.extend(said)
        mask.extend([1] * len(said))

    guess = DIGITS[int(rng.integers(0, 10))]
    if not practice and rng.random() < 0.5:
        say(["ANS", guess])
        return words, mask
    action = "ASK_B" if practice else ACTIONS[int(rng.integers(0, 3))]
    say([action])
    if practice:
        mask = [0] * len(mask)
    reply = user_reply(action, task, 0, 0)
    words.extend(reply)
    mask.extend([0] * len(reply))
    knows = action == "ASK_B" and bool(task.reveal[0, 0])
    say(["ANS", DIGITS[task.target(0)] if knows else guess])
    return words, mask
