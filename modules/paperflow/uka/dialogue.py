"""UKA's paper-scale dialogues: one open LLM plays the supporter (realising the planner's strategy), the help-seeker
(an ESConv case), the critic (PPDPP's four verdicts, l samples, the keyword parse of `needworld.critic_reward`),
the feedback reader (the seeker's reply as one of NeedWorld's feedback classes, which the ToM belief observes), the
theory-of-mind model (the likelihood L~[need, strategy, feedback] elicited from the LLM) and the pairwise judge.

The planners are the smoke scale's (`agents.Agent`, the same greedy decision rule): PRINCIPLES-like scores the
strategy prior reweighted by retrieved principles, UKA scores strategies by EIG and retrieved rewards under its belief,
the permuted-ToM control reads another test case's belief (`agents.belief_shuffle`); `standard` is the LLM with no
strategy instruction at all. The test dialogues advance turn by turn over all cases (`run_test`), as at smoke scale,
so that a turn's choices read every case's belief of that turn. Every request carries a seed derived from (seed, case, turn, attempt, role),
so a rerun against the same server asks the same questions.

A long job resumes (README, "Long jobs resume"): `run_test`, `acquire` and `win_rates` take an optional `journal`
(a `RowJournal` keyed by "key", in the job's checkpoint folder) that keeps each finished LLM unit, a simulated turn or
a judged pair, under the request seeds that name it. A rerun replays the planner (its beliefs, memory and generators
are recomputed, not saved) and takes the units already there from the journal instead of the server, so it asks only
the remaining ones and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.lm.serve import Client
from paperflow.core.resume import RowJournal
from paperflow.uka import agents as ag
from paperflow.uka import belief as bf
from paperflow.uka import esconv
from paperflow.uka import needworld as nw
from paperflow.uka.llm import chat_texts
from paperflow.uka.memory import Embeddings

log = logging.getLogger(__name__)

# what the supporter is asked to do for each ESConv strategy (after PPDPP's ESConvAct, in our words)
STRATEGY_ACT = {
    "Question": "Ask the seeker to say more about what they just described.",
    "Restatement or Paraphrasing": "Restate in your own words what the seeker just said.",
    "Reflection of feelings": "Name and acknowledge the feelings the seeker is expressing.",
    "Self-disclosure": "Share a brief, relevant experience of your own.",
    "Affirmation and Reassurance": "Affirm the seeker's strengths and reassure them.",
    "Providing Suggestions": "Suggest something concrete the seeker could do.",
    "Information": "Give factual information that helps with the seeker's situation.",
    "Others": "Chat with the seeker warmly.",
}
FEEDBACK_DEFINITION = {
    "elaborates": "tells more about their problem or feelings",
    "agrees": "agrees with or accepts what the supporter said",
    "pushes_back": "disagrees, rejects or resists what the supporter said",
    "asks_help": "asks the supporter for help, advice or information",
    "short": "gives a short or non-committal answer",
}
NEED_DEFINITION = {
    "validation": "to have their feelings validated",
    "understanding": "to feel understood",
    "advice": "practical advice on what to do",
    "information": "information about their situation",
}
# the critic's instruction and its four verdict sentences (PPDPP's ESConv critic; the parse is by keyword)
CRITIC_SYSTEM = (
    "Given a conversation between a Supporter and a Seeker, assess whether the Seeker's emotional issue has been "
    "solved after the conversation."
)
CRITIC_CHOICES = (
    "No, the Seeker feels worse. No, the Seeker feels the same. No, but the Seeker feels better. "
    "Yes, the Seeker's issue has been solved."
)
SEEKER_OPENING = "Hi, what would you like to talk about today?"  # as PPDPP's "Now tell me your issue."
ROLE_IDS = {"supporter": 1, "seeker": 2, "critic": 3, "feedback": 4, "tom": 5, "judge": 6}
SPEAKER = {"supporter": "Supporter", "seeker": "Seeker"}


def request_seed(*parts: int) -> int:
    """A request's sampling seed from integer parts (seed, case, turn, attempt, role id)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def first_class(text: str, names: Sequence[str]) -> int:
    """The index of the name (of `names`) that occurs first in the lowercased text, -1 when none does."""
    low = text.lower().replace("-", "_").replace(" ", "_")
    hits = [(low.find(n), i) for i, n in enumerate(names) if n in low]
    return min(hits)[1] if hits else -1


def transcript_text(history: Sequence[Mapping[str, str]]) -> str:
    return " ".join(f"{SPEAKER[t['role']]}: {t['content']}" for t in history)


