"""NeedWorld, the smoke-scale stand-in for an LLM help-seeker (spec section 7): a user with a hidden need, a distress
that moves with the supporter's strategy, weak strategy-dependent feedback, and a noisy critic whose verbal verdicts
are parsed as in the PPDPP/DPDP code line.

The tables are version `needworld-v1`, written once before any method ran and never tuned per method (spec
section 9); `table_digest()` goes into every output so that a changed table cannot pass for the old one.

    world = World.build("main")                      # or "uninformative" (the section-11 negative control)
    users = sample_users(np.random.default_rng(0), 150)
    d, fb, r, done = world.step(users.need, d, turn, strategy, noise)   # vectorised over users

Everything here is numpy over arrays of users; the per-user randomness comes from pre-drawn `TurnNoise` so that
every method meets the same users with the same draws (paired comparisons, common random numbers).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

VERSION = "needworld-v1"

NEEDS = ("validation", "understanding", "advice", "information")
STRATEGIES = (  # the 8 ESConv strategies
    "Question",
    "Restatement or Paraphrasing",
    "Reflection of feelings",
    "Self-disclosure",
    "Affirmation and Reassurance",
    "Providing Suggestions",
    "Information",
    "Others",
)
FEEDBACK = ("elaborates", "agrees", "pushes_back", "asks_help", "short")
PHASES = ("explore", "comfort", "action")
EMOTIONS = ("anxiety", "sadness", "anger", "fear", "shame")
PROBLEMS = ("job crisis", "breakup with partner", "problems with friends", "academic pressure", "conflict with parents")

Q, RP, RF, SD, AR, PS, INF, OT = range(8)
SUGGESTIONS = PS
TURNS_PER_PHASE = 2  # explore -> comfort -> action, advancing every 2 turns and staying in action

# mu[need, phase, strategy]: the expected drop of distress in one turn, in [-0.15, 0.3] (spec section 7).
# Explore: listening helps everyone a little, pushing solutions early backfires a little; comfort and action: the
# strategy has to match the need (validation -> affirmation, understanding -> reflection / restatement, advice ->
# suggestions, information -> information).
_MU = {
    "explore": {
        "validation": (0.08, 0.06, 0.08, 0.00, 0.10, -0.05, -0.03, 0.00),
        "understanding": (0.08, 0.06, 0.12, 0.00, 0.04, -0.05, -0.03, 0.00),
        "advice": (0.08, 0.06, 0.08, 0.00, 0.04, 0.05, -0.03, 0.00),
        "information": (0.08, 0.06, 0.08, 0.00, 0.04, -0.05, 0.05, 0.00),
    },
    "comfort": {
        "validation": (0.02, 0.08, 0.18, 0.05, 0.25, -0.12, -0.10, 0.00),
        "understanding": (0.05, 0.22, 0.25, 0.10, 0.08, -0.10, -0.08, 0.00),
        "advice": (0.05, 0.05, 0.03, 0.05, 0.03, 0.20, 0.10, 0.00),
        "information": (0.05, 0.03, 0.00, 0.00, 0.00, 0.10, 0.22, 0.00),
    },
    "action": {
        "validation": (-0.02, 0.05, 0.15, 0.10, 0.28, -0.15, -0.12, 0.00),
        "understanding": (0.00, 0.15, 0.22, 0.18, 0.10, -0.12, -0.10, 0.00),
        "advice": (-0.02, 0.00, 0.00, 0.05, 0.05, 0.30, 0.12, 0.00),
        "information": (-0.02, 0.00, 0.00, 0.00, 0.02, 0.12, 0.30, 0.00),
    },
}

# The feedback class each need most often gives to a strategy (one entry per need, in NEEDS order). Question,
# Restatement and Reflection are informative (peak 0.6), Self-disclosure and Affirmation mildly (peak 0.32);
# Suggestions, Information and Others are near-uniform (spec section 7).
_SIGNATURE = {
    Q: ("short", "elaborates", "asks_help", "agrees"),
    RP: ("agrees", "elaborates", "pushes_back", "asks_help"),
    RF: ("elaborates", "agrees", "pushes_back", "short"),
    SD: ("elaborates", "agrees", "short", "asks_help"),
    AR: ("agrees", "elaborates", "pushes_back", "asks_help"),
}
_PEAK = {Q: 0.6, RP: 0.6, RF: 0.6, SD: 0.32, AR: 0.32}
# near-uniform rows: fixed deviations of at most 0.02 from 0.2 (summing to 0), per need, for PS / INF / OT
_FLAT = (
    (0.02, -0.01, 0.0, -0.01, 0.0),
    (-0.01, 0.02, -0.01, 0.0, 0.0),
    (0.0, -0.01, 0.02, -0.01, 0.0),
    (0.0, 0.0, -0.01, 0.02, -0.01),
)

INFORMATIVE = (Q, RP, RF)
PROBLEM_BIAS = 0.36  # p(the need's own problem | need); the other four problems share the rest (a weak cue)

# distress dynamics and critic (spec section 7)
D0 = (0.7, 0.9)
TRANSITION_SD = 0.05
SUCCESS_DISTRESS = 0.3
CRITIC_SD = 0.04  # noise of each critic sample's reading of the change of distress
CRITIC_BAND = 0.05  # |perceived change| below this reads as "the same"
OFF_FORMAT = 0.05  # share of critic samples that name no verdict (dropped by the parser)

# the critic's verdict strings (one per sample) and the keyword map of the PPDPP/DPDP code line: first match in
# this order wins, a sample without any keyword is dropped, and no parsed sample at all gives 0
VERDICT_TEXT = (
    "The seeker feels worse.",
    "The seeker feels the same.",
    "The seeker feels better.",
    "The seeker's issue is solved.",
    "The seeker seems to be thinking it over.",  # off-format: no keyword
)
KEYWORDS = (("worse", -1.0), ("same", -0.5), ("better", 0.1), ("solved", 1.0))


def parse_verdict(text: str) -> float | None:
    """The reward of one critic sample: the value of the first keyword (in KEYWORDS order) found in the lowercased
    text, or None when none is found (the sample is dropped)."""
    low = text.lower()
    for word, value in KEYWORDS:
        if word in low:
            return value
    return None


def critic_reward(samples: list[str]) -> float:
    """r_t = mean of the parsed samples' values, dropping unparsed ones; 0 when none parses (spec section 2.1)."""
    values = [v for v in map(parse_verdict, samples) if v is not None]
    return float(np.mean(values)) if values else 0.0


