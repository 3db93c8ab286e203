"""The problem-designer world (spec section 4, smoke stand-in): concept sets c, hidden plans z drawn from a stochastic
grammar p*(z | c), and arithmetic problems x realised from z with random digits, verifiable by evaluation.

    c = ("MUL", "PAREN")                         # 2-3 of the 8 concepts
    z = ("PLAN", "d2", "mul", "d1", "add", "d1", "nest", "END")
    x = ("(", "2", "3", "*", "4", ")", "+", "7", "=")
    evaluate(x) -> 99; realised_concepts(x) -> {"MUL", "ADD", "PAREN", "TWO_DIGIT", "CHAIN3"}

A plan is PLAN, the first operand's size, then (op, size) per operation, then the modifiers nest / carry / zero,
then END. Every concept of c is realised by the plan; an extra operation is added with probability 0.4; the
operations are ordered at random. The realiser draws digits that satisfy the modifiers (carry: the added operands'
units digits sum to 10 or more; zero: a "* 0" step, or "- itself" without a multiplication).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONCEPTS = ("ADD", "SUB", "MUL", "PAREN", "CARRY", "TWO_DIGIT", "CHAIN3", "ZERO_TRAP")
OPS = ("add", "sub", "mul")
SIZES = ("d1", "d2")
MODIFIERS = ("nest", "carry", "zero")
PLAN_INNER = (*OPS, *SIZES, *MODIFIERS)
PLAN_WORDS = ("PLAN", *PLAN_INNER, "END")
SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
DIGITS = tuple(str(d) for d in range(10))
PROBLEM_WORDS = (*DIGITS, "+", "-", "*", "(", ")", "=")
SEPARATORS = ("<c>", "<x>", "<z>")
WORDS = (*SEPARATORS, *CONCEPTS, *PLAN_WORDS, *PROBLEM_WORDS)
EXTRA_OP = 0.4
EXTRA_TWO_DIGIT = 0.3


@dataclass(frozen=True)
class Item:
    concepts: tuple[str, ...]
    plan: tuple[str, ...]
    problem: tuple[str, ...]

    @property
    def answer(self) -> int:
        return evaluate(self.problem)


def draw_concepts(rng: np.random.Generator, weights: np.ndarray | None = None) -> tuple[str, ...]:
    """2 or 3 distinct concepts (in CONCEPTS order), uniformly or by `weights`."""
    k = int(rng.integers(2, 4))
    p = None if weights is None else weights / weights.sum()
    idx = sorted(rng.choice(len(CONCEPTS), size=k, replace=False, p=p))
    return tuple(CONCEPTS[i] for i in idx)


def draw_plan(c: Sequence[str], rng: np.random.Generator) -> tuple[str, ...]:
    """z ~ p*(z | c): the operations c requires (and carry -> add, zero -> mul or sub, CHAIN3 -> 2 or more), an
    extra operation with probability 0.4, in random order; sizes d2 where TWO_DIGIT asks; the modifiers."""
    ops = [o for o, concept in zip(OPS, ("ADD", "SUB", "MUL")) if concept in c]
    if "CARRY" in c and "add" not in ops:
        ops.append("add")
    if "ZERO_TRAP" in c and not {"mul", "sub"} & set(ops):
        ops.append(str(rng.choice(["mul", "sub"])))
    while len(ops) < (2 if "CHAIN3" in c else 1):
        ops.append(str(rng.choice(OPS)))
    if rng.random() < EXTRA_OP:
        ops.append(str(rng.choice(OPS)))
    ops = [ops[i] for i in rng.permutation(len(ops))]
    sizes = ["d1"] * (len(ops) + 1)
    if "TWO_DIGIT" in c:
        sizes[int(rng.integers(0, len(sizes)))] = "d2"
        sizes = [s if s == "d2" or rng.random() >= EXTRA_TWO_DIGIT else "d2" for s in sizes]
    plan = ["PLAN", sizes[0]]
    for op, size in zip(ops, sizes[1:]):
        plan += [op, size]
    plan += [m for m, concept in zip(MODIFIERS, ("PAREN", "CARRY", "ZERO_TRAP")) if concept in c]
    return (*plan, "END")


def parse_plan(z: Sequence[str]) -> tuple[list[str], list[str], set[str]] | None:
    """(ops, sizes, modifiers) of a well-formed plan, or None."""
    z = list(z)
    if len(z) < 5 or z[0] != "PLAN" or z[-1] != "END" or z[1] not in SIZES:
        return None
    body, sizes, ops = z[2:-1], [z[1]], []
    while len(body) >= 2 and body[0] in OPS and body[1] in SIZES:
        ops.append(body[0])
        sizes.append(body[1])
        body = body[2:]
    mods = list(body)
    if not ops or any(m not in MODIFIERS for m in mods) or len(set(mods)) != len(mods):
        return None
    if list(mods) != [m for m in MODIFIERS if m in mods]:
        return None
    return ops, sizes, set(mods)


def _number(size: str, rng: np.random.Generator) -> int:
    return int(rng.integers(1, 10)) if size == "d1" else int(rng.integers(10, 100))


def realise(z: Sequence[str], rng: np.random.Generator) -> tuple[str, ...] | None:
    """x from a plan: operands of the planned sizes, carry forced on the first addition, the zero trap on the first
    multiplication (right operand 0) or, without one, the first subtraction (right operand = its left neighbour),
    parentheses around the first operation. None when the plan is not well formed or cannot be realised (the zero
    trap on a two-digit operand, or on an operand of the carry): p* draws again (`draw_items`)."""
    parsed = parse_plan(z)
    if parsed is None:
        return None
    ops, sizes, mods = parsed
    if "carry" in mods and "add" not in ops or "zero" in mods and not {"mul", "sub"} & set(ops):
        return None
    zero_at = None
    if "zero" in mods:
        if "mul" in ops:
            zero_at = (ops.index("mul") + 1,)
        else:
            i = ops.index("sub")
            zero_at = (i, i + 1)
            if sizes[i] != sizes[i + 1]:
                return None  # "n - n" needs equal sizes
        if "mul" in ops and sizes[zero_at[0]] == "d2":
            return None  # "* 0" has no two-digit operand
    nums = [_number(s, rng) for s in sizes]
    if "carry" in mods:
        i = ops.index("add")
        if zero_at is not None and {i, i + 1} & set(zero_at):
            return None  # the carry's operands cannot also be the zero trap's
        left, right = nums[i], nums[i + 1]
        need = 10 - left % 10
        if need > 9:  # the left units digit is 0: no carry possible, redraw it
            left = left - left % 10 + int(rng.integers(1, 10))
            need = 10 - left % 10
        unit = int(rng.integers(need, 10))
        right = (right // 10) * 10 + unit if right >= 10 else unit
        nums[i], nums[i + 1] = left, right
    if zero_at is not None:
        if len(zero_at) == 1:
            nums[zero_at[0]] = 0
        else:
            nums[zero_at[1]] = nums[zero_at[0]]
    words: list[str] = []
    for k, n in enumerate(nums):
        if k > 0:
            words.append(SYMBOL[ops[k - 1]])
        if k == 0 and "nest" in mods:
            words.append("(")
        words += list(str(n))
        if k == 1 and "nest" in mods:
            words.append(")")
    return (*words, "=")


def tokens_to_expression(x: Sequence[str]) -> tuple[list, bool] | None:
    """Numbers and symbols of a problem (without '='), and whether it is well formed: operand, (op operand)*,
    with balanced parentheses that never close before they open. None when it does not parse."""
    x = list(x)
    if not x or x[-1] != "=" or "=" in x[:-1]:
        return None
    items, digits = [], ""
    for w in x[:-1]:
        if w in DIGITS:
            digits += w
            continue
        if digits:
            items.append(int(digits))
            digits = ""
        if w not in ("+", "-", "*", "(", ")"):
            return None
        items.append(w)
    if digits:
        items.append(int(digits))
    depth, expect_operand = 0, True
    for it in items:
        if it == "(":
            if not expect_operand:
                return None
            depth += 1
        elif it == ")":
            if expect_operand or depth == 0:
                return None
            depth -= 1
        elif isinstance(it, int):
            if not expect_operand:
                return None
            expect_operand = False
        else:
            if expect_operand:
                return None
            expect_operand = True
    if depth != 0 or expect_operand:
        return None
    return items, True


def evaluate(x: Sequence[str]) -> int:
    """The value of a well-formed problem (Python arithmetic on the parsed numbers); ValueError otherwise."""
    parsed = tokens_to_expression(x)
    if parsed is None:
        raise ValueError(f"not a well-formed problem: {' '.join(x)}")
    return int(eval(" ".join(str(i) for i in parsed[0]), {"__builtins__": {}}))  # noqa: S307 (digits and + - * ( ))


def is_valid(x: Sequence[str]) -> bool:
    """Parses and evaluates (spec section 8's validity)."""
    try:
        evaluate(x)
    except (ValueError, SyntaxError, ZeroDivisionError):
        return False
    return True


def realised_concepts(x: Sequence[str]) -> set[str]:
    """The concepts a well-formed problem realises: its operations, parentheses, a two-digit number, three or
    more operands, an addition with a carry in the units of the operands written beside the "+" (as the realiser
    forces it), a "* 0" / "0 *" or "n - n" step."""
    parsed = tokens_to_expression(x)
    if parsed is None:
        return set()
    items = parsed[0]
    flat = [i for i in items if i not in ("(", ")")]
    numbers = [i for i in flat if isinstance(i, int)]
    out = {c for c, s in (("ADD", "+"), ("SUB", "-"), ("MUL", "*")) if s in flat}
    if "(" in items:
        out.add("PAREN")
    if any(n >= 10 for n in numbers):
        out.add("TWO_DIGIT")
    if len(numbers) >= 3:
        out.add("CHAIN3")
    for k in range(1, len(flat) - 1, 2):
        left, op, right = flat[k - 1], flat[k], flat[k + 1]
        if op == "+" and left % 10 + right % 10 >= 10:
            out.add("CARRY")
        if op == "*" and 0 in (left, right) or op == "-" and left == right:
            out.add("ZERO_TRAP")
    return out


def consistent(x: Sequence[str], c: Sequence[str]) -> bool:
    """x realises every concept of c (spec section 8's concept consistency)."""
    return set(c) <= realised_concepts(x)


def n_ops(x: Sequence[str]) -> int:
    return sum(1 for w in x if w in ("+", "-", "*"))


def skeleton(x: Sequence[str]) -> str:
    """The problem with every number replaced by its digit count (diversity and dedup key)."""
    parsed = tokens_to_expression(x)
    if parsed is None:
        return "invalid"
    return " ".join(f"N{len(str(i))}" if isinstance(i, int) else i for i in parsed[0])


def draw_items(
    rng: np.random.Generator, n: int, min_ops: int, max_ops: int, exclude: set[tuple] | None = None
) -> list[Item]:
    """n items (c, z, x) from p*, keeping plans with min_ops..max_ops operations and problems not in `exclude`
    (dedup by the problem itself: skeleton plus digits)."""
    out, seen = [], set(exclude or ())
    while len(out) < n:
        c = draw_concepts(rng)
        z = draw_plan(c, rng)
        ops = len(parse_plan(z)[0])
        if not min_ops <= ops <= max_ops:
            continue
        x = realise(z, rng)
        if x is None or x in seen:
            continue
        seen.add(x)
        out.append(Item(c, z, x))
    return out


def corrupt_plan(z: Sequence[str], rng: np.random.Generator, rate: float) -> tuple[str, ...]:
    """The cold-start annotator (stand-in for the four LLMs): each inner plan token is, with probability `rate`,
    replaced by a different inner token or swapped with a different right neighbour (half each). PLAN and END
    stay."""
    inner = list(z[1:-1])
    for i in range(len(inner)):
        if rng.random() < rate:
            if rng.random() < 0.5 or i == len(inner) - 1 or inner[i] == inner[i + 1]:
                inner[i] = str(rng.choice([w for w in PLAN_INNER if w != inner[i]]))
            else:
                inner[i], inner[i + 1] = inner[i + 1], inner[i]
    return ("PLAN", *inner, "END")


def alignment_accuracy(pred: Sequence[str], true: Sequence[str]) -> float:
    """Position-wise token accuracy after a minimum-edit alignment: the number of aligned equal pairs on an
    optimal Levenshtein path (most matches among optimal paths) divided by len(true)."""
    n, m = len(pred), len(true)
    cost = np.zeros((n + 1, m + 1), dtype=int)
    match = np.zeros((n + 1, m + 1), dtype=int)
    cost[:, 0] = np.arange(n + 1)
    cost[0, :] = np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            same = pred[i - 1] == true[j - 1]
            options = [
                (cost[i - 1, j - 1] + (0 if same else 1), -(match[i - 1, j - 1] + int(same))),
                (cost[i - 1, j] + 1, -match[i - 1, j]),
                (cost[i, j - 1] + 1, -match[i, j - 1]),
            ]
            c, neg = min(options)
            cost[i, j], match[i, j] = c, -neg
    return float(match[n, m]) / max(m, 1)


class ConceptSampler:
    """Concept sets for synthesis (spec 2.4 / section 7): the first concept by its frequency in the seeds, each
    next one by softmax((co-occurrence share + sum of cosine similarities to the chosen ones) / temperature),
    with random 64-d concept embeddings (seeded)."""

    def __init__(
        self, seed_concepts: Sequence[Sequence[str]], rng: np.random.Generator, dim: int = 64, temperature: float = 1.0
    ):
        k = len(CONCEPTS)
        self.freq = np.ones(k)
        self.cooc = np.zeros((k, k))
        for c in seed_concepts:
            idx = [CONCEPTS.index(w) for w in c]
            self.freq[idx] += 1
            for i in idx:
                for j in idx:
                    if i != j:
                        self.cooc[i, j] += 1
        self.cooc /= max(self.cooc.max(), 1)
        emb = rng.normal(size=(k, dim))
        self.emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        self.temperature = float(temperature)

    def draw(self, rng: np.random.Generator) -> tuple[str, ...]:
        size = int(rng.integers(2, 4))
        chosen = [int(rng.choice(len(CONCEPTS), p=self.freq / self.freq.sum()))]
        while len(chosen) < size:
            score = self.cooc[chosen].sum(0) + (self.emb @ self.emb[chosen].T).sum(1)
            score[chosen] = -np.inf
            p = np.exp((score - score[np.isfinite(score)].max()) / self.temperature)
            chosen.append(int(rng.choice(len(CONCEPTS), p=p / p.sum())))
        return tuple(CONCEPTS[i] for i in sorted(chosen))