@dataclass
class Roles:
    """The LLM roles of one job: one client, the sampling settings of each role (`llm` config block)."""

    client: Client
    llm: Mapping[str, Mapping[str, Any]]

    def _ask(self, role: str, messages: list[dict[str, str]], seed: int, n: int = 1) -> list[str]:
        cfg = self.llm[role]
        return chat_texts(
            self.client, messages, temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], n=n, seed=seed
        )

    def supporter(self, history: Sequence[Mapping[str, str]], strategy: int, seed: int) -> str:
        """The supporter's next utterance; strategy -1 (Standard) gives no strategy instruction."""
        act = "" if strategy < 0 else " " + STRATEGY_ACT[nw.STRATEGIES[strategy]]
        system = (
            "You are a supporter in an emotional-support conversation. Help the seeker reduce their emotional "
            f"distress and work through their challenges. Reply with one short sentence.{act}"
        )
        chat = [{"role": "user" if t["role"] == "seeker" else "assistant", "content": t["content"]} for t in history]
        return self._ask("supporter", [{"role": "system", "content": system}, *chat], seed)[0].strip()

    def seeker(self, case: Mapping[str, Any], history: Sequence[Mapping[str, str]], seed: int) -> str:
        system = (
            f"You play a help-seeker in an emotional-support conversation. You feel {case['emotion']} about "
            f"{case['problem']}. Your situation: {case['situation']} Reply to the supporter with one short sentence."
        )
        chat = [{"role": "user" if t["role"] == "supporter" else "assistant", "content": t["content"]} for t in history]
        opening = {"role": "user", "content": SEEKER_OPENING}  # the history starts with the seeker's own turn
        return self._ask("seeker", [{"role": "system", "content": system}, opening, *chat], seed)[0].strip()

    def critic(self, case: Mapping[str, Any], history: Sequence[Mapping[str, str]], samples: int, seed: int):
        """(the `samples` verdict texts, r_t = their keyword-parsed mean: spec section 2.1)."""
        user = (
            f"You can only reply with one of the following sentences: {CRITIC_CHOICES}\n\nThe following is a "
            f"conversation about {case['emotion']} regarding {case['problem']}: {transcript_text(history)}\n"
            "Question: Has the Seeker's issue been solved? Answer: "
        )
        texts = self._ask(
            "critic", [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}], seed, n=samples
        )
        return texts, nw.critic_reward(texts)

    def feedback(self, history: Sequence[Mapping[str, str]], seed: int) -> int:
        """The class (index into nw.FEEDBACK) of the seeker's last reply, -1 when the answer names none."""
        classes = "; ".join(f"{k}: the seeker {v}" for k, v in FEEDBACK_DEFINITION.items())
        user = (
            f"Conversation: {transcript_text(history[-2:])}\nClassify the Seeker's last reply as exactly one of "
            f"these labels ({classes}). Answer with the label only."
        )
        return first_class(self._ask("feedback", [{"role": "user", "content": user}], seed)[0], nw.FEEDBACK)

    def tom_sample(self, need: int, strategy: int, samples: int, seed: int) -> list[int]:
        """`samples` predicted feedback classes of a seeker who wants `need` to a supporter using `strategy`."""
        s = nw.STRATEGIES[strategy]
        classes = "; ".join(f"{k}: the seeker {v}" for k, v in FEEDBACK_DEFINITION.items())
        user = (
            f"A help-seeker in an emotional-support conversation mainly wants {NEED_DEFINITION[nw.NEEDS[need]]}. The "
            f"supporter's last turn used the strategy '{s}' ({STRATEGY_ACT[s]}). How does the seeker most likely "
            f"reply? Choose one label ({classes}). Answer with the label only."
        )
        return [
            first_class(t, nw.FEEDBACK) for t in self._ask("tom", [{"role": "user", "content": user}], seed, samples)
        ]

    def judge(self, case: Mapping[str, Any], a: Sequence[Mapping[str, str]], b: Sequence[Mapping[str, str]], seed: int):
        """'A', 'B' or None (an answer that starts with neither)."""
        user = (
            f"Two supporters talked with the same help-seeker, who feels {case['emotion']} about {case['problem']}."
            f"\nConversation A: {transcript_text(a)}\nConversation B: {transcript_text(b)}\n"
            "Which supporter helped the seeker more? Answer with A or B only."
        )
        answer = self._ask("judge", [{"role": "user", "content": user}], seed)[0].strip().upper()
        return answer[0] if answer[:1] in ("A", "B") else None


