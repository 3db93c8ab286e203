"""dualreform's acceptance checks (spec sections 10 and 11): BM25 ranks equal rank-bm25's, retrieval metrics equal
pytrec_eval's, gold references reduce to the reference-based preferences, the generator and the teacher do what the
spec says, the CQR model writes its candidates (sampled, seeded, de-duplicated) and TRL trains it, the config's claims judged on constructed results (held, voided by their controls,
refuted, no data on a missing seed), config errors are named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from paperflow.core.claims import CONTROL_HOLDS, HELD, NO_DATA, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.dualreform import claims, pipeline
from paperflow.dualreform.candidates import mentioned_entities, teacher_rewrite
from paperflow.dualreform.data import generate
from paperflow.dualreform.retrieval import BM25Index, retrieval_metrics

WORLD = {
    "n_entities": 40,
    "values_per_aspect": 12,
    "values_per_passage": 8,
    "filler_vocab": 30,
    "filler_per_passage": 29,
    "n_train": 30,
    "n_test": 10,
    "min_turns": 4,
    "max_turns": 6,
    "p_switch": 0.3,
    "response_values": 5,
    "response_noise": 3,
    "p_entity_in_response": 0.3,
}


@pytest.fixture(scope="module")
def world():
    return generate(WORLD, seed=0)


@pytest.fixture(scope="module")
def table(world):
    return pipeline.candidate_table(world, k1=0.9, b=0.4, tiebreak_seed=2, teacher_seed=1, teacher_error_rate=0.3)


def test_bm25s_ranks_equal_rank_bm25_on_the_synthetic_corpus(world):
    from rank_bm25 import BM25Okapi

    texts = world.passages["text"].tolist()
    ours = BM25Index(texts, k1=0.9, b=0.4, tiebreak_seed=0)
    ref = BM25Okapi([t.split() for t in texts], k1=0.9, b=0.4)
    queries = world.turns["response"].tolist()[:60] + world.turns["human_rewrite"].tolist()[:60]
    scores = ours.scores(queries)
    for q, s in zip(queries, scores):
        theirs = ref.get_scores(q.split())
        # bm25s leaves out Okapi's constant factor (k1 + 1): the scores are proportional, so the rankings agree
        # (ties included, up to bm25s's float32 rounding)
        np.testing.assert_allclose(s * (0.9 + 1), theirs, rtol=1e-5, atol=1e-6, err_msg=q)
        top = np.argsort(-theirs, kind="stable")[:50]
        assert (np.diff(s[top]) <= 1e-5).all(), q  # our scores fall along their top-50 order
    assert not np.allclose(
        BM25Index(texts, k1=1.5, b=0.75, tiebreak_seed=0).scores(queries[:5]) * 1.9,
        [ref.get_scores(q.split()) for q in queries[:5]],
        rtol=1e-3,
    )


def test_metrics_equal_pytrec_eval(world, table):
    import pytrec_eval

    test = table[table["split"] == "test"].reset_index(drop=True)
    index = BM25Index(world.passages["text"].tolist(), 0.9, 0.4, tiebreak_seed=2)
    queries = list(test["query"])  # the raw queries: ranks from 1 to beyond 100
    top = index.rankings(queries, 100)
    ranks = index.rank_of(queries, test["gold_pid"].tolist())
    assert (ranks > 1).any() and (ranks == 1).any()
    run = {f"q{i}": {f"d{pid}": float(100 - r) for r, pid in enumerate(row)} for i, row in enumerate(top)}
    qrels = {f"q{i}": {f"d{pid}": 1} for i, pid in enumerate(test["gold_pid"])}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut_3", "recall_10", "recall_100"})
    per_query = evaluator.evaluate(run)
    theirs = {
        key: np.mean([v[name] for v in per_query.values()])
        for key, name in (
            ("mrr", "recip_rank"),
            ("ndcg@3", "ndcg_cut_3"),
            ("recall@10", "recall_10"),
            ("recall@100", "recall_100"),
        )
    }
    ours = retrieval_metrics(ranks)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-9), key


def test_gold_references_reduce_to_the_reference_based_preferences(world, table):
    train = table[table["split"] == "train"].reset_index(drop=True).iloc[:40]
    gold = pipeline.pseudo_references("retpo", train, 0, np.random.default_rng(0))
    assert np.array_equal(gold, train["gold_pid"].to_numpy())
    index = BM25Index(world.passages["text"].tolist(), 0.9, 0.4, tiebreak_seed=2)
    cands = [[q, h, f"{q} filler"] for q, h in zip(train["query"], train["human_rewrite"])]
    flat = [c for cs in cands for c in cs]
    tops = index.rankings(flat, pipeline.DEPTH).reshape(len(train), 3, pipeline.DEPTH)
    via_refs = np.stack(pipeline.reference_ranks(list(tops), gold))
    direct = np.minimum(index.rank_of(flat, np.repeat(gold, 3)), pipeline.DEPTH + 1).reshape(len(train), 3)
    assert np.array_equal(via_refs, direct)
    assert (via_refs[:, 1] <= via_refs[:, 0]).mean() > 0.9  # the resolved rewrite ranks its passage higher
    a = pipeline.preferences(list(via_refs), np.random.default_rng(5))
    b = pipeline.preferences(list(direct), np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_preferences_pick_the_best_rank_and_a_strictly_worse_one():
    ranks = [np.array([3, 1, 1, 7]), np.array([2, 2, 2]), np.array([], dtype=int), np.array([5])]
    best, worse = pipeline.preferences(ranks, np.random.default_rng(0))
    assert best[0] in (1, 2) and ranks[0][worse[0]] > 1
    assert best[1] in (0, 1, 2) and worse[1] == -1  # every candidate ties: no DPO pair
    assert best[2] == -1 and worse[2] == -1  # no candidate: no SFT target either
    assert best[3] == 0 and worse[3] == -1


def test_the_generator_keeps_the_phenomenon(world):
    turns, passages = world.turns, world.passages.set_index("pid")
    for row in turns.itertuples():
        gold = set(passages.loc[row.gold_pid, "text"].split())
        name = world.entities[row.entity]
        values = [w for w in row.response.split() if w not in name.split()]
        assert sum(w in gold for w in values) >= WORLD["response_values"]
        if row.query.startswith("and its"):
            assert name not in row.query and row.human_rewrite == f"{row.query} {name}"
        else:
            assert name in row.query and row.human_rewrite == row.query
    index = BM25Index(passages["text"].tolist(), 0.9, 0.4, tiebreak_seed=0)
    top_human = index.top1(turns["human_rewrite"].tolist())
    top_raw = index.top1(turns["response"].tolist())
    assert np.mean(top_human == turns["gold_pid"]) > 0.95  # a resolved query finds its passage
    assert np.mean(top_raw == turns["gold_pid"]) < 0.7  # a response without its entity often does not


def test_the_teacher_reads_the_conversation_and_errs_at_its_rate(world, table):
    lexicon = {tuple(name.split()): name for name in world.entities}
    turns = table.sort_values(["split", "conv", "turn"], kind="stable")
    # error rate 0: the text-reading teacher resolves every ellipsis as the gold rewrite does (this world names
    # every new entity), so its errors are the only difference from the gold rewrites
    hist, last, rng = [], None, np.random.default_rng(0)
    for row in turns.itertuples():
        if row.conv != last:
            hist, last = [], row.conv
        assert teacher_rewrite(row.query, hist, lexicon, world.entities, 0.0, rng) == (row.human_rewrite, "")
        hist.append((row.query, row.response))
    # error rate 1: a drop leaves no entity name, a swap names one entity, not the turn's
    history = [("what about ka lo founding", ""), ("what about mi nu leader", "")]
    lex = {("ka", "lo"): "ka lo", ("mi", "nu"): "mi nu", ("pe", "ta"): "pe ta"}
    kinds = set()
    for i in range(40):
        out, kind = teacher_rewrite(
            "and its awards", history, lex, ["ka lo", "mi nu", "pe ta"], 1.0, np.random.default_rng(i)
        )
        kinds.add(kind)
        assert out == "and its awards" if kind == "drop" else out == "and its awards ka lo"  # the history's other one
    assert kinds == {"drop", "swap"}
    out, kind = teacher_rewrite(
        "what about pe ta founding", [], lex, ["ka lo", "mi nu", "pe ta"], 1.0, np.random.default_rng(1)
    )
    assert "pe ta" not in out and kind in ("drop", "swap")
    with pytest.raises(ValueError, match="teacher_error_rate"):
        teacher_rewrite("x", [], lex, ["ka lo"], 1.5, np.random.default_rng(0))
    # in the table: the share of erring rewrites is the configured rate (0.3), erring ones differ from the gold
    train = table[table["split"] == "train"]
    for col in ("teacher_rewrite_error", "teacher_refine_error"):
        assert abs((table[col] != "").mean() - 0.3) < 0.08, col  # about 200 turns: 2.5 standard errors
    wrong = train["teacher_rewrite_error"] != ""
    assert (train.loc[wrong, "teacher_rewrite"] != train.loc[wrong, "human_rewrite"]).all()
    assert (train.loc[~wrong, "teacher_rewrite"] == train.loc[~wrong, "human_rewrite"]).all()


def test_single_role_references_are_the_erring_teachers_refinements(table):
    train = table[table["split"] == "train"].reset_index(drop=True)
    refs = pipeline.pseudo_references("single_role", train, 10, np.random.default_rng(0))
    assert np.array_equal(refs, train["r_teacher_top1"].to_numpy())
    hit = refs == train["gold_pid"].to_numpy()
    right = (train["teacher_refine_error"] == "").to_numpy()
    # the teacher's right refinements name the entity and find the gold passage; its wrong ones mostly do not
    assert hit[right].mean() > 0.95 and hit[~right].mean() < 0.6


def test_the_sft_stage_trains_on_the_teachers_outputs_never_the_gold(world, table, monkeypatch):
    from paperflow.dualreform import lora

    seen = {}

    def fake_sft(model, tok, prompts, targets, lora_settings, settings, seed, out_dir, device, every_s=None):
        seen.update(prompts=prompts, targets=targets, lora=lora_settings, settings=settings)
        return model, None, pd.DataFrame({"loss": [1.0]})

    monkeypatch.setattr(lora, "train_sft", fake_sft)
    spec = {"arch": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    spec |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
    pipeline.train_sft(table, world.passages, spec, {"epochs": 1, "batch_size": 4, "lr": 1e-3}, seed=0)
    train = table[table["split"] == "train"]
    n = len(train)
    # both roles: the words the teacher's (erring) rewrite and refinement add to the query and to the response
    rewrites = [pipeline.expansion(q, r) for q, r in zip(train["query"], train["teacher_rewrite"])]
    refines = [pipeline.expansion(r, t) for r, t in zip(train["response"], train["teacher_refine"])]
    assert seen["targets"] == [*rewrites, *refines]
    gold = [pipeline.expansion(q, h) for q, h in zip(train["query"], train["human_rewrite"])]
    assert seen["targets"][:n] != gold
    assert seen["prompts"][n].split()[-1] == "<rew>" and train["response"].iloc[0] in seen["prompts"][n]
    assert seen["lora"] is None and seen["settings"]["num_train_epochs"] == 1  # full fine-tuning, TRL's settings


def test_mentioned_entities_follow_the_history():
    lexicon = {("ka", "lo"): "ka lo", ("mi", "nu"): "mi nu"}
    history = [("what about ka lo founding", "x y"), ("what about mi nu leader", "z mi nu")]
    names, last = mentioned_entities(history, lexicon)
    assert names == ["ka lo", "mi nu"] and last == "mi nu"
    assert mentioned_entities([], lexicon) == ([], None)


def test_expansion_and_expand_are_inverse_on_appended_words():
    assert pipeline.expansion("and its awards", "and its awards mi nu") == "mi nu"
    assert pipeline.expansion("what about ka lo founding", "what about founding") == ""
    assert pipeline.expand("and its awards", "mi nu") == "and its awards mi nu"
    assert pipeline.expand("and its awards", "") == "and its awards"


def _evals(mrr: dict[str, list[float]], seeds, iterations=2) -> pd.DataFrame:
    rows = []
    for method, values in mrr.items():
        its = {"raw": [0], "sft_human": [0], "dualreform": list(range(1, iterations + 1))}.get(method, [1])
        rows += [{"method": method, "seed": s, "iteration": it, "mrr": v} for s, v in zip(seeds, values) for it in its]
    return pd.DataFrame(rows)


def _hits(acc: float, n: int) -> np.ndarray:
    return np.arange(n) < round(acc * n)


def _refs(acc: list[float], seeds, n=100, iterations=2) -> pd.DataFrame:
    rows = []
    for s, a in zip(seeds, acc):
        for it in range(1, iterations + 1):
            hit = _hits(a, n)
            rows.append(
                pd.DataFrame(
                    {"iteration": it, "seed": s, "turn_index": np.arange(n), "ref": np.where(hit, 1, 0), "gold": 1}
                )
            )
    return pd.concat(rows)


def _table(raw_acc: float, n=100) -> pd.DataFrame:
    """Training turns whose raw response retrieves passage 1 (the gold) for the first raw_acc * n turns."""
    return pd.DataFrame({"split": "train", "r_raw_top1": _hits(raw_acc, n).astype(int), "gold_pid": 1})


SEEDS = [0, 1, 2]
GOOD = {
    "raw": [0.48, 0.48, 0.48],
    "sft_human": [0.91, 0.91, 0.92],
    "retpo": [0.96, 0.97, 0.96],
    "dualreform": [0.95, 0.96, 0.955],
    "single_role": [0.95, 0.95, 0.95],
    "raw_ref": [0.80, 0.79, 0.81],
    "random_ref": [0.25, 0.3, 0.2],
}
ACC = {"dualreform": 0.95, "single_role": 0.70, "raw_ref": 0.36, "retpo": 1.0, "random_ref": 0.01}


def _verdicts(mrr, acc=None, raw_acc=0.36, evals=None, scale="smoke"):
    """The config's claims at `scale` judged on the metrics table of these results."""
    acc = {**ACC, **(acc or {})}
    refs = {m: _refs([a] * len(SEEDS), SEEDS) for m, a in acc.items()}
    evals = _evals(mrr, SEEDS) if evals is None else evals
    frame = claims.metrics_table(evals, refs, _table(raw_acc), 2, "synthconvqa", scale)
    specs = parse_claims(load_paper_config("dualreform", scale)["claims"], "config/dualreform.yaml")
    return {v.id: v for v in judge_all(specs, frame, scale)}