VERDICT_VALUE = np.array([np.nan if (v := parse_verdict(t)) is None else v for t in VERDICT_TEXT])


def phase_of(turn: int | np.ndarray) -> int | np.ndarray:
    return np.minimum(np.asarray(turn) // TURNS_PER_PHASE, len(PHASES) - 1)


def mu_table() -> np.ndarray:
    """mu[need, phase, strategy] (4 x 3 x 8)."""
    return np.array([[_MU[p][z] for p in PHASES] for z in NEEDS], dtype=float)


def likelihood_table(world: str = "main") -> np.ndarray:
    """L[need, strategy, feedback] (4 x 8 x 5), rows summing to 1. `uninformative`: every strategy's feedback has
    the same near-uniform law for every need (section 11's negative control: no strategy reveals the need)."""
    flat = 0.2 + np.array(_FLAT)  # [need, feedback]
    table = np.empty((len(NEEDS), len(STRATEGIES), len(FEEDBACK)))
    for s in range(len(STRATEGIES)):
        for z in range(len(NEEDS)):
            if world == "main" and s in _SIGNATURE:
                peak = _PEAK[s]
                row = np.full(len(FEEDBACK), (1 - peak) / (len(FEEDBACK) - 1))
                row[FEEDBACK.index(_SIGNATURE[s][z])] = peak
            elif world in ("main", "uninformative"):
                row = flat[z] if world == "main" else np.full(len(FEEDBACK), 0.2)
            else:
                raise ValueError(f"world {world!r}: allowed worlds are 'main', 'uninformative'")
            table[z, s] = row
    return table


def table_digest(world: str = "main") -> str:
    """sha256 (16 hex) of the version, mu, L and the critic constants: what the outputs record."""
    blob = json.dumps(
        {
            "version": VERSION,
            "mu": mu_table().round(6).tolist(),
            "L": likelihood_table(world).round(6).tolist(),
            "critic": [CRITIC_SD, CRITIC_BAND, OFF_FORMAT, SUCCESS_DISTRESS, list(KEYWORDS)],
            "dynamics": [D0, TRANSITION_SD, TURNS_PER_PHASE, PROBLEM_BIAS],
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Users:
    """A batch of help-seekers: hidden need, initial distress and the situation's emotion and problem (indices)."""

    need: np.ndarray
    d0: np.ndarray
    emotion: np.ndarray
    problem: np.ndarray

    def __len__(self) -> int:
        return len(self.need)

    def take(self, idx) -> Users:
        return Users(self.need[idx], self.d0[idx], self.emotion[idx], self.problem[idx])


def sample_users(rng: np.random.Generator, n: int) -> Users:
    """n users: need uniform over NEEDS; the problem weakly tied to the need (p = PROBLEM_BIAS for problem index =
    need index, the rest shared); emotion uniform; d_0 ~ U(0.7, 0.9)."""
    need = rng.integers(0, len(NEEDS), n)
    other = (1 - PROBLEM_BIAS) / (len(PROBLEMS) - 1)
    probs = np.full((len(NEEDS), len(PROBLEMS)), other)
    probs[np.arange(len(NEEDS)), np.arange(len(NEEDS))] = PROBLEM_BIAS
    u = rng.random(n)
    problem = (u[:, None] > np.cumsum(probs[need], axis=1)).sum(axis=1)
    emotion = rng.integers(0, len(EMOTIONS), n)
    d0 = rng.uniform(*D0, n)
    return Users(need=need, d0=d0, emotion=emotion, problem=np.minimum(problem, len(PROBLEMS) - 1))


@dataclass(frozen=True)
class TurnNoise:
    """The draws of one simulated turn for a batch of users: transition noise, the feedback's uniform, the critic
    samples' noise and format draws, and a uniform for a stochastic agent's choice."""

    transition: np.ndarray  # [n]
    feedback: np.ndarray  # [n] uniform
    critic: np.ndarray  # [n, l]
    off_format: np.ndarray  # [n, l] uniform
    agent: np.ndarray  # [n] uniform

    @staticmethod
    def draw(rng: np.random.Generator, n: int, samples: int) -> TurnNoise:
        return TurnNoise(
            transition=rng.normal(0.0, TRANSITION_SD, n),
            feedback=rng.random(n),
            critic=rng.normal(0.0, CRITIC_SD, (n, samples)),
            off_format=rng.random((n, samples)),
            agent=rng.random(n),
        )

    def take(self, idx) -> TurnNoise:
        return TurnNoise(
            self.transition[idx], self.feedback[idx], self.critic[idx], self.off_format[idx], self.agent[idx]
        )


def draw_noise(rng: np.random.Generator, n: int, turns: int, samples: int) -> list[TurnNoise]:
    """One TurnNoise per turn for n users (the same list serves every method: common random numbers)."""
    return [TurnNoise.draw(rng, n, samples) for _ in range(turns)]


def inverse_cdf(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row-wise categorical draw: the first index whose cumulative probability exceeds u."""
    c = np.cumsum(probs, axis=-1)
    return np.minimum((u[..., None] >= c).sum(axis=-1), probs.shape[-1] - 1)


@dataclass(frozen=True)
class Outcome:
    distress: np.ndarray  # after the turn
    feedback: np.ndarray  # feedback class index
    reward: np.ndarray  # critic reward r_t
    success: np.ndarray  # distress <= SUCCESS_DISTRESS
    verdicts: np.ndarray  # [n, l] index into VERDICT_TEXT


@dataclass(frozen=True)
class World:
    name: str
    mu: np.ndarray
    L: np.ndarray

    @staticmethod
    def build(name: str = "main") -> World:
        return World(name=name, mu=mu_table(), L=likelihood_table(name))

    @property
    def digest(self) -> str:
        return table_digest(self.name)

    def step(self, need, distress, turn: int, strategy, noise: TurnNoise) -> Outcome:
        """One turn for a batch: d' = clip(d - mu[z, phase, s] + N(0, 0.05), 0, 1); feedback ~ L[z, s]; l critic
        samples read the change d - d' with N(0, CRITIC_SD) noise: 'solved' when d' <= 0.3, else better / worse
        beyond CRITIC_BAND, else the same, or (share OFF_FORMAT) no verdict; r_t = the parsed mean."""
        need, strategy = np.asarray(need), np.asarray(strategy)
        phase = phase_of(turn)
        new = np.clip(distress - self.mu[need, phase, strategy] + noise.transition, 0.0, 1.0)
        feedback = inverse_cdf(self.L[need, strategy], noise.feedback)
        perceived = (distress - new)[:, None] + noise.critic
        solved = (new <= SUCCESS_DISTRESS)[:, None]
        verdict = np.where(perceived > CRITIC_BAND, 2, np.where(perceived < -CRITIC_BAND, 0, 1))
        verdict = np.where(solved, 3, verdict)
        verdict = np.where(noise.off_format < OFF_FORMAT, 4, verdict)
        values = VERDICT_VALUE[verdict]
        parsed = ~np.isnan(values)
        count = parsed.sum(axis=1)
        reward = np.where(count > 0, np.nansum(values, axis=1) / np.maximum(count, 1), 0.0)
        return Outcome(new, feedback, reward, new <= SUCCESS_DISTRESS, verdict)


# Situation texts (what the memory's retrieval embeds): the phase, the emotion and problem, the last reply's class.
_PHASE_TEXT = {
    "explore": "Early in the conversation.",
    "comfort": "In the middle of the conversation.",
    "action": "Late in the conversation.",
}
_FEEDBACK_TEXT = {
    None: "The seeker has just opened up.",
    "elaborates": "Their last reply elaborated at length.",
    "agrees": "Their last reply agreed with the supporter.",
    "pushes_back": "Their last reply pushed back.",
    "asks_help": "Their last reply asked for help.",
    "short": "Their last reply was short.",
}
_NEED_TEXT = {
    "validation": "They seem to want their feelings validated.",
    "understanding": "They seem to want to be understood.",
    "advice": "They seem to want advice.",
    "information": "They seem to want information.",
}
NO_FEEDBACK = len(FEEDBACK)  # the last-feedback index of a first turn


def situation_index(phase, emotion, problem, last_feedback):
    """The row of a situation in `situation_texts()` (vectorised)."""
    n_fb = len(FEEDBACK) + 1
    return ((np.asarray(phase) * len(EMOTIONS) + emotion) * len(PROBLEMS) + problem) * n_fb + last_feedback


def situation_texts() -> list[str]:
    """Every situation text, in `situation_index` order (3 x 5 x 5 x 6 = 450)."""
    fbs = [*FEEDBACK, None]
    return [
        f"{_PHASE_TEXT[p]} The seeker feels {e} about {pr}. {_FEEDBACK_TEXT[f]}"
        for p in PHASES
        for e in EMOTIONS
        for pr in PROBLEMS
        for f in fbs
    ]


def keyed_texts() -> list[str]:
    """Every (situation, need hypothesis) text, row = situation_index * len(NEEDS) + need (UKA's memory keys)."""
    return [f"{s} {_NEED_TEXT[z]}" for s in situation_texts() for z in NEEDS]
