"""The supporter agents, their knowledge acquisition (self-play "training", no gradients) and their test episodes.

Methods (spec sections 3 and 7; the names are the config's):
  standard            the LLM's biased strategy prior (70% Providing Suggestions), no memory
  uniform_prior       control: the strategy prior without its bias (uniform), no memory
  principles          PRINCIPLES-like: the prior reweighted by retrieved principles, score log prior(s) + beta votes(s);
                      principles written on success and on a successful revision ("rather than" the failed ones)
  uka                 UKA: training scores EIG(s) + lambda E_b[R(s, z)]; test scores E_b[R] - kappa Std_b[R];
                      knowledge entries (situation, argmax b, strategy, reward) on success and, after a successful
                      revision, also the failed attempts (the contrastive part)
  uka_no_eig_train    ablation "EIG only at test": UKA without the EIG term in training (E_b[R] only)
  uka_no_belief_test  ablation "EIG only in training": UKA's memory, but the test choice uses the uniform belief
  uka_permuted_tom    control: UKA's memory and rule, but at test it decides with another user's belief (the beliefs
                      of the seed's test users shuffled by a fixed derangement): a belief, not about this user

The decision rule is the same for every agent, in training and at test (`greedy`): the strategy of largest score,
exact ties broken uniformly with the turn's pre-drawn uniform. Only the score differs between methods.

The ToM likelihood L~ is estimated, never given: counts of (need, strategy, feedback) in the seed's labelled corpus
of logged training dialogues (`tom_corpus`) with a Dirichlet prior (`belief.estimate_likelihood`). One estimate per
seed serves every method, and the same Bayes filter with it follows every agent's dialogue, so that the posterior
entropy and the need accuracy of section 8 are measured alike for all methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from paperflow.uka import belief as bf
from paperflow.uka import needworld as nw
from paperflow.uka.memory import Embeddings, KnowledgeMemory, PrincipleMemory

METHODS = (
    "standard",
    "uniform_prior",
    "principles",
    "uka",
    "uka_no_eig_train",
    "uka_no_belief_test",
    "uka_permuted_tom",
)
TRAINED = {  # the methods with a training stage, and whose memory a method evaluates with
    "standard": None,
    "uniform_prior": None,
    "principles": "principles",
    "uka": "uka",
    "uka_no_eig_train": "uka_no_eig_train",
    "uka_no_belief_test": "uka",
    "uka_permuted_tom": "uka",
}
R_START = 0.0  # r_0: the reward a first turn is compared with (status = r_t > r_{t-1})

# seeded streams: one generator per purpose, so that a method never shifts another's draws
STREAMS = {"test_users": 1, "train_users": 2, "tom": 3, "test_noise": 4, "train_noise": 5, "shuffle": 6}
TIE = 0.0  # only exact ties are ties (a score within float rounding of the best loses, as argmax)


def stream(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), STREAMS[name]])


@dataclass(frozen=True)
class Settings:
    turns: int
    critic_samples: int
    dialogues: int
    budget_turns: int
    max_revisions: int
    prior_suggestions: float
    tom_prior: float
    top_k: int
    lam: float
    kappa: float
    beta: float
    unknown_reward: float

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> Settings:
        sim, tr, ag = cfg["simulation"], cfg["training"], cfg["agent"]
        return Settings(
            turns=int(sim["turns"]),
            critic_samples=int(sim["critic_samples"]),
            dialogues=int(tr["dialogues"]),
            budget_turns=int(tr["budget_turns"]),
            max_revisions=int(tr["max_revisions"]),
            prior_suggestions=float(ag["prior_suggestions"]),
            tom_prior=float(ag["tom_prior"]),
            top_k=int(ag["top_k"]),
            lam=float(ag["lam"]),
            kappa=float(ag["kappa"]),
            beta=float(ag["beta"]),
            unknown_reward=float(ag["unknown_reward"]),
        )


def strategy_prior(suggestions: float) -> np.ndarray:
    """The LLM's biased prior over strategies: `suggestions` on Providing Suggestions, the rest shared equally."""
    p = np.full(len(nw.STRATEGIES), (1 - suggestions) / (len(nw.STRATEGIES) - 1))
    p[nw.SUGGESTIONS] = suggestions
    return p


