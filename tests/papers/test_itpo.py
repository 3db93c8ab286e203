"""itpo's acceptance checks (spec sections 10 and 11): the RLOO closed form, ITPO-norm's conservation and its
reductions (uniform weights at equal scores or T -> infinity, K = 1 = outcome-only), the implicit PRM's identity
and its BCE step, a golden fixture of the official recipe's turn-reward semantics (2 prompts x n = 4, 2-3 turns,
traced through a loop-by-loop reference of `calculate_segment_proportions_itpo(norm)` and
`compute_rloo_advantage_return`) matched to 1e-6, the environment (repacked histories, turn segments, seeded user,
exact Q-values and ex-ante labels), the claims with their negative controls, config errors by name; the tiny
pipeline's outputs are checked on the workflow tests' run (tests/tiny_outputs.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.itpo import analysis, claims, env, prm, rewards, rl, sft
from paperflow.itpo.checkpoints import load_models, save_models

MODEL = {
    "arch": "llama",
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 48,
}


def tiny_model(seed=0):
    return build_model(MODEL, seed)


# ---------------------------------------------------------------- section 10.1: RLOO closed form


def test_rloo_closed_form_on_single_reward_positions():
    mask = torch.tensor([[0, 1, 1, 0]] * 4)
    ends = rewards.turn_ends(mask)
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0])
    stream = rewards.Stream(torch.where(ends, outcome[:, None], 0.0), ends, 1.0)
    _, _, total = rewards.advantages([stream], mask, group_size=4)
    assert torch.allclose(total[:, 2], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]), atol=1e-7)
    assert torch.all(total[:, [0, 1, 3]] == 0)


# ---------------------------------------------------------------- section 10.2-10.3: ITPO-norm conservation, reductions


def _random_turns(seed, rows=6, length=14):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, length, dtype=torch.long)
    for i in range(rows):
        pos = 1
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            n = int(torch.randint(1, 4, (1,), generator=g))
            mask[i, pos : pos + n] = 1
            pos += n + 1
    scores = torch.randn(rows, length, generator=g) * mask
    return mask, scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_itponorm_turn_rewards_sum_to_the_outcome(seed):
    mask, scores = _random_turns(seed)
    outcome = torch.rand(mask.shape[0], generator=torch.Generator().manual_seed(seed))
    zero = torch.zeros_like(outcome)
    (stream,) = rewards.reward_streams(
        "itponorm", mask, outcome, zero, scores, temperature=0.4, dpo_coef=1.0, gt_coef=1.0
    )
    assert torch.allclose(stream.values.sum(1), outcome, atol=1e-6)
    assert torch.equal(stream.positions, rewards.turn_ends(mask))


def test_equal_per_token_scores_give_uniform_weights_and_t_infinity_too():
    mask = torch.tensor([[1, 1, 0, 1, 0, 1, 1, 1], [0, 1, 0, 1, 1, 0, 0, 0]])
    equal = mask * 0.3  # S_k / n_k = 0.3 on every turn
    w = rewards.proportions_itponorm(equal, mask, 0.4)
    assert torch.allclose(w[0], torch.full((3,), 1 / 3))
    assert torch.allclose(w[1, :2], torch.full((2,), 0.5)) and w[1, 2] == 0
    _, scores = _random_turns(3, rows=2, length=8)
    w_inf = rewards.proportions_itponorm(scores * mask, mask, 1e12)
    assert torch.allclose(w_inf[0], torch.full((3,), 1 / 3), atol=1e-6)


def test_one_turn_itponorm_equals_outcome_only_apart_from_length():
    mask = torch.tensor([[0, 1, 1, 1, 0]] * 8)
    scores = torch.randn(8, 5) * mask
    outcome = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    zero = torch.zeros(8)
    kw = dict(temperature=0.4, dpo_coef=5.0, gt_coef=5.0)
    (norm,) = rewards.reward_streams("itponorm", mask, outcome, zero, scores, **kw)
    (out,) = rewards.reward_streams("outcome", mask, outcome, zero, None, **kw)
    assert torch.allclose(norm.values, out.values) and torch.equal(norm.positions, out.positions)
    a_norm = rewards.advantages([norm], mask, 4)[0]
    a_out = rewards.advantages([out], mask, 4)[0]
    assert torch.allclose(a_norm, a_out, atol=1e-6)


def test_outcome_only_advantages_are_constant_within_a_trajectory():
    mask, _ = _random_turns(4, rows=8)
    outcome = torch.tensor([1.0, 0, 1, 0, 0, 0, 1, 1])
    streams = rewards.reward_streams(
        "outcome", mask, outcome, torch.zeros(8), None, temperature=0.4, dpo_coef=5, gt_coef=5
    )
    adv = rewards.advantages(streams, mask, 4)[0]
    assert rewards.advantage_volatility(adv, mask) < 1e-6


# ---------------------------------------------------------------- section 10.4: implicit PRM identity


def test_identical_prm_and_reference_give_zero_rewards_and_probability_one_half():
    model = tiny_model()
    ids = torch.randint(4, 30, (3, 9))
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, 4:] = 1
    with torch.no_grad():
        ref_logp = sequence_logprobs(model, ids, attn)
    r = prm.token_rewards(model, ref_logp, ids, attn, resp, beta=0.05)
    assert torch.all(r == 0)
    with torch.no_grad():
        logits = prm.implicit_logits(model, ref_logp, ids, attn, resp, 0.05)
    assert torch.allclose(torch.sigmoid(logits), torch.full((3,), 0.5))


def test_one_bce_step_on_a_successful_trajectory_raises_its_implicit_reward():
    ref = tiny_model().eval()
    phi = tiny_model().train()
    ids = torch.randint(4, 30, (1, 9))
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, 3:] = 1
    with torch.no_grad():
        ref_logp = sequence_logprobs(ref, ids, attn)
    opt = torch.optim.SGD(phi.parameters(), lr=1.0)
    before = float(prm.implicit_logits(phi, ref_logp, ids, attn, resp, 0.05).detach())
    prm.update_prm(phi, opt, ref_logp, ids, attn, resp, torch.tensor([1.0]), 0.05, 1, 10.0)
    after = float(prm.implicit_logits(phi, ref_logp, ids, attn, resp, 0.05).detach())
    assert before == 0.0 and after > 1e-4


# ---------------------------------------------------------------- section 10.5 / 11: golden fixture


def _segments(row):
    runs, cur = [], []
    for t, m in enumerate(row):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def _ref_masked_rloo(x, pos, n):
    """PRIME's masked_rloo, loop by loop: per group, each row's mean over its positions; baseline = their sum / (n-1);
    every position -> x * n / (n - 1) - baseline."""
    out = [[0.0] * len(x[0]) for _ in x]
    for start in range(0, len(x), n):
        means = []
        for i in range(start, start + n):
            vals = [x[i][t] for t in range(len(x[i])) if pos[i][t]]
            means.append(sum(vals) / len(vals))
        b = sum(means) / (n - 1)
        for i in range(start, start + n):
            for t in range(len(x[i])):
                if pos[i][t]:
                    out[i][t] = x[i][t] * n / (n - 1) - b
    return out


def _ref_whiten(x, mask):
    vals = [x[i][t] for i in range(len(x)) for t in range(len(x[0])) if mask[i][t]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in x]


def _ref_advantages(method, mask, scores, outcome, token_amount, n, temperature, coef, gt_coef):
    """The official semantics traced in plain Python (spec sections 2.3-2.4, 9, 11)."""
    rows, length = len(mask), len(mask[0])
    segs = [_segments(r) for r in mask]
    ends = [[False] * length for _ in range(rows)]
    for i, ss in enumerate(segs):
        for s in ss:
            ends[i][s[-1]] = True
    counts_all = [len(s) for ss in segs for s in ss]
    n_bar = sum(counts_all) / len(counts_all)
    zeros = lambda: [[0.0] * length for _ in range(rows)]
    length_stream = zeros()
    for i, ss in enumerate(segs):
        total = sum(len(s) for s in ss)
        for s in ss:
            length_stream[i][s[-1]] += token_amount[i] * len(s) / total
    streams = []
    if method == "outcome":  # reward_dpo_coef = 0: the whole weighted score at the last token of the last turn
        x, pos = zeros(), [[False] * length for _ in range(rows)]
        for i, ss in enumerate(segs):
            x[i][ss[-1][-1]] = outcome[i] + token_amount[i]
            pos[i][ss[-1][-1]] = True
        streams.append((x, pos, gt_coef))
    elif method == "itponorm":
        x = zeros()
        for i, ss in enumerate(segs):
            logits = [sum(scores[i][t] for t in s) / len(s) * n_bar / temperature for s in ss]
            mx = max(logits)
            e = [math.exp(v - mx) for v in logits]
            for s, w in zip(ss, e):
                x[i][s[-1]] += outcome[i] * w / sum(e) + length_stream[i][s[-1]]
        streams.append((x, ends))
    elif method == "itpo":
        x = zeros()
        for i, ss in enumerate(segs):
            for s in ss:
                x[i][s[-1]] += sum(scores[i][t] for t in s)
        streams += [(length_stream, ends), (x, ends)]
    elif method == "prime":
        dense = [[scores[i][t] if mask[i][t] else 0.0 for t in range(length)] for i in range(rows)]
        last = zeros()
        last_pos = [[False] * length for _ in range(rows)]
        for i, ss in enumerate(segs):
            last[i][ss[-1][-1]] = outcome[i]
            last_pos[i][ss[-1][-1]] = True
        streams += [(dense, [[bool(m) for m in r] for r in mask]), (length_stream, ends), (last, last_pos, gt_coef)]
    total = zeros()
    for x, pos, *scale in streams:
        step = _ref_masked_rloo(x, pos, n)
        for i in range(rows):
            for t in range(length):
                total[i][t] += step[i][t] * (scale[0] if scale else coef)
    returns = [[sum(total[i][u] * mask[i][u] for u in range(t, length)) for t in range(length)] for i in range(rows)]
    return _ref_whiten(returns, mask), returns


# 2 prompts x n = 4; rows with 2 or 3 assistant turns of lengths 1-4 (0s between them: the user's tokens)
GOLDEN_MASK = [
    [0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0],
    [0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 0, 0],
    [0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0],
    [0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0],
    [0, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0],
    [0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0],
]
GOLDEN_SCORES = [[round(0.1 * (((3 * i + 5 * t) % 7) - 3), 1) for t in range(12)] for i in range(8)]
GOLDEN_OUTCOME = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
GOLDEN_TOKENS = [-0.06, -0.04, -0.09, -0.03, -0.06, -0.05, -0.03, -0.08]


def test_golden_fixture_turn_proportions_by_hand():
    mask, scores = torch.tensor(GOLDEN_MASK), torch.tensor(GOLDEN_SCORES)
    # score(i, t) = 0.1 * (((3 i + 5 t) mod 7) - 3); row 0's turns [1, 2], [5, 6, 7], [9] hold (0.2, 0.0),
    # (0.1, -0.1, -0.3), (0.0): turn sums 0.2, -0.3, 0.0
    s = rewards.proportions_itpo(scores * mask, mask)
    assert torch.allclose(s[0], torch.tensor([0.2, -0.3, 0.0]), atol=1e-6)
    # 20 turns over the batch holding 43 assistant tokens: n_bar = 2.15
    assert float(rewards.turn_stats(scores, mask).mean_count) == pytest.approx(2.15)
    logits = torch.tensor([0.2 / 2, -0.3 / 3, 0.0 / 1]) * 2.15 / 0.4
    w = rewards.proportions_itponorm(scores * mask, mask, 0.4)
    assert torch.allclose(w[0], torch.softmax(logits, 0), atol=1e-6)


@pytest.mark.parametrize("method", ["itponorm", "itpo", "prime", "outcome"])
def test_golden_fixture_matches_the_official_semantics(method):
    mask = torch.tensor(GOLDEN_MASK)
    scores = torch.tensor(GOLDEN_SCORES) * mask
    outcome, tokens = torch.tensor(GOLDEN_OUTCOME), torch.tensor(GOLDEN_TOKENS)
    streams = rewards.reward_streams(method, mask, outcome, tokens, scores, temperature=0.4, dpo_coef=5.0, gt_coef=3.0)
    adv, returns, _ = rewards.advantages(streams, mask, group_size=4)
    ref_adv, ref_returns = _ref_advantages(
        method, GOLDEN_MASK, scores.tolist(), GOLDEN_OUTCOME, GOLDEN_TOKENS, 4, 0.4, 5.0, 3.0
    )
    assert torch.allclose(returns, torch.tensor(ref_returns), atol=1e-6)
    m = mask.bool()
    assert torch.allclose(adv[m], torch.tensor(ref_adv)[m], atol=1e-6)
    # the baseline is subtracted at every reward position: the first turn's return carries every later turn's
    if method == "itpo":
        assert not torch.allclose(returns[:, 0], returns[:, -1])


def _ref_turn_scores(mask, scores):
    """S_k / n_k of every turn of every row, loop by loop (the analysis' turn score)."""
    return [[sum(scores[i][t] for t in seg) / len(seg) for seg in _segments(mask[i])] for i in range(len(mask))]


def _ref_volatility(adv, mask):
    """Spec section 8: per row the sample std of A_t over its assistant tokens, the mean over rows."""
    stds = []
    for i, row in enumerate(mask):
        vals = [adv[i][t] for t in range(len(row)) if row[t]]
        mean = sum(vals) / len(vals)
        stds.append(math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)))
    return sum(stds) / len(stds)