def _gated(found):
    return {k: v.verdict for k, v in found.items() if v.gated}


def test_claims_hold_on_good_results_and_beating_the_raw_query_is_the_sft_stages():
    found = _verdicts(GOOD)
    assert _gated(found) == {
        "g1_refinement_beats_erring_teacher": HELD,
        "g2_dualreform_ge_90pct_of_reference_based": HELD,
        "g3_dualreform_gt_sft": HELD,
    }
    g2 = found["g2_dualreform_ge_90pct_of_reference_based"]
    assert g2.central and g2.value == pytest.approx(np.mean(np.divide(GOOD["dualreform"], GOOD["retpo"])))
    assert g2.control["method"] == "raw_ref" and g2.control["verdict"] != HELD
    assert found["g1_refinement_beats_erring_teacher"].value == pytest.approx(0.95 - 0.70)
    assert found["refined_refs_beat_raw_by_10pts"].value == pytest.approx(0.95 - 0.36)
    assert _verdicts(GOOD, scale="cpu")["control_random_refs_do_not_beat_sft"].verdict == HELD  # smoke: no random_ref
    assert found["refs_iteration_last_ge_first"].verdict == HELD and not found["refs_iteration_last_ge_first"].gated
    # SFT-only beats the raw query in every seed too: the reported margin over the raw query is not DualReform's
    assert found["g3_dualreform_gt_raw_every_seed"].verdict == CONTROL_HOLDS
    assert _verdicts(dict(GOOD, sft_human=[0.45, 0.91, 0.92]))["g3_dualreform_gt_raw_every_seed"].verdict == HELD


