"""The tool catalogue: Python functions over an episode's database, each with a JSON schema for its arguments, the
roles that may call it, the state machine it enforces and its mandatory side effects (audit rows, notifications).

A call is atomic: the arguments are validated against the schema (unknown or missing keys, wrong types and values
outside an enum are refused before anything runs), and a refused call (permission, missing entity, policy) rolls
the database and the episode's minting state back. Results are JSON-able dicts; `harness` wraps them as MCP
content. Distractor tools (`DISTRACTORS`) are the "legacy" twins of real write tools, same schema and description
but without the mandatory audit/notification side effects, plus read tools that find nothing: the noise the plus_5
/ plus_10 modes add (spec section 2).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from paperflow.enterpriseops_gym.sandbox import Episode


class ToolError(Exception):
    """A refused call: `kind` is permission | not_found | policy | invalid."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Tool:
    name: str
    domain: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[[Episode, dict[str, Any]], dict[str, Any]] = field(repr=False)
    writes: bool = False
    distractor: bool = False

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-tool form (also MCP's name / description / inputSchema)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def schema(required: Mapping[str, Any], optional: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


STR = {"type": "string", "minLength": 1}
PRIORITY = {"type": "integer", "minimum": 1, "maximum": 4}


def _row(conn: sqlite3.Connection, sql: str, *args: Any) -> dict[str, Any] | None:
    r = conn.execute(sql, args).fetchone()
    return dict(r) if r is not None else None


def _rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sql, args)]


def _items(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"items": rows, "count": len(rows)}


def get(ep: Episode, table: str, id_: str, what: str) -> dict[str, Any]:
    row = _row(ep.conn, f"SELECT * FROM {table} WHERE id = ?", id_)
    if row is None:
        raise ToolError("not_found", f"no {what} with id {id_!r}")
    return row


def role_of(ep: Episode, user_id: str) -> str:
    row = _row(ep.conn, "SELECT r.name FROM users u JOIN roles r ON r.id = u.role_id WHERE u.id = ?", user_id)
    if row is None:
        raise ToolError("permission", f"unknown acting identity {user_id!r}")
    return row["name"]


def require(ep: Episode, *roles: str, what: str) -> str:
    role = role_of(ep, ep.actor)
    if role != "admin" and role not in roles:
        raise ToolError("permission", f"role {role!r} may not {what}; needs one of {', '.join(roles)}")
    return role


def audit(ep: Episode, action: str, table: str, record_id: str) -> None:
    if ep.quiet:
        return
    ep.conn.execute(
        "INSERT INTO audit_log (id, actor_id, action, table_name, record_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (ep.mint("audit_log"), ep.actor, action, table, record_id, ep.now()),
    )


def notify(ep: Episode, recipient: str | None, subject: str, body: str) -> None:
    if recipient is None or ep.quiet:
        return
    ep.conn.execute(
        "INSERT INTO notifications (id, recipient_id, subject, body, created_at) VALUES (?, ?, ?, ?, ?)",
        (ep.mint("notifications"), recipient, subject, body, ep.now()),
    )


def _insert(ep: Episode, table: str, row: dict[str, Any]) -> dict[str, Any]:
    ep.conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    return row


def _update(ep: Episode, table: str, id_: str, **values: Any) -> dict[str, Any]:
    sets = ", ".join(f"{k} = ?" for k in values)
    ep.conn.execute(f"UPDATE {table} SET {sets} WHERE id = ?", (*values.values(), id_))
    return get(ep, table, id_, table)