@pytest.mark.parametrize("method", ["itponorm", "itpo", "prime", "outcome"])
def test_golden_fixture_every_quantity_the_claims_use(method):
    """Issue 45: beside the advantages, every quantity the claims read is traced by hand on the golden fixture: the
    batch-normed PRM rewards, the turn scores S_k / n_k of the turn AUROC (`analysis.turn_scores` aggregates with
    `rewards.turn_stats`), the within-trajectory advantage std of the robustness claim, and the advantages from
    the batch-normed scores the RL step feeds them (not raw scores)."""
    mask = torch.tensor(GOLDEN_MASK)
    raw = torch.tensor(GOLDEN_SCORES) * mask
    largest = max(abs(sum(raw[i, t:].tolist())) for i in range(8) for t in range(12))
    normed = rewards.batch_norm_scores(raw, mask)
    ref_normed = [[v / (largest + 1e-6) for v in row] for row in raw.tolist()]
    assert torch.allclose(normed, torch.tensor(ref_normed), atol=1e-7)
    t = rewards.turn_stats(raw, mask)
    per_turn = (t.sums / t.counts.clamp(min=1)).tolist()
    for i, ref in enumerate(_ref_turn_scores(GOLDEN_MASK, raw.tolist())):
        assert per_turn[i][: len(ref)] == pytest.approx(ref, abs=1e-6)
    outcome, tokens = torch.tensor(GOLDEN_OUTCOME), torch.tensor(GOLDEN_TOKENS)
    streams = rewards.reward_streams(method, mask, outcome, tokens, normed, temperature=0.4, dpo_coef=5.0, gt_coef=5.0)
    adv, _, _ = rewards.advantages(streams, mask, group_size=4)
    ref_adv, _ = _ref_advantages(method, GOLDEN_MASK, ref_normed, GOLDEN_OUTCOME, GOLDEN_TOKENS, 4, 0.4, 5.0, 5.0)
    m = mask.bool()
    assert torch.allclose(adv[m], torch.tensor(ref_adv)[m], atol=1e-5)
    assert rewards.advantage_volatility(adv, mask) == pytest.approx(_ref_volatility(ref_adv, GOLDEN_MASK), abs=1e-5)