def greedy(scores: np.ndarray, u: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
    """Every agent's decision rule: per row, the strategy of largest score among those not excluded; exact ties
    broken uniformly by the row's uniform u in [0, 1)."""
    s = np.where(exclude, -np.inf, scores) if exclude is not None else np.asarray(scores, float)
    top = s >= s.max(axis=1, keepdims=True) - TIE
    k = top.sum(axis=1)
    pick = np.minimum((np.asarray(u) * k).astype(int), k - 1)
    return np.argmax(top & (np.cumsum(top, axis=1) - 1 == pick[:, None]), axis=1)


def tom_corpus(world: nw.World, users: nw.Users, seed: int, settings: Settings) -> np.ndarray:
    """The labelled corpus the agent's ToM is estimated from: each training user in one logged dialogue of `turns`
    turns whose supporter draws every strategy uniformly (as ESConv's human supporters use all eight), the user's
    need known in hindsight (a training label). Returns the counts n[need, strategy, feedback]."""
    rng = stream(seed, "tom")
    n, d = len(users), users.d0.copy()
    need, strategy, feedback = [], [], []
    for t in range(settings.turns):
        s = rng.integers(0, len(nw.STRATEGIES), n)
        out = world.step(users.need, d, t, s, nw.TurnNoise.draw(rng, n, settings.critic_samples))
        d = out.distress
        need.append(users.need), strategy.append(s), feedback.append(out.feedback)
    shape = (len(nw.NEEDS), len(nw.STRATEGIES), len(nw.FEEDBACK))
    return bf.feedback_counts(np.concatenate(need), np.concatenate(strategy), np.concatenate(feedback), shape)


def agent_likelihood(world: nw.World, seed: int, settings: Settings, train_users: nw.Users) -> np.ndarray:
    """The seed's ToM likelihood L~ (the same for every method): the corpus counts with the Dirichlet prior
    `agent.tom_prior`. The simulator's own table L only generates the corpus."""
    return bf.estimate_likelihood(tom_corpus(world, train_users, seed, settings), settings.tom_prior)


def belief_shuffle(method: str, seed: int, n: int) -> np.ndarray | None:
    """The permuted-ToM control's derangement of the seed's n test users (user i decides with the belief of user
    shuffle[i] != i; one cycle through a random order), None for every other method."""
    if method != "uka_permuted_tom":
        return None
    if n < 2:
        raise ValueError("the permuted-ToM control needs at least 2 test users")
    order = stream(seed, "shuffle").permutation(n)
    out = np.empty(n, int)
    out[order] = np.roll(order, -1)
    return out


@dataclass
class Agent:
    method: str
    settings: Settings
    likelihood: np.ndarray  # the agent's L~ [Z, S, U]
    emb: Embeddings
    memory: PrincipleMemory | KnowledgeMemory | None
    shuffle: np.ndarray | None = None  # uka_permuted_tom: whose belief each test user's choice reads
    _table: tuple[int, np.ndarray] | None = field(default=None, repr=False)  # test: predictions of every situation

    def decision_belief(self, belief: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The beliefs the test choice of users `idx` reads: their own, or (permuted-ToM) those of the users the
        fixed derangement assigns them (`belief` holds every test user's)."""
        idx = np.asarray(idx)
        return belief[idx] if self.shuffle is None else belief[self.shuffle[idx]]

    @property
    def kind(self) -> str:
        return "uka" if self.method.startswith("uka") else self.method

    def _prior(self) -> np.ndarray:
        if self.method == "uniform_prior":
            return np.full(len(nw.STRATEGIES), 1 / len(nw.STRATEGIES))
        return strategy_prior(self.settings.prior_suggestions)

    def prior_scores(self, situation: np.ndarray) -> np.ndarray:
        """standard / uniform_prior / principles: log prior(s) (+ beta votes(s) of the retrieved principles)."""
        logits = np.log(self._prior())[None].repeat(len(situation), axis=0)
        if self.kind == "principles" and self.memory is not None:
            logits = logits + self.settings.beta * self.memory.votes(self.emb, situation, self.settings.top_k)
        return logits

    def _tie_break(self) -> np.ndarray:
        return 1e-9 * np.log(self._prior())  # equal scores: the LLM's preferred strategy first

    def predicted(self, situation: np.ndarray, table: bool = False) -> np.ndarray:
        """R(s, z) per situation row, [n, Z, S]. `table`: read it from the predictions of every situation, computed
        once per memory size (the test: the memory no longer changes); training asks the memory row by row."""
        s = self.settings
        if self.memory is None:
            return np.full((len(situation), len(nw.NEEDS), len(nw.STRATEGIES)), s.unknown_reward)
        if not table:
            return self.memory.predicted(self.emb, situation, s.top_k, s.unknown_reward)
        if self._table is None or self._table[0] != len(self.memory):
            every = np.arange(len(self.emb.situation))
            self._table = (len(self.memory), self.memory.predicted(self.emb, every, s.top_k, s.unknown_reward))
        return self._table[1][np.asarray(situation)]

    def train_scores(self, belief: np.ndarray, situation: np.ndarray) -> np.ndarray:
        """UKA in training: EIG(s) + lambda E_b[R(s, z)] (EIG dropped for uka_no_eig_train)."""
        expected = np.einsum("nz,nzs->ns", belief, self.predicted(situation))
        gain = 0.0 if self.method == "uka_no_eig_train" else bf.eig(belief, self.likelihood)
        return gain + self.settings.lam * expected + self._tie_break()

    def test_scores(self, belief: np.ndarray, situation: np.ndarray) -> np.ndarray:
        """UKA at test: E_b[R(s, z)] - kappa Std_b[R(s, z)] (the uniform belief for uka_no_belief_test)."""
        if self.method == "uka_no_belief_test":
            belief = bf.uniform(len(belief), belief.shape[1])
        r = self.predicted(situation, table=True)
        mean = np.einsum("nz,nzs->ns", belief, r)
        var = np.einsum("nz,nzs->ns", belief, (r - mean[:, None]) ** 2)
        return mean - self.settings.kappa * np.sqrt(np.maximum(var, 0.0)) + self._tie_break()

    def choose_test(self, belief: np.ndarray, situation: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The test choice of each row: `greedy` on the method's test score (`belief`: the decision beliefs)."""
        scores = self.test_scores(belief, situation) if self.kind == "uka" else self.prior_scores(situation)
        return greedy(scores, u)

    def choose_train(self, belief: np.ndarray, situation: np.ndarray, tried: list[int], u: float) -> int:
        """The training choice: `greedy` on the method's training score, the strategies already tried excluded."""
        exclude = np.zeros((1, len(nw.STRATEGIES)), bool)
        exclude[0, tried] = True
        scores = self.train_scores(belief, situation) if self.kind == "uka" else self.prior_scores(situation)
        return int(greedy(scores, np.array([u]), exclude)[0])


def new_memory(method: str) -> PrincipleMemory | KnowledgeMemory | None:
    kind = "uka" if method.startswith("uka") else method
    return {"standard": None, "principles": PrincipleMemory(), "uka": KnowledgeMemory()}[kind]


def acquire(
    world: nw.World, method: str, seed: int, settings: Settings, emb: Embeddings, users: nw.Users | None = None
) -> tuple[Agent, pd.DataFrame]:
    """Self-play knowledge acquisition (spec sections 2.2 and 2.3): up to `dialogues` training users, at most
    `budget_turns` simulated turns in all (revisions count). A turn whose reward does not beat the previous turn's
    is revised (backtrack: the user never saw it) up to `max_revisions` times; the last attempt stands if none wins.
    `users`: the training users (default: the seed's own draw). Returns the agent with its memory and one row per
    simulated attempt."""
    if users is None:
        users = nw.sample_users(stream(seed, "train_users"), settings.dialogues)
    agent = Agent(method, settings, agent_likelihood(world, seed, settings, users), emb, new_memory(method))
    if len(users) < settings.dialogues:
        raise ValueError(f"{len(users)} training users for training.dialogues = {settings.dialogues}")
    rng = stream(seed, "train_noise")
    rows, budget = [], settings.budget_turns
    for i in range(settings.dialogues):
        if budget <= 0:
            break
        user = users.take([i])
        d, b, last, r_prev = user.d0, bf.uniform(1, len(nw.NEEDS)), nw.NO_FEEDBACK, R_START
        for t in range(settings.turns):
            if budget <= 0:
                break
            sit = nw.situation_index(nw.phase_of(t), user.emotion, user.problem, np.array([last]))
            tried, attempts = [], []
            for attempt in range(settings.max_revisions + 1):
                s = agent.choose_train(b, sit, tried, float(rng.random()))
                out = world.step(user.need, d, t, np.array([s]), nw.TurnNoise.draw(rng, 1, settings.critic_samples))
                budget -= 1
                b_after = bf.update(b, agent.likelihood, [s], out.feedback)
                won = bool(out.reward[0] > r_prev)
                attempts.append((s, out, b_after))
                rows.append(
                    {
                        "dialogue": i,
                        "turn": t,
                        "attempt": attempt,
                        "strategy": s,
                        "reward": float(out.reward[0]),
                        "won": won,
                        "success": bool(out.success[0]),
                        "need": int(user.need[0]),
                        "inferred_need": int(b_after[0].argmax()),
                    }
                )
                if won or budget <= 0:
                    break
                tried.append(s)
            s, out, b_after = attempts[-1]
            if rows[-1]["won"]:
                _write(agent, int(sit[0]), attempts)
            d, b, last, r_prev = out.distress, b_after, int(out.feedback[0]), float(out.reward[0])
            if out.success[0]:
                break
    return agent, pd.DataFrame(rows)


def _write(agent: Agent, situation: int, attempts: list) -> None:
    """After a winning attempt: a principle (the winner, rather than the failed ones), or UKA's knowledge entries
    (the winner and, after revisions, each failed attempt with its reward), labelled with the inferred need."""
    s_win, out_win, b_win = attempts[-1]
    if agent.kind == "principles":
        agent.memory.add(situation, s_win, [a[0] for a in attempts[:-1]])
    elif agent.kind == "uka":
        for s, out, b_after in attempts:
            agent.memory.add(situation, int(b_after[0].argmax()), s, float(out.reward[0]))


def run_episodes(
    world: nw.World, agent: Agent, users: nw.Users, noise: list[nw.TurnNoise], settings: Settings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Test episodes, all users at once, no backtracking: each user's dialogue ends on success (distress <= 0.3)
    or after `turns` turns. Returns (one row per user, one row per user and turn; `uniform_choice`: the strategy UKA's
    rule would have played there under the uniform belief, -1 for the other methods)."""
    n, Z = len(users), len(nw.NEEDS)
    d, b = users.d0.copy(), bf.uniform(n, Z)
    last = np.full(n, nw.NO_FEEDBACK)
    active, success, turns = np.ones(n, bool), np.zeros(n, bool), np.zeros(n, int)
    entropy_t3 = np.full(n, np.nan)
    per_turn = []
    for t in range(settings.turns):
        idx = np.flatnonzero(active)
        if idx.size:
            sit = nw.situation_index(nw.phase_of(t), users.emotion[idx], users.problem[idx], last[idx])
            s = agent.choose_test(agent.decision_belief(b, idx), sit, noise[t].agent[idx])
            # what the same rule would play here under the uniform belief (UKA's arms): how often the belief matters
            flat = (
                agent.choose_test(bf.uniform(idx.size, Z), sit, noise[t].agent[idx])
                if agent.kind == "uka"
                else np.full(idx.size, -1)
            )
            out = world.step(users.need[idx], d[idx], t, s, noise[t].take(idx))
            b[idx] = bf.update(b[idx], agent.likelihood, s, out.feedback)
            d[idx], last[idx] = out.distress, out.feedback
            turns[idx] += 1
            success[idx] = out.success
            active[idx] = ~out.success
            per_turn.append(
                pd.DataFrame(
                    {
                        "user": idx,
                        "turn": t,
                        "strategy": s,
                        "uniform_choice": flat,
                        "feedback": out.feedback,
                        "reward": out.reward,
                        "distress": out.distress,
                        "entropy": bf.entropy(b[idx]),
                    }
                )
            )
        if t == 2:
            entropy_t3 = bf.entropy(b)  # after three observed replies (or the last, for a dialogue already over)
    if settings.turns < 3:
        entropy_t3 = bf.entropy(b)
    per_user = pd.DataFrame(
        {
            "user": np.arange(n),
            "need": users.need,
            "success": success,
            "turns": np.where(success, turns, settings.turns),
            "entropy_t3": entropy_t3,
            "need_accuracy": (b.argmax(axis=1) == users.need).astype(float),
            "final_distress": d,
        }
    )
    return per_user, pd.concat(per_turn, ignore_index=True) if per_turn else pd.DataFrame()


def evaluation_users(seed: int, n: int) -> nw.Users:
    """The seed's test users (the same for every method and world)."""
    return nw.sample_users(stream(seed, "test_users"), n)


def evaluation_noise(seed: int, n: int, settings: Settings) -> list[nw.TurnNoise]:
    """The pre-drawn noise of the seed's test episodes (common random numbers across methods and worlds)."""
    return nw.draw_noise(stream(seed, "test_noise"), n, settings.turns, settings.critic_samples)


def identify_need(
    world: nw.World, likelihood: np.ndarray, users: nw.Users, noise: list[nw.TurnNoise], turns: int
) -> np.ndarray:
    """The ToM machinery alone (spec section 10.6): every turn, play the strategy of largest EIG under
    `likelihood`, observe the user's feedback and update the belief; no stopping. Returns the final beliefs."""
    b, d = bf.uniform(len(users), len(nw.NEEDS)), users.d0.copy()
    for t in range(turns):
        s = np.argmax(bf.eig(b, likelihood), axis=1)
        out = world.step(users.need, d, t, s, noise[t])
        b, d = bf.update(b, likelihood, s, out.feedback), out.distress
    return b
