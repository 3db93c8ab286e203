"""Tasks from parameterised templates (spec sections 2.3 and 7): a policy system prompt, a user request, the acting
identity, a golden plan whose arguments may be symbolic references to earlier results ("$2.result.id": resolved at
replay, so the plan survives ids minted anew in every run), a final-answer template, feasibility, and verifiers.

Verifiers are derived, AppWorld-style, from the difference between the seed database and the database after the
golden replay: every inserted row (by its stable columns; references to minted rows through the referenced row's
label), every changed column of an updated row, the row count of every changed table, and an `unchanged` hash over
every table the golden plan leaves alone (collateral damage). Lookups add a response check and a tool-execution
check; infeasible tasks are verified by the unchanged hash of every table and a response check that the answer
declines.

Each task is written in the official Hugging Face column layout (task_id, domain, system_prompt, user_prompt,
selected_tools, restricted_tools, mcp_endpoint, number_of_runs, reset_database_between_runs, gym_servers_config and
verifiers as JSON text), with our own fields under `eog`.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.sandbox import (
    TABLES,
    Episode,
    Template,
    columns,
    label_column,
)
from paperflow.enterpriseops_gym.sandbox import _literal as sql_literal

REF = re.compile(r"\$(\d+)\.result((?:\.[\w-]+)*)")
MODES = {"oracle": 0, "plus_5": 5, "plus_10": 10}
DOMAINS = ("itsm", "hr", "csm", "hybrid")
INFEASIBLE_KINDS = ("permission", "nonexistent", "policy")
POLICY = {
    "itsm": "You are the IT service desk assistant. Only ITIL agents change incidents, problems, changes and assets. "
    "Incidents move new -> in_progress -> resolved (close notes required) -> closed. Every change is audited.",
    "hr": "You are the HR assistant. Only HR agents read or change other people's HR data; salaries are personal "
    "data. HR cases move new -> in_progress -> resolved (notes required) -> closed. Never guess employee data.",
    "csm": "You are the customer service assistant. Only CSM agents open, escalate or link customer cases; a case's "
    "contact must belong to its account. Closed cases cannot be escalated.",
}
POLICY["hybrid"] = " ".join(POLICY.values())
DECLINE_PREFIX = "I cannot do this"
VOLATILE = re.compile(r"^(id|number)$|_at$")


@dataclass
class Draft:
    template: str
    domain: str
    actor: str
    prompt: str
    plan: list[dict[str, Any]]
    final: str
    feasible: bool = True
    infeasible_kind: str | None = None
    answer_sql: str | None = None  # lookups: the SQL whose result the answer must contain
    category: str = "update"


# ---- symbolic references -----------------------------------------------------------------------------------------


class Unresolved(KeyError):
    """A reference to a result that does not exist (a failed or missing step, or a wrong path)."""


def lookup(results: Mapping[int, Any], step: int, path: str) -> Any:
    if step not in results:
        raise Unresolved(f"${step}.result{path}")
    value = results[step]
    for part in [p for p in path.split(".") if p]:
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise Unresolved(f"${step}.result{path}") from exc
    return value


def resolve(value: Any, results: Mapping[int, Any]) -> Any:
    """An argument with every "$k.result.path" replaced by the value in step k's result (1-based steps). A whole-
    string reference keeps the value's type; an unresolvable one stays as the literal text (the tool then fails)."""
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    whole = REF.fullmatch(value)
    try:
        if whole:
            return lookup(results, int(whole.group(1)), whole.group(2))
        return REF.sub(lambda m: str(lookup(results, int(m.group(1)), m.group(2))), value)
    except Unresolved:
        return value


def render(template: str, results: Mapping[int, Any]) -> str:
    """The final answer: "{$2.result.name}" placeholders filled, "?" where a reference cannot be resolved."""

    def one(m: re.Match) -> str:
        try:
            inner = REF.fullmatch(m.group(1))
            return str(lookup(results, int(inner.group(1)), inner.group(2)))
        except Unresolved:
            return "?"

    return re.sub(r"\{(\$[^}]+)\}", one, template)


def replay(ep: Episode, plan: Sequence[Mapping[str, Any]], final: str) -> tuple[list[dict[str, Any]], str]:
    """Run a plan on an episode: the calls made (tool, resolved args, outcome) and the rendered answer. Steps marked
    "skip" are not run (the mutation test's deletions)."""
    results: dict[int, Any] = {}
    calls = []
    for k, step in enumerate(plan, 1):
        if step.get("skip"):  # a step deleted by the mutation test keeps its number
            continue
        args = resolve(step["args"], results)
        out = T.call(ep, step["tool"], args)
        if out["ok"]:
            results[k] = out["result"]
        calls.append({"tool": step["tool"], "args": args, **out})
    return calls, render(final, results)