def test_a_reask_after_dunno_is_preferred_less_under_itponorm_than_under_outcome_only():
    """The README's reading of the central claim: one group of n = 8 after a DUNNO on turn 1, four rows guess
    (ASK_B, wrong ANS: outcome 0) and four re-ask (ASK_B, ASK_B, right ANS: outcome 1), the PRM's turn weights
    uniform. Both methods give the re-ask the higher advantage at turn 2, but ITPO-norm by a smaller margin (it
    credits only the later turns' shares of the outcome to turn 2, outcome-only the whole outcome)."""
    turn = [1, 1, 1, 0]
    mask = torch.tensor([turn * 2 + [0] * 4] * 4 + [turn * 3] * 4)
    outcome = torch.tensor([0.0] * 4 + [1.0] * 4)
    length = torch.tensor([-0.06] * 4 + [-0.09] * 4)
    gap = {}
    for method in ("outcome", "itponorm"):
        streams = rewards.reward_streams(
            method, mask, outcome, length, torch.zeros(8, 12), temperature=0.4, dpo_coef=5.0, gt_coef=5.0
        )
        adv, _, _ = rewards.advantages(streams, mask, 8)
        gap[method] = float(adv[4, 4] - adv[0, 4])  # turn 2's first token: re-ask minus guess
    assert 0 < gap["itponorm"] < gap["outcome"]