def test_the_controls_void_the_claims_when_they_do_as_well():
    # references from the unrefined responses give the same model: the refinement is not what G2 and G3 measure
    found = _gated(_verdicts(dict(GOOD, raw_ref=GOOD["dualreform"])))
    assert found["g2_dualreform_ge_90pct_of_reference_based"] == CONTROL_HOLDS
    assert found["g3_dualreform_gt_sft"] == CONTROL_HOLDS
    # unrefined responses that beat the teacher's refinements: the teacher's errors make G1's gain
    assert _gated(_verdicts(GOOD, acc={"raw_ref": 0.80}, raw_acc=0.80))["g1_refinement_beats_erring_teacher"] == (
        CONTROL_HOLDS
    )


def test_claims_fail_on_results_that_do_not_show_them():
    # the SFT-only model's results in DualReform's place: G3 cannot hold
    assert _gated(_verdicts(dict(GOOD, dualreform=GOOD["sft_human"])))["g3_dualreform_gt_sft"] != HELD
    # the random-reference control's results in DualReform's place: G2 is refuted
    found = _gated(_verdicts(dict(GOOD, dualreform=GOOD["random_ref"])))
    assert found["g2_dualreform_ge_90pct_of_reference_based"] == REFUTED
    assert found["g3_dualreform_gt_sft"] == REFUTED
    # a refinement no better than the erring teacher's: G1 is refuted
    assert _gated(_verdicts(GOOD, acc={"dualreform": 0.60}))["g1_refinement_beats_erring_teacher"] == REFUTED
    # random references that beat SFT fail the reported control (judged at cpu: smoke runs no random_ref)
    found = _verdicts(dict(GOOD, random_ref=[0.95, 0.95, 0.95]), scale="cpu")
    assert found["control_random_refs_do_not_beat_sft"].verdict == REFUTED