# ---- templates ------------------------------------------------------------------------------------------------


def _q(conn: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sql, args)]


def _step(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args}


ISSUE_TEXT = ("Conference room display is dead", "Cannot print invoices", "VPN token rejected", "Disk almost full")
NOTES = ("Replaced the faulty cable", "Reset the user profile", "Applied the vendor patch", "Cleared the cache")
ADMIN, ITIL, HR, CSM = "usr0001", "usr0002", "usr0005", "usr0007"


def _employee(conn, rng) -> dict[str, Any]:
    return rng.choice(_q(conn, "SELECT u.* FROM users u JOIN roles r ON r.id = u.role_id WHERE r.name = 'employee'"))


def t_incident_assignee(conn, rng) -> Draft:
    inc = rng.choice(_q(conn, "SELECT * FROM incidents WHERE assigned_to IS NOT NULL"))
    return Draft(
        "incident_assignee",
        "itsm",
        ITIL,
        f"Who is working on incident {inc['number']}? Reply with the assignee's full name.",
        [
            _step("itsm_search_incidents", number=inc["number"]),
            _step("get_user", user_id="$1.result.items.0.assigned_to"),
        ],
        f"Incident {inc['number']} is assigned to {{$2.result.name}}.",
        answer_sql=f"SELECT u.name FROM incidents i JOIN users u ON u.id = i.assigned_to WHERE i.number = '{inc['number']}'",
        category="lookup",
    )


def t_create_incident(conn, rng) -> Draft:
    user, p, text = _employee(conn, rng), rng.randint(2, 4), rng.choice(ISSUE_TEXT)
    return Draft(
        "create_incident",
        "itsm",
        ITIL,
        f'Open a priority {p} incident for {user["email"]}: "{text}".',
        [
            _step("find_user", email=user["email"]),
            _step("itsm_create_incident", caller_id="$1.result.items.0.id", short_description=text, priority=p),
        ],
        "Opened incident {$2.result.number}.",
        category="create",
    )


def t_resolve_incident(conn, rng) -> Draft:
    inc, notes = rng.choice(_q(conn, "SELECT * FROM incidents WHERE state = 'in_progress'")), rng.choice(NOTES)
    return Draft(
        "resolve_incident",
        "itsm",
        ITIL,
        f'Resolve incident {inc["number"]} with the close notes "{notes}".',
        [
            _step("itsm_search_incidents", number=inc["number"]),
            _step(
                "itsm_update_incident_state", incident_id="$1.result.items.0.id", state="resolved", close_notes=notes
            ),
        ],
        f"Incident {inc['number']} is resolved.",
    )


def t_assign_incident(conn, rng) -> Draft:
    inc = rng.choice(_q(conn, "SELECT * FROM incidents WHERE state = 'new'"))
    group = rng.choice(_q(conn, "SELECT * FROM groups WHERE domain = 'itsm'"))
    member = rng.choice(
        _q(conn, "SELECT u.* FROM group_members m JOIN users u ON u.id = m.user_id WHERE m.group_id = ?", group["id"])
    )
    return Draft(
        "assign_incident",
        "itsm",
        ITIL,
        f"Assign incident {inc['number']} to the {group['name']} group and to {member['email']}.",
        [
            _step("itsm_search_incidents", number=inc["number"]),
            _step("itsm_find_group", name=group["name"]),
            _step("find_user", email=member["email"]),
            _step(
                "itsm_assign_incident",
                incident_id="$1.result.items.0.id",
                group_id="$2.result.items.0.id",
                assignee_id="$3.result.items.0.id",
            ),
        ],
        f"Incident {inc['number']} is assigned.",
    )


def t_problem_from_incident(conn, rng) -> Draft:
    inc = rng.choice(_q(conn, "SELECT * FROM incidents WHERE state IN ('new', 'in_progress')"))
    text = f"Root cause: {inc['short_description'].lower()}"
    return Draft(
        "problem_from_incident",
        "itsm",
        ITIL,
        f'Open a problem "{text}" and link incident {inc["number"]} to it.',
        [
            _step("itsm_search_incidents", number=inc["number"]),
            _step("itsm_create_problem", short_description=text),
            _step("itsm_link_incident_to_problem", incident_id="$1.result.items.0.id", problem_id="$2.result.id"),
        ],
        "Opened problem {$2.result.number} and linked " + inc["number"] + ".",
        category="multi",
    )