def test_batch_norm_divides_by_the_largest_reverse_cumsum():
    mask = torch.tensor(GOLDEN_MASK)
    r = torch.tensor(GOLDEN_SCORES) * mask
    largest = max(abs(sum(r[i, t:].tolist())) for i in range(8) for t in range(12))
    assert torch.allclose(rewards.batch_norm_scores(r, mask), r / (largest + 1e-6))


def test_grpo_variant_normalises_within_groups():
    mask = torch.tensor([[0, 1, 1, 0]] * 4)
    ends = rewards.turn_ends(mask)
    stream = rewards.Stream(torch.where(ends, torch.tensor([1.0, 0, 0, 1])[:, None], 0.0), ends, 1.0)
    total = rewards.advantages([stream], mask, 4, baseline="grpo")[2]
    sd = float(torch.tensor([1.0, 0, 0, 1]).std())
    assert torch.allclose(total[:, 2], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (sd + 1e-6), atol=1e-6)


# ---------------------------------------------------------------- the environment


def test_optimal_values_by_hand():
    assert env.optimal_value(2, False) == pytest.approx(0.1 - 0.03)  # last turn: guess
    assert env.optimal_value(2, True) == pytest.approx(0.97)
    v1 = -0.02 + 0.75 * 0.97 + 0.25 * 0.07
    assert env.optimal_value(1, False) == pytest.approx(v1)
    assert env.optimal_value(0, False) == pytest.approx(-0.02 + 0.75 * 0.97 + 0.25 * v1)


