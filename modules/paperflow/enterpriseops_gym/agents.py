"""The offline agents (spec section 3): no model, each a plausible bound on what an agent can do.

- noop: declines every request, calls nothing.
- random: uniform tool, arguments sampled from the schema (strings from the request's words and the ids seen in
  earlier results), `max_calls` calls.
- heuristic: a keyword planner; picks the action tool whose name best matches the request, resolves its id
  arguments with one lookup each from entities it can read off the request (numbers, emails, tags, quoted text,
  capitalised names), fills the rest from quoted text and enum words, and declines when a call is refused.
- golden: replays the golden plan, resolving its symbolic references ("$2.result.id") against this run's results.
- golden_guided: replays the trajectory recorded under another salt (other minted ids), rewriting every id that
  the recording minted into the one minted at the same place in this run (what the official orchestrator asks an
  LLM to do); with `rewrite=False` it replays the recorded ids literally (the negative control).
- golden_literal: golden_guided with `rewrite=False`, run as an agent of its own: the control of the claims that
  golden replay and the scripted model solve every task (a near-miss plan the verifiers must reject).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.harness import Session, parse_content
from paperflow.enterpriseops_gym.tasks import render, resolve

REFUSAL = "I cannot help with this request."


@dataclass
class Noop:
    name: str = "noop"

    def act(self, task: Mapping[str, Any], session: Session):
        return REFUSAL, [{"role": "assistant", "content": REFUSAL}]


def _collect_ids(payload: Any, out: list[str]) -> None:
    if isinstance(payload, dict):
        for k, v in payload.items():
            if (k == "id" or k.endswith("_id")) and isinstance(v, str):
                out.append(v)
            _collect_ids(v, out)
    elif isinstance(payload, list):
        for v in payload:
            _collect_ids(v, out)


@dataclass
class RandomAgent:
    seed: int
    max_calls: int = 10
    name: str = "random"

    def act(self, task: Mapping[str, Any], session: Session):
        rng = random.Random(f"{self.seed}:{task['task_id']}:{task['eog']['mode']}")
        words = re.findall(r'"([^"]+)"|([\w.@+-]+)', task["user_prompt"])
        pool = [a or b for a, b in words]
        flow = []
        for _ in range(self.max_calls):
            name = rng.choice(session.names)
            args = {}
            params = T.CATALOGUE[name].parameters
            for p, spec in params["properties"].items():
                if p not in params["required"] and rng.random() > 0.3:
                    continue
                if "enum" in spec:
                    args[p] = rng.choice(spec["enum"])
                elif spec.get("type") == "integer":
                    args[p] = rng.randint(spec.get("minimum", 0), spec.get("maximum", 10))
                else:
                    args[p] = rng.choice(pool)
            result = session.call(name, args)
            _collect_ids(parse_content(result)[1], pool)
            flow.append({"tool": name, "args": args, "isError": result["isError"]})
        return "Finished.", flow


NUMBER = re.compile(r"\b(?:INC|PRB|CHG|HRC|CS)\d{7}\b")
EMAIL = re.compile(r"[\w.+-]+@[\w.-]+\.\w+")
TAG = re.compile(r"\bP\d{6}\b")
QUOTED = re.compile(r'"([^"]+)"')
CAPS = re.compile(r"\b(?:[A-Z][a-z]+)(?: [A-Z][a-z]+)*\b")
VERBS = {
    "open": "create",
    "create": "create",
    "resolve": "state",
    "close": "state",
    "assign": "assign",
    "give": "assign",
    "escalate": "escalate",
    "link": "link",
    "move": "update",
    "add": "add",
    "submit": "submit",
    "offboard": "status",
    "terminated": "status",
    "send": "notification",
}
ID_KINDS = {  # argument -> the words of the entity its lookup is named after
    "caller_id": "user",
    "user_id": "user",
    "subject_person_id": "user",
    "assignee_id": "user",
    "recipient_id": "user",
    "manager_id": "user",
    "incident_id": "incidents",
    "group_id": "group",
    "assignment_group_id": "group",
    "problem_id": "problems",
    "change_id": "changes",
    "asset_id": "assets",
    "account_id": "account",
    "contact_id": "contact",
    "hr_service_id": "service",
}


def _tokens(text: str) -> set[str]:
    return {w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower())}


@dataclass
class Heuristic:
    name: str = "heuristic"

    def act(self, task: Mapping[str, Any], session: Session):
        prompt = task["user_prompt"]
        words = _tokens(prompt)
        entities = {
            "number": NUMBER.findall(prompt),
            "email": EMAIL.findall(prompt),
            "asset_tag": TAG.findall(prompt),
            "quoted": QUOTED.findall(prompt),
            "name": [c for c in CAPS.findall(QUOTED.sub("", prompt)) if c.split()[0] not in ("Open", "Who", "What")],
        }
        intents = {VERBS[w] for w in re.findall(r"[a-z]+", prompt.lower()) if w in VERBS}
        writes = [n for n in session.names if T.CATALOGUE[n].writes]
        reads = [n for n in session.names if not T.CATALOGUE[n].writes]

        def score(name: str) -> int:
            return len(_tokens(name.replace("_", " ")) & (words | intents))

        flow: list[dict[str, Any]] = []

        def call(name: str, args: dict[str, Any]) -> tuple[bool, Any]:
            ok, payload = parse_content(session.call(name, args))
            flow.append({"tool": name, "args": args, "ok": ok})
            return ok, payload

        def lookup(kind: str) -> tuple[str | None, Any]:
            """The id of the request's entity of `kind`, from the best-named read tool it can fill."""
            for tool in sorted(reads, key=lambda n: -len(_tokens(n.replace("_", " ")) & {kind.rstrip("s")})):
                if kind.rstrip("s") not in _tokens(tool.replace("_", " ")):
                    continue
                props = T.CATALOGUE[tool].parameters["properties"]
                for p in props:
                    for value in entities.get(p, []) + (entities["name"] if p == "name" else []):
                        ok, payload = call(tool, {p: value})
                        if ok and isinstance(payload, dict) and payload.get("items"):
                            return payload["items"][0].get("id"), payload["items"][0]
                        if ok and isinstance(payload, dict) and "id" in payload:
                            return payload["id"], payload
            return None, None

        if not intents or not writes:  # a question: look the thing up and answer with what was found
            for kind in ("incidents", "user", "account", "contact"):
                _, row = lookup(kind)
                if row:
                    for key in sorted(row, key=lambda k: -len(_tokens(k.replace("_", " ")) & words)):
                        if key.endswith(("_id", "_to")) and isinstance(row[key], str) and row[key].startswith("usr"):
                            ok, user = (
                                call("get_user", {"user_id": row[key]})
                                if "get_user" in session.names
                                else (False, None)
                            )
                            if ok:
                                return f"{user['name']} ({user['email']})", flow
                    return json.dumps(row), flow
            return REFUSAL, flow
        action = max(writes, key=score)  # ties: the first listed
        params = T.CATALOGUE[action].parameters
        args: dict[str, Any] = {}
        quoted = list(entities["quoted"])
        for p, spec in params["properties"].items():
            if p in ID_KINDS:
                found, _ = lookup(ID_KINDS[p])
                if found is not None:
                    args[p] = found
            elif "enum" in spec:
                hits = [v for v in spec["enum"] if v in prompt.lower() or v.rstrip("d") in prompt.lower()]
                if hits:
                    args[p] = hits[-1]
            elif spec.get("type") == "integer":
                m = re.search(r"priority (\d)", prompt)
                if m:
                    args[p] = int(m.group(1))
            elif p == "email" and entities["email"]:
                args[p] = entities["email"][0]
            elif p == "name" and entities["name"]:
                args[p] = entities["name"][0]
            elif quoted and p in params["required"] or (quoted and p.endswith("notes")):
                args[p] = quoted.pop(0)
        ok, payload = call(action, args)
        if not ok:
            return (
                f"I cannot complete this: {payload.get('error', {}).get('message', payload) if isinstance(payload, dict) else payload}",
                flow,
            )
        return "Done.", flow


