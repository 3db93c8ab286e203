"""Grid scenes (spec section 4, offline stand-in): a 4x4 grid with 1-3 objects of distinct cells, shape and colour
drawn with a language prior (each shape has a usual colour), and the "image" as one noisy feature vector per cell
(one-hot shape + one-hot colour + Gaussian noise of a per-scene sigma). Questions with 1-2 word canonical answers.

# TODO(share): merge with paperflow.core.scenes (specflow's generator) once it exists and fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES = ("circle", "square", "triangle", "star")
COLOURS = ("red", "green", "blue", "yellow")
COUNTS = ("zero", "one", "two", "three")
USUAL_COLOUR = {"circle": "red", "square": "green", "triangle": "blue", "star": "yellow"}
GRID = 4
N_CELLS = GRID * GRID
FEATURE_DIM = len(SHAPES) + len(COLOURS)
QUESTION_KINDS = ("colour_of_shape", "shape_of_colour", "count_colour")


@dataclass(frozen=True)
class Scene:
    objects: tuple[tuple[int, str, str], ...]  # (cell, shape, colour), sorted by cell
    sigma: float

    def describe(self) -> list[str]:
        """The object list as words: "red circle , blue square" (cells in reading order)."""
        words: list[str] = []
        for i, (_, shape, colour) in enumerate(self.objects):
            words += ([","] if i else []) + [colour, shape]
        return words


def draw_scene(rng: np.random.Generator, prior: float, sigmas: tuple[float, ...]) -> Scene:
    """1-3 objects on distinct cells; a shape takes its usual colour with probability `prior`, else another."""
    n = int(rng.integers(1, 4))
    cells = sorted(rng.choice(N_CELLS, size=n, replace=False).tolist())
    objects = []
    for cell in cells:
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        others = [c for c in COLOURS if c != USUAL_COLOUR[shape]]
        colour = USUAL_COLOUR[shape] if rng.random() < prior else others[int(rng.integers(len(others)))]
        objects.append((int(cell), shape, colour))
    return Scene(tuple(objects), float(sigmas[int(rng.integers(len(sigmas)))]))


def features(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    """[16, 8] float32: one-hot shape and colour in the occupied cells, plus N(0, sigma^2) noise everywhere."""
    x = np.zeros((N_CELLS, FEATURE_DIM), dtype=np.float32)
    for cell, shape, colour in scene.objects:
        x[cell, SHAPES.index(shape)] = 1.0
        x[cell, len(SHAPES) + COLOURS.index(colour)] = 1.0
    return x + rng.normal(0.0, scene.sigma, size=x.shape).astype(np.float32)


def questions(scene: Scene) -> list[tuple[str, list[str], str]]:
    """Every (kind, question words, canonical answer) the scene answers unambiguously."""
    shapes = [s for _, s, _ in scene.objects]
    colours = [c for _, _, c in scene.objects]
    out = []
    for _, shape, colour in scene.objects:
        if shapes.count(shape) == 1:
            out.append(("colour_of_shape", ["what", "colour", "is", "the", shape, "?"], colour))
        if colours.count(colour) == 1:
            out.append(("shape_of_colour", ["what", "shape", "is", "the", colour, "object", "?"], shape))
    for colour in COLOURS:
        out.append(
            ("count_colour", ["how", "many", colour, "objects", "are", "there", "?"], COUNTS[colours.count(colour)])
        )
    return out


def draw_items(n: int, seed: int, prior: float, sigmas: tuple[float, ...]) -> list[dict]:
    """`n` (scene, question) items, one question per scene drawn uniformly among its kinds then among the
    questions of that kind: dicts with the scene, its features, the question and the canonical answer."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        scene = draw_scene(rng, prior, sigmas)
        qs = questions(scene)
        kinds = sorted({k for k, _, _ in qs})
        kind = kinds[int(rng.integers(len(kinds)))]
        of_kind = [q for q in qs if q[0] == kind]
        _, words, answer = of_kind[int(rng.integers(len(of_kind)))]
        items.append(
            {
                "item": i,
                "kind": kind,
                "question": " ".join(words),
                "answer": answer,
                "objects": " ".join(scene.describe()),
                "sigma": scene.sigma,
                "features": features(scene, rng).reshape(-1).tolist(),
            }
        )
    return items