@pytest.mark.parametrize(
    ("turn", "knows", "action", "answer", "useful"),
    [
        (0, False, "ASK_B", None, True),
        (0, False, "ASK_A", None, False),
        (0, False, "ASK_C", None, False),
        (0, False, "ANS", "right", False),  # a lucky guess is not useful ex ante
        (1, True, "ANS", "right", True),
        (1, True, "ANS", "wrong", False),
        (1, True, "ASK_B", None, False),
        (2, False, "ANS", "wrong", True),  # the last turn's guess beats a certain failure
        (0, False, "INVALID", None, False),
    ],
)
def test_ex_ante_labels(turn, knows, action, answer, useful):
    assert env.useful_ex_ante(turn, knows, action, answer) is useful


def test_parse_turn():
    assert env.parse_turn(["um", "um", "ASK_B", "EOT"]) == ("ASK_B", None)
    assert env.parse_turn(["ANS", "7", "EOT"]) == ("ANS", 7)
    assert env.parse_turn(["ANS", "EOT"]) == ("INVALID", None)
    assert env.parse_turn(["ASK_B", "um", "EOT"]) == ("INVALID", None)


def test_rollout_histories_are_one_run_with_one_segment_per_turn():
    tasks = env.draw_tasks(24, np.random.default_rng(0), "b")
    model = tiny_model()
    ep = env.rollout(model, tasks, 1.0, torch.Generator().manual_seed(0))
    attn = ep.attention_mask
    assert torch.all(attn[:, -1] == 1) and torch.all(attn[:, 1:] >= attn[:, :-1])  # left-padded, no holes
    sequence_logprobs(model, ep.input_ids, attn)  # refuses holes: must not raise
    t = rewards.turn_stats(torch.zeros(ep.input_ids.shape), ep.response_mask)
    for i, turns in enumerate(ep.turns):
        assert int(t.valid[i].sum()) == len(turns)
        assert t.counts[i, : len(turns)].tolist() == [turn["tokens"] for turn in turns]
    words = {v: w for w, v in env.ids().items()}
    for i in range(len(tasks)):
        row = [words.get(int(x), "<unk>") for x, m in zip(ep.input_ids[i], attn[i]) if m]
        assert row[:8] == ["<bos>", *env.opening(tasks, i)]
        user = [words.get(int(x)) for x, m, r in zip(ep.input_ids[i], attn[i], ep.response_mask[i]) if m and not r]
        assert set(user[8:]) <= {"USER", "a=", "b=", "c=", "DUNNO", "AST", *env.DIGITS}  # mask 0 between turns