def test_a_missing_seed_gives_no_data():
    evals = _evals(GOOD, SEEDS)
    evals = evals[~((evals["method"] == "dualreform") & (evals["seed"] == 2))]
    found = _gated(_verdicts(GOOD, evals=evals))
    assert found["g2_dualreform_ge_90pct_of_reference_based"] == NO_DATA
    assert found["g3_dualreform_gt_sft"] == NO_DATA


def test_the_metrics_table_does_not_depend_on_row_order():
    refs = {"dualreform": _refs([0.9, 0.95, 0.97], SEEDS)}
    a = claims.metrics_table(_evals(GOOD, SEEDS), refs, _table(0.36), 2, "synthconvqa", "smoke")
    b = claims.metrics_table(
        _evals(GOOD, SEEDS).iloc[::-1],
        {"dualreform": refs["dualreform"].iloc[::-1]},
        _table(0.36),
        2,
        "synthconvqa",
        "smoke",
    )
    key = ["seed", "unit", "method", "metric"]
    assert a.sort_values(key).reset_index(drop=True).equals(b.sort_values(key).reset_index(drop=True))
    acc = a[(a["method"] == "dualreform") & (a["metric"] == "synthconvqa/ref_accuracy")].groupby("seed")["value"]
    assert acc.mean().tolist() == pytest.approx([0.9, 0.95, 0.97])


