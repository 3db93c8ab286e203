"""The kit's RL and preference losses: closed forms, and equality with TRL 1.16 on the same tensors (GRPO and RLOO
advantages from the trainers' own scoring step, GRPOTrainer._compute_loss for grpo/bnpo/dapo/dr_grpo, with and
without KL, per-sequence and per-token advantages; DPOTrainer._compute_loss on a batch of its own collator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from paperflow.core.lm import losses
from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.lm.tokenizer import encode_words
from paperflow.core.lm.trl_anchor import dpo_texts

pytestmark = pytest.mark.xdist_group("lm_losses")

WORLD = DigitWorld.from_config({"addition": {"n_digits": 2}})
SPEC = {
    "arch": "llama",
    "vocab_size": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}
G = 4
# three groups of four rollouts: mixed, all equal (zero advantage), mixed with non-binary rewards
PRESET = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 2.0, 0.0, 1.0])
TEMPERATURE = 0.7


# ---------------------------------------------------------------- closed forms


def test_identical_rewards_give_zero_advantage_and_mixed_groups_are_standardised():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = losses.group_advantages(r, 4, eps=1e-12)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert abs(adv[4:].mean()) < 1e-6 and abs(adv[4:].std(unbiased=True) - 1) < 1e-6
    population = losses.group_advantages(r, 4, eps=1e-12, unbiased=False)
    assert abs(population[4:].std(unbiased=False) - 1) < 1e-6
    assert losses.group_advantages(r, 4)[4].item() == pytest.approx(-0.5 / (math.sqrt(1 / 3) + 1e-4))  # TRL's eps
    assert torch.allclose(losses.group_advantages(r, 4, scale="none"), r - r.reshape(2, 4).mean(1).repeat_interleave(4))
    batch = losses.group_advantages(r, 4, scale="batch", eps=0.0)
    assert torch.allclose(batch, losses.group_advantages(r, 4, scale="none") / r.std())
    with pytest.raises(ValueError, match="groups of 3"):
        losses.group_advantages(r, 3)
    with pytest.raises(ValueError, match="allowed values"):
        losses.group_advantages(r, 4, scale="grp")
    with pytest.raises(ValueError, match=r"\[N\]"):
        losses.group_advantages(r.reshape(4, 2), 2)


def test_rloo_is_the_leave_one_out_baseline():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0])
    assert torch.allclose(losses.rloo_advantages(r, 2), torch.tensor([1.0, -1.0, -2.0, 2.0]))
    r3 = torch.tensor([3.0, 0.0, 1.0])
    assert torch.allclose(losses.rloo_advantages(r3, 3), torch.tensor([3 - 0.5, 0 - 2.0, 1 - 1.5]))
    with pytest.raises(ValueError, match="at least 2"):
        losses.rloo_advantages(r, 1)
    with pytest.raises(ValueError, match="groups of 3"):
        losses.rloo_advantages(r, 3)


def test_rloo_per_position_follows_primes_masked_rloo():
    # ITPO acceptance check 1: one reward position per rollout -> plain RLOO, R = [1, 0, 0, 1] -> [2/3, -2/3, -2/3, 2/3]
    rewards = torch.zeros(4, 5)
    mask = torch.zeros(4, 5, dtype=torch.bool)
    for i, (pos, value) in enumerate([(4, 1.0), (2, 0.0), (3, 0.0), (1, 1.0)]):
        rewards[i, pos], mask[i, pos] = value, True
    out = losses.rloo_advantages(rewards, 4, mask)
    assert torch.allclose(out[mask], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    assert torch.equal(out[~mask], torch.zeros(16))
    assert torch.allclose(out[mask], losses.rloo_advantages(rewards[mask], 4))
    # several positions (turn ends): x * G/(G-1) - sum_j mean_j / (G-1) at every position, by hand
    x = torch.tensor([[0.5, 0.0, 1.5, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    m = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]])
    means = [1.0, 2.0, 1.0]  # rollout means over their own positions
    b = sum(means) / 2
    expect = torch.tensor([[0.5 * 1.5 - b, 0, 1.5 * 1.5 - b, 0], [0, 2.0 * 1.5 - b, 0, 0], [1.5 - b] * 4])
    assert torch.allclose(losses.rloo_advantages(x, 3, m), expect)
    # rewards outside the mask are ignored
    assert torch.equal(losses.rloo_advantages(x + 9 * (1 - m), 3, m), losses.rloo_advantages(x, 3, m))
    with pytest.raises(ValueError, match="mask"):
        losses.rloo_advantages(x, 3)
    with pytest.raises(ValueError, match=r"rollouts \[1\]"):
        losses.rloo_advantages(x, 3, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]))


def test_dynamic_sampling_drops_the_groups_without_variance():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    keep = losses.dynamic_sampling_keep(r, 2)
    assert keep.tolist() == [False, False, True, True, False, False]
    assert keep.view(-1, 2)[:, 0].tolist() == [False, True, False]
    assert losses.dynamic_sampling_keep(PRESET, G).tolist() == [True] * 4 + [False] * 4 + [True] * 4


def test_reverse_cumsum_equals_a_loop():
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    loop = torch.stack([torch.stack([x[i, t:].sum() for t in range(7)]) for i in range(3)])
    torch.testing.assert_close(losses.reverse_cumsum(x), loop, atol=1e-6, rtol=0)
    loop0 = torch.stack([x[t:].sum(0) for t in range(3)])
    torch.testing.assert_close(losses.reverse_cumsum(x, dim=0), loop0, atol=1e-6, rtol=0)


def test_masked_statistics_and_whitening():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 60.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert losses.masked_mean(x, mask) == pytest.approx(3.0)
    assert losses.masked_mean(x, mask.bool(), dim=1).tolist() == pytest.approx([1.5, 4.5])
    assert losses.masked_var(x, mask) == pytest.approx(np.var([1, 2, 4, 5], ddof=1))
    assert losses.masked_var(x, mask, unbiased=False) == pytest.approx(np.var([1, 2, 4, 5]))
    w = losses.masked_whiten(x, mask)
    kept = np.array([1, 2, 4, 5])
    expect = (kept - kept.mean()) / math.sqrt(np.var(kept, ddof=1) + 1e-8)  # verl / former trl.core
    assert w[mask.bool()].tolist() == pytest.approx(expect.tolist(), abs=1e-6)
    assert losses.masked_mean(w, mask) == pytest.approx(0, abs=1e-6)
    shifted = losses.masked_whiten(x, mask, shift_mean=False)
    assert losses.masked_mean(shifted, mask) == pytest.approx(3.0, abs=1e-6)
    with pytest.raises(ValueError, match="shapes differ"):
        losses.masked_mean(x, mask[:, :2])
    with pytest.raises(ValueError, match="at least two"):
        losses.masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_kl_estimators_closed_forms_and_k3_is_nonnegative():
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    d = ref - logp
    assert torch.allclose(losses.kl_estimate(logp, ref, "k1"), logp - ref)
    assert torch.allclose(losses.kl_estimate(logp, ref, "k2"), (logp - ref) ** 2 / 2)
    assert torch.allclose(losses.kl_estimate(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert (losses.kl_estimate(logp, ref, "k3") >= 0).all() and losses.kl_estimate(logp, ref)[2] == 0
    with pytest.raises(ValueError, match="allowed values"):
        losses.kl_estimate(logp, ref, "k4")
    with pytest.raises(ValueError, match="shapes differ"):
        losses.kl_estimate(logp, ref[:2])


def test_clipping_is_asymmetric():
    logp = torch.log(torch.tensor([[1.25, 0.7]]))  # ratios 1.25 and 0.7 against old log-probs 0
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    pos, neg = torch.tensor([1.0]), torch.tensor([-1.0])
    loss_pos, stats = losses.clipped_surrogate(logp, old, pos, mask, 0.2, 0.28, "token_mean")
    assert loss_pos.item() == pytest.approx(-(1.25 + 0.7) / 2)  # 1.25 < 1 + 0.28: not clipped
    assert stats["clip_high_fraction"] == 0
    swapped, stats = losses.clipped_surrogate(logp, old, pos, mask, 0.28, 0.2, "token_mean")
    assert swapped.item() == pytest.approx(-(1.2 + 0.7) / 2) and stats["clip_high_fraction"] == 0.5
    loss_neg, stats = losses.clipped_surrogate(logp, old, neg, mask, 0.2, 0.28, "token_mean")
    assert loss_neg.item() == pytest.approx((1.25 + 0.8) / 2)  # max(-0.7, -0.8) -> the clipped term
    assert stats["clip_low_fraction"] == pytest.approx(0.5) and stats["clip_region_fraction"] == pytest.approx(0.5)


def test_aggregations_by_hand():
    per_token_ratio = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    logp, old = per_token_ratio.log(), torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # per-token advantages; ratio 1 -> loss = -A
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    seq, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "grpo")
    assert seq.item() == pytest.approx(-((1 + 2) / 2 + 4) / 2)
    tok, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "bnpo")
    assert tok.item() == pytest.approx(-(1 + 2 + 4) / 3)
    dapo, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "dapo", token_count=7)
    assert dapo.item() == pytest.approx(-(1 + 2 + 4) / 7)
    fixed, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "dr_grpo", max_completion_length=5)
    assert fixed.item() == pytest.approx(-(1 + 2 + 4) / (2 * 5))
    for name, alias in losses.TRL_LOSS_TYPES.items():
        kw = {"max_completion_length": 5}
        a, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, name, **kw)
        b, _ = losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, alias, **kw)
        assert a.item() == b.item()
    with pytest.raises(ValueError, match="allowed values"):
        losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "seq")
    with pytest.raises(ValueError, match="max_completion_length"):
        losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "dr_grpo")
    with pytest.raises(ValueError, match="advantages"):
        losses.clipped_surrogate(logp, old, adv[:, :2], mask, 0.2, 0.2, "grpo")
    with pytest.raises(ValueError, match="shapes differ"):
        losses.clipped_surrogate(logp, old[:, :2], adv, mask, 0.2, 0.2, "grpo")
    with pytest.raises(ValueError, match="needs the per-token `kl`"):
        losses.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, "grpo", kl_coef=0.1)


def test_dpo_is_log2_at_the_reference_and_its_gradient_favours_the_chosen():
    pc = torch.tensor([-3.0, -5.0], requires_grad=True)
    pr = torch.tensor([-4.0, -2.0], requires_grad=True)
    l, rc, rr = losses.dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.1)
    assert torch.allclose(l, torch.full((2,), math.log(2)))
    assert torch.equal(rc, torch.zeros(2)) and torch.equal(rr, torch.zeros(2))
    l.sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # descent raises log pi(y_w) and lowers log pi(y_l)
    ref_c, ref_r = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -2.5])
    l2, rc, rr = losses.dpo_loss(pc.detach(), pr.detach(), ref_c, ref_r, beta=0.5)
    h = 0.5 * ((pc.detach() - ref_c) - (pr.detach() - ref_r))
    assert torch.allclose(l2, -torch.nn.functional.logsigmoid(h))
    assert torch.allclose(rc - rr, h)
    smooth, _, _ = losses.dpo_loss(pc.detach(), pr.detach(), ref_c, ref_r, beta=0.5, label_smoothing=0.1)
    logsig = torch.nn.functional.logsigmoid
    assert torch.allclose(smooth, -0.9 * logsig(h) - 0.1 * logsig(-h))
    half, _, _ = losses.dpo_loss(pr.detach(), pc.detach(), ref_r, ref_c, beta=0.5, label_smoothing=0.5)
    assert torch.allclose(half, losses.dpo_loss(pc.detach(), pr.detach(), ref_c, ref_r, 0.5, 0.5)[0])  # even in h
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.dpo_loss(pc, pr, ref_c, ref_r, beta=0.1, label_smoothing=0.7)
    with pytest.raises(ValueError, match="shapes differ"):
        losses.dpo_loss(pc, pr[:1], ref_c, ref_r, beta=0.1)


# ---------------------------------------------------------------- TRL 1.16 parity


@pytest.fixture(scope="module")
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


def _preset_reward(completions, **_):
    assert len(completions) == len(PRESET)
    return PRESET.tolist()


def _online_trainer(kind: str, tmp_path):
    """A GRPOTrainer / RLOOTrainer on three addition prompts x G rollouts whose reward function returns PRESET;
    float32 (TRL 1.16 turns bf16 autocast on by default, on CPU too) and sampling temperature 0.7."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (RLOOConfig, RLOOTrainer)
    prompts = [" ".join(["<bos>", *ex.prompt]) for ex in WORLD.sample("addition", 3, np.random.default_rng(0))]
    args = config_cls(
        output_dir=str(tmp_path),
        per_device_train_batch_size=len(PRESET),
        num_generations=G,
        max_completion_length=4,
        max_steps=1,
        temperature=TEMPERATURE,
        beta=0.0,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to=[],
        seed=0,
        **({"epsilon": 0.2, "epsilon_high": 0.28} if kind == "grpo" else {}),
    )
    trainer = trainer_cls(
        model=build_model(SPEC, seed=0),
        reward_funcs=_preset_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=WORLD.tokenizer(),
    )
    trainer.model.train()
    return trainer, [{"prompt": p} for p in prompts for _ in range(G)]


