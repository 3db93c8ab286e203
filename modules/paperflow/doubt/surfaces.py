"""The answer surfaces (spec section 11): every canonical answer has several paraphrases, which the tiny VLM is
trained on, so that sampled answer sets vary in wording as well as in meaning. The parser maps a surface back to
its canonical answer (the first colour, shape or count word in it; None if there is none)."""

from __future__ import annotations

from collections.abc import Sequence

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