def elicit_tom(roles: Roles, samples: int, seed: int) -> dict[str, Any]:
    """The ToM likelihood L~[need, strategy, feedback]: `samples` LLM predictions per (need, strategy), add-one
    smoothed (a row whose answers all fail to parse is uniform). Returns the table, the counts and the unparsed."""
    Z, S, U = len(nw.NEEDS), len(nw.STRATEGIES), len(nw.FEEDBACK)
    counts, unparsed = np.zeros((Z, S, U)), 0
    for z in range(Z):
        for s in range(S):
            for u in roles.tom_sample(z, s, samples, request_seed(seed, z, s, 0, ROLE_IDS["tom"])):
                if u < 0:
                    unparsed += 1
                else:
                    counts[z, s, u] += 1
    likelihood = bf.estimate_likelihood(counts, 1.0)
    return {"likelihood": likelihood.tolist(), "counts": counts.tolist(), "unparsed": unparsed, "samples": samples}


def paper_likelihood(tom: Mapping[str, Any]) -> np.ndarray:
    """The agent's L~ at paper scale: the elicited table (the same for every method)."""
    return np.asarray(tom["likelihood"], dtype=float)


@dataclass(frozen=True)
class Axes:
    """The situation axes of the cases: index a (turn, case, last feedback) into the embedded vocabulary."""

    emotions: list[str]
    problems: list[str]

    def index(self, turn: int, case: Mapping[str, Any], last: int) -> np.ndarray:
        return np.atleast_1d(
            esconv.situation_index(
                nw.phase_of(turn),
                self.emotions.index(case["emotion"]),
                self.problems.index(case["problem"]),
                last,
                len(self.emotions),
                len(self.problems),
            )
        )


def make_agent(
    method: str,
    settings: ag.Settings,
    tom: Mapping[str, Any],
    emb: Embeddings,
    memory=None,
    shuffle: np.ndarray | None = None,
):
    """The planner of `method` (None for standard: the LLM alone); `shuffle`: the permuted-ToM control's
    derangement of the test cases (agents.belief_shuffle)."""
    if method == "standard":
        return None
    return ag.Agent(method, settings, paper_likelihood(tom), emb, memory, shuffle)


def _turn(roles: Roles, case, history, strategy: int, critic_samples: int, seeds: Sequence[int]):
    """One simulated turn after `history`: (supporter text, seeker text, critic texts, reward, feedback class)."""
    said = roles.supporter(history, strategy, request_seed(*seeds, ROLE_IDS["supporter"]))
    after = [*history, {"role": "supporter", "content": said}]
    reply = roles.seeker(case, after, request_seed(*seeds, ROLE_IDS["seeker"]))
    after = [*after, {"role": "seeker", "content": reply}]
    verdicts, reward = roles.critic(case, after, critic_samples, request_seed(*seeds, ROLE_IDS["critic"]))
    feedback = roles.feedback(after, request_seed(*seeds, ROLE_IDS["feedback"]))
    return said, reply, verdicts, reward, feedback


def unit_key(kind: str, parts: Sequence[int]) -> str:
    """A journalled unit's key: its kind and the integer parts of its request seeds."""
    return "/".join([kind, *(str(int(p)) for p in parts)])


def _journalled(journal: RowJournal | None, key: str) -> dict | None:
    return journal.complete([key])[0] if journal is not None and key in journal else None


_TURN_FIELDS = ("said", "reply", "verdicts", "reward", "feedback")


def _journal_turn(journal: RowJournal | None, seeds: Sequence[int], turn: tuple) -> tuple:
    if journal is not None:
        journal.append({"key": unit_key("turn", seeds), **dict(zip(_TURN_FIELDS, turn))})
    return turn


def _journalled_turn(
    roles: Roles, case, history, strategy: int, critic_samples: int, seeds: Sequence[int], journal: RowJournal | None
) -> tuple:
    """`_turn`, or its outcome from `journal` when a former run finished it (then nothing is asked)."""
    row = _journalled(journal, unit_key("turn", seeds))
    if row is not None:
        return tuple(row[f] for f in _TURN_FIELDS)
    return _journal_turn(journal, seeds, _turn(roles, case, history, strategy, critic_samples, seeds))