def test_user_is_fixed_per_episode_and_greedy_rollouts_repeat():
    tasks = env.draw_tasks(16, np.random.default_rng(1), "b")
    frame = tasks.to_frame()
    again = env.Tasks.from_frame(frame)
    model = tiny_model(3)
    a = env.rollout(model, tasks, 0.0, None)
    b = env.rollout(model, again, 0.0, None)
    assert torch.equal(a.input_ids, b.input_ids) and np.array_equal(a.success, b.success)


def test_user_reveals_b_with_its_drawn_probability():
    tasks = env.draw_tasks(4000, np.random.default_rng(2))
    replies = [env.user_reply("ASK_B", tasks, i, 0)[1] for i in range(len(tasks))]
    share = np.mean([r == "b=" for r in replies])
    assert abs(share - env.P_REVEAL) < 0.03
    assert env.user_reply("ASK_A", tasks, 0, 0)[1:3] == ["a=", str(tasks.a[0])]


def test_sft_demos_answer_correctly_when_b_is_known_and_mask_the_assistant_only():
    rng = np.random.default_rng(0)
    for _ in range(200):
        words, mask = env.demo(rng, "sum")
        said = {w for w, m in zip(words, mask) if m}
        assert said <= {"um", "EOT", "ANS", "ASK_A", "ASK_B", "ASK_C", *env.DIGITS}
        if "b=" in words:
            a, b = int(words[words.index("a=") + 1]), int(words[words.index("b=") + 1])
            assert words[-2] == str((a + b) % 10)
    words, mask = env.demo(rng, "b", practice=True)
    assert "b=" in words and sum(mask) == len(words) - words.index("AST", 8) - 1


def test_checkpoint_file_round_trip(tmp_path):
    models = {("policy", 0): tiny_model(0), ("prm", 0): tiny_model(1), ("control", 4): tiny_model(2)}
    path = save_models(models, tmp_path / "m.safetensors", MODEL)
    back = load_models(path)
    assert set(back) == set(models)
    for k, m in models.items():
        for (n, a), (_, b) in zip(m.state_dict().items(), back[k].state_dict().items()):
            assert torch.equal(a, b), n


def test_rl_iteration_runs_every_method_and_leaves_the_init_unchanged():
    init = tiny_model()
    before = {k: v.clone() for k, v in init.state_dict().items()}
    s = rl.Settings(
        steps=1,
        prompts_per_step=2,
        group_size=4,
        lr=1e-3,
        prm_lr=1e-3,
        beta=0.05,
        turn_temperature=0.4,
        rollout_temperature=1.0,
        dpo_coef=5,
        gt_coef=5,
        clip=0.2,
        kl_coef=0.001,
        grad_clip=1.0,
        prm_grad_clip=10,
        prm_minibatches=2,
        ppo_minibatches=2,
        ppo_epochs=1,
        eval_every=1,
    )
    tasks = env.draw_tasks(8, np.random.default_rng(0), "b")
    for method in rewards.METHODS:
        out = rl.train(init, method, s, 0, tasks)
        assert [r["step"] for r in out.records] == [0, 1] and "greedy_success" in out.records[-1]
        assert ("prm_loss" in out.records[-1]) == (method in rewards.PRM_METHODS)
        assert ("control_prm_loss" in out.records[-1]) == (method == "itponorm")
    assert all(torch.equal(before[k], v) for k, v in init.state_dict().items())