def t_change_request(conn, rng) -> Draft:
    group = rng.choice(_q(conn, "SELECT * FROM groups WHERE domain = 'itsm'"))
    risk, text = (
        rng.choice(["low", "moderate", "high"]),
        f"Upgrade {rng.choice(['firewall', 'backup', 'proxy'])} firmware",
    )
    return Draft(
        "change_request",
        "itsm",
        ITIL,
        f'Create a {risk} risk change request "{text}" for the {group["name"]} group and submit it for assessment.',
        [
            _step("itsm_find_group", name=group["name"]),
            _step(
                "itsm_create_change_request",
                short_description=text,
                risk=risk,
                assignment_group_id="$1.result.items.0.id",
            ),
            _step("itsm_submit_change", change_id="$2.result.id"),
        ],
        "Change {$2.result.number} is awaiting assessment.",
        category="multi",
    )


def t_assign_asset(conn, rng) -> Draft:
    asset, user = rng.choice(_q(conn, "SELECT * FROM assets WHERE state = 'in_stock'")), _employee(conn, rng)
    return Draft(
        "assign_asset",
        "itsm",
        ITIL,
        f"Give asset {asset['asset_tag']} to {user['email']}.",
        [
            _step("itsm_search_assets", asset_tag=asset["asset_tag"]),
            _step("find_user", email=user["email"]),
            _step("itsm_assign_asset", asset_id="$1.result.items.0.id", user_id="$2.result.items.0.id"),
        ],
        f"Asset {asset['asset_tag']} now belongs to {user['email']}.",
    )


def t_manager_lookup(conn, rng) -> Draft:
    user = _employee(conn, rng)
    return Draft(
        "manager_lookup",
        "hr",
        HR,
        f"Who is the manager of {user['email']}? Reply with the manager's full name.",
        [
            _step("find_user", email=user["email"]),
            _step("hr_get_profile", user_id="$1.result.items.0.id"),
            _step("get_user", user_id="$2.result.manager_id"),
        ],
        "The manager is {$3.result.name}.",
        answer_sql=f"SELECT m.name FROM hr_profiles p JOIN users m ON m.id = p.manager_id WHERE p.user_id = '{user['id']}'",
        category="lookup",
    )


def t_hr_case(conn, rng) -> Draft:
    user, service = _employee(conn, rng), rng.choice(_q(conn, "SELECT * FROM hr_services"))
    p, text = rng.randint(2, 4), f"Please help with {service['name'].lower()}"
    return Draft(
        "hr_case",
        "hr",
        HR,
        f'Open a priority {p} HR case for {user["email"]} under the "{service["name"]}" service: "{text}".',
        [
            _step("find_user", email=user["email"]),
            _step("hr_find_service", name=service["name"]),
            _step(
                "hr_create_case",
                subject_person_id="$1.result.items.0.id",
                hr_service_id="$2.result.items.0.id",
                description=text,
                priority=p,
            ),
        ],
        "Opened HR case {$3.result.number}.",
        category="create",
    )


def t_move_department(conn, rng) -> Draft:
    user = _employee(conn, rng)
    dept = rng.choice([d for d in ("Engineering", "Finance", "Sales", "Support", "Legal") if d != user["department"]])
    title = rng.choice(["Senior Analyst", "Team Lead", "Principal Engineer"])
    return Draft(
        "move_department",
        "hr",
        HR,
        f"Move {user['email']} to the {dept} department with the title {title}.",
        [
            _step("find_user", email=user["email"]),
            _step("hr_update_profile", user_id="$1.result.items.0.id", department=dept, title=title),
        ],
        f"{user['email']} is now {title} in {dept}.",
    )


def t_resolve_hr_case(conn, rng) -> Draft:
    case, notes = rng.choice(_q(conn, "SELECT * FROM hr_cases WHERE state = 'in_progress'")), rng.choice(NOTES)
    return Draft(
        "resolve_hr_case",
        "hr",
        HR,
        f'Resolve HR case {case["number"]} with the notes "{notes}".',
        [
            _step("hr_search_cases", number=case["number"]),
            _step("hr_update_case_state", case_id="$1.result.items.0.id", state="resolved", notes=notes),
        ],
        f"HR case {case['number']} is resolved.",
    )


