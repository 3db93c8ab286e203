"""The answer surfaces (spec section 11): every canonical answer has several paraphrases, which the tiny VLM is
trained on, so that sampled answer sets vary in wording as well as in meaning. The parser maps a surface back to
its canonical answer (the first colour, shape or count word in it; None if there is none)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from paperflow.doubt.scenes import COLOURS, COUNTS, SHAPES

TEMPLATES = {
    "colour_of_shape": ("{}", "it is {}", "the colour is {}", "{} colour"),
    "shape_of_colour": ("{}", "it is a {}", "the shape is a {}", "a {} shape"),
    "count_colour": ("{}", "there are {}", "the count is {}", "{} objects"),
}
VALUES = {"colour_of_shape": COLOURS, "shape_of_colour": SHAPES, "count_colour": COUNTS}
CANONICAL = frozenset(COLOURS + SHAPES + COUNTS)
WRAP = "The answer of this question is {}."  # the official code's sentence around a (mapped) answer
PROMPT_WORDS = ("what", "colour", "is", "the", "shape", "object", "?", "how", "many", "objects", "are", "there")
CONTROL_WORDS = ("<img>", "list", "desc", "ans", ",")


def surface(kind: str, answer: str, template: int) -> list[str]:
    return TEMPLATES[kind][template].format(answer).split()


def sampled_template_probs(weights: Sequence[float], kind: str, temperature: float) -> np.ndarray:
    """The probability of each template of `kind` in a sample at `temperature` from a model that learnt the training
    weights exactly: word by word, the next-word law (from the weights of the templates sharing the prefix, the end
    of a template one more outcome) is raised to 1 / temperature and renormalised, as the sampler does."""
    words = [surface(kind, "X", t) + ["</s>"] for t in range(len(TEMPLATES[kind]))]
    w = np.asarray(weights, dtype=float)
    out = np.ones(len(words))

    def walk(members: list[int], depth: int) -> None:
        nexts = sorted({words[m][depth] for m in members})
        mass = np.array([w[[m for m in members if words[m][depth] == x]].sum() for x in nexts])
        sharp = (mass / mass.sum()) ** (1.0 / temperature)
        sharp /= sharp.sum()
        for x, q in zip(nexts, sharp):
            group = [m for m in members if words[m][depth] == x]
            out[group] *= q
            if x != "</s>" and q > 0:  # a prefix never trained on: its templates keep probability 0
                walk(group, depth + 1)

    walk(list(range(len(words))), 0)
    return out


def _weights(w0: float, k: int) -> np.ndarray:
    return np.r_[w0, np.full(k - 1, (1 - w0) / (k - 1))]


def sampled_variety(w0: float, kind: str, temperature: float) -> float:
    """The expected surface variety of samples at `temperature` from a model that learnt the weights (bare answer
    w0, each paraphrase (1 - w0) / (k - 1)): the probability of a surface other than the most likely one."""
    return float(1 - sampled_template_probs(_weights(w0, len(TEMPLATES[kind])), kind, temperature).max())


def template_weights(variety: float, kind: str, temperature: float) -> np.ndarray:
    """Training weights of the templates of `kind`: the bare answer (template 0) w0, each paraphrase (1 - w0) / (k - 1),
    w0 solved (bisection) so that samples at `temperature` have the surface variety `variety` (`sampled_variety`):
    the measured variety of config `train.surface_variety` holds at the sampling temperature, not in the training
    data (issue 50). Four templates cap the variety (at most 0.75; lower where two templates share their first
    word); a larger `variety` gets the cap (`variety_ceiling`), with the bare answer still the most likely surface."""
    k = len(TEMPLATES[kind])
    w_cap, cap = variety_ceiling(kind, temperature)
    if variety >= cap:
        return _weights(w_cap, k)
    lo, hi = w_cap, 1.0  # on [w_cap, 1] the variety falls as w0 rises
    for _ in range(60):
        mid = (lo + hi) / 2
        if sampled_variety(mid, kind, temperature) > variety:
            lo = mid
        else:
            hi = mid
    return _weights((lo + hi) / 2, k)


def variety_ceiling(kind: str, temperature: float) -> tuple[float, float]:
    """(w0, variety) where the sampled variety of `kind`'s templates peaks (a grid of w0 step 1e-3, refined by
    golden-section search): beyond it a paraphrase would become the most likely surface."""
    grid = np.linspace(1e-3, 1.0, 1000)
    values = np.array([sampled_variety(w, kind, temperature) for w in grid])
    j = int(np.argmax(values))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    g = (np.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if sampled_variety(a, kind, temperature) >= sampled_variety(b, kind, temperature):
            hi = b
        else:
            lo = a
    w = (lo + hi) / 2
    return float(w), sampled_variety(w, kind, temperature)


def canonical(text: str | Sequence[str]) -> str | None:
    """The canonical answer of a surface: its first colour / shape / count word, None when it has none."""
    words = text.split() if isinstance(text, str) else list(text)
    return next((w for w in words if w in CANONICAL), None)


def vocabulary_words() -> list[str]:
    words = list(CONTROL_WORDS) + list(PROMPT_WORDS) + list(COLOURS + SHAPES + COUNTS)
    for templates in TEMPLATES.values():
        for t in templates:
            words += [w for w in t.split() if w != "{}"]
    return list(dict.fromkeys(words))


def dev_surfaces() -> list[tuple[str, str]]:
    """(surface, canonical) for every template and value: the dev set the semantic clusterer's threshold is
    chosen on (no test item, no model output)."""
    return [
        (" ".join(surface(kind, value, t)), value)
        for kind, values in VALUES.items()
        for value in values
        for t in range(len(TEMPLATES[kind]))
    ]


def normalise(text: str) -> str:
    """A surface string as compared across samples: lower case, punctuation dropped, whitespace collapsed ("Blue."
    and "blue" are one surface; "The sky is blue." is another)."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def surface_variety(answers: Sequence[str], meaning: Callable[[str], str | None]) -> tuple[int, int]:
    """(off-mode, counted) of one answer set: among the answers whose `meaning` is parsed and shared by at least
    one other answer of the set, how many are phrased otherwise than their meaning's most common surface
    (`normalise`d). The surface variety of many sets is sum(off-mode) / sum(counted): how often one meaning is
    phrased differently across samples (issue 50; the same statistic for SmolLM2's answers in
    tools/measure/doubt_surface_variety.py and for the tiny VLM's sampled sets)."""
    groups: dict[str, list[str]] = {}
    for a in answers:
        m = meaning(a)
        if m is not None:
            groups.setdefault(m, []).append(normalise(a))
    off = counted = 0
    for surfaces in groups.values():
        if len(surfaces) >= 2:
            counted += len(surfaces)
            off += len(surfaces) - Counter(surfaces).most_common(1)[0][1]
    return off, counted