def test_every_arm_of_a_seed_trains_on_the_same_task_stream(monkeypatch):
    """Issue 45: the control's outcome permutation has a generator of its own, so ITPO-norm (which trains the
    permuted-outcome PRM alongside) draws the same training tasks, user draws included, as every other arm."""
    s = rl.Settings(
        steps=3,
        prompts_per_step=2,
        group_size=4,
        lr=1e-3,
        prm_lr=1e-3,
        beta=0.05,
        turn_temperature=0.4,
        rollout_temperature=1.0,
        dpo_coef=5,
        gt_coef=5,
        clip=0.2,
        kl_coef=0.001,
        grad_clip=1.0,
        prm_grad_clip=10,
        prm_minibatches=2,
        ppo_minibatches=2,
        ppo_epochs=1,
        eval_every=3,
    )
    eval_tasks = env.draw_tasks(4, np.random.default_rng(0), "b")
    seen: list[pd.DataFrame] = []
    rollout = env.rollout

    def recording(policy, tasks, temperature, gen):
        if temperature > 0:  # the training rollouts (greedy evaluation runs at 0)
            seen.append(tasks.to_frame())
        return rollout(policy, tasks, temperature, gen)

    monkeypatch.setattr(env, "rollout", recording)
    streams = {}
    for method in ("outcome", "prime", "itponorm"):
        seen.clear()
        out = rl.train(tiny_model(), method, s, 7, eval_tasks)
        assert ("control_prm_loss" in out.records[-1]) == (method == "itponorm")
        streams[method] = list(seen)
    assert len(streams["outcome"]) == s.steps
    for method in ("prime", "itponorm"):
        for a, b in zip(streams["outcome"], streams[method], strict=True):
            pd.testing.assert_frame_equal(a, b)
    seen.clear()
    other = rl.train(tiny_model(), "outcome", s, 8, eval_tasks)
    assert other.records  # another seed, another stream
    assert not seen[0].equals(streams["outcome"][0])


def test_sft_model_spec_takes_the_environment_vocabulary():
    spec = sft.model_spec({**MODEL, "vocab_size": 8})
    assert spec["vocab_size"] == len(env.ids())


# ---------------------------------------------------------------- the claims and their negative controls


def _curves(itn_gain, prime_gain, seeds=(0, 1, 2), itpo_gain=0.0):
    rows = []
    for s in seeds:
        for m, gain in (("outcome", 0.0), ("itponorm", itn_gain), ("prime", prime_gain), ("itpo", itpo_gain)):
            for step in (0, 5, 10):
                rows.append(
                    {
                        "method": m,
                        "seed": s,
                        "step": step,
                        "greedy_success": 0.2 + gain * step / 10 + 0.3 * step / 10,
                        "adv_volatility": {"prime": 0.6, "outcome": 0.0}.get(m, 0.2),
                    }
                )
    return pd.DataFrame(rows)