@pytest.fixture(scope="module")
def grpo(offline, tmp_path_factory):
    return _online_trainer("grpo", tmp_path_factory.mktemp("grpo"))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trls_scoring_step(grpo, scale):
    trainer, generation_batch = grpo
    trainer.scale_rewards = scale
    theirs = trainer._generate_and_score_completions(generation_batch)["advantages"]
    torch.testing.assert_close(losses.group_advantages(PRESET, G, scale=scale), theirs, atol=1e-6, rtol=0)
    if scale != "none":  # the std convention and eps are TRL's, and would be caught: EAPO writes std + 1e-6
        assert not torch.allclose(losses.group_advantages(PRESET, G, scale, unbiased=False), theirs, atol=1e-3)
        assert not torch.allclose(losses.group_advantages(PRESET, G, scale, eps=1e-6), theirs, atol=1e-6, rtol=0)


def test_rloo_advantages_equal_trls_scoring_step(offline, tmp_path):
    trainer, generation_batch = _online_trainer("rloo", tmp_path)
    theirs = trainer._generate_and_score_completions(generation_batch)["advantages"]
    torch.testing.assert_close(losses.rloo_advantages(PRESET, G), theirs, atol=1e-6, rtol=0)
    assert not torch.allclose(losses.group_advantages(PRESET, G, scale="none"), theirs, atol=1e-3)


