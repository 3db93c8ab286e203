"""Seeded synthetic grid scenes: a few objects, each with a shape and a colour, in distinct cells of a G x G grid.

One scene description serves two renderings:

- `cell_features`: one feature vector per cell (one-hot shape and colour, plus Gaussian noise), the "image" of a
  vision-free toy VLM (doubt);
- `render`: an RGB picture, each object drawn `object_px` wide at a random offset inside its cell on a textured
  background, with the per-pixel instance map (specflow: counting, object coverage of kept patch tokens).

    scenes = sample_scenes(1000, grid=4, min_objects=1, max_objects=5, seed=0)
    images, instance = render(scenes, cell_px=8, seed=1)        # (1000, 32, 32, 3), (1000, 32, 32)
    covers = patch_objects(instance, patch=4, max_objects=5)    # (1000, 64, 5): patch p shows object j

Numpy only; the same seed gives the same scenes. Padding slots (scene with fewer objects than `max_objects`) hold -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES = ("square", "cross", "circle", "triangle", "star")
COLOURS = ("red", "green", "blue", "yellow")
RGB = np.array([[0.9, 0.1, 0.1], [0.1, 0.8, 0.1], [0.15, 0.3, 0.95], [0.95, 0.9, 0.1]], dtype=np.float32)


@dataclass(frozen=True)
class GridScenes:
    """n scenes on a `grid` x `grid` layout; arrays of shape (n, max_objects), -1 in unused slots."""

    grid: int
    cell: np.ndarray  # cell index r * grid + c, distinct within a scene
    shape: np.ndarray  # index into SHAPES
    colour: np.ndarray  # index into COLOURS
    count: np.ndarray  # (n,) objects per scene

    def __len__(self) -> int:
        return len(self.count)

    @property
    def max_objects(self) -> int:
        return self.cell.shape[1]


def sample_scenes(
    n: int,
    *,
    grid: int = 4,
    min_objects: int = 1,
    max_objects: int = 3,
    n_shapes: int = len(SHAPES),
    n_colours: int = len(COLOURS),
    seed: int = 0,
) -> GridScenes:
    """`n` scenes with a count uniform in [min_objects, max_objects], objects in distinct cells (uniform without
    replacement), shape and colour uniform over the first `n_shapes` / `n_colours`."""
    if not 1 <= min_objects <= max_objects <= grid * grid:
        raise ValueError(f"need 1 <= min_objects <= max_objects <= grid^2; got {min_objects}, {max_objects}, {grid}")
    if not (1 <= n_shapes <= len(SHAPES) and 1 <= n_colours <= len(COLOURS)):
        raise ValueError(f"n_shapes <= {len(SHAPES)} and n_colours <= {len(COLOURS)}")
    rng = np.random.default_rng(seed)
    count = rng.integers(min_objects, max_objects + 1, size=n)
    cells = np.argsort(rng.random((n, grid * grid)), axis=1)[:, :max_objects]  # distinct cells per scene
    shape = rng.integers(0, n_shapes, size=(n, max_objects))
    colour = rng.integers(0, n_colours, size=(n, max_objects))
    unused = np.arange(max_objects)[None, :] >= count[:, None]
    for arr in (cells, shape, colour):
        arr[unused] = -1
    return GridScenes(grid=grid, cell=cells, shape=shape, colour=colour, count=count)


def cell_features(scenes: GridScenes, noise_sigma: float | np.ndarray, seed: int = 0) -> np.ndarray:
    """(n, grid^2, len(SHAPES) + len(COLOURS)) float32: one-hot shape and colour of the cell's object (zeros for
    an empty cell) plus N(0, sigma^2) noise; `noise_sigma` is a scalar or one value per scene."""
    n, cells = len(scenes), scenes.grid * scenes.grid
    feats = np.zeros((n, cells, len(SHAPES) + len(COLOURS)), dtype=np.float32)
    rows, slots = np.nonzero(scenes.cell >= 0)
    feats[rows, scenes.cell[rows, slots], scenes.shape[rows, slots]] = 1.0
    feats[rows, scenes.cell[rows, slots], len(SHAPES) + scenes.colour[rows, slots]] = 1.0
    sigma = np.broadcast_to(np.asarray(noise_sigma, dtype=np.float32), (n,))
    noise = np.random.default_rng(seed).standard_normal(feats.shape).astype(np.float32)
    return feats + sigma[:, None, None] * noise


def shape_mask(shape: int, size: int) -> np.ndarray:
    """(size, size) bool stencil of SHAPES[shape]."""
    r, c = np.mgrid[:size, :size]
    mid = (size - 1) / 2
    name = SHAPES[shape]
    if name == "square":
        return np.ones((size, size), dtype=bool)
    if name == "cross":
        return (np.abs(r - mid) <= 0.5) | (np.abs(c - mid) <= 0.5)
    if name == "circle":
        return (r - mid) ** 2 + (c - mid) ** 2 <= (size / 2) ** 2
    if name == "triangle":
        return np.abs(c - mid) <= (r + 1) / 2
    if name == "star":  # a diagonal cross plus the centre row and column
        diag = (np.abs(r - c) <= 0.5) | (np.abs(r + c - (size - 1)) <= 0.5)
        return diag | (np.abs(r - mid) <= 0.5) | (np.abs(c - mid) <= 0.5)
    raise ValueError(f"unknown shape {shape}")


def render(
    scenes: GridScenes,
    *,
    cell_px: int = 8,
    object_px: tuple[int, int] = (3, 5),
    texture: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """RGB images (n, H, W, 3) float32 in [0, 1], H = W = grid * cell_px, and the instance map (n, H, W) int8
    (-1 background, j for the object in slot j). Each object is a stencil of side uniform in `object_px`, at a
    uniform offset inside its cell, in its colour (+-5% jitter); the background is grey 0.35 with uniform
    texture of amplitude `texture`."""
    lo, hi = object_px
    if not 1 <= lo <= hi <= cell_px:
        raise ValueError(f"object_px {object_px} must lie in [1, cell_px={cell_px}]")
    rng = np.random.default_rng(seed)
    n, side = len(scenes), scenes.grid * cell_px
    images = (0.35 + texture * (rng.random((n, side, side, 3), dtype=np.float32) - 0.5)).astype(np.float32)
    instance = np.full((n, side, side), -1, dtype=np.int8)
    stencils = {(s, z): shape_mask(s, z) for s in range(len(SHAPES)) for z in range(lo, hi + 1)}
    sizes = rng.integers(lo, hi + 1, size=scenes.cell.shape)
    offsets = rng.random((*scenes.cell.shape, 2))
    jitter = 1 + 0.05 * (rng.random((*scenes.cell.shape, 3)) - 0.5) * 2
    for i, j in zip(*np.nonzero(scenes.cell >= 0)):
        z = sizes[i, j]
        gr, gc = divmod(int(scenes.cell[i, j]), scenes.grid)
        r0 = gr * cell_px + int(offsets[i, j, 0] * (cell_px - z + 1))
        c0 = gc * cell_px + int(offsets[i, j, 1] * (cell_px - z + 1))
        m = stencils[(int(scenes.shape[i, j]), int(z))]
        images[i, r0 : r0 + z, c0 : c0 + z][m] = np.clip(RGB[scenes.colour[i, j]] * jitter[i, j], 0, 1)
        instance[i, r0 : r0 + z, c0 : c0 + z][m] = j
    return images, instance


def patch_objects(instance: np.ndarray, patch: int, max_objects: int) -> np.ndarray:
    """(n, (H/patch) * (W/patch), max_objects) bool: patch p (row-major) shows at least one pixel of object j."""
    n, h, w = instance.shape
    if h % patch or w % patch:
        raise ValueError(f"image {h}x{w} is not a multiple of patch {patch}")
    tiles = instance.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    tiles = tiles.reshape(n, (h // patch) * (w // patch), patch * patch)
    return (tiles[..., None] == np.arange(max_objects)).any(axis=2)
