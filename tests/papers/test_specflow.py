"""specflow's acceptance checks (spec sections 10 and 11): the diffusion's closed form, mass and Prop. 3.1 optimality,
the reduction to [CLS] Top-K, the quotas and the quadtree tiling, the sinks (Lemma A.6), Table 1's arithmetic,
VisionZip against its definition (written row by row) on a real CLIPVisionModel, eager attention, FastV's
analogue, object coverage, the metrics table and the config's claims judged on it with their controls (the
single-object control included), config errors by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from paperflow.core.claims import CONTROL_HOLDS, HELD, NO_DATA, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.specflow import claims as sc
from paperflow.specflow.baselines import BASELINES, Tokens, visionzip, visionzip_split
from paperflow.specflow.specflow import (
    SpecFlowConfig,
    allocate,
    coreset_sinks,
    heat_fixed_point,
    heat_flow,
    knn_graph,
    quadtree_leaves,
    quotas,
    specflow,
)
from paperflow.specflow.stages import coverage

GRID = (8, 8)


def _tokens(seed=0, b=3, n=64, d=16, heads=4, peaked=True):
    rng = np.random.default_rng(seed)
    cls_heads = rng.random((b, heads, n)) ** (8 if peaked else 1)
    cls_heads /= cls_heads.sum(-1, keepdims=True)
    attn = rng.random((b, n, n))
    return Tokens(
        z=rng.standard_normal((b, n, d)),
        cls=cls_heads.mean(1),
        cls_heads=cls_heads,
        keys=rng.standard_normal((b, n + 1, d)),
        attn=attn / attn.sum(-1, keepdims=True),
        grid=GRID,
    )


# --- check 1: the diffusion ------------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [False, True])
def test_diffusion_converges_to_the_closed_form_and_preserves_mass(symmetric):
    rng = np.random.default_rng(1)
    z = rng.standard_normal((1, 64, 8))
    w = knn_graph(z, k=6, tau=10.0, symmetric=symmetric)[0]
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-12)
    assert ((w > 0).sum(1) >= 6).all() and (np.diag(w) == 0).all()
    s = rng.random(64)
    s /= s.sum()
    alpha = 0.5
    star = heat_fixed_point(s, w, alpha)
    np.testing.assert_allclose(heat_flow(s, w, alpha, 200), star, atol=1e-8)
    e = s.copy()
    for t in range(1, 30):  # unnormalised iterate: sum exactly 1, and the alpha^t contraction in L1
        e = (1 - alpha) * s + alpha * w.T @ e
        assert abs(e.sum() - 1) < 1e-12
        assert np.abs(e - star).sum() <= alpha**t * np.abs(s - star).sum() + 1e-12
    np.testing.assert_allclose(heat_flow(s, w, alpha, 7, renormalise=False), heat_flow(s, w, alpha, 7), atol=1e-12)


def test_w_times_e_instead_of_w_transpose_loses_mass():
    """The pitfall of spec section 9: the row-stochastic W applied as W e does not preserve mass."""
    rng = np.random.default_rng(2)
    w = knn_graph(rng.standard_normal((1, 64, 8)), 6, 10.0)[0]
    s = rng.random(64) ** 6
    s /= s.sum()
    wrong = 0.5 * s + 0.5 * w @ s
    assert abs(wrong.sum() - 1) > 1e-3
    assert abs((0.5 * s + 0.5 * w.T @ s).sum() - 1) < 1e-12


def test_fixed_point_zeroes_the_prop31_gradient_on_a_symmetric_graph():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((1, 64, 8))
    tau, alpha = 10.0, 0.5
    w = knn_graph(z, 6, tau, symmetric=True)[0]
    zn = z[0] / np.linalg.norm(z[0], axis=1, keepdims=True)
    sim = np.where(w > 0, np.exp(tau * (zn @ zn.T)), 0.0)  # S symmetric, W = D^-1 S
    np.testing.assert_allclose(sim, sim.T)
    deg = sim.sum(1)
    np.testing.assert_allclose(w, sim / deg[:, None], atol=1e-12)
    s = rng.random(64)
    s /= s.sum()
    e = heat_fixed_point(s, w, alpha)
    x, y = e / deg, s / deg
    grad = (x - y) + alpha / (1 - alpha) * (deg * x - sim @ x) / deg  # d/de of the Prop-3.1 objective
    scale = np.abs(x - y).max()
    assert np.abs(grad).max() < 1e-8 * scale
    wrong = (x - y) + 3 * (deg * x - sim @ x) / deg  # the gradient at the same e for alpha = 0.75 is not zero
    assert np.abs(wrong).max() > 1e-2 * scale


# --- check 2: reduction to Top-K --------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 7, 14, 21, 63])
def test_alpha0_single_leaf_no_sinks_is_cls_topk(budget):
    t = _tokens()
    cfg = SpecFlowConfig(alpha=0.0, delta=np.inf, sinks=False)
    fed, kept = specflow(t.z, t.cls, GRID, budget, cfg)
    _, top = BASELINES["topk"](t, budget, np.random.default_rng(0))
    np.testing.assert_array_equal(kept, top)
    np.testing.assert_array_equal(fed, np.take_along_axis(t.z, top[..., None], 1))
    full_cfg = SpecFlowConfig(alpha=0.0, sinks=False, allocation="uniform")  # fixed crops: differs somewhere
    if budget == 7:
        assert any(not np.array_equal(a, b) for a, b in zip(specflow(t.z, t.cls, GRID, 7, full_cfg)[1], top))


def test_ties_break_by_index_and_uniform_energy_never_splits():
    e = np.full(64, 1 / 64)
    assert quadtree_leaves(e.reshape(8, 8), 2, 1 / 64) == [(0, 8, 0, 8)]
    np.testing.assert_array_equal(allocate(e, GRID, 5, SpecFlowConfig()), np.arange(5))


# --- check 3: quotas and the quadtree ---------------------------------------------------------------------------


def test_quotas_and_leaves_for_every_budget():
    rng = np.random.default_rng(4)
    for _ in range(20):
        e = rng.random(64) ** 4
        e /= e.sum()
        leaves = quadtree_leaves(e.reshape(8, 8), 2, 1 / 64 * rng.uniform(0.2, 2))
        cover = np.zeros((8, 8), int)
        for r0, r1, c0, c1 in leaves:
            cover[r0:r1, c0:c1] += 1
            assert (r1 - r0) in (2, 4, 8) and (c1 - c0) in (2, 4, 8)
        assert (cover == 1).all()
        idx = np.arange(64).reshape(8, 8)
        mass = np.array([e[idx[r0:r1, c0:c1]].sum() for r0, r1, c0, c1 in leaves])
        size = np.array([(r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in leaves])
        for k in range(1, 65):
            q = quotas(mass, size, k)
            assert q.sum() == k and (q >= 0).all() and (q <= size).all()
            if k >= 48:
                assert (np.abs(q - k * mass / mass.sum()) < 1 + len(leaves)).all()
            kept = allocate(e, GRID, k, SpecFlowConfig(delta=None))
            assert len(kept) == len(set(kept.tolist())) == k and (np.diff(kept) > 0).all()


def test_odd_crops_split_at_the_floor_midpoint():
    e = np.zeros((5, 7))
    e[0, 0] = 1.0
    leaves = quadtree_leaves(e, 2, 0.0)
    assert (0, 2, 0, 3) in leaves and (2, 5, 3, 7) in leaves


# --- check 4: sinks ---------------------------------------------------------------------------------------------


def test_sinks_mean_residual_and_radius():
    rng = np.random.default_rng(5)
    z = rng.standard_normal((64, 8))
    kept = np.sort(rng.choice(64, 9, replace=False))
    u_mean, u_res = coreset_sinks(z, kept)
    pruned = np.setdiff1d(np.arange(64), kept)
    np.testing.assert_allclose(u_mean, z[pruned].mean(0))
    dist = np.linalg.norm(z[pruned] - u_mean, axis=1)
    assert any(np.array_equal(u_res, row) for row in z[pruned])
    r = np.linalg.norm(u_res - u_mean)
    assert np.isclose(r, dist.max()) and (dist <= r + 1e-12).all()
    assert coreset_sinks(z, np.arange(64)).shape == (0, 8)
    fed, kept2 = specflow(z[None], rng.random((1, 64)), GRID, 7, SpecFlowConfig())
    assert fed.shape == (1, 9, 8) and kept2.shape == (1, 7)
    fed_m, kept_m = specflow(z[None], rng.random((1, 64)), GRID, 7, SpecFlowConfig(matched=True))
    assert fed_m.shape == (1, 7, 8) and kept_m.shape == (1, 5)


# --- check 5: Table 1 arithmetic --------------------------------------------------------------------------------


def test_table1_average_recomputed_from_the_per_benchmark_numbers():
    assert round(sc.relative_average(sc.SPECFLOW_64), 1) == 95.6
    assert round(sc.relative_average({"GQA": 61.9, "MME": None}), 1) == 100.0  # missing benchmarks are skipped
    frame = sc.table1_frame()
    assert frame.loc[frame.method == "SpecFlow", "recomputed"].item() == 95.6


# --- check 6 and section 11: VisionZip on a real CLIPVisionModel; eager attention ------------------------------


def _visionzip_by_definition(t, dominant, contextual):
    """VisionZip's selection as its paper defines it, row by row in plain Python: the dominant tokens are the
    patches with the most [CLS] attention summed over heads; of the others (in index order), every `step`-th one is
    a contextual target, each remaining patch joins the target whose key is most cosine-similar, and a contextual
    token is its target plus the mean of the patches that joined it."""
    out_idx, out_tokens = [], []
    for b in range(len(t)):
        score = t.cls_heads[b].sum(axis=0)
        dom = sorted(sorted(range(len(score)), key=lambda i: -score[i])[:dominant])
        rest = [i for i in range(len(score)) if i not in dom]
        step = max(1, len(rest) // contextual)
        targets = list(range(0, len(rest), step))[:contextual]
        keys = [t.keys[b, 1 + rest[r]] / np.linalg.norm(t.keys[b, 1 + rest[r]]) for r in range(len(rest))]
        groups = {tgt: [] for tgt in targets}
        for r in range(len(rest)):
            if r not in targets:
                groups[max(targets, key=lambda tgt: float(keys[r] @ keys[tgt]))].append(rest[r])
        ctx = [
            t.z[b, rest[tgt]] + (np.mean([t.z[b, m] for m in groups[tgt]], axis=0) if groups[tgt] else 0.0)
            for tgt in targets
        ]
        out_idx.append(dom)
        out_tokens.append(np.concatenate([t.z[b, dom], np.stack(ctx)]))
    return np.array(out_idx), np.stack(out_tokens)


@pytest.fixture(scope="module")
def standin():
    from paperflow.specflow.model import StandIn

    cfg = load_paper_config("specflow", "tiny")
    return StandIn(cfg, 5, seed=0).eval()


@pytest.mark.parametrize("budget", [7, 14, 21])
def test_visionzip_agrees_with_its_definition_on_clip_features(standin, budget):
    from paperflow.specflow.model import extract

    rng = np.random.default_rng(6)
    images = rng.random((6, 32, 32, 3)).astype(np.float32)
    toks = extract(standin, images, GRID)
    fed, kept = visionzip(toks, budget, rng)
    dominant, contextual = visionzip_split(budget)
    ref_idx, ref_tokens = _visionzip_by_definition(toks, dominant, contextual)
    np.testing.assert_array_equal(kept, ref_idx)
    np.testing.assert_allclose(fed, ref_tokens, atol=1e-10)


def test_encoder_runs_eager_attention_and_returns_cls_weights(standin):
    from paperflow.specflow.model import to_pixels

    assert standin.encoder.config._attn_implementation == "eager"
    _, out = standin.features(to_pixels(np.zeros((2, 32, 32, 3), np.float32)), attentions=True)
    attn = out.attentions[-1]
    assert attn is not None and attn.shape == (2, 2, 65, 65)
    np.testing.assert_allclose(attn.sum(-1).detach().numpy(), 1.0, atol=1e-5)
    # the seed layer is the last one built: LLaVA's select_layer = -2 of a 4-layer encoder
    assert len(standin.encoder.encoder.layers) == 3


def test_fastv_cuts_at_its_block_and_the_later_blocks_see_k_tokens():
    """FastV's analogue: blocks 1..fastv_layer see all 64 tokens (+ query), the later ones K + 1; the smoke and cpu
    reader has 4 blocks with the cut after block 1, so 3 of 4 blocks run after it (LLaVA-1.5: 30 of 32)."""
    from paperflow.specflow.model import build_reader

    for scale in ("smoke", "cpu"):
        rd = load_paper_config("specflow", scale)["reader"]
        assert (rd["layers"], rd["fastv_layer"]) == (4, 1) and rd["subsets"] is True
    reader = build_reader({"hidden_size": 16, "heads": 2, "layers": 4, "fastv_layer": 1}, 5).eval()
    lengths = []
    for block in reader.blocks:
        block.register_forward_hook(lambda mod, args, out: lengths.append(args[0].shape[1]))
    with torch.no_grad():
        reader(torch.randn(2, 64, 16), fastv_keep=7)
    assert lengths == [65, 8, 8, 8]
    with pytest.raises(ValueError, match="fastv_layer 4"):
        build_reader({"hidden_size": 16, "heads": 2, "layers": 4, "fastv_layer": 4}, 5)


def test_the_reader_trains_on_random_subsets_of_every_claimed_budget(monkeypatch):
    """reader.subsets: every step the reader also reads a random subset (sorted indices, no repeats) of each
    ratio's K; the claims' K = 7 among them."""
    from paperflow.specflow import model as sm
    from paperflow.specflow.stages import subset_budgets

    cfg = load_paper_config("specflow", "tiny")
    assert subset_budgets(cfg) == [7, 14, 21]
    assert subset_budgets({**cfg, "reader": {**cfg["reader"], "subsets": False}}) == []
    keep = sm.random_subsets(torch.Generator().manual_seed(0), 5, 64, 7)
    assert keep.shape == (5, 7) and all(len(set(r.tolist())) == 7 for r in keep)
    assert (keep.diff(dim=1) > 0).all()
    widths = []
    forward = sm.Reader.forward
    monkeypatch.setattr(
        sm.Reader, "forward", lambda self, t, fastv_keep=None: widths.append(t.shape[1]) or forward(self, t, fastv_keep)
    )
    rng = np.random.default_rng(0)
    images, labels = rng.random((8, 32, 32, 3)).astype(np.float32), rng.integers(0, 5, 8)
    sm.train_standin(cfg, images, labels, 5, 0, {**cfg["train"], "batch_size": 8}, subset_budgets(cfg))
    assert widths == [64, 7, 14, 21]  # one step: full tokens, then each budget


def test_fastv_keeps_k_tokens_and_is_the_identity_at_full_budget(standin):
    z = torch.randn(4, 64, standin.reader.head.in_features)
    full = standin.reader(z)
    torch.testing.assert_close(standin.reader(z, fastv_keep=64), full)
    assert not torch.allclose(standin.reader(z, fastv_keep=3), full)


def test_every_baseline_feeds_k_tokens():
    t = _tokens(b=2)
    for name, fn in BASELINES.items():
        if name == "full":
            continue
        fed, kept = fn(t, 7, np.random.default_rng(0))
        assert fed.shape == (2, 7, 16), name
        if kept is not None:
            assert kept.shape[1] in (7, visionzip_split(7)[0]), name


def test_object_coverage():
    covers = np.zeros((2, 64, 5), bool)
    covers[0, 3, 0] = covers[0, 10, 1] = covers[1, 20, 0] = True
    count = np.array([2, 1])
    assert coverage(np.array([[3, 10], [20, 21]]), covers, count).tolist() == [1.0, 1.0]
    assert coverage(np.array([[3, 4], [0, 1]]), covers, count).tolist() == [0.5, 0.0]  # per scene
    assert np.isnan(coverage(None, covers, count)).all()


# --- claims (config/specflow.yaml, judged by paperflow.core.claims) and their controls ------------------------

SEEDS = list(range(6))
ITEMS = 100


def _frame(values: dict, ratio=0.889):
    """The per-scene evaluation rows of (method, task) -> (accuracy, coverage): in each seed the scenes are ranked
    by a fixed permutation and the first round(accuracy x ITEMS) are read right (so a method with a higher accuracy
    is right wherever a lower one is: paired effects of one sign); coverage is the value plus a small per-scene
    offset; the full-token reading is always right (relative = accuracy)."""
    rows = []
    for (method, task), (acc, cov) in values.items():
        for s in SEEDS:
            rank = np.random.default_rng(s).permutation(ITEMS)
            rows.append(
                pd.DataFrame(
                    {
                        "method": method,
                        "task": task,
                        "seed": s,
                        "ratio": ratio,
                        "budget": 7,
                        "k_fed": 7,
                        "item": np.arange(ITEMS),
                        "correct": (rank < round(acc * ITEMS)).astype(int),
                        "full_correct": 1,
                        "coverage": cov + 0.01 * (rank % 3),
                        "prune_ms": 0.1,
                        "leaves": np.nan,
                        "energy_std_over_delta": np.nan,
                    }
                )
            )
    return pd.concat(rows, ignore_index=True)


def verdicts(values: dict, frame=None):
    table = sc.metrics_table(_frame(values) if frame is None else frame, "smoke")
    have = set(zip(table.method, table.metric))
    specs = [
        s
        for s in parse_claims(load_paper_config("specflow", "smoke")["claims"], "config/specflow.yaml")
        if all((m, s.metric) in have for m in s.methods())
    ]
    return {v.id: v for v in judge_all(specs, table, "smoke")}


GOOD = {
    ("specflow", "count"): (0.80, 0.90),
    ("topk", "count"): (0.70, 0.80),
    ("fastv", "count"): (0.70, np.nan),
    ("specflow_noheat", "count"): (0.74, 0.78),
    ("specflow_topk", "count"): (0.72, 0.80),
    ("random", "count"): (0.70, 0.40),
    ("specflow", "control"): (0.95, 1.0),
    ("topk", "control"): (0.95, 1.0),
    ("random", "control"): (0.60, 0.30),
}
GATED_CLAIMS = {
    "specflow_vs_topk",
    "specflow_vs_fastv",
    "specflow_vs_random",
    "ablation_no_diffusion",
    "ablation_no_quadtree",
    "coverage_vs_topk",
    "coverage_no_diffusion",
    "coverage_no_quadtree",
    "single_object_tie",
}


def test_metrics_table_names_are_the_ones_the_settings_declare():
    from paperflow.specflow.settings import claim_metrics

    table = sc.metrics_table(_frame(GOOD), "smoke")
    cfg = {"source": {"kind": "synthetic"}, "ratios": [0.889]}
    assert set(table.metric) == set(claim_metrics(cfg))
    part = table[(table.method == "specflow") & (table.metric == "count/relative@0.889") & (table.seed == 1)]
    assert len(part) == ITEMS and part.unit.nunique() == ITEMS  # one value per scene: the claims' item
    assert part.value.mean() == pytest.approx(0.80)


def test_relative_accuracy_divides_by_the_seeds_full_token_accuracy():
    frame = _frame({("specflow", "count"): (0.40, 0.5)})
    frame.loc[frame.item % 2 == 0, "full_correct"] = 0  # full-token accuracy 0.5 in every seed
    table = sc.metrics_table(frame, "smoke")
    rel = table[table.metric == "count/relative@0.889"].groupby("seed").value.mean()
    acc = frame.groupby("seed").correct.mean()
    assert np.allclose(rel.to_numpy(), acc.to_numpy() / 0.5)
    summary = sc.summary_table(frame)
    assert summary.relative.iloc[0] == pytest.approx(0.80) and summary.full_accuracy.iloc[0] == pytest.approx(0.5)


def test_claims_hold_on_a_gain_with_controls_that_fail():
    found = verdicts(GOOD)
    assert {k: v.verdict for k, v in found.items() if v.gated} == dict.fromkeys(GATED_CLAIMS, HELD)
    assert all(v.control["verdict"] != HELD for v in found.values() if v.gated)
    assert found["specflow_vs_topk"].central and found["specflow_vs_topk"].ci_low > 0
    assert found["specflow_vs_topk"].unit == "item" and found["specflow_vs_topk"].n_units == len(SEEDS) * ITEMS


def test_the_baselines_numbers_in_specflows_place_are_not_held():
    bad = dict(GOOD)
    bad[("specflow", "count")] = GOOD[("topk", "count")]
    found = verdicts(bad)
    for cid in (
        "specflow_vs_topk",
        "specflow_vs_random",
        "ablation_no_diffusion",
        "ablation_no_quadtree",
        "coverage_vs_topk",
        "coverage_no_quadtree",
    ):
        assert found[cid].verdict in ("refuted", "inconclusive") and not found[cid].held, cid


def test_a_control_as_good_as_specflow_voids_the_claims():
    # random selection beats Top-K, FastV and both ablations and covers as many objects as SpecFlow; Top-K beats
    # random (in the first world); random ties with Top-K on one object as well
    bad = dict(GOOD)
    bad[("random", "count")] = (0.80, 0.90)
    bad[("random", "control")] = (0.95, 1.0)
    found = verdicts(bad)
    assert {k for k, v in found.items() if v.verdict == CONTROL_HOLDS} == GATED_CLAIMS - {"specflow_vs_random"}
    assert not any(v.held for v in found.values() if v.gated)
    worse = dict(GOOD)
    worse[("random", "count")] = (0.60, 0.40)  # Top-K beats random too: the margin over random is saliency's
    assert verdicts(worse)["specflow_vs_random"].verdict == CONTROL_HOLDS


def test_the_single_object_tie_fails_when_specflow_differs_and_a_missing_seed_is_no_data():
    bad = dict(GOOD)
    bad[("specflow", "control")] = (0.60, 0.3)  # random selection's accuracy in SpecFlow's place
    assert verdicts(bad)["single_object_tie"].verdict == "refuted"
    frame = _frame(GOOD)
    frame.loc[(frame.method == "specflow") & (frame.task == "count") & (frame.seed == 1), "correct"] = np.nan
    found = verdicts(GOOD, frame)
    assert found["specflow_vs_topk"].verdict == NO_DATA and not found["specflow_vs_topk"].held
    assert found["coverage_vs_topk"].verdict == HELD  # coverage of that seed is there


# --- config -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit,message",
    [
        (("  seeds: [0, 1, 2]", "  seedz: [0, 1, 2]"), "seedz"),
        (("    hidden_size: 64\n", "    hiden_size: 64\n"), "hiden_size"),
        (("alpha: 0.5", "alpha: 1.5"), "alpha"),
        (("allocation: quadtree", "allocation: octree"), "octree|allocation"),
        (("report_ratio: 0.889", "report_ratio: 0.5"), "report_ratio"),
        (
            ("topk, fastv, specflow, specflow_noheat, specflow_topk]", "topk, fastv, specflow, specflow_noheat]"),
            "specflow_topk",
        ),
    ],
)
def test_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "specflow.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("specflow", "smoke", repo_copy)


def test_every_scale_loads_with_the_gated_methods():
    from paperflow.specflow.settings import GATED, PAPER_GATED

    for scale in ("tiny", "smoke", "cpu"):
        assert set(GATED) <= set(load_paper_config("specflow", scale)["methods"])
    paper = set(load_paper_config("specflow", "paper")["methods"])  # FastV prunes inside LLaVA's LLM at paper scale
    assert set(PAPER_GATED) <= paper and "fastv" in paper