def _search(ep: Episode, table: str, args: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    where = [f"{columns[k]} = ?" for k in args]
    sql = f"SELECT * FROM {table}" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
    return _items(_rows(ep.conn, sql, *args.values()))


# ---- identity -------------------------------------------------------------------------------------------------


def whoami(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    user = get(ep, "users", ep.actor, "user")
    return {**user, "role": role_of(ep, ep.actor)}


def find_user(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    if not args:
        raise ToolError("invalid", "give email or name")
    return _search(ep, "users", args, {"email": "email", "name": "name"})


def get_user(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return get(ep, "users", args["user_id"], "user")


# ---- ITSM -----------------------------------------------------------------------------------------------------

INCIDENT_MOVES = {
    ("new", "in_progress"),
    ("in_progress", "resolved"),
    ("resolved", "closed"),
    ("resolved", "in_progress"),
}


def search_incidents(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "incidents", args, {"number": "number", "caller_id": "caller_id", "state": "state"})


def create_incident(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    role = role_of(ep, ep.actor)
    caller = get(ep, "users", args["caller_id"], "user")
    if role not in ("admin", "itil") and caller["id"] != ep.actor:
        raise ToolError("permission", "an employee may open incidents only for themselves")
    if args["priority"] == 1 and role not in ("admin", "itil"):
        raise ToolError("permission", "only ITIL agents may open priority 1 incidents")
    group = args.get("assignment_group_id")
    if group is not None:
        get(ep, "groups", group, "group")
    now = ep.now()
    row = _insert(
        ep,
        "incidents",
        {
            "id": ep.mint("incidents"),
            "number": ep.next_number("incidents"),
            "short_description": args["short_description"],
            "caller_id": caller["id"],
            "assigned_to": None,
            "assignment_group": group,
            "priority": args["priority"],
            "state": "new",
            "close_notes": None,
            "problem_id": None,
            "opened_at": now,
            "updated_at": now,
        },
    )
    audit(ep, "create", "incidents", row["id"])
    notify(ep, caller["id"], "Incident opened", f"We opened an incident for you: {args['short_description']}")
    return row


def assign_incident(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="assign incidents")
    inc = get(ep, "incidents", args["incident_id"], "incident")
    get(ep, "groups", args["group_id"], "group")
    if inc["state"] in ("resolved", "closed"):
        raise ToolError("policy", f"incident {inc['number']} is {inc['state']}; reopen it before reassigning")
    assignee = args.get("assignee_id")
    if assignee is not None:
        get(ep, "users", assignee, "user")
        member = _row(
            ep.conn, "SELECT 1 AS m FROM group_members WHERE group_id = ? AND user_id = ?", args["group_id"], assignee
        )
        if member is None:
            raise ToolError("policy", f"user {assignee} is not a member of group {args['group_id']}")
    state = "in_progress" if inc["state"] == "new" else inc["state"]
    row = _update(
        ep,
        "incidents",
        inc["id"],
        assignment_group=args["group_id"],
        assigned_to=assignee,
        state=state,
        updated_at=ep.now(),
    )
    audit(ep, "assign", "incidents", inc["id"])
    notify(ep, assignee, "Incident assigned to you", f"{inc['number']}: {inc['short_description']}")
    return row


def update_incident_state(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="change incident states")
    inc = get(ep, "incidents", args["incident_id"], "incident")
    new = args["state"]
    if (inc["state"], new) not in INCIDENT_MOVES:
        raise ToolError("policy", f"incident {inc['number']} cannot go from {inc['state']} to {new}")
    notes = args.get("close_notes")
    if new == "resolved" and not notes:
        raise ToolError("policy", "resolving an incident needs close_notes")
    values = {"state": new, "updated_at": ep.now()}
    if notes:
        values["close_notes"] = notes
    row = _update(ep, "incidents", inc["id"], **values)
    audit(ep, f"state:{new}", "incidents", inc["id"])
    if new == "resolved":
        notify(ep, inc["caller_id"], "Incident resolved", f"{inc['short_description']}: {notes}")
    return row


def find_group(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "groups", args, {"name": "name"})


def create_problem(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="open problems")
    row = _insert(
        ep,
        "problems",
        {
            "id": ep.mint("problems"),
            "number": ep.next_number("problems"),
            "short_description": args["short_description"],
            "opened_by": ep.actor,
            "state": "new",
            "opened_at": ep.now(),
        },
    )
    audit(ep, "create", "problems", row["id"])
    return row


def search_problems(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "problems", args, {"number": "number"})


def link_incident_to_problem(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="link incidents to problems")
    inc = get(ep, "incidents", args["incident_id"], "incident")
    get(ep, "problems", args["problem_id"], "problem")
    if inc["state"] == "closed":
        raise ToolError("policy", f"incident {inc['number']} is closed")
    row = _update(ep, "incidents", inc["id"], problem_id=args["problem_id"], updated_at=ep.now())
    audit(ep, "link_problem", "incidents", inc["id"])
    return row


def create_change(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="request changes")
    get(ep, "groups", args["assignment_group_id"], "group")
    row = _insert(
        ep,
        "change_requests",
        {
            "id": ep.mint("change_requests"),
            "number": ep.next_number("change_requests"),
            "short_description": args["short_description"],
            "requested_by": ep.actor,
            "assignment_group": args["assignment_group_id"],
            "risk": args["risk"],
            "state": "draft",
            "opened_at": ep.now(),
        },
    )
    audit(ep, "create", "change_requests", row["id"])
    return row


def submit_change(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="submit changes")
    chg = get(ep, "change_requests", args["change_id"], "change request")
    if chg["state"] != "draft":
        raise ToolError("policy", f"change {chg['number']} is {chg['state']}; only drafts can be submitted")
    row = _update(ep, "change_requests", chg["id"], state="assess")
    audit(ep, "submit", "change_requests", chg["id"])
    manager = _row(ep.conn, "SELECT manager_id FROM groups WHERE id = ?", chg["assignment_group"])
    notify(ep, manager["manager_id"] if manager else None, "Change awaiting assessment", chg["short_description"])
    return row


def search_changes(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "change_requests", args, {"number": "number"})


def search_assets(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "assets", args, {"asset_tag": "asset_tag", "state": "state", "assigned_to": "assigned_to"})


def assign_asset(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="assign assets")
    asset = get(ep, "assets", args["asset_id"], "asset")
    user = get(ep, "users", args["user_id"], "user")
    if asset["state"] != "in_stock":
        raise ToolError("policy", f"asset {asset['asset_tag']} is {asset['state']}, not in stock")
    if not user["active"]:
        raise ToolError("policy", f"user {user['email']} is not active")
    row = _update(ep, "assets", asset["id"], assigned_to=user["id"], state="in_use")
    audit(ep, "assign", "assets", asset["id"])
    notify(ep, user["id"], "Equipment assigned", f"{asset['model']} ({asset['asset_tag']}) is now yours")
    return row


def return_asset(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "itil", what="return assets")
    asset = get(ep, "assets", args["asset_id"], "asset")
    if asset["state"] != "in_use":
        raise ToolError("policy", f"asset {asset['asset_tag']} is not in use")
    row = _update(ep, "assets", asset["id"], assigned_to=None, state="in_stock")
    audit(ep, "return", "assets", asset["id"])
    return row


# ---- HR -------------------------------------------------------------------------------------------------------

HR_CASE_MOVES = {("new", "in_progress"), ("in_progress", "resolved"), ("resolved", "closed")}


def get_profile(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    role = role_of(ep, ep.actor)
    if role not in ("admin", "hr_agent") and args["user_id"] != ep.actor:
        raise ToolError("permission", "HR profiles of other people are visible to HR agents only")
    row = _row(ep.conn, "SELECT * FROM hr_profiles WHERE user_id = ?", args["user_id"])
    if row is None:
        raise ToolError("not_found", f"no HR profile for user {args['user_id']!r}")
    if role not in ("admin", "hr_agent"):
        row.pop("salary")  # PII policy: salaries only to HR
    return row


def update_profile(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "hr_agent", what="edit HR profiles")
    prof = _row(ep.conn, "SELECT * FROM hr_profiles WHERE user_id = ?", args["user_id"])
    if prof is None:
        raise ToolError("not_found", f"no HR profile for user {args['user_id']!r}")
    changes = {k: v for k, v in args.items() if k != "user_id"}
    if not changes:
        raise ToolError("invalid", "nothing to change")
    if "manager_id" in changes:
        get(ep, "users", changes["manager_id"], "user")
        if changes["manager_id"] == args["user_id"]:
            raise ToolError("policy", "nobody manages themselves")
    row = _update(ep, "hr_profiles", prof["id"], **changes)
    audit(ep, "update", "hr_profiles", prof["id"])
    notify(ep, args["user_id"], "Your HR profile changed", ", ".join(f"{k}: {v}" for k, v in sorted(changes.items())))
    return row


def set_employment_status(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "hr_agent", what="change employment status")
    prof = _row(ep.conn, "SELECT * FROM hr_profiles WHERE user_id = ?", args["user_id"])
    if prof is None:
        raise ToolError("not_found", f"no HR profile for user {args['user_id']!r}")
    if args["status"] == "terminated":
        held = _rows(
            ep.conn, "SELECT asset_tag FROM assets WHERE assigned_to = ? AND state = 'in_use'", args["user_id"]
        )
        if held:
            raise ToolError("policy", f"return the assets first: {', '.join(a['asset_tag'] for a in held)}")
        ep.conn.execute("UPDATE users SET active = 0 WHERE id = ?", (args["user_id"],))
    row = _update(ep, "hr_profiles", prof["id"], employment_status=args["status"])
    audit(ep, f"status:{args['status']}", "hr_profiles", prof["id"])
    return row


def find_service(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "hr_services", args, {"name": "name"})


def create_hr_case(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    role = role_of(ep, ep.actor)
    if role not in ("admin", "hr_agent") and args["subject_person_id"] != ep.actor:
        raise ToolError("permission", "only HR agents open cases about other people")
    get(ep, "users", args["subject_person_id"], "user")
    get(ep, "hr_services", args["hr_service_id"], "HR service")
    row = _insert(
        ep,
        "hr_cases",
        {
            "id": ep.mint("hr_cases"),
            "number": ep.next_number("hr_cases"),
            "subject_person": args["subject_person_id"],
            "opened_by": ep.actor,
            "hr_service": args["hr_service_id"],
            "state": "new",
            "priority": args["priority"],
            "description": args["description"],
            "notes": None,
            "opened_at": ep.now(),
        },
    )
    audit(ep, "create", "hr_cases", row["id"])
    notify(ep, args["subject_person_id"], "HR case opened", args["description"])
    return row


def search_hr_cases(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "hr_cases", args, {"number": "number", "subject_person_id": "subject_person"})


def update_hr_case_state(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "hr_agent", what="change HR case states")
    case = get(ep, "hr_cases", args["case_id"], "HR case")
    new = args["state"]
    if (case["state"], new) not in HR_CASE_MOVES:
        raise ToolError("policy", f"HR case {case['number']} cannot go from {case['state']} to {new}")
    if new == "resolved" and not args.get("notes"):
        raise ToolError("policy", "resolving an HR case needs notes")
    values = {"state": new} | ({"notes": args["notes"]} if args.get("notes") else {})
    row = _update(ep, "hr_cases", case["id"], **values)
    audit(ep, f"state:{new}", "hr_cases", case["id"])
    if new == "resolved":
        notify(ep, case["subject_person"], "HR case resolved", args["notes"])
    return row


# ---- CSM ------------------------------------------------------------------------------------------------------


def find_account(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "accounts", args, {"name": "name"})


def find_contact(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "contacts", args, {"email": "email", "account_id": "account_id"})


def add_contact(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "csm_agent", what="add contacts")
    get(ep, "accounts", args["account_id"], "account")
    if _row(ep.conn, "SELECT id FROM contacts WHERE email = ?", args["email"]):
        raise ToolError("policy", f"a contact with email {args['email']} exists already")
    row = _insert(
        ep,
        "contacts",
        {"id": ep.mint("contacts"), "account_id": args["account_id"], "name": args["name"], "email": args["email"]},
    )
    audit(ep, "create", "contacts", row["id"])
    return row


def create_csm_case(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "csm_agent", what="open customer cases")
    account = get(ep, "accounts", args["account_id"], "account")
    contact = get(ep, "contacts", args["contact_id"], "contact")
    if contact["account_id"] != account["id"]:
        raise ToolError("policy", f"contact {contact['email']} does not belong to {account['name']}")
    row = _insert(
        ep,
        "csm_cases",
        {
            "id": ep.mint("csm_cases"),
            "number": ep.next_number("csm_cases"),
            "account_id": account["id"],
            "contact_id": contact["id"],
            "short_description": args["short_description"],
            "priority": args["priority"],
            "state": "open",
            "assigned_to": ep.actor,
            "incident_id": None,
            "opened_at": ep.now(),
        },
    )
    audit(ep, "create", "csm_cases", row["id"])
    notify(ep, account["owner_id"], "New case on your account", f"{account['name']}: {args['short_description']}")
    return row


def search_csm_cases(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _search(ep, "csm_cases", args, {"number": "number", "account_id": "account_id"})


def escalate_case(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "csm_agent", what="escalate cases")
    case = get(ep, "csm_cases", args["case_id"], "case")
    if case["state"] not in ("open", "in_progress"):
        raise ToolError("policy", f"case {case['number']} is {case['state']}; only open cases can be escalated")
    row = _update(ep, "csm_cases", case["id"], state="escalated", priority=1)
    audit(ep, "escalate", "csm_cases", case["id"])
    owner = _row(ep.conn, "SELECT owner_id FROM accounts WHERE id = ?", case["account_id"])
    notify(ep, owner["owner_id"], "Case escalated", f"{case['short_description']}: {args['reason']}")
    return row


def link_case_incident(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    require(ep, "csm_agent", "itil", what="link cases to incidents")
    case = get(ep, "csm_cases", args["case_id"], "case")
    get(ep, "incidents", args["incident_id"], "incident")
    if case["state"] == "closed":
        raise ToolError("policy", f"case {case['number']} is closed")
    state = "in_progress" if case["state"] == "open" else case["state"]
    row = _update(ep, "csm_cases", case["id"], incident_id=args["incident_id"], state=state)
    audit(ep, "link_incident", "csm_cases", case["id"])
    return row


# ---- shared ---------------------------------------------------------------------------------------------------


def search_articles(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    like = f"%{args['query'].lower()}%"
    return _items(_rows(ep.conn, "SELECT * FROM knowledge_articles WHERE LOWER(title) LIKE ? ORDER BY id", like))


def send_notification(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    get(ep, "users", args["recipient_id"], "user")
    nid = ep.mint("notifications")
    _insert(
        ep,
        "notifications",
        {
            "id": nid,
            "recipient_id": args["recipient_id"],
            "subject": args["subject"],
            "body": args["body"],
            "created_at": ep.now(),
        },
    )
    audit(ep, "notify", "notifications", nid)
    return {"id": nid, "recipient_id": args["recipient_id"], "subject": args["subject"]}


def _tool(name, domain, description, params, fn, writes=False) -> Tool:
    return Tool(name, domain, description, params, fn, writes)


INC_STATES = {"enum": ["in_progress", "resolved", "closed"]}
TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        _tool("whoami", "common", "Return the acting user's record and role.", schema({}), whoami),
        _tool(
            "find_user",
            "common",
            "Find users by exact email or full name.",
            schema({}, {"email": STR, "name": STR}),
            find_user,
        ),
        _tool("get_user", "common", "Get one user by id.", schema({"user_id": STR}), get_user),
        _tool(
            "send_notification",
            "common",
            "Send a notification to a user.",
            schema({"recipient_id": STR, "subject": STR, "body": STR}),
            send_notification,
            True,
        ),
        _tool(
            "kb_search_articles",
            "common",
            "Search knowledge articles by title words.",
            schema({"query": STR}),
            search_articles,
        ),
        _tool(
            "itsm_search_incidents",
            "itsm",
            "Search incidents by number, caller id or state.",
            schema({}, {"number": STR, "caller_id": STR, "state": STR}),
            search_incidents,
        ),
        _tool(
            "itsm_create_incident",
            "itsm",
            "Create an incident for a caller with a short description and a priority (1 critical .. 4 low).",
            schema({"caller_id": STR, "short_description": STR, "priority": PRIORITY}, {"assignment_group_id": STR}),
            create_incident,
            True,
        ),
        _tool(
            "itsm_assign_incident",
            "itsm",
            "Assign an incident to a group and optionally to a member of it.",
            schema({"incident_id": STR, "group_id": STR}, {"assignee_id": STR}),
            assign_incident,
            True,
        ),
        _tool(
            "itsm_update_incident_state",
            "itsm",
            "Move an incident to in_progress, resolved (needs close_notes) or closed (only from resolved).",
            schema({"incident_id": STR, "state": INC_STATES}, {"close_notes": STR}),
            update_incident_state,
            True,
        ),
        _tool("itsm_find_group", "itsm", "Find an assignment group by name.", schema({"name": STR}), find_group),
        _tool(
            "itsm_create_problem",
            "itsm",
            "Open a problem record.",
            schema({"short_description": STR}),
            create_problem,
            True,
        ),
        _tool("itsm_search_problems", "itsm", "Search problems by number.", schema({"number": STR}), search_problems),
        _tool(
            "itsm_link_incident_to_problem",
            "itsm",
            "Link an incident to a problem.",
            schema({"incident_id": STR, "problem_id": STR}),
            link_incident_to_problem,
            True,
        ),
        _tool(
            "itsm_create_change_request",
            "itsm",
            "Create a draft change request for an assignment group.",
            schema(
                {"short_description": STR, "risk": {"enum": ["low", "moderate", "high"]}, "assignment_group_id": STR}
            ),
            create_change,
            True,
        ),
        _tool(
            "itsm_submit_change",
            "itsm",
            "Submit a draft change request for assessment.",
            schema({"change_id": STR}),
            submit_change,
            True,
        ),
        _tool(
            "itsm_search_changes", "itsm", "Search change requests by number.", schema({"number": STR}), search_changes
        ),
        _tool(
            "itsm_search_assets",
            "itsm",
            "Search assets by tag, state or assigned user id.",
            schema({}, {"asset_tag": STR, "state": STR, "assigned_to": STR}),
            search_assets,
        ),
        _tool(
            "itsm_assign_asset",
            "itsm",
            "Assign an in-stock asset to an active user.",
            schema({"asset_id": STR, "user_id": STR}),
            assign_asset,
            True,
        ),
        _tool(
            "itsm_return_asset",
            "itsm",
            "Return an asset in use to stock.",
            schema({"asset_id": STR}),
            return_asset,
            True,
        ),
        _tool(
            "hr_get_profile",
            "hr",
            "Get the HR profile of a user (salary visible to HR agents only).",
            schema({"user_id": STR}),
            get_profile,
        ),
        _tool(
            "hr_update_profile",
            "hr",
            "Update department, title or manager in a user's HR profile.",
            schema({"user_id": STR}, {"department": STR, "title": STR, "manager_id": STR}),
            update_profile,
            True,
        ),
        _tool(
            "hr_set_employment_status",
            "hr",
            "Set a user's employment status (terminated needs all assets returned).",
            schema({"user_id": STR, "status": {"enum": ["active", "on_leave", "terminated"]}}),
            set_employment_status,
            True,
        ),
        _tool("hr_find_service", "hr", "Find an HR service by name.", schema({"name": STR}), find_service),
        _tool(
            "hr_create_case",
            "hr",
            "Open an HR case about a person for an HR service.",
            schema({"subject_person_id": STR, "hr_service_id": STR, "description": STR, "priority": PRIORITY}),
            create_hr_case,
            True,
        ),
        _tool(
            "hr_search_cases",
            "hr",
            "Search HR cases by number or subject person id.",
            schema({}, {"number": STR, "subject_person_id": STR}),
            search_hr_cases,
        ),
        _tool(
            "hr_update_case_state",
            "hr",
            "Move an HR case to in_progress, resolved (needs notes) or closed (only from resolved).",
            schema({"case_id": STR, "state": INC_STATES}, {"notes": STR}),
            update_hr_case_state,
            True,
        ),
        _tool("csm_find_account", "csm", "Find a customer account by name.", schema({"name": STR}), find_account),
        _tool(
            "csm_find_contact",
            "csm",
            "Find customer contacts by email or account id.",
            schema({}, {"email": STR, "account_id": STR}),
            find_contact,
        ),
        _tool(
            "csm_add_contact",
            "csm",
            "Add a contact to a customer account.",
            schema({"account_id": STR, "name": STR, "email": STR}),
            add_contact,
            True,
        ),
        _tool(
            "csm_create_case",
            "csm",
            "Open a customer case for an account and one of its contacts.",
            schema({"account_id": STR, "contact_id": STR, "short_description": STR, "priority": PRIORITY}),
            create_csm_case,
            True,
        ),
        _tool(
            "csm_search_cases",
            "csm",
            "Search customer cases by number or account id.",
            schema({}, {"number": STR, "account_id": STR}),
            search_csm_cases,
        ),
        _tool(
            "csm_escalate_case",
            "csm",
            "Escalate an open customer case with a reason.",
            schema({"case_id": STR, "reason": STR}),
            escalate_case,
            True,
        ),
        _tool(
            "csm_link_incident",
            "csm",
            "Link a customer case to an ITSM incident.",
            schema({"case_id": STR, "incident_id": STR}),
            link_case_incident,
            True,
        ),
    ]
}


def _quietly(fn):
    """A legacy twin: the same change without the mandatory audit and notification side effects."""

    def run(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
        ep.quiet = True
        try:
            return fn(ep, args)
        finally:
            ep.quiet = False

    return run


def _nothing(ep: Episode, args: dict[str, Any]) -> dict[str, Any]:
    return _items([])


LEGACY_OF = (
    "itsm_create_incident",
    "itsm_update_incident_state",
    "itsm_assign_incident",
    "itsm_assign_asset",
    "hr_create_case",
    "hr_update_profile",
    "csm_create_case",
    "csm_escalate_case",
)
ARCHIVES = {
    "itsm_search_incidents_archive": ("itsm", "itsm_search_incidents"),
    "csm_find_account_v1": ("csm", "csm_find_account"),
    "hr_find_service_catalog_v1": ("hr", "hr_find_service"),
    "find_user_directory_legacy": ("common", "find_user"),
}
DISTRACTORS: dict[str, Tool] = {
    **{
        f"{n}_legacy": Tool(
            f"{n}_legacy",
            TOOLS[n].domain,
            TOOLS[n].description + " (legacy endpoint)",
            TOOLS[n].parameters,
            _quietly(TOOLS[n].fn),
            True,
            True,
        )
        for n in LEGACY_OF
    },
    **{
        n: Tool(n, domain, TOOLS[twin].description + " (archive)", TOOLS[twin].parameters, _nothing, False, True)
        for n, (domain, twin) in ARCHIVES.items()
    },
}
CATALOGUE: dict[str, Tool] = {**TOOLS, **DISTRACTORS}
_VALIDATORS = {name: jsonschema.Draft202012Validator(t.parameters) for name, t in CATALOGUE.items()}
# names the agent must never see as tools (spec section 9): the verifiers' SQL access
HIDDEN = ("sql_runner", "seed_database", "delete_database")


def call(ep: Episode, name: str, args: Any) -> dict[str, Any]:
    """Run tool `name` with `args` on the episode: {"ok": True, "result": ...} or {"ok": False, "error": {kind,
    message}}; a refused call leaves the database and the minting state as they were."""
    tool = CATALOGUE.get(name)
    if tool is None:
        return {"ok": False, "error": {"kind": "invalid", "message": f"unknown tool {name!r}"}}
    if not isinstance(args, dict):
        return {"ok": False, "error": {"kind": "invalid", "message": "arguments must be a JSON object"}}
    errors = sorted(_VALIDATORS[name].iter_errors(args), key=lambda e: list(e.path))
    if errors:
        return {"ok": False, "error": {"kind": "invalid", "message": "; ".join(e.message for e in errors)}}
    try:  # a lone surrogate ("\\ud800" in the model's JSON) would escape from SQLite as UnicodeEncodeError
        json.dumps(args, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        message = f"arguments hold text that is not valid Unicode ({bad}, a lone surrogate); send UTF-8 text"
        return {"ok": False, "error": {"kind": "invalid", "message": message}}
    ticks, minted = ep.ticks, list(ep.minted)
    try:
        result = tool.fn(ep, dict(args))
    except ToolError as exc:
        ep.conn.rollback()
        ep.ticks, ep.minted = ticks, minted
        return {"ok": False, "error": {"kind": exc.kind, "message": exc.message}}
    except sqlite3.IntegrityError as exc:
        ep.conn.rollback()
        ep.ticks, ep.minted = ticks, minted
        return {"ok": False, "error": {"kind": "invalid", "message": f"constraint failed: {exc}"}}
    ep.conn.commit()
    return {"ok": True, "result": result}