def _turns(signal, control_signal, seeds=(0, 1, 2), n=300):
    rng = np.random.default_rng(0)
    frames = []
    for s in seeds:
        useful = rng.random(n) < 0.5
        frames.append(
            pd.DataFrame(
                {
                    "episode": np.arange(n) // 2,
                    "method": "itponorm",
                    "seed": s,
                    "useful": useful,
                    "useful_after_reply": useful,
                    "score_prm": signal * useful + rng.normal(0, 1, n),
                    "score_control": control_signal * useful + rng.normal(0, 1, n),
                    "score_init": 0.0,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


CI = {"bootstrap": 100, "bootstrap_seed": 0}
SEEDS = [0, 1, 2, 3, 4]


def judged(curves, turns, seeds=SEEDS) -> dict:
    """The verdicts of the config's synthetic claims on the metrics table of these numbers."""
    from paperflow.core.claims import judge_all, parse_claims
    from paperflow.core.config import load_paper_config

    specs = parse_claims(load_paper_config("itpo", "smoke")["claims"], "config/itpo.yaml")
    table = claims.metrics_table(curves, turns, seeds, ["outcome", "prime", "itpo", "itponorm"], CI, "smoke")
    return {v.id: v for v in judge_all(specs, table, "smoke")}


def test_claims_hold_on_a_clear_signal():
    found = judged(_curves(0.05, -0.1, SEEDS, itpo_gain=-0.1), _turns(3.0, 0.0, SEEDS))
    assert {k: v.verdict for k, v in found.items()} == {
        "turn_auroc_itponorm": "held",
        "control_permuted_prm_at_chance": "held",
        "success_auc_itponorm_vs_outcome": "held",
        "success_auc_itponorm_gt_prime": "held",
        "turn_auroc_gain_over_control": "held",
        "prime_advantages_most_volatile": "held",
    }
    assert found["turn_auroc_itponorm"].control["verdict"] != "held"
    # the untrained PRM (AUROC 0.5) does not beat the permuted one: the gain is the trained PRM's
    assert found["turn_auroc_gain_over_control"].control["verdict"] != "held"
    # ITPO's turn sums as good as ITPO-norm against PRIME: the claim over PRIME is voided
    voided = judged(_curves(0.05, -0.1, SEEDS, itpo_gain=0.05), _turns(3.0, 0.0, SEEDS))
    assert voided["success_auc_itponorm_gt_prime"].verdict == "control also holds"


def test_a_control_prm_that_separates_as_well_voids_the_auroc_claim():
    # the control PRM given the same signal as the PRM (its outcomes not really permuted): it leaves chance, and
    # the PRM's AUROC, which clears 0.75 on its own numbers, counts as not held since the control clears it too
    found = judged(_curves(0.05, -0.1, SEEDS), _turns(3.0, 3.0, SEEDS))
    assert found["control_permuted_prm_at_chance"].verdict == "refuted"
    assert found["turn_auroc_itponorm"].verdict == "control also holds" and not found["turn_auroc_itponorm"].held
    # and the paired gain over the control is nil
    assert not found["turn_auroc_gain_over_control"].held


def test_claims_fail_on_the_baselines_in_the_methods_place():
    # no turn signal; ITPO-norm's success curve no better than PRIME's and well below outcome-only's
    found = judged(_curves(-0.2, -0.2, SEEDS), _turns(0.0, 0.0, SEEDS))
    assert found["turn_auroc_itponorm"].verdict == "refuted"
    assert found["success_auc_itponorm_vs_outcome"].verdict == "refuted"
    assert not found["success_auc_itponorm_gt_prime"].held
    # both PRMs at chance: the check holds on its own numbers, but the trained PRM's interval includes 0.5 too
    assert found["control_permuted_prm_at_chance"].verdict == "control also holds"


def test_success_auc_is_the_trapezoid_over_the_iteration_range():
    c = pd.DataFrame({"method": "outcome", "seed": 0, "step": [0, 5, 10], "greedy_success": [0.0, 0.5, 0.5]})
    assert claims.success_auc(c, "outcome", 0) == pytest.approx((0.25 * 5 + 0.5 * 5) / 10)


def test_auroc_and_its_bootstrap_interval():
    frame = pd.DataFrame({"episode": [0, 0, 1, 1, 2, 2], "useful": [1, 0, 1, 0, 1, 0], "s": [2, 1, 3, 0, 1, 2]})
    assert analysis.auroc(frame["useful"], frame["s"]) == pytest.approx(7 / 9)
    boot = analysis.bootstrap_aurocs(frame, "useful", "s", 50, 0)
    assert boot.shape == (50,) and np.nanmin(boot) >= 0 and np.nanmax(boot) <= 1
    assert claims.ci_miss(0.45, 0.6) < 0 < claims.ci_miss(0.55, 0.7)


# ---------------------------------------------------------------- config and paper scale


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("methods: [outcome, prime, itpo, itponorm]", "methods: [outcome, prime, itpo, itponrm]"), "itponrm"),
        (("    hidden_size: 64\n", "    hiden_size: 64\n"), "did you mean 'hidden_size'"),
        (("methods: [outcome, prime, itpo, itponorm]", "methods: [outcome, itpo, itponorm]"), "lacks"),
        (("    goal: b ", "    goal: c "), "goal"),
        (("control_methods: [itponorm]", "control_methods: [outcome]"), "control_methods"),
        (("    max_position_embeddings: 48", "    max_position_embeddings: 24"), "max_position_embeddings"),
    ],
)
def test_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "itpo.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("itpo", "smoke", repo_copy)


def test_paper_scale_is_refused_by_name(tmp_path):
    from paperflow.itpo.stages import download

    with pytest.raises(ConfigError, match="not pinned"):
        download({"kind": "collabllm"}, {}, str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"))
