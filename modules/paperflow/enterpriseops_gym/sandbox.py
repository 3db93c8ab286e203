"""The sandbox: an 18-table relational world (ITSM, HR, CSM, shared identity, audit) in SQLite, generated from one
seed, and the per-episode database that every run starts from (spec sections 2.1 and 4).

The world is written once as SQL text (`world_sql`); an episode restores it into a private in-memory database
(`Template.episode`, sqlite3's backup API), so no state can leak between episodes. Ids minted during an episode
depend on the episode's salt and a counter only, and time is a logical clock, so a replay is bit-for-bit
repeatable and `db_hash` compares final states.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# table -> (DDL body, the column a verifier uses to name a row, the prefix of ids minted in it)
SCHEMA: dict[str, tuple[str, str, str]] = {
    "roles": ("id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE", "name", "rol"),
    "users": (
        "id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, "
        "role_id TEXT NOT NULL REFERENCES roles(id), department TEXT NOT NULL, active INTEGER NOT NULL",
        "email",
        "usr",
    ),
    "groups": (
        "id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, domain TEXT NOT NULL, manager_id TEXT REFERENCES users(id)",
        "name",
        "grp",
    ),
    "group_members": (
        "group_id TEXT NOT NULL REFERENCES groups(id), user_id TEXT NOT NULL REFERENCES users(id), "
        "PRIMARY KEY (group_id, user_id)",
        "group_id",
        "gmb",
    ),
    "problems": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, short_description TEXT NOT NULL, "
        "opened_by TEXT NOT NULL REFERENCES users(id), state TEXT NOT NULL, opened_at TEXT NOT NULL",
        "short_description",
        "prb",
    ),
    "incidents": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, short_description TEXT NOT NULL, "
        "caller_id TEXT NOT NULL REFERENCES users(id), assigned_to TEXT REFERENCES users(id), "
        "assignment_group TEXT REFERENCES groups(id), priority INTEGER NOT NULL, state TEXT NOT NULL, "
        "close_notes TEXT, problem_id TEXT REFERENCES problems(id), opened_at TEXT NOT NULL, updated_at TEXT NOT NULL",
        "short_description",
        "inc",
    ),
    "change_requests": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, short_description TEXT NOT NULL, "
        "requested_by TEXT NOT NULL REFERENCES users(id), assignment_group TEXT REFERENCES groups(id), "
        "risk TEXT NOT NULL, state TEXT NOT NULL, opened_at TEXT NOT NULL",
        "short_description",
        "chg",
    ),
    "assets": (
        "id TEXT PRIMARY KEY, asset_tag TEXT NOT NULL UNIQUE, model TEXT NOT NULL, "
        "assigned_to TEXT REFERENCES users(id), state TEXT NOT NULL",
        "asset_tag",
        "ast",
    ),
    "hr_topics": ("id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE", "name", "hrt"),
    "hr_services": (
        "id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, topic_id TEXT NOT NULL REFERENCES hr_topics(id)",
        "name",
        "hrs",
    ),
    "hr_profiles": (
        "id TEXT PRIMARY KEY, user_id TEXT NOT NULL UNIQUE REFERENCES users(id), department TEXT NOT NULL, "
        "title TEXT NOT NULL, manager_id TEXT REFERENCES users(id), employment_status TEXT NOT NULL, "
        "salary INTEGER NOT NULL",
        "user_id",
        "hrp",
    ),
    "hr_cases": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, subject_person TEXT NOT NULL REFERENCES users(id), "
        "opened_by TEXT NOT NULL REFERENCES users(id), hr_service TEXT NOT NULL REFERENCES hr_services(id), "
        "state TEXT NOT NULL, priority INTEGER NOT NULL, description TEXT NOT NULL, notes TEXT, opened_at TEXT NOT NULL",
        "description",
        "hrc",
    ),
    "accounts": (
        "id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, tier TEXT NOT NULL, owner_id TEXT NOT NULL REFERENCES users(id)",
        "name",
        "acc",
    ),
    "contacts": (
        "id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id), name TEXT NOT NULL, "
        "email TEXT NOT NULL UNIQUE",
        "email",
        "con",
    ),
    "csm_cases": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, account_id TEXT NOT NULL REFERENCES accounts(id), "
        "contact_id TEXT NOT NULL REFERENCES contacts(id), short_description TEXT NOT NULL, priority INTEGER NOT NULL, "
        "state TEXT NOT NULL, assigned_to TEXT REFERENCES users(id), incident_id TEXT REFERENCES incidents(id), "
        "opened_at TEXT NOT NULL",
        "short_description",
        "csc",
    ),
    "knowledge_articles": (
        "id TEXT PRIMARY KEY, number TEXT NOT NULL UNIQUE, title TEXT NOT NULL, topic TEXT NOT NULL, "
        "author_id TEXT NOT NULL REFERENCES users(id), state TEXT NOT NULL",
        "title",
        "kba",
    ),
    "notifications": (
        "id TEXT PRIMARY KEY, recipient_id TEXT NOT NULL REFERENCES users(id), subject TEXT NOT NULL, "
        "body TEXT NOT NULL, created_at TEXT NOT NULL",
        "subject",
        "ntf",
    ),
    "audit_log": (
        "id TEXT PRIMARY KEY, actor_id TEXT NOT NULL REFERENCES users(id), action TEXT NOT NULL, "
        "table_name TEXT NOT NULL, record_id TEXT NOT NULL, created_at TEXT NOT NULL",
        "action",
        "aud",
    ),
}
TABLES = tuple(SCHEMA)
NUMBER_PREFIX = {"incidents": "INC", "problems": "PRB", "change_requests": "CHG", "hr_cases": "HRC", "csm_cases": "CS"}
ROLES = ("admin", "itil", "hr_agent", "csm_agent", "employee")
DEPARTMENTS = ("Engineering", "Finance", "Sales", "Support", "People", "Legal")
FIRST = ("Ada", "Bela", "Chen", "Dara", "Emil", "Fatou", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mira", "Nils")
LAST = ("Okafor", "Petrov", "Quist", "Rossi", "Sato", "Tanaka", "Udal", "Varga", "Weber", "Xu", "Yilmaz", "Zamora")
ISSUES = (
    "VPN drops every hour",
    "Laptop will not boot",
    "Email sync fails on phone",
    "Printer on floor 3 jams",
    "Cannot reach the payroll portal",
    "Shared drive is read-only",
    "Badge reader rejects card",
    "Slow database queries in reporting",
    "Password reset link expired",
    "Monitor flickers after update",
)
COMPANIES = ("Acme Freight", "Birch Labs", "Cobalt Health", "Delta Foods", "Evergreen Bank", "Fjord Energy")
COMPANIES += ("Granite Media", "Harbor Retail", "Ion Robotics", "Juniper Travel", "Kestrel Air", "Lumen Schools")
HR_TOPICS = {"Benefits": ("Health insurance enrolment", "Pension change"), "Payroll": ("Salary correction",)}
HR_TOPICS |= {"Leave": ("Parental leave request", "Sick leave report"), "Onboarding": ("Equipment request",)}
ASSET_MODELS = ("ThinkPad X1", "MacBook Pro 14", "Dell Latitude 7440", "iPhone 15", "Pixel 8")
MINUTES_PER_TICK = 1


def ddl() -> str:
    """The schema as SQL (CREATE TABLE statements in dependency order)."""
    return "\n".join(f"CREATE TABLE {t} ({body});" for t, (body, _, _) in SCHEMA.items())


@dataclass(frozen=True)
class WorldSize:
    users: int = 40
    incidents: int = 30
    problems: int = 6
    changes: int = 8
    assets: int = 24
    hr_cases: int = 14
    accounts: int = 10
    contacts_per_account: int = 3
    csm_cases: int = 14
    articles: int = 8

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> WorldSize:
        return cls(**{k: int(v) for k, v in cfg.items() if k != "seed"})


def _stamp(minutes: int) -> str:
    """A time on the seed day, `minutes` (< 600) after 09:00."""
    return f"2026-01-05T{9 + minutes // 60:02d}:{minutes % 60:02d}:00"


def generate_world(seed: int, size: WorldSize) -> dict[str, list[dict[str, Any]]]:
    """Every row of the world, from `seed` alone (pure Python, `random.Random(seed)`)."""
    rng = random.Random(seed)
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    rows["roles"] = [{"id": f"rol{i:03d}", "name": r} for i, r in enumerate(ROLES, 1)]
    role_id = {r["name"]: r["id"] for r in rows["roles"]}
    names = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], size.users)
    # fixed role mix: the first users are the agents the tasks act as, the rest are employees
    role_cycle = ["admin", "itil", "itil", "itil", "hr_agent", "hr_agent", "csm_agent", "csm_agent"]
    for i, name in enumerate(names, 1):
        role = role_cycle[i - 1] if i <= len(role_cycle) else "employee"
        rows["users"].append(
            {
                "id": f"usr{i:04d}",
                "name": name,
                "email": name.lower().replace(" ", ".") + "@example.com",
                "role_id": role_id[role],
                "department": rng.choice(DEPARTMENTS),
                "active": 1,
            }
        )
    users = [u["id"] for u in rows["users"]]
    itil = [u["id"] for u in rows["users"] if u["role_id"] == role_id["itil"]]
    employees = users[len(role_cycle) :]
    for i, (name, domain) in enumerate(
        [("Service Desk", "itsm"), ("Network Ops", "itsm"), ("Hardware Support", "itsm"), ("HR Operations", "hr")]
        + [("Customer Care", "csm"), ("Key Accounts", "csm")],
        1,
    ):
        rows["groups"].append(
            {"id": f"grp{i:03d}", "name": name, "domain": domain, "manager_id": rng.choice(users[:8])}
        )
    agents_of = {"itsm": itil + [users[0]], "hr": users[4:6], "csm": users[6:8]}
    for g in rows["groups"]:
        for u in agents_of[g["domain"]]:
            rows["group_members"].append({"group_id": g["id"], "user_id": u})
    for i in range(1, size.problems + 1):
        rows["problems"].append(
            {
                "id": f"prb{i:04d}",
                "number": f"PRB{1000 + i:07d}",
                "short_description": f"Recurring: {rng.choice(ISSUES)}",
                "opened_by": rng.choice(itil),
                "state": rng.choice(["new", "assess"]),
                "opened_at": _stamp(rng.randrange(0, 600)),
            }
        )
    itsm_groups = [g for g in rows["groups"] if g["domain"] == "itsm"]
    for i in range(1, size.incidents + 1):
        state = rng.choice(["new", "new", "in_progress", "in_progress", "resolved", "closed"])
        group = rng.choice(itsm_groups) if state != "new" else None
        stamp = _stamp(rng.randrange(0, 600))
        rows["incidents"].append(
            {
                "id": f"inc{i:04d}",
                "number": f"INC{1000 + i:07d}",
                "short_description": rng.choice(ISSUES),
                "caller_id": rng.choice(employees),
                "assigned_to": rng.choice(itil) if group else None,
                "assignment_group": group["id"] if group else None,
                "priority": rng.randint(2, 4),
                "state": state,
                "close_notes": "Fixed by the service desk" if state in ("resolved", "closed") else None,
                "problem_id": None,
                "opened_at": stamp,
                "updated_at": stamp,
            }
        )
    for i in range(1, size.changes + 1):
        rows["change_requests"].append(
            {
                "id": f"chg{i:04d}",
                "number": f"CHG{1000 + i:07d}",
                "short_description": f"Patch {rng.choice(['mail', 'vpn', 'erp', 'wiki'])} servers",
                "requested_by": rng.choice(itil),
                "assignment_group": rng.choice(itsm_groups)["id"],
                "risk": rng.choice(["low", "moderate", "high"]),
                "state": rng.choice(["draft", "assess"]),
                "opened_at": _stamp(rng.randrange(0, 600)),
            }
        )
    for i in range(1, size.assets + 1):
        in_use = rng.random() < 0.5
        rows["assets"].append(
            {
                "id": f"ast{i:04d}",
                "asset_tag": f"P{100000 + i * 7}",
                "model": rng.choice(ASSET_MODELS),
                "assigned_to": rng.choice(employees) if in_use else None,
                "state": "in_use" if in_use else "in_stock",
            }
        )
    for i, (topic, services) in enumerate(HR_TOPICS.items(), 1):
        rows["hr_topics"].append({"id": f"hrt{i:03d}", "name": topic})
        for s in services:
            rows["hr_services"].append(
                {"id": f"hrs{len(rows['hr_services']) + 1:03d}", "name": s, "topic_id": f"hrt{i:03d}"}
            )
    managers = users[:8]
    for i, u in enumerate(rows["users"], 1):
        rows["hr_profiles"].append(
            {
                "id": f"hrp{i:04d}",
                "user_id": u["id"],
                "department": u["department"],
                "title": rng.choice(["Analyst", "Engineer", "Specialist", "Lead", "Coordinator"]),
                "manager_id": rng.choice([m for m in managers if m != u["id"]]),
                "employment_status": "active",
                "salary": rng.randrange(50, 150) * 1000,
            }
        )
    for i in range(1, size.hr_cases + 1):
        rows["hr_cases"].append(
            {
                "id": f"hrc{i:04d}",
                "number": f"HRC{1000 + i:07d}",
                "subject_person": rng.choice(employees),
                "opened_by": rng.choice(users[4:6]),
                "hr_service": rng.choice(rows["hr_services"])["id"],
                "state": rng.choice(["new", "in_progress", "in_progress", "resolved"]),
                "priority": rng.randint(2, 4),
                "description": f"Request about {rng.choice(['benefits', 'leave', 'payroll', 'equipment'])}",
                "notes": None,
                "opened_at": _stamp(rng.randrange(0, 600)),
            }
        )
    companies = rng.sample(COMPANIES, min(size.accounts, len(COMPANIES)))
    for i, company in enumerate(companies, 1):
        rows["accounts"].append(
            {
                "id": f"acc{i:03d}",
                "name": company,
                "tier": rng.choice(["gold", "silver", "bronze"]),
                "owner_id": rng.choice(users[6:8]),
            }
        )
        for j in range(size.contacts_per_account):
            name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            domain = company.lower().replace(" ", "") + ".com"
            rows["contacts"].append(
                {
                    "id": f"con{len(rows['contacts']) + 1:04d}",
                    "account_id": f"acc{i:03d}",
                    "name": name,
                    "email": f"{name.lower().replace(' ', '.')}{j}@{domain}",
                }
            )
    for i in range(1, size.csm_cases + 1):
        contact = rng.choice(rows["contacts"])
        rows["csm_cases"].append(
            {
                "id": f"csc{i:04d}",
                "number": f"CS{1000 + i:07d}",
                "account_id": contact["account_id"],
                "contact_id": contact["id"],
                "short_description": f"Customer reports: {rng.choice(ISSUES).lower()}",
                "priority": rng.randint(2, 4),
                "state": rng.choice(["open", "open", "in_progress", "closed"]),
                "assigned_to": rng.choice(users[6:8]),
                "incident_id": None,
                "opened_at": _stamp(rng.randrange(0, 600)),
            }
        )
    for i in range(1, size.articles + 1):
        issue = rng.choice(ISSUES)
        rows["knowledge_articles"].append(
            {
                "id": f"kba{i:04d}",
                "number": f"KB{1000 + i:07d}",
                "title": f"How to fix: {issue.lower()}",
                "topic": rng.choice(["network", "hardware", "accounts", "software"]),
                "author_id": rng.choice(itil),
                "state": "published",
            }
        )
    return rows


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def world_sql(seed: int, size: WorldSize) -> str:
    """The seed database as one SQL script (schema + INSERTs): the `sql_content` of the official seeding API."""
    rows = generate_world(seed, size)
    lines = [ddl()]
    for table in TABLES:
        for row in rows[table]:
            cols = ", ".join(row)
            lines.append(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(_literal(v) for v in row.values())});")
    return "\n".join(lines) + "\n"


def connect(sql: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    if sql is not None:
        conn.executescript(sql)
    return conn


def table_rows(conn: sqlite3.Connection, table: str) -> list[tuple]:
    cols = columns(conn, table)
    return [tuple(r) for r in conn.execute(sorted_rows_sql(table, cols))]


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def sorted_rows_sql(table: str, cols: list[str]) -> str:
    return f"SELECT {', '.join(cols)} FROM {table} ORDER BY {', '.join(cols)}"


def db_hash(conn: sqlite3.Connection, tables: Iterable[str] = TABLES) -> str:
    """sha256 over the sorted rows of `tables` (order of insertion and rowids do not matter)."""
    return rows_hash({t: table_rows(conn, t) for t in tables})


def rows_hash(rows: Mapping[str, Iterable[tuple]]) -> str:
    """The hash of `db_hash` from rows already read ({table: sorted row tuples}), e.g. through the SQL API."""
    h = hashlib.sha256()
    for table, table_rows_ in rows.items():
        h.update(table.encode())
        for row in table_rows_:
            h.update(repr(tuple(row)).encode())
    return h.hexdigest()


class Template:
    """The seed world parsed once; `episode()` gives a private copy of it (the reset between episodes)."""

    def __init__(self, sql: str):
        self.sql = sql
        self.conn = connect(sql)
        self.digest = hashlib.sha256(sql.encode()).hexdigest()

    def episode(self, actor: str, salt: str) -> Episode:
        conn = connect()
        self.conn.backup(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        return Episode(conn=conn, actor=actor, salt=salt)


@dataclass
class Episode:
    """One episode's database, acting identity (the x-user-id of the official harness) and minting state."""

    conn: sqlite3.Connection
    actor: str
    salt: str
    ticks: int = 0
    minted: list[tuple[str, str]] = field(default_factory=list)  # (table, id) in minting order
    quiet: bool = False  # set by the legacy distractor tools: skip the mandatory audit and notifications

    def now(self) -> str:
        self.ticks += 1
        minutes = 600 + self.ticks * MINUTES_PER_TICK
        return f"2026-01-06T{9 + minutes // 60 % 24:02d}:{minutes % 60:02d}:00"

    def mint(self, table: str) -> str:
        """A new id for `table`: a hash of the salt, the table and a counter (so another salt mints other ids)."""
        n = sum(1 for t, _ in self.minted if t == table)
        digest = hashlib.sha256(f"{self.salt}:{table}:{n}".encode()).hexdigest()[:10]
        new = f"{SCHEMA[table][2]}_{digest}"
        self.minted.append((table, new))
        return new

    def next_number(self, table: str) -> str:
        prefix = NUMBER_PREFIX[table]
        last = self.conn.execute(f"SELECT MAX(CAST(SUBSTR(number, {len(prefix) + 1}) AS INTEGER)) FROM {table}")
        return f"{prefix}{(last.fetchone()[0] or 1000) + 1:07d}"

    def hash(self, tables: Iterable[str] = TABLES) -> str:
        return db_hash(self.conn, tables)

    def close(self) -> None:
        self.conn.close()


def foreign_keys(conn: sqlite3.Connection, table: str) -> dict[str, str]:
    """column -> referenced table."""
    return {r[3]: r[2] for r in conn.execute(f"PRAGMA foreign_key_list({table})")}


def label_column(table: str) -> str:
    return SCHEMA[table][1]