def _loss_inputs(trainer, seed: int, token_advantages: bool):
    """Prompt/completion tensors laid out as TRL's (prompts left-padded, completions right-padded), old log-probs
    moved off the current ones so that ratios leave the clipping band, and a token count for the generation
    batch larger than this micro-batch's (as when it is one of several)."""
    tok = trainer.processing_class
    g = torch.Generator().manual_seed(seed)
    exs = WORLD.sample("addition", 6, np.random.default_rng(seed))
    prompt = encode_words(tok, [ex.prompt[2:] if i % 3 == 0 else ex.prompt for i, ex in enumerate(exs)])
    comp_len = [4, 2, 3, 4, 1, 4]
    completion = torch.randint(4, 16, (6, 4), generator=g)
    cmask = torch.tensor([[1] * n + [0] * (4 - n) for n in comp_len])
    completion = torch.where(cmask.bool(), completion, torch.full_like(completion, tok.pad_token_id))
    ids = torch.cat([prompt["input_ids"], completion], 1)
    mask = torch.cat([prompt["attention_mask"], cmask], 1)
    with torch.no_grad():
        logp = sequence_logprobs(trainer.model, ids, mask, temperature=TEMPERATURE)[:, -4:]
    old = (logp + 0.4 * torch.randn(logp.shape, generator=g)) * cmask
    adv = torch.randn((6, 4) if token_advantages else (6,), generator=g)
    ref = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * cmask
    inputs = {
        "prompt_ids": prompt["input_ids"],
        "prompt_mask": prompt["attention_mask"],
        "completion_ids": completion,
        "completion_mask": cmask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": cmask.sum() + 9,
    }
    return inputs, ids, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize(
    ("beta", "weighted", "token_advantages"),
    [(0.0, False, False), (0.04, False, False), (0.04, True, False), (0.0, False, True)],
)
def test_clipped_surrogate_equals_trls_grpo_loss(grpo, loss_type, beta, weighted, token_advantages):
    trainer, _ = grpo
    trainer.loss_type, trainer.beta = loss_type, beta
    trainer.args.use_bias_correction_kl = weighted
    trainer.current_gradient_accumulation_steps = 1
    assert trainer.args.steps_per_generation == 1 and trainer.accelerator.num_processes == 1
    inputs, ids, mask = _loss_inputs(trainer, seed=7, token_advantages=token_advantages)
    theirs = trainer._compute_loss(trainer.model, inputs)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    logp = sequence_logprobs(trainer.model, ids, mask, temperature=TEMPERATURE)[:, -4:]
    kl = losses.kl_estimate(logp, inputs["ref_per_token_logps"], "k3")

    def ours(eps_low, eps_high):
        return losses.clipped_surrogate(
            logp,
            inputs["old_per_token_logps"],
            inputs["advantages"],
            inputs["completion_mask"],
            eps_low=eps_low,
            eps_high=eps_high,
            aggregation=loss_type,
            max_completion_length=trainer.max_completion_length,
            token_count=inputs["num_items_in_batch"] if loss_type == "dapo" else None,
            kl=kl if beta else None,
            kl_coef=beta,
            kl_importance_weighted=weighted,
        )

    loss, stats = ours(trainer.epsilon_low, trainer.epsilon_high)
    torch.testing.assert_close(loss, theirs, atol=1e-6, rtol=0)
    for ours_key, trl_key in [("clip_low_fraction", "low_mean"), ("clip_high_fraction", "high_mean")]:
        assert stats[ours_key].item() == pytest.approx(logged[f"clip_ratio/{trl_key}"], abs=1e-6)
    assert stats["clip_region_fraction"].item() == pytest.approx(logged["clip_ratio/region_mean"], abs=1e-6)
    assert stats["clip_low_fraction"] > 0 and stats["clip_high_fraction"] > 0  # both ends of the band are hit
    if beta:  # TRL logs the KL term it adds: ratio-weighted under use_bias_correction_kl
        ratio = torch.exp(logp - inputs["old_per_token_logps"])
        logged_kl = losses.masked_mean(kl * ratio if weighted else kl, inputs["completion_mask"])
        assert logged_kl.item() == pytest.approx(logged["kl"], abs=1e-6)
    swapped, _ = ours(trainer.epsilon_high, trainer.epsilon_low)
    assert abs(swapped.item() - theirs.item()) > 1e-4