def test_raw_response_references_are_the_unrefined_responses_top_passage(world, table):
    train = table[table["split"] == "train"].reset_index(drop=True)
    refs = pipeline.pseudo_references("raw_ref", train, 10, np.random.default_rng(0))
    index = BM25Index(world.passages["text"].tolist(), 0.9, 0.4, tiebreak_seed=2)
    assert refs.tolist() == index.top1(train["response"].tolist()).tolist()
    assert np.mean(refs == train["gold_pid"].to_numpy()) == pytest.approx(claims.raw_response_accuracy(table))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            (
                "methods: [raw, sft_human, retpo, dualreform, single_role, raw_ref",  # defaults' and smoke's lists
                "methods: [raw, sft_human, dualreform, dualref",
            ),
            "dualref",
        ),
        (("    hidden_size: 64\n", "    hiden_size: 64\n"), "did you mean 'hidden_size'"),
        (
            ("methods: [raw, sft_human, retpo, dualreform, single_role, raw_ref", "methods: [raw, retpo"),
            "starts from",
        ),
        (("  iterations: 2 ", "  iteration: 2 "), "iteration"),
    ],
)
def test_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "dualreform.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("dualreform", "smoke", repo_copy)


TINY = {"arch": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
TINY |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32, "tie_word_embeddings": True}
WORDS = ["and", "its", "founding", "awards", "what", "about", "ka", "lo", "mi", "nu", "pe", "ta"]