def t_account_owner(conn, rng) -> Draft:
    acc = rng.choice(_q(conn, "SELECT * FROM accounts"))
    return Draft(
        "account_owner",
        "csm",
        CSM,
        f"What is the email address of the owner of the {acc['name']} account?",
        [_step("csm_find_account", name=acc["name"]), _step("get_user", user_id="$1.result.items.0.owner_id")],
        "The owner's email is {$2.result.email}.",
        answer_sql=f"SELECT u.email FROM accounts a JOIN users u ON u.id = a.owner_id WHERE a.name = '{acc['name']}'",
        category="lookup",
    )


def t_csm_case(conn, rng) -> Draft:
    contact = rng.choice(
        _q(conn, "SELECT c.*, a.name AS account FROM contacts c JOIN accounts a ON a.id = c.account_id")
    )
    p, text = rng.randint(2, 4), f"Portal shows error {rng.randint(400, 599)}"
    return Draft(
        "csm_case",
        "csm",
        CSM,
        f'Open a priority {p} case for {contact["account"]} on behalf of {contact["email"]}: "{text}".',
        [
            _step("csm_find_account", name=contact["account"]),
            _step("csm_find_contact", email=contact["email"]),
            _step(
                "csm_create_case",
                account_id="$1.result.items.0.id",
                contact_id="$2.result.items.0.id",
                short_description=text,
                priority=p,
            ),
        ],
        "Opened case {$3.result.number}.",
        category="create",
    )


def t_escalate_case(conn, rng) -> Draft:
    case = rng.choice(_q(conn, "SELECT * FROM csm_cases WHERE state IN ('open', 'in_progress')"))
    reason = f"Customer outage since {rng.randint(2, 9)} hours"
    return Draft(
        "escalate_case",
        "csm",
        CSM,
        f'Escalate customer case {case["number"]}; reason: "{reason}".',
        [
            _step("csm_search_cases", number=case["number"]),
            _step("csm_escalate_case", case_id="$1.result.items.0.id", reason=reason),
        ],
        f"Case {case['number']} is escalated.",
    )


def t_add_contact(conn, rng) -> Draft:
    acc = rng.choice(_q(conn, "SELECT * FROM accounts"))
    name = f"{rng.choice(['Noor', 'Omar', 'Pia', 'Raul'])} {rng.choice(['Adler', 'Berg', 'Costa'])}"
    email = name.lower().replace(" ", ".") + f"+{rng.randint(10, 99)}@" + acc["name"].lower().replace(" ", "") + ".com"
    return Draft(
        "add_contact",
        "csm",
        CSM,
        f"Add {name} ({email}) as a contact of {acc['name']}.",
        [
            _step("csm_find_account", name=acc["name"]),
            _step("csm_add_contact", account_id="$1.result.items.0.id", name=name, email=email),
        ],
        f"{name} is a contact of {acc['name']}.",
        category="create",
    )


def t_case_to_incident(conn, rng) -> Draft:
    case = rng.choice(_q(conn, "SELECT * FROM csm_cases WHERE state IN ('open', 'in_progress')"))
    user, text = _employee(conn, rng), f"Backend fault behind {case['number']}"
    return Draft(
        "case_to_incident",
        "hybrid",
        ADMIN,
        f"Customer case {case['number']} is caused by an internal fault: open a priority 2 incident with caller "
        f'{user["email"]} and description "{text}", then link the case to it.',
        [
            _step("csm_search_cases", number=case["number"]),
            _step("find_user", email=user["email"]),
            _step("itsm_create_incident", caller_id="$2.result.items.0.id", short_description=text, priority=2),
            _step("csm_link_incident", case_id="$1.result.items.0.id", incident_id="$3.result.id"),
        ],
        "Opened {$3.result.number} and linked " + case["number"] + ".",
        category="multi",
    )


def t_offboard(conn, rng) -> Draft:
    holders = _q(
        conn,
        "SELECT assigned_to AS id, COUNT(*) AS n FROM assets WHERE state = 'in_use' GROUP BY assigned_to HAVING n <= 3",
    )
    uid = rng.choice(holders)["id"]
    user = _q(conn, "SELECT * FROM users WHERE id = ?", uid)[0]
    n = _q(conn, "SELECT COUNT(*) AS n FROM assets WHERE assigned_to = ? AND state = 'in_use'", uid)[0]["n"]
    plan = [_step("find_user", email=user["email"]), _step("itsm_search_assets", assigned_to="$1.result.items.0.id")]
    plan += [_step("itsm_return_asset", asset_id=f"$2.result.items.{i}.id") for i in range(n)]
    plan += [_step("hr_set_employment_status", user_id="$1.result.items.0.id", status="terminated")]
    return Draft(
        "offboard",
        "hybrid",
        ADMIN,
        f"Offboard {user['email']}: return all of their equipment to stock and set their employment status to terminated.",
        plan,
        f"{user['email']} is offboarded.",
        category="multi",
    )