@dataclass
class Golden:
    name: str = "golden"

    def act(self, task: Mapping[str, Any], session: Session):
        results: dict[int, Any] = {}
        flow = []
        for k, step in enumerate(task["eog"]["golden_plan"], 1):
            args = resolve(step["args"], results)
            ok, payload = parse_content(session.call(step["tool"], args))
            if ok:
                results[k] = payload
            flow.append({"tool": step["tool"], "args": args, "ok": ok})
        return render(task["eog"]["final_answer"], results), flow


def _pair_strings(old: Any, new: Any, mapping: dict[str, str]) -> None:
    """Walk a recorded result and this run's result together: where a string differs, the recorded one maps to
    this run's (the ids minted at the same place)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in old.keys() & new.keys():
            _pair_strings(old[k], new[k], mapping)
    elif isinstance(old, list) and isinstance(new, list):
        for a, b in zip(old, new):
            _pair_strings(a, b, mapping)
    elif isinstance(old, str) and isinstance(new, str) and old != new:
        mapping[old] = new


def _rewrite(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _rewrite(v, mapping) for k, v in value.items()}
    if isinstance(value, str):
        for old, new in mapping.items():
            value = value.replace(old, new)
    return value


@dataclass
class GoldenGuided:
    rewrite: bool = True
    name: str = "golden_guided"

    def act(self, task: Mapping[str, Any], session: Session):
        mapping: dict[str, str] = {}
        flow = []
        for step in task["eog"]["recorded_trajectory"]:
            args = _rewrite(step["args"], mapping) if self.rewrite else step["args"]
            ok, payload = parse_content(session.call(step["tool"], args))
            if ok and self.rewrite:
                _pair_strings(step["result"], payload, mapping)
            flow.append({"tool": step["tool"], "args": args, "ok": ok})
        answer = task["eog"]["recorded_answer"]
        return (_rewrite(answer, mapping) if self.rewrite else answer), flow


def golden_literal() -> GoldenGuided:
    return GoldenGuided(rewrite=False, name="golden_literal")


OFFLINE = {
    "noop": Noop,
    "heuristic": Heuristic,
    "golden": Golden,
    "golden_guided": GoldenGuided,
    "golden_literal": golden_literal,
}