def _tiny(seed: int = 0):
    from paperflow.core.lm.models import build_model
    from paperflow.dualreform import cqr

    tok = cqr.make_tokenizer(WORDS)
    return build_model({**TINY, "vocab_size": len(tok)}, seed=seed), tok


def _prompts(n: int) -> list[str]:
    from paperflow.dualreform import cqr

    queries = ["and its founding", "and its awards", "what about ka lo founding", "what about pe ta awards"]
    return [cqr.prompt_text(cqr.rewrite_prompt(["what about mi nu awards"], queries[i % 4])) for i in range(n)]


def _margin(model, tok, prompt: str, chosen: str, rejected: str) -> float:
    import torch

    from paperflow.core.lm.sampling import sequence_logprobs
    from paperflow.core.lm.tokenizer import encode_pairs

    words = prompt.split()[1:]  # encode_pairs writes the BOS
    batch = encode_pairs(tok, [words, words], [chosen.split(), rejected.split()])
    with torch.no_grad():
        logp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"])
    c, r = (logp * batch["completion_mask"]).sum(-1).tolist()
    return c - r


def test_sampled_candidates_are_reproducible_per_seed_and_turn_and_de_duplicated():
    from paperflow.dualreform import writer

    model, tok = _tiny()
    prompts = _prompts(6)
    args = {"k": 8, "temperature": 1.5, "max_new_tokens": 2}
    a = writer.sample_candidates(model, tok, prompts, seed=3, batch_size=64, **args)
    assert a == writer.sample_candidates(model, tok, prompts, seed=3, batch_size=64, **args)
    # a turn's candidates come from its own (seed, turn) generator: the batching does not change them
    assert a == writer.sample_candidates(model, tok, prompts, seed=3, batch_size=1, **args)
    assert a != writer.sample_candidates(model, tok, prompts, seed=4, **args)
    raw = writer._generate(model, tok, prompts, 8, 1.5, None, 2, 3, 64)
    for drawn, kept in zip(raw, a):
        assert kept == list(dict.fromkeys(t for t in drawn if t))  # de-duplicated in the order drawn, no empty one
        assert len(set(kept)) == len(kept) and all(w in tok.get_vocab() for c in kept for w in c.split())
    assert sum(len(set(d)) < len(d) for d in raw) > 0  # the fixture has duplicates to remove
    with pytest.raises(ValueError, match="temperature"):
        writer.sample_candidates(model, tok, prompts, seed=3, k=2, temperature=0.0, max_new_tokens=2)
    greedy = writer.greedy(model, tok, prompts, max_new_tokens=4)
    assert greedy == writer.greedy(model, tok, prompts[::-1], max_new_tokens=4)[::-1]