def t_new_hire_kit(conn, rng) -> Draft:
    user, asset = _employee(conn, rng), rng.choice(_q(conn, "SELECT * FROM assets WHERE state = 'in_stock'"))
    return Draft(
        "new_hire_kit",
        "hybrid",
        ADMIN,
        f'Open a priority 3 HR case for {user["email"]} under the "Equipment request" service with the description '
        f'"New laptop", and give them asset {asset["asset_tag"]}.',
        [
            _step("find_user", email=user["email"]),
            _step("hr_find_service", name="Equipment request"),
            _step(
                "hr_create_case",
                subject_person_id="$1.result.items.0.id",
                hr_service_id="$2.result.items.0.id",
                description="New laptop",
                priority=3,
            ),
            _step("itsm_search_assets", asset_tag=asset["asset_tag"]),
            _step("itsm_assign_asset", asset_id="$4.result.items.0.id", user_id="$1.result.items.0.id"),
        ],
        "Opened {$3.result.number} and assigned " + asset["asset_tag"] + ".",
        category="multi",
    )


def t_notify_owner(conn, rng) -> Draft:
    acc, inc = rng.choice(_q(conn, "SELECT * FROM accounts")), rng.choice(_q(conn, "SELECT * FROM incidents"))
    return Draft(
        "notify_owner",
        "hybrid",
        ADMIN,
        f'Send the owner of the {acc["name"]} account a notification with the subject "Status of {inc["number"]}" '
        f"whose body is the incident's current state.",
        [
            _step("csm_find_account", name=acc["name"]),
            _step("itsm_search_incidents", number=inc["number"]),
            _step(
                "send_notification",
                recipient_id="$1.result.items.0.owner_id",
                subject=f"Status of {inc['number']}",
                body="$2.result.items.0.state",
            ),
        ],
        "Notified the account owner.",
        category="multi",
    )


# infeasible: the golden plan looks, then declines


def i_permission_incident(conn, rng) -> Draft:
    user, inc = _employee(conn, rng), rng.choice(_q(conn, "SELECT * FROM incidents WHERE state = 'in_progress'"))
    return Draft(
        "deny_resolve_as_employee",
        "itsm",
        user["id"],
        f'Resolve incident {inc["number"]} with the close notes "Works now".',
        [_step("whoami")],
        DECLINE_PREFIX + ": your role ({$1.result.role}) may not change incident states.",
        feasible=False,
        infeasible_kind="permission",
    )


def i_permission_salary(conn, rng) -> Draft:
    asker, other = _employee(conn, rng), _employee(conn, rng)
    return Draft(
        "deny_salary_lookup",
        "hr",
        asker["id"],
        f"What is the salary of {other['email']}?",
        [_step("whoami")],
        DECLINE_PREFIX + ": salaries are personal data visible to HR agents only, and you are {$1.result.role}.",
        feasible=False,
        infeasible_kind="permission",
    )


def i_permission_escalate(conn, rng) -> Draft:
    case = rng.choice(_q(conn, "SELECT * FROM csm_cases WHERE state = 'open'"))
    return Draft(
        "deny_escalate_as_itil",
        "csm",
        ITIL,
        f'Escalate customer case {case["number"]}; reason: "Urgent".',
        [_step("whoami")],
        DECLINE_PREFIX + ": escalation needs a CSM agent and you are {$1.result.role}.",
        feasible=False,
        infeasible_kind="permission",
    )


def i_missing_incident(conn, rng) -> Draft:
    number = f"INC{9000000 + rng.randint(1, 99999):07d}"
    return Draft(
        "missing_incident",
        "itsm",
        ITIL,
        f'Resolve incident {number} with the close notes "Done".',
        [_step("itsm_search_incidents", number=number)],
        DECLINE_PREFIX + f": incident {number} does not exist.",
        feasible=False,
        infeasible_kind="nonexistent",
    )


def i_missing_person(conn, rng) -> Draft:
    email = f"{rng.choice(['sam', 'kim', 'lee'])}.nobody{rng.randint(1, 99)}@example.com"
    return Draft(
        "missing_person",
        "hr",
        HR,
        f'Open a priority 3 HR case for {email} under the "Pension change" service: "Update pension".',
        [_step("find_user", email=email)],
        DECLINE_PREFIX + f": there is no employee {email}.",
        feasible=False,
        infeasible_kind="nonexistent",
    )