def run_test(
    roles: Roles,
    agent,
    axes: Axes,
    cases: pd.DataFrame,
    settings: ag.Settings,
    success: float,
    seed: int,
    concurrency: int,
    journal: RowJournal | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """Every test case's dialogue (no backtracking), turn by turn over all cases as `agents.run_episodes` does at
    smoke scale: each turn the planner chooses for every running case from the beliefs of that turn (its own, or
    the permuted-ToM control's other case's), then the cases' turns run `concurrency` at a time. A dialogue ends
    when r_t >= `success` or after `settings.turns` turns. Returns (per case, per turn, transcripts), in case order.
    `journal`: the finished turns, kept as they come and not asked again on a rerun (module docstring)."""
    records = cases.to_dict("records")
    n = len(records)
    history = [[{"role": "seeker", "content": c["first_user"]}] for c in records]
    b = bf.uniform(n, len(nw.NEEDS))
    last, done = np.full(n, nw.NO_FEEDBACK), np.zeros(n, bool)
    entropy_t3, rows = np.full(n, np.nan), [[] for _ in range(n)]
    rngs = [np.random.default_rng([int(seed), int(c["case"]), 7]) for c in records]
    with ThreadPoolExecutor(max_workers=max(int(concurrency), 1)) as pool:
        for t in range(settings.turns):
            idx = np.flatnonzero(~done)
            if not idx.size:
                break
            u = np.array([rngs[i].random() for i in idx])
            if agent is None:
                strategies = np.full(idx.size, -1)
            else:
                sit = np.concatenate([axes.index(t, records[i], last[i]) for i in idx])
                strategies = agent.choose_test(agent.decision_belief(b, idx), sit, u)
            jobs = [
                (records[i], history[i], int(strategies[k]), (seed, records[i]["case"], t, 0))
                for k, i in enumerate(idx)
            ]
            known = {k: _journalled(journal, unit_key("turn", j[3])) for k, j in enumerate(jobs)}
            todo = [j for k, j in enumerate(jobs) if known[k] is None]
            asked = pool.map(lambda j: _turn(roles, j[0], j[1], j[2], settings.critic_samples, j[3]), todo)
            asked = iter([_journal_turn(journal, j[3], out) for j, out in zip(todo, asked)])  # kept as they come
            turns = [
                next(asked) if known[k] is None else tuple(known[k][f] for f in _TURN_FIELDS) for k in range(len(jobs))
            ]
            for k, i in enumerate(idx):
                s, (said, reply, verdicts, reward, fb) = int(strategies[k]), turns[k]
                history[i] += [
                    {"role": "supporter", "content": said, "strategy": s},
                    {"role": "seeker", "content": reply},
                ]
                if agent is not None and fb >= 0:
                    b[i] = bf.update(b[i : i + 1], agent.likelihood, [s], [fb])[0]
                last[i] = fb if fb >= 0 else nw.NO_FEEDBACK
                done[i] = reward >= success
                rows[i].append(
                    {
                        "case": int(records[i]["case"]),
                        "turn": t,
                        "strategy": s,
                        "feedback": fb,
                        "reward": reward,
                        "entropy": float(bf.entropy(b[i])) if agent is not None else np.nan,
                        "verdicts": verdicts,
                    }
                )
                if t == 2:
                    entropy_t3[i] = rows[i][-1]["entropy"]
    summaries = []
    for i, c in enumerate(records):
        e3 = entropy_t3[i]
        if agent is not None and np.isnan(e3):
            e3 = float(bf.entropy(b[i]))  # a dialogue shorter than three turns: its last belief
        summaries.append(
            {
                "case": int(c["case"]),
                "success": bool(done[i]),
                "turns": len(rows[i]) if done[i] else settings.turns,
                "final_reward": rows[i][-1]["reward"],
                "entropy_t3": e3,
            }
        )
    per_turn = pd.DataFrame([r for case_rows in rows for r in case_rows])
    return (
        pd.DataFrame(summaries),
        per_turn,
        [{"case": int(c["case"]), "history": history[i]} for i, c in enumerate(records)],
    )


def acquire(
    roles: Roles,
    agent,
    axes: Axes,
    cases: pd.DataFrame,
    settings: ag.Settings,
    success: float,
    seed: int,
    journal: RowJournal | None = None,
) -> pd.DataFrame:
    """Self-play knowledge acquisition on the training cases, as `agents.acquire` at smoke scale: a turn whose
    critic reward does not beat the previous one is revised (the seeker never saw it) up to `max_revisions` times,
    the budget counts every simulated turn, and a winning attempt writes the memory. One dialogue after another:
    each uses what the earlier ones wrote. Returns one row per simulated attempt. `journal`: the finished turns, kept
    as they come; a rerun replays the dialogues (the memory grows again) asking only the turns not there."""
    rng = np.random.default_rng([int(seed), 11])
    rows, budget = [], settings.budget_turns
    for i, case in enumerate(cases.head(settings.dialogues).to_dict("records")):
        if budget <= 0:
            break
        history = [{"role": "seeker", "content": case["first_user"]}]
        b, last, r_prev = bf.uniform(1, len(nw.NEEDS)), nw.NO_FEEDBACK, ag.R_START
        for t in range(settings.turns):
            if budget <= 0:
                break
            sit = axes.index(t, case, last)
            tried, attempts = [], []
            for attempt in range(settings.max_revisions + 1):
                s = agent.choose_train(b, sit, tried, float(rng.random()))
                said, reply, _, reward, fb = _journalled_turn(
                    roles, case, history, s, settings.critic_samples, (seed, 100000 + i, t, attempt), journal
                )
                budget -= 1
                b_after = bf.update(b, agent.likelihood, [s], [fb]) if fb >= 0 else b
                won = reward > r_prev
                attempts.append((s, _Out(reward), b_after, said, reply, fb))
                rows.append(
                    {
                        "dialogue": i,
                        "case": int(case["case"]),
                        "turn": t,
                        "attempt": attempt,
                        "strategy": s,
                        "reward": reward,
                        "won": won,
                        "success": reward >= success,
                        "feedback": fb,
                        "inferred_need": int(b_after[0].argmax()),
                    }
                )
                if won or budget <= 0:
                    break
                tried.append(s)
            if rows[-1]["won"]:
                ag._write(agent, int(sit[0]), [a[:3] for a in attempts])
            s, out, b, said, reply, fb = attempts[-1]
            history += [{"role": "supporter", "content": said, "strategy": s}, {"role": "seeker", "content": reply}]
            last, r_prev = (fb if fb >= 0 else nw.NO_FEEDBACK), out.value
            if out.value >= success:
                break
    return pd.DataFrame(rows)


class _Out:
    """The reward of an attempt in the shape `agents._write` reads (`out.reward[0]`)."""

    def __init__(self, value: float):
        self.value = float(value)
        self.reward = np.array([self.value])


def win_rates(
    roles: Roles,
    cases: pd.DataFrame,
    mine: Sequence[Mapping],
    theirs: Sequence[Mapping],
    seed: int,
    concurrency: int,
    journal: RowJournal | None = None,
) -> pd.DataFrame:
    """Per test case, the judge's preference for `mine` over `theirs`, asked in both orders (position bias): 1 when
    both answers prefer mine, 0 when both prefer theirs, 0.5 when they split (a tie counts half); an order whose
    answer names neither is left out, NaN when both are. `journal`: the judged cases, kept as they come and not asked
    again on a rerun."""
    by_case = {int(c["case"]): c for c in cases.to_dict("records")}
    a_of, b_of = {t["case"]: t["history"] for t in mine}, {t["case"]: t["history"] for t in theirs}
    if set(a_of) != set(b_of):
        raise ValueError(f"the two methods' transcripts cover different cases: {sorted(set(a_of) ^ set(b_of))[:5]}")

    def ask(case_id: int) -> tuple[str | None, str | None]:
        case = by_case[case_id]
        first = roles.judge(case, a_of[case_id], b_of[case_id], request_seed(seed, case_id, 0, 0, ROLE_IDS["judge"]))
        second = roles.judge(case, b_of[case_id], a_of[case_id], request_seed(seed, case_id, 0, 1, ROLE_IDS["judge"]))
        return first, second

    def row(case_id: int, first: str | None, second: str | None) -> dict:
        votes = [
            v
            for v in (None if first is None else first == "A", None if second is None else second == "B")
            if v is not None
        ]
        return {"case": case_id, "first": first, "second": second, "win": float(np.mean(votes)) if votes else np.nan}

    ids = sorted(a_of)
    known = {c: _journalled(journal, unit_key("judge", (seed, c))) for c in ids}
    known = {c: (r["first"], r["second"]) for c, r in known.items() if r is not None}
    todo = [c for c in ids if c not in known]
    with ThreadPoolExecutor(max_workers=max(int(concurrency), 1)) as pool:
        for c, (first, second) in zip(todo, pool.map(ask, todo)):  # kept as they come
            if journal is not None:
                journal.append({"key": unit_key("judge", (seed, c)), "first": first, "second": second})
            known[c] = (first, second)
    return pd.DataFrame([row(c, *known[c]) for c in ids])