def test_the_candidates_scored_are_the_models_samples_and_the_refinement_is_its_writing(world, table, monkeypatch):
    from paperflow.dualreform import cqr, writer

    train = table[table["split"] == "train"].reset_index(drop=True).iloc[:12]
    tok = cqr.make_tokenizer(pipeline.vocabulary(world.passages))
    from paperflow.core.lm.models import build_model

    model = build_model({**TINY, "max_position_embeddings": 64, "vocab_size": len(tok)}, seed=0)
    index = BM25Index(world.passages["text"].tolist(), 0.9, 0.4, tiebreak_seed=2)
    gen = {"k": 6, "temperature": 2.0, "top_k": None, "max_new_tokens": 3}
    cands, tops = pipeline.sample_pool(model, tok, train, index, gen, seed=7)
    rewrite, _ = pipeline.turn_prompts(train)
    assert cands == writer.sample_candidates(
        model, tok, rewrite, k=6, temperature=2.0, max_new_tokens=3, seed=7, keep_empty=True
    )
    for q, cs, top in zip(train["query"], cands, tops):
        assert np.array_equal(top, index.rankings([pipeline.expand(q, c) for c in cs], pipeline.DEPTH))
    # train_method scores these candidates, and DualReform's references come from what the model writes for the
    # responses (refine role), expanded and retrieved
    seen = {}

    def fake_optimise(m, refs, tr, tk, cs, tp, settings, seed, tag):
        seen.setdefault("cands", cs)
        seen.setdefault("refs", []).append(refs)
        return pd.DataFrame({"loss": [0.0]})

    written = []

    def fake_greedy(m, tk, prompts, max_new_tokens, batch_size=64):
        written.append(prompts)
        return ["ka lo"] * len(prompts)

    monkeypatch.setattr(pipeline, "optimise", fake_optimise)
    monkeypatch.setattr(writer, "greedy", fake_greedy)
    passages = world.passages
    settings = {"iterations": 2, "generation": gen, "bm25": {"k1": 0.9, "b": 0.4}, "tiebreak_seed": 2}
    tab = pd.concat([train, table[table["split"] == "test"]], ignore_index=True)
    _, _, refs = pipeline.train_method("dualreform", model, tab, passages, settings, seed=7)
    assert seen["cands"] == cands
    _, refine = pipeline.turn_prompts(train)
    assert written == [refine, refine]  # iteration 1 with the SFT model, 2 with iteration 1's
    expected = index.top1([pipeline.expand(r, "ka lo") for r in train["response"]])
    assert all(np.array_equal(r, expected) for r in seen["refs"])
    assert refs["refined"].iloc[0] == pipeline.expand(train["response"].iloc[0], "ka lo")


def test_trl_sft_of_the_tiny_model_lowers_the_loss_and_its_greedy_rewrite_is_the_target():
    from paperflow.dualreform import writer

    model, tok = _tiny()
    prompts = _prompts(4)
    targets = ["mi nu", "mi nu", "", "pe ta awards"]
    assert writer.greedy(model, tok, prompts, max_new_tokens=4) != targets
    history = pipeline.fit_sft(
        model, tok, prompts * 4, targets * 4, {"epochs": 40, "batch_size": 16, "lr": 1e-2}, 0, "t"
    )
    assert history["loss"].iloc[-1] < 0.1 * history["loss"].iloc[0]
    assert (history["phase"] == "t").all() and len(history) == 40
    assert writer.greedy(model, tok, prompts, max_new_tokens=4) == targets


def test_trl_dpo_of_the_tiny_model_raises_the_chosen_over_rejected_margin():
    """Spec 10.1 through TRL's DPOTrainer (full fine-tuning against a frozen copy): the first step's loss is log 2
    (policy = reference) and log pi(y_w) - log pi(y_l) rises."""
    import math

    model, tok = _tiny()
    prompts = _prompts(1) * 8
    before = _margin(model, tok, prompts[0], "ka lo", "mi nu")
    stage = {"epochs": 10, "batch_size": 8, "lr": 1e-2, "beta": 0.1}
    history = pipeline.fit_dpo(model, tok, prompts, ["ka lo"] * 8, ["mi nu"] * 8, stage, 0, "d")
    assert history["loss"].iloc[0] == pytest.approx(math.log(2), abs=1e-5)
    assert _margin(model, tok, prompts[0], "ka lo", "mi nu") > before + 1.0
    assert history["loss"].iloc[-1] < history["loss"].iloc[0] and "reward_accuracy" in history