def i_missing_account(conn, rng) -> Draft:
    name = f"{rng.choice(['Nimbus', 'Orion', 'Pallas'])} {rng.choice(['Logistics', 'Pharma'])}"
    return Draft(
        "missing_account",
        "csm",
        CSM,
        f'Open a priority 2 case for {name} on behalf of help@{name.lower().replace(" ", "")}.com: "Login fails".',
        [_step("csm_find_account", name=name)],
        DECLINE_PREFIX + f": the account {name} does not exist.",
        feasible=False,
        infeasible_kind="nonexistent",
    )


def i_policy_close(conn, rng) -> Draft:
    inc = rng.choice(_q(conn, "SELECT * FROM incidents WHERE state = 'in_progress'"))
    return Draft(
        "policy_close_unresolved",
        "itsm",
        ITIL,
        f"Close incident {inc['number']} right away; do not resolve it first.",
        [_step("itsm_search_incidents", number=inc["number"])],
        DECLINE_PREFIX + f": {inc['number']} is {{$1.result.items.0.state}} and only resolved incidents can be closed.",
        feasible=False,
        infeasible_kind="policy",
    )


def i_policy_terminate(conn, rng) -> Draft:
    uid = rng.choice(_q(conn, "SELECT DISTINCT assigned_to AS id FROM assets WHERE state = 'in_use'"))["id"]
    user = _q(conn, "SELECT * FROM users WHERE id = ?", uid)[0]
    return Draft(
        "policy_terminate_with_assets",
        "hybrid",
        ADMIN,
        f"Set the employment status of {user['email']} to terminated, but leave their equipment with them.",
        [_step("find_user", email=user["email"]), _step("itsm_search_assets", assigned_to="$1.result.items.0.id")],
        DECLINE_PREFIX + ": policy requires returning their {$2.result.count} asset(s) before termination.",
        feasible=False,
        infeasible_kind="policy",
    )


def i_policy_escalate_closed(conn, rng) -> Draft:
    case = rng.choice(_q(conn, "SELECT * FROM csm_cases WHERE state = 'closed'"))
    return Draft(
        "policy_escalate_closed",
        "csm",
        CSM,
        f'Escalate customer case {case["number"]}; reason: "Customer unhappy".',
        [_step("csm_search_cases", number=case["number"])],
        DECLINE_PREFIX + f": case {case['number']} is closed and closed cases cannot be escalated.",
        feasible=False,
        infeasible_kind="policy",
    )


FEASIBLE: tuple[Callable[..., Draft], ...] = (
    t_incident_assignee,
    t_create_incident,
    t_resolve_incident,
    t_assign_incident,
    t_problem_from_incident,
    t_change_request,
    t_assign_asset,
    t_manager_lookup,
    t_hr_case,
    t_move_department,
    t_resolve_hr_case,
    t_account_owner,
    t_csm_case,
    t_escalate_case,
    t_add_contact,
    t_case_to_incident,
    t_offboard,
    t_new_hire_kit,
    t_notify_owner,
)
INFEASIBLE: tuple[Callable[..., Draft], ...] = (
    i_permission_incident,
    i_missing_incident,
    i_policy_close,
    i_permission_salary,
    i_missing_person,
    i_policy_terminate,
    i_permission_escalate,
    i_missing_account,
    i_policy_escalate_closed,
)


# ---- verifier derivation ----------------------------------------------------------------------------------------


def _row_map(conn: sqlite3.Connection, table: str) -> dict[Any, dict[str, Any]]:
    rows = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
    return {r.get("id", tuple(r.values())): r for r in rows}


def _ref_expr(table: str, col: str, value: Any, ref: str | None, conn: sqlite3.Connection) -> tuple[str, Any]:
    """(SQL expression, its value in the golden final state) for one column: a minted id (of table `ref`) is named
    through the referenced row's label column, so the verifier does not depend on the id itself."""
    if ref is None:
        return f"{table}.{col}", value
    label = label_column(ref)
    shown = conn.execute(f"SELECT {label} FROM {ref} WHERE id = ?", (value,)).fetchone()[0]
    return f"(SELECT {label} FROM {ref} WHERE id = {table}.{col})", shown


