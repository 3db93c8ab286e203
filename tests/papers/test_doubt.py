"""doubt's acceptance checks (spec sections 10 and 11): Rbar's closed forms (centred: |n_A - n_B| / n; uncentred:
sqrt(p^2 + q^2 + 2pq cos theta); a symmetric 3-way split ~0), the degenerate set = 1 in float32 and float64, Rbar
equal to the spec's definition written independently in torch, SE's formula with cluster -1, AUROC against sklearn and
detection accuracy at 0.48, the AUROC pseudo-values (their mean is sklearn's AUROC, the variance of their mean
DeLong's), why categorical answers make C1 trivial (section 11), the clusterer's dev threshold, the surface variety
statistic and the template weights that give it at the sampling temperature (issue 50), the embedding-prefix sampler
against full forwards, the config's claims judged on constructed metrics (held, refuted, voided by their controls, no
data), config errors by name; the tiny pipeline's outputs are checked on the workflow tests' run
(tests/tiny_outputs.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.doubt import claims, metrics, scores, surfaces
from paperflow.doubt.methods import METHODS, Scorer, score, subsets
from paperflow.doubt.scenes import USUAL_COLOUR, draw_items
from paperflow.doubt.surfaces import canonical, dev_surfaces

RNG = np.random.default_rng(0)


def two_point_set(n_a: int, n_b: int, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=d), rng.normal(size=d)
    return np.stack([u] * n_a + [v] * n_b)


@pytest.mark.parametrize("n_a", range(0, 11))
def test_centred_rbar_is_the_count_margin(n_a):
    emb = two_point_set(n_a, 10 - n_a)
    expected = 1.0 if n_a in (0, 10) else abs(2 * n_a - 10) / 10
    assert scores.rbar(emb) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("n_a", range(1, 10))
def test_uncentred_rbar_is_the_two_cluster_formula(n_a):
    emb = two_point_set(n_a, 10 - n_a, seed=n_a)
    u, v = emb[0] / np.linalg.norm(emb[0]), emb[-1] / np.linalg.norm(emb[-1])
    p, q, cos = n_a / 10, 1 - n_a / 10, float(u @ v)
    assert scores.rbar(emb, debias=False) == pytest.approx(math.sqrt(p * p + q * q + 2 * p * q * cos), abs=1e-6)


def test_symmetric_three_way_split_is_about_zero():
    offset = np.r_[5.0, -2.0, 0.0, 1.0]
    angles = [0, 2 * np.pi / 3, 4 * np.pi / 3]
    points = [offset + np.r_[np.cos(a), np.sin(a), 0, 0] for a in angles]
    emb = np.stack([p for p in points for _ in range(3)])
    assert scores.rbar(emb) < 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_identical_answers_give_one_in_every_dtype(dtype):
    base = np.random.default_rng(1).normal(size=384).astype(dtype)
    assert scores.rbar(np.stack([base] * 10)) == 1.0
    assert scores.rbar_batch(np.stack([base] * 10)[None].repeat(3, 0)).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("debias", [True, False])
def test_gram_form_equals_the_direct_form(debias):
    rng = np.random.default_rng(4)
    protos = rng.normal(size=(6, 24)) + 1.0
    ids = rng.integers(0, 6, size=(200, 7))
    ids[:5] = 2  # degenerate sets too
    gram = protos @ protos.T
    direct = scores.rbar_batch(protos[ids], debias)
    np.testing.assert_allclose(
        scores.rbar_gram_batch(gram[ids[:, :, None], ids[:, None, :]], debias), direct, atol=1e-9
    )
    assert direct[:5].tolist() == [1.0] * 5


def test_batched_lexical_similarity_equals_the_pairwise_rouge_mean():
    strings = ["it is red", "red", "the colour is red", "blue colour", "it is a star"]
    ids = np.random.default_rng(2).integers(0, 5, size=(20, 4))
    batched = scores.mean_pairwise(scores.rouge_matrix(strings), ids)
    expected = [scores.lexical_similarity([strings[i] for i in row]) for row in ids]
    np.testing.assert_allclose(batched, expected, atol=1e-12)
    assert scores.rouge_l("the colour is red".split(), "it is red".split()) == pytest.approx(
        2 * (2 / 3 * 2 / 4) / (2 / 3 + 2 / 4)
    )


def reference_rbar(emb: torch.Tensor) -> float:
    """Spec section 2's definition of the mean resultant length, written again in torch float64: centre, normalise
    (+1e-12), ||sum|| / n."""
    e = emb - emb.mean(dim=0)
    x = e / (e.norm(dim=1, keepdim=True) + 1e-12)
    return float(x.sum(dim=0).norm() / emb.shape[0])


def test_rbar_equals_the_specs_definition_on_50_random_answer_lists():
    from paperflow.core.lm.encoders import encode_sentences

    pool = [s for s, _ in dev_surfaces()]
    rng = np.random.default_rng(3)
    lists = [[pool[i] for i in rng.integers(len(pool), size=10)] for _ in range(50)]
    lists = [a for a in lists if len(set(a)) > 1]  # degenerate sets excluded, as the spec says
    emb = encode_sentences(sorted({a for lst in lists for a in lst}), batch_size=64)
    index = {a: i for i, a in enumerate(sorted({a for lst in lists for a in lst}))}
    for lst in lists:
        e = emb[[index[a] for a in lst]].astype(np.float64)
        assert scores.rbar(e) == pytest.approx(reference_rbar(torch.as_tensor(e)), abs=1e-6)


def test_semantic_entropy_is_vl_uncertaintys_formula_with_cluster_minus_one():
    clusters = [0, 0, 1, -1, -1, 2, 0, 0, 1, 0]  # -1: unparsable answers, a cluster of their own
    n = len(clusters)
    expected = -sum((clusters.count(c) / n) * math.log2(clusters.count(c) / n) for c in set(clusters))
    assert scores.semantic_entropy(clusters) == pytest.approx(expected, abs=1e-12)
    assert scores.semantic_entropy([3] * 10) == 0.0


def test_auroc_matches_sklearn_and_accuracy_at_048_on_a_hand_made_list():
    pairs = [(1, 0.10), (0, 0.90), (1, 0.48), (0, 0.48), (0, 0.70), (1, 0.30), (0, 0.49), (1, 0.90), (0, 0.20)]
    wrong = np.array([p[0] for p in pairs], dtype=bool)
    trust = np.array([p[1] for p in pairs])
    assert metrics.auroc(wrong, -trust) == pytest.approx(roc_auc_score(wrong, -trust), abs=1e-12)
    # trustworthy iff score > 0.48: flagged = [T, F, T, T, F, T, F, F, T] vs wrong [T, F, T, F, F, T, F, T, F]
    assert metrics.detection_accuracy(wrong, trust <= 0.48) == pytest.approx(6 / 9)
    y, s = RNG.integers(0, 2, 200).astype(bool), RNG.integers(0, 5, 200).astype(float)  # many ties
    assert metrics.auroc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_categorical_answers_make_c1_trivial():
    """Spec 11: with one embedding per distinct answer and centring, at n = 3 Rbar and SE are monotone functions of
    the same counts, (3), (2,1), (1,1,1) -> Rbar 1, 1/3, ~0 and SE 0, 0.918, 1.585, so their AUROCs and their
    spreads over sub-samplings are equal: C1 would hold by construction."""
    rng = np.random.default_rng(5)
    d = 32
    # three answers on a simplex, shifted (anisotropic, like sentence embeddings): the (1,1,1) case is symmetric
    sym = np.stack([np.r_[np.cos(a), np.sin(a), np.zeros(d - 2)] for a in (0, 2 * np.pi / 3, 4 * np.pi / 3)]) + 3.0
    for counts, (r, u) in {(3,): (1.0, 0.0), (2, 1): (1 / 3, 0.918), (1, 1, 1): (0.0, 1.585)}.items():
        ids = [k for k, c in enumerate(counts) for _ in range(c)]
        assert scores.rbar(sym[ids]) == pytest.approx(r, abs=1e-6)
        assert scores.semantic_entropy(ids) == pytest.approx(u, abs=1e-3)
    # answer sets with categorical answers (each answer one of the 3): AUROC and spread equal
    n_items, n_max = 300, 10
    answers = rng.integers(0, 3, size=(n_items, n_max))
    answers[:150] = np.where(rng.random((150, n_max)) < 0.8, 0, answers[:150])  # consistent sets
    wrong = rng.random(n_items) < np.where(np.arange(n_items) < 150, 0.2, 0.6)
    scorer = Scorer([f"a{k}" for k in range(3)], sym, judge_threshold=0.9999)
    assert np.array_equal(scorer.same, np.eye(3, dtype=bool))  # the clusterer sees 3 distinct answers
    aucs = {"vmf_plain": [], "se_plain": [], "se_exact": []}
    for idx in subsets(0, 3, n_max, 30):
        sets = {"A": answers[:, idx]}
        for method in aucs:
            s, _ = score(METHODS[method], sets, scorer)
            aucs[method].append(metrics.auroc(wrong, s))
    np.testing.assert_allclose(aucs["vmf_plain"], aucs["se_plain"], atol=1e-12)
    assert np.std(aucs["vmf_plain"]) == pytest.approx(np.std(aucs["se_plain"]), abs=1e-12)
    frame = pd.concat([_frame(aucs, n=3, seed=s) for s in (0, 1)])  # two seeds alike: a zero-width interval
    c1 = _judge(frame, ids={"c1_auroc_n3", "stability_n3"})
    assert {k: v.value for k, v in c1.items()} == pytest.approx({"c1_auroc_n3": 0.0, "stability_n3": 0.0}, abs=1e-12)
    assert c1["stability_n3"].verdict == "refuted"  # equal spreads: "more stable" fails
    assert c1["c1_auroc_n3"].verdict == "held"  # equal AUROCs: ">= 0" holds by construction, hence not gated


def _frame(aucs_by_method: dict[str, list[float]], n: int, seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "method": m,
                "seed": seed,
                "n": n,
                "auroc": float(np.mean(a)),
                "auroc_std_subsamples": float(np.std(a)),
                "detection_accuracy": np.nan,
            }
            for m, a in aucs_by_method.items()
        ]
    )


def _judge(frame: pd.DataFrame, items: pd.DataFrame | None = None, ids=None) -> dict:
    """The config's smoke claims (those named in `ids`, else those whose method and baseline the table has) judged on
    the metrics table of `frame` and `items`."""
    from paperflow.core.claims import judge_all, parse_claims

    items = pd.DataFrame() if items is None else items
    table = claims.metrics_table(frame, items, {"sampling": {"n_max": 10}, "scale": "smoke"})
    specs = parse_claims(load_paper_config("doubt", "smoke")["claims"], "x")
    present = set(zip(table["method"], table["metric"]))

    def measured(s) -> bool:
        return all((m, s.metric) in present for m in (s.method, s.baseline) if isinstance(m, str))

    specs = [s for s in specs if (s.id in ids if ids else measured(s))]
    return {v.id: v for v in judge_all(specs, table, "smoke")}


def test_clusterer_threshold_separates_the_dev_paraphrases():
    from paperflow.core.lm.encoders import encode_sentences
    from paperflow.doubt.surfaces import WRAP

    dev = dev_surfaces()
    emb = encode_sentences([WRAP.format(s) for s, _ in dev], batch_size=64).astype(np.float64)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    threshold, acc = scores.choose_threshold(unit, [c for _, c in dev])
    assert acc > 0.9 and -1 < threshold < 1
    same = scores.cosine_judge(unit, threshold)
    ids = list(range(len(dev)))
    clusters = scores.greedy_clusters(ids, same)
    assert len(set(clusters)) >= 6  # more than a single blob, fewer than every surface
    assert len(set(clusters)) < len(dev)


def test_choose_threshold_is_exact_on_separable_pairs():
    unit = np.array([[1, 0], [0.99, 0.141], [0, 1], [0.141, 0.99]], dtype=float)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    threshold, acc = scores.choose_threshold(unit, ["a", "a", "b", "b"])
    assert acc == 1.0 and 0.3 < threshold < 0.98


def test_surfaces_parse_back_and_scenes_carry_the_language_prior():
    for s, c in dev_surfaces():
        assert canonical(s) == c
    assert canonical("it is") is None
    items = draw_items(2000, 0, 0.7, (0.2,))
    pairs = [o.split() for it in items for o in it["objects"].split(" , ")]
    usual = np.mean([USUAL_COLOUR[s] == c for c, s in pairs])
    assert 0.65 < usual < 0.75
    for it in items[:200]:
        if it["kind"] == "colour_of_shape":
            shape = it["question"].split()[4]
            assert f"{it['answer']} {shape}" in it["objects"]


def test_surface_variety_counts_answers_off_their_meanings_modal_surface():
    answers = ["red", "red .", "it is red", "red", "blue", "the colour is blue", "it is", "green"]
    # red: 4 answers, 3 "red" (punctuation dropped) and 1 paraphrase; blue: 2 answers, 1 off its mode;
    # green alone and "it is" without a meaning are not counted
    assert surfaces.surface_variety(answers, canonical) == (2, 6)
    assert surfaces.surface_variety(["red"] * 10, canonical) == (0, 10)
    assert surfaces.surface_variety(["red", "blue", "green"], canonical) == (0, 0)


@pytest.mark.parametrize("kind", sorted(surfaces.TEMPLATES))
@pytest.mark.parametrize("variety", [0.0, 0.05, 0.2, 0.5, 0.8])
def test_template_weights_give_the_configured_variety_at_the_sampling_temperature(kind, variety):
    weights = surfaces.template_weights(variety, kind, 0.5)
    assert weights.sum() == pytest.approx(1.0) and len(set(weights[1:].round(12))) == 1
    sampled = surfaces.sampled_template_probs(weights, kind, 0.5)
    assert sampled.sum() == pytest.approx(1.0) and sampled[0] == pytest.approx(sampled.max())  # bare answer modal
    _, cap = surfaces.variety_ceiling(kind, 0.5)
    assert 1 - sampled.max() == pytest.approx(min(variety, cap), abs=1e-6)
    if 0 < variety < cap:  # sampling at T = 0.5 sharpens: the training data must paraphrase more often than the samples
        assert 1 - weights[0] > variety


def test_the_variety_ceiling_is_uniform_training_and_lower_where_templates_share_a_first_word():
    # "red" and "red colour" share their first word: at T = 0.5 the first word's law (1/2, 1/4, 1/4) becomes
    # (2/3, 1/6, 1/6), split evenly between the two: the modal surface has 1/3 and the ceiling is 2/3
    assert surfaces.variety_ceiling("colour_of_shape", 0.5) == pytest.approx((0.25, 2 / 3), abs=1e-6)
    assert surfaces.variety_ceiling("shape_of_colour", 0.5) == pytest.approx((0.25, 0.75), abs=1e-6)


def test_sampling_at_temperature_one_reproduces_the_training_weights_and_sharpens_below_it():
    w = np.array([0.4, 0.3, 0.2, 0.1])
    for kind in surfaces.TEMPLATES:
        np.testing.assert_allclose(surfaces.sampled_template_probs(w, kind, 1.0), w, atol=1e-12)
    # colour_of_shape: "red" and "red colour" share their first word; at T = 0.5 the first word's law (0.5 for the
    # bare answer's word, 0.3 "it", 0.2 "the") is squared and renormalised, then "red" ends with 0.4 / 0.5 vs 0.1 / 0.5
    first = np.array([0.5, 0.3, 0.2]) ** 2 / (np.array([0.5, 0.3, 0.2]) ** 2).sum()
    end = 0.8**2 / (0.8**2 + 0.2**2)
    expected = [first[0] * end, first[1], first[2], first[0] * (1 - end)]
    np.testing.assert_allclose(surfaces.sampled_template_probs(w, "colour_of_shape", 0.5), expected, atol=1e-12)


@pytest.fixture(scope="module")
def tiny_vlm():
    from paperflow.doubt import vlm

    spec = {
        "arch": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    tok = vlm.tokenizer()
    return vlm.TinyVLM(vlm.lm_spec(spec, len(tok)), seed=0).eval(), tok


def _greedy_by_full_forward(model, tok, prompt, cells, steps):
    from paperflow.doubt import vlm

    words = list(prompt)
    out = []
    for _ in range(steps):
        from paperflow.core.lm.tokenizer import encode_words

        ids = encode_words(tok, [words])["input_ids"]
        with torch.no_grad():
            logits = model.lm(inputs_embeds=model.embed(ids, cells[None], tok.convert_tokens_to_ids("<img>"))).logits
        last = logits[0, -1].clone()
        last[vlm.banned_ids(tok)] = float("-inf")
        t = int(last.argmax())
        if t == tok.eos_token_id:
            break
        out.append(tok.convert_ids_to_tokens(t))
        words.append(out[-1])
    assert vlm.IMG == prompt[:16]
    return out


def test_prefix_sampler_greedy_equals_full_forwards_and_ignores_batch_padding(tiny_vlm):
    from paperflow.doubt import vlm

    model, tok = tiny_vlm
    items = draw_items(3, 1, 0.7, (0.5,))
    cells = torch.as_tensor(np.array([it["features"] for it in items], dtype=np.float32).reshape(-1, 16, 8))
    prompts = [vlm.IMG + it["question"].split() for it in items] + [vlm.IMG + ["list"]]
    cells = torch.cat([cells, cells[:1]])
    g = torch.Generator().manual_seed(0)
    batched = vlm.sample_prefix(model, tok, prompts, cells, 4, 0.0, 10, g)
    for k, p in enumerate(prompts):
        assert batched[k] == _greedy_by_full_forward(model, tok, p, cells[k], 4)


def test_prefix_sampler_is_seeded_and_top_k_one_is_greedy(tiny_vlm):
    from paperflow.doubt import vlm

    model, tok = tiny_vlm
    items = draw_items(4, 2, 0.7, (0.5,))
    cells = torch.as_tensor(np.array([it["features"] for it in items], dtype=np.float32).reshape(-1, 16, 8))
    prompts = [vlm.IMG + it["question"].split() for it in items]

    def run(seed, temperature, k):
        return vlm.sample_prefix(model, tok, prompts, cells, 4, temperature, k, torch.Generator().manual_seed(seed))

    assert run(0, 1.0, 10) == run(0, 1.0, 10)
    assert run(1, 5.0, 1) == run(2, 0.0, 10)


def test_prefix_sampler_in_row_batches_is_the_same_law(tiny_vlm):
    """Sampling in batches of rows (sampling.batch_rows) changes only the order of the generator's draws: greedy
    completions are identical whatever the batch, and a batch that holds every row is the unbatched call."""
    from paperflow.doubt import vlm

    model, tok = tiny_vlm
    items = draw_items(5, 3, 0.7, (0.5,))
    cells = torch.as_tensor(np.array([it["features"] for it in items], dtype=np.float32).reshape(-1, 16, 8))
    prompts = [vlm.IMG + it["question"].split() for it in items]

    def run(temperature, rows):
        return vlm.sample_prefix(model, tok, prompts, cells, 4, temperature, 10, torch.Generator().manual_seed(3), rows)

    assert run(0.0, 2) == run(0.0, None) == run(0.0, 1)
    assert run(1.0, 5) == run(1.0, None) == run(1.0, 50)
    with pytest.raises(ValueError, match="batch_rows"):
        run(1.0, 0)


SEEDS = (0, 1, 2, 3, 4)
JITTER = (0.01, -0.02, 0.015, 0.0, -0.005)
STABILITY = {"stability_n3", "stability_n5"}


def _stability_frame(vmf=0.02, se=0.03, exact=0.035, seeds=SEEDS) -> pd.DataFrame:
    """Per seed: the spread of AUROC over sub-samplings of vMF, SE and exact-string entropy at n = 3 and 5."""
    rows = [
        {"method": m, "seed": s, "n": n, "auroc": 0.6, "auroc_std_subsamples": v + 0.002 * JITTER[(s + k) % 5] / 0.02}
        for s in seeds
        for n in (3, 5)
        for k, (m, v) in enumerate((("vmf_plain", vmf), ("se_plain", se), ("se_exact", exact)))
    ]
    return pd.DataFrame(rows).assign(detection_accuracy=np.nan)


def _items(gain: dict[str, float], seeds=SEEDS, n: int = 400) -> pd.DataFrame:
    """Per seed and item: a label and each detector's score, the score tracking the label by `gain[method]` (0: noise,
    the same noise for every detector, so that paired differences reflect the gains)."""
    frames = []
    for s in seeds:
        rng = np.random.default_rng(s)
        wrong = rng.random(n) < 0.35
        noise = rng.normal(size=n)
        own = rng.normal(size=(len(gain), n))
        scores_ = {f"score_{m}": g * wrong + noise + 0.3 * own[k] for k, (m, g) in enumerate(gain.items())}
        frames.append(pd.DataFrame({"seed": s, "item": np.arange(n), "wrong": wrong, **scores_}))
    return pd.concat(frames, ignore_index=True)


def test_auroc_pseudo_values_average_to_the_auroc_with_delongs_variance():
    rng = np.random.default_rng(8)
    wrong = rng.random(300) < 0.3
    score_ = np.round(wrong + rng.normal(0, 1, 300), 1)  # ties
    values = metrics.auroc_pseudo_values(wrong, score_)
    assert values.mean() == pytest.approx(roc_auc_score(wrong, score_), abs=1e-12)
    pos, neg = score_[wrong], score_[~wrong]
    v10 = np.array([np.mean((neg < x) + 0.5 * (neg == x)) for x in pos])  # DeLong's structural components
    v01 = np.array([np.mean((pos > x) + 0.5 * (pos == x)) for x in neg])
    delong = v10.var() / len(pos) + v01.var() / len(neg)
    assert values.var() / len(values) == pytest.approx(delong, rel=1e-9)
    assert np.isnan(metrics.auroc_pseudo_values(np.zeros(5, bool), np.arange(5.0))).all()


def test_the_central_claim_is_judged_paired_by_item_and_voided_by_vmf_on_the_plain_set():
    """DOUBT ahead of SE with vMF on A at SE's level: held; vMF on A as good as DOUBT: control also holds; DOUBT
    behind SE: refuted. The pooled estimate is the mean over seeds of the per-seed AUROC differences."""
    held = _judge(_stability_frame(), _items({"doubt": 1.2, "se_plain": 0.6, "vmf_plain": 0.6}))["doubt_beats_se"]
    assert held.verdict == "held" and held.unit == "item" and held.n_units == len(SEEDS) * 400
    items = _items({"doubt": 1.2, "se_plain": 0.6, "vmf_plain": 0.6})
    per_seed = [
        metrics.auroc(g["wrong"], g["score_doubt"]) - metrics.auroc(g["wrong"], g["score_se_plain"])
        for _, g in items.groupby("seed")
    ]
    assert held.value == pytest.approx(np.mean(per_seed), abs=1e-9)
    voided = _judge(_stability_frame(), _items({"doubt": 1.2, "se_plain": 0.6, "vmf_plain": 1.2}))["doubt_beats_se"]
    assert voided.verdict == "control also holds" and not voided.held
    assert voided.control["method"] == "vmf_plain"
    refuted = _judge(_stability_frame(), _items({"doubt": 0.3, "se_plain": 1.0, "vmf_plain": 0.3}))["doubt_beats_se"]
    assert refuted.verdict == "refuted"


def test_stability_claims_hold_fail_and_are_voided_by_exact_string_entropy():
    out = _judge(_stability_frame())
    assert {k: out[k].verdict for k in STABILITY} == dict.fromkeys(STABILITY, "held")
    out = _judge(_stability_frame(vmf=0.04))
    assert {k: out[k].verdict for k in STABILITY} == dict.fromkeys(STABILITY, "refuted")
    out = _judge(_stability_frame(exact=0.02))  # counting strings is as stable: not evidence for vMF's geometry
    assert {k: out[k].verdict for k in STABILITY} == dict.fromkeys(STABILITY, "control also holds")
    assert out["stability_n3"].control["method"] == "se_exact"


def test_every_claim_is_judged_with_debias_on_gated_and_off_reported():
    from paperflow.core.claims import parse_claims

    specs = {s.id: s for s in parse_claims(load_paper_config("doubt", "cpu")["claims"], "x")}
    gated = {k for k, s in specs.items() if s.gated}
    assert gated == {"doubt_beats_se", "stability_n3", "stability_n5"}
    assert specs["doubt_beats_se"].central
    for k in gated:
        off = specs[f"{k.replace('_beats', '_nodebias_beats') if 'beats' in k else k + '_nodebias'}"]
        assert not off.gated and off.metric == specs[k].metric and off.baseline == specs[k].baseline
        assert off.method.endswith("_nodebias") and off.method.removesuffix("_nodebias") == specs[k].method
    assert not any("shuffle" in k for k in specs)


def test_a_missing_seed_is_no_data():
    items = _items({"doubt": 1.2, "se_plain": 0.6, "vmf_plain": 0.6})
    items.loc[items["seed"] == 3, "score_doubt"] = np.nan
    assert _judge(_stability_frame(), items)["doubt_beats_se"].verdict == "no data"


def test_c3_counts_consistent_wrong_items_and_compares_flags():
    one = {
        "wrong": [True, True, True, False, True],
        "largest_plain_cluster": [10, 8, 9, 10, 5],
        "flag_doubt": [1.0, 1.0, 0.0, 0.0, 1.0],
        "flag_se_plain": [0.0, 0.0, 0.0, 0.0, 1.0],
    }
    items = pd.concat([pd.DataFrame(one).assign(seed=s) for s in (0, 1)], ignore_index=True)
    cw = claims.consistent_wrong(items, 10)
    assert cw.iloc[0]["consistent_wrong"] == 3
    assert cw.iloc[0]["doubt_flags"] == pytest.approx(2 / 3) and cw.iloc[0]["se_flags"] == 0.0
    assert cw.iloc[0]["doubt_flags_all_items"] == pytest.approx(3 / 5)
    c3 = _judge(_stability_frame(seeds=(0, 1)), items, ids={"c3_consistent_but_wrong"})["c3_consistent_but_wrong"]
    assert c3.verdict == "held" and c3.value == pytest.approx(2 / 3) and not c3.gated
    assert claims.flag_rate_summary(items, 10)["se_plain"] == {"all": pytest.approx(1 / 5), "consistent_wrong": 0.0}
    # a seed without any consistent-but-wrong answer has no C3 value: no data
    none = items.assign(largest_plain_cluster=5)
    assert (
        _judge(_stability_frame(seeds=(0, 1)), none, ids={"c3_consistent_but_wrong"})["c3_consistent_but_wrong"].verdict
        == "no data"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (("methods: [doubt, vmf_plain,", "methods: [doubtt, vmf_plain,"), "doubtt"),
        (("    surface_variety: ", "    surface_varietyy: "), "surface_variety"),
        (("    hidden_size: 64\n", "    hiden_size: 64\n"), "did you mean 'hidden_size'"),
        (("methods: [doubt, vmf_plain,", "methods: [vmf_plain,"), "gated claims"),  # defaults' and smoke's lists
        (("    ns: [3, 5, 10]", "    ns: [3, 5, 12]"), "n_max"),
        (("format_mix: [0.4, 0.3, 0.3]", "format_mix: [0.4, 0.3, 0.4]"), "format_mix"),
    ],
)
def test_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "doubt.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("doubt", "smoke", repo_copy)


def test_paper_scale_is_refused_by_name(tmp_path):
    from paperflow.doubt.stages import download

    with pytest.raises(ConfigError, match="synthetic grid scenes only.*paper.smk"):
        download({"kind": "benchmarks"}, {}, str(tmp_path / "x.parquet"))
