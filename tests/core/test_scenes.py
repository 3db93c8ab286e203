"""paperflow.core.scenes: seeded grid scenes, their cell features and their rendering."""

import numpy as np
import pytest

from paperflow.core.scenes import COLOURS, SHAPES, cell_features, patch_objects, render, sample_scenes, shape_mask


def test_same_seed_same_scenes_and_counts_in_range():
    a, b = (
        sample_scenes(200, grid=4, min_objects=1, max_objects=3, seed=7),
        sample_scenes(200, grid=4, max_objects=3, seed=7),
    )
    for x, y in ((a.cell, b.cell), (a.shape, b.shape), (a.colour, b.colour), (a.count, b.count)):
        np.testing.assert_array_equal(x, y)
    assert a.count.min() >= 1 and a.count.max() <= 3 and set(a.count) == {1, 2, 3}
    assert not np.array_equal(a.cell, sample_scenes(200, grid=4, max_objects=3, seed=8).cell)


def test_distinct_cells_and_padding():
    s = sample_scenes(300, grid=4, min_objects=2, max_objects=5, seed=0)
    for i in range(len(s)):
        used = s.cell[i][s.cell[i] >= 0]
        assert len(used) == s.count[i] == len(set(used.tolist()))
        assert (s.shape[i, s.count[i] :] == -1).all() and (s.colour[i, s.count[i] :] == -1).all()
        assert (s.shape[i, : s.count[i]] < len(SHAPES)).all() and (s.colour[i, : s.count[i]] < len(COLOURS)).all()


def test_bad_counts_refused():
    with pytest.raises(ValueError):
        sample_scenes(5, grid=2, min_objects=1, max_objects=5)


def test_cell_features_one_hot_without_noise():
    s = sample_scenes(50, grid=4, max_objects=3, seed=1)
    f = cell_features(s, 0.0)
    assert f.shape == (50, 16, len(SHAPES) + len(COLOURS))
    assert f.sum() == 2 * s.count.sum()
    i, j = 0, 0
    cell = s.cell[i, j]
    assert f[i, cell, s.shape[i, j]] == 1 and f[i, cell, len(SHAPES) + s.colour[i, j]] == 1
    noisy = cell_features(s, np.linspace(0.2, 1.4, 50), seed=3)
    assert np.std(noisy[0] - f[0]) < np.std(noisy[-1] - f[-1])


def test_render_instance_map_and_patch_objects():
    s = sample_scenes(40, grid=4, min_objects=1, max_objects=5, seed=2)
    images, inst = render(s, cell_px=8, object_px=(3, 5), seed=4)
    assert images.shape == (40, 32, 32, 3) and inst.shape == (40, 32, 32)
    assert images.min() >= 0 and images.max() <= 1
    for i in range(40):  # every object is drawn, inside its own cell, and nothing else is
        present = set(np.unique(inst[i]).tolist()) - {-1}
        assert present == set(range(s.count[i]))
        for j in range(s.count[i]):
            rows, cols = np.nonzero(inst[i] == j)
            gr, gc = divmod(int(s.cell[i, j]), 4)
            assert rows.min() >= 8 * gr and rows.max() < 8 * gr + 8 and cols.min() >= 8 * gc and cols.max() < 8 * gc + 8
    covers = patch_objects(inst, patch=4, max_objects=5)
    assert covers.shape == (40, 64, 5)
    assert (covers.any(axis=1).sum(axis=1) == s.count).all()  # each object shows in some patch
    again, _ = render(s, cell_px=8, seed=4)
    np.testing.assert_array_equal(images, again)


def test_shape_stencils_differ():
    masks = [shape_mask(k, 5) for k in range(len(SHAPES))]
    assert all(m.any() for m in masks)
    assert len({m.tobytes() for m in masks}) == len(SHAPES)