def derive_verifiers(seed: sqlite3.Connection, ep: Episode, query: Callable[[str], Any]) -> list[dict[str, Any]]:
    """database_state verifiers for every difference between `seed` and the golden final state `ep`, and an
    unchanged hash over the tables the golden plan leaves alone."""
    from paperflow.enterpriseops_gym.verifiers import protected_hash, sqlite_query

    minted = {i: t for t, i in ep.minted}
    out: list[dict[str, Any]] = []
    untouched = []
    for table in TABLES:
        before, after = _row_map(seed, table), _row_map(ep.conn, table)
        if before == after:
            untouched.append(table)
            continue
        for key in sorted(set(after) - set(before), key=str):
            conds = []
            for col, value in after[key].items():
                if VOLATILE.search(col):
                    continue
                expr, shown = _ref_expr(
                    table, col, value, minted.get(value) if isinstance(value, str) else None, ep.conn
                )
                conds.append(f"{expr} IS NULL" if shown is None else f"{expr} = {sql_literal(shown)}")
            sql = f"SELECT COUNT(*) AS n FROM {table} WHERE " + " AND ".join(conds)
            out.append(_state(f"{table}: new row ({after[key].get(label_column(table))})", sql, query(sql)))
        for key in sorted(set(before) & set(after), key=str):
            changed = [c for c in after[key] if after[key][c] != before[key][c] and not VOLATILE.search(c)]
            if not changed:
                continue
            exprs = []
            for col in changed:
                value = after[key][col]
                expr, _ = _ref_expr(table, col, value, minted.get(value) if isinstance(value, str) else None, ep.conn)
                exprs.append(f"{expr} AS {col}")
            sql = f"SELECT {', '.join(exprs)} FROM {table} WHERE id = {sql_literal(key)}"
            out.append(_state(f"{table} {key}: {', '.join(changed)}", sql, query(sql)))
        for key in sorted(set(before) - set(after), key=str):
            sql = f"SELECT COUNT(*) AS n FROM {table} WHERE id = {sql_literal(key)}"
            out.append(_state(f"{table} {key}: deleted", sql, query(sql)))
        sql = f"SELECT COUNT(*) AS n FROM {table}"
        out.append(_state(f"{table}: row count", sql, query(sql)))
    if untouched:
        digest = protected_hash(sqlite_query(seed), untouched, lambda t: columns(seed, t))
        out.append(
            {
                "verifier_type": "unchanged",
                "name": "collateral: untouched tables",
                "tables": untouched,
                "expected_hash": digest,
            }
        )
    return out


def _state(name: str, sql: str, expected: Any) -> dict[str, Any]:
    return {
        "verifier_type": "database_state",
        "name": name,
        "query": sql,
        "expected_value": expected,
        "comparison_type": "equals",
    }


# ---- the task set -----------------------------------------------------------------------------------------------


@dataclass
class TaskSet:
    tasks: list[dict[str, Any]]
    modes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def mode_tools(oracle: Sequence[str], domain: str, extra: int, rng: random.Random) -> list[str]:
    """The task's tool list in a mode: the oracle tools plus `extra` others, the legacy twins of the oracle tools
    first, then the domain's archive tools and other real tools; listed in a shuffled order."""
    twins = [f"{n}_legacy" for n in oracle if f"{n}_legacy" in T.DISTRACTORS]
    rng.shuffle(twins)
    near = [
        n for n, t in T.DISTRACTORS.items() if n not in twins and (t.domain in (domain, "common") or domain == "hybrid")
    ]
    rest = [n for n, t in T.CATALOGUE.items() if n not in oracle and n not in twins and n not in near and n != "whoami"]
    rng.shuffle(near)
    rng.shuffle(rest)
    chosen = list(oracle) + (twins + near + rest)[:extra]
    rng.shuffle(chosen)
    return chosen