@pytest.fixture(scope="module")
def dpo(offline, tmp_path_factory):
    """A DPOTrainer (policy and reference of different seeds) on addition pairs, rejected answers of two lengths."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tok = WORLD.tokenizer()
    exs = WORLD.sample("addition", 6, np.random.default_rng(3))
    pairs = [
        {
            "prompt": " ".join(ex.prompt),
            "chosen": " ".join(ex.answer),
            "rejected": " ".join(ex.answer[::-1] if i % 2 else ex.answer[1:]),
        }
        for i, ex in enumerate(exs)
    ]
    args = DPOConfig(
        output_dir=str(tmp_path_factory.mktemp("dpo")),
        beta=0.1,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to=[],
        max_steps=1,
        per_device_train_batch_size=len(pairs),
    )
    trainer = DPOTrainer(
        model=build_model(SPEC, seed=1),
        ref_model=build_model(SPEC, seed=2),
        args=args,
        train_dataset=Dataset.from_list([dpo_texts(p, tok.eos_token) for p in pairs]),
        processing_class=tok,
    )
    trainer.model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    return trainer, batch


def _our_dpo_logps(trainer, batch):
    ids, am, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    policy = (sequence_logprobs(trainer.model, ids, am) * cm).sum(1)
    with torch.no_grad():
        ref = (sequence_logprobs(trainer.ref_model, ids, am) * cm).sum(1)
    n = ids.shape[0] // 2  # TRL's batch: chosen rows, then rejected rows
    return policy[:n], policy[n:], ref[:n], ref[n:]


def test_dpo_loss_equals_trls_dpo_trainer(dpo):
    trainer, batch = dpo
    tok = trainer.processing_class
    assert not (batch["input_ids"] == tok.unk_token_id).any()  # dpo_texts keeps every word a word
    assert batch["attention_mask"].sum(1).unique().numel() > 1  # padded rows are in the batch
    trainer.label_smoothing = 0.0
    theirs = trainer._compute_loss(trainer.model, batch, return_outputs=False)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    pc, pr, rc, rr = _our_dpo_logps(trainer, batch)
    ours, chosen, rejected = losses.dpo_loss(pc, pr, rc, rr, beta=0.1)
    torch.testing.assert_close(ours.mean(), theirs, atol=1e-6, rtol=0)
    assert chosen.mean().item() == pytest.approx(logged["rewards/chosen"], abs=1e-6)
    assert (chosen - rejected).mean().item() == pytest.approx(logged["rewards/margins"], abs=1e-6)
    assert abs(ours.mean().item() - math.log(2)) > 1e-3  # policy and reference differ: not the trivial value
    other_beta, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta=0.2)
    assert abs(other_beta.mean().item() - theirs.item()) > 1e-4


def test_trls_sigmoid_dpo_ignores_label_smoothing(dpo):
    """TRL 1.16 reads label_smoothing only in its robust/exo/aot losses: conservative DPO is not TRL's sigmoid."""
    trainer, batch = dpo
    trainer.label_smoothing = 0.2
    try:
        theirs = trainer._compute_loss(trainer.model, batch, return_outputs=False)
    finally:
        trainer.label_smoothing = 0.0
    pc, pr, rc, rr = _our_dpo_logps(trainer, batch)
    torch.testing.assert_close(losses.dpo_loss(pc, pr, rc, rr, beta=0.1)[0].mean(), theirs, atol=1e-6, rtol=0)
    smoothed = losses.dpo_loss(pc, pr, rc, rr, beta=0.1, label_smoothing=0.2)[0].mean()
    assert abs(smoothed.item() - theirs.item()) > 1e-4