def build_tasks(sql: str, n_feasible: int, n_infeasible: int, seed: int, modes: Sequence[str]) -> TaskSet:
    """`n_feasible` + `n_infeasible` tasks, cycling through the templates, entities drawn with `random.Random(seed)`;
    each golden plan is replayed (it must succeed step by step), its verifiers derived, and its trajectory recorded
    under another salt for the golden-guided agent."""
    from paperflow.enterpriseops_gym.verifiers import sqlite_query

    template = Template(sql)
    rng = random.Random(seed)
    drafts = [FEASIBLE[i % len(FEASIBLE)](template.conn, rng) for i in range(n_feasible)]
    drafts += [INFEASIBLE[i % len(INFEASIBLE)](template.conn, rng) for i in range(n_infeasible)]
    tasks = []
    for i, d in enumerate(drafts):
        task_id = f"eog-{d.domain}-{i:03d}-{d.template}"
        ep = template.episode(d.actor, salt=task_id)
        calls, answer = replay(ep, d.plan, d.final)
        failed = [c for c in calls if not c["ok"]]
        if failed:
            raise RuntimeError(f"{task_id}: golden step {failed[0]['tool']} fails: {failed[0]['error']}")
        if d.feasible:
            verifiers = derive_verifiers(template.conn, ep, _extracting(sqlite_query(ep.conn)))
        else:
            from paperflow.enterpriseops_gym.verifiers import protected_hash

            digest = protected_hash(sqlite_query(template.conn), TABLES, lambda t: columns(template.conn, t))
            verifiers = [
                {
                    "verifier_type": "unchanged",
                    "name": "no side effects",
                    "tables": list(TABLES),
                    "expected_hash": digest,
                }
            ]
            verifiers.append(
                _response("answer declines", "SELECT 1 AS refused", "declines", "The assistant must decline.")
            )
        if d.answer_sql:
            verifiers.append(
                _response(
                    "answer names the result", d.answer_sql, "contains_sql_result", "The answer must state the value."
                )
            )
            verifiers.append(
                {
                    "verifier_type": "tool_execution",
                    "name": "looked it up",
                    "selected_tools": [d.plan[0]["tool"]],
                    "minimum_tool_calls": len(d.plan),
                }
            )
        ep.close()
        record_ep = template.episode(d.actor, salt=f"record:{task_id}")
        recorded, recorded_answer = replay(record_ep, d.plan, d.final)
        record_ep.close()
        oracle = sorted({s["tool"] for s in d.plan})
        tasks.append(
            {
                "task_id": task_id,
                "domain": d.domain,
                "system_prompt": POLICY[d.domain],
                "user_prompt": d.prompt,
                "restricted_tools": [],
                "mcp_endpoint": "/mcp",
                "number_of_runs": 1,
                "reset_database_between_runs": True,
                "gym_servers_config": json.dumps(
                    [
                        {
                            "mcp_server_name": "eog",
                            "mcp_server_url": "http://127.0.0.1/mcp",
                            "seed_database_file": "seed.sql",
                            "context": {"x-user-id": d.actor},
                        }
                    ]
                ),
                "verifiers": json.dumps(verifiers),
                "eog": {
                    "template": d.template,
                    "category": d.category if d.feasible else "infeasible",
                    "feasible": d.feasible,
                    "infeasible_kind": d.infeasible_kind,
                    "actor": d.actor,
                    "golden_plan": d.plan,
                    "final_answer": d.final,
                    "golden_answer": answer,
                    "recorded_trajectory": [
                        {"tool": c["tool"], "args": c["args"], "result": c["result"]} for c in recorded
                    ],
                    "recorded_answer": recorded_answer,
                    "oracle_tools": oracle,
                },
            }
        )
    out = TaskSet(tasks)
    for mode in modes:
        rows = []
        for t in tasks:
            mrng = random.Random(f"{seed}:{mode}:{t['task_id']}")
            rows.append(
                {
                    **t,
                    "selected_tools": mode_tools(t["eog"]["oracle_tools"], t["domain"], MODES[mode], mrng),
                    "eog": {**t["eog"], "mode": mode},
                }
            )
        out.modes[mode] = rows
    return out


def _extracting(query):
    from paperflow.enterpriseops_gym.verifiers import extract

    return lambda sql: extract(query(sql))


def _response(name: str, sql: str, rule: str, prompt: str) -> dict[str, Any]:
    return {
        "verifier_type": "response_check",
        "name": name,
        "sql_query": sql,
        "comparison_prompt": prompt,
        "minimum_comparison_value": 7,
        "judge_rule": rule,
    }


def load_task(row: Mapping[str, Any]) -> dict[str, Any]:
    """A task row in the official layout (JSON text columns parsed); rows without our `eog` block load too."""
    task = dict(row)
    for key in ("verifiers", "gym_servers_config"):
        if isinstance(task.get(key), str):
            task[key] = json.loads(task[key])
    task.setdefault("restricted_tools", [])
    return task


def actor_of(task: Mapping[str, Any]) -> str:
    servers = task["gym_servers_config"]
    return servers[0]["context"]["x-user-id"]


def visible_tools(task: Mapping[str, Any]) -> list[str]:
    """selected_tools minus restricted_tools, in the task's order (spec section 2's episode)."""
    return [n for n in task["selected_tools"] if n not in set(task["restricted_tools"]) and n in T.CATALOGUE]
