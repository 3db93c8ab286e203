"""The kit's RL and preference losses: closed forms, and equality with TRL 1.16 on the same tensors (its
GRPO advantages from a real GRPOTrainer step, its GRPO losses through GRPOTrainer._compute_loss, its DPO loss
through DPOTrainer._compute_loss)."""

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


# ---------------------------------------------------------------- closed forms


def test_identical_rewards_give_zero_advantage_and_mixed_groups_are_standardised():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = losses.group_advantages(r, 4, eps=0.0 + 1e-12)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert abs(adv[4:].mean()) < 1e-6 and abs(adv[4:].std(unbiased=True) - 1) < 1e-5
    assert torch.allclose(losses.group_advantages(r, 4, scale="none"), r - r.reshape(2, 4).mean(1).repeat_interleave(4))
    with pytest.raises(ValueError, match="groups of 3"):
        losses.group_advantages(r, 3)
    with pytest.raises(ValueError, match="allowed values"):
        losses.group_advantages(r, 4, scale="grp")


def test_rloo_is_the_leave_one_out_baseline_per_sequence_and_per_position():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0])
    assert torch.allclose(losses.rloo_advantages(r, 2), torch.tensor([1.0, -1.0, -2.0, 2.0]))
    tok = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 0.0]])
    expect = torch.stack([tok[i] - (tok.sum(0) - tok[i]) / 2 for i in range(3)])
    assert torch.allclose(losses.rloo_advantages(tok, 3), expect)
    assert torch.allclose(losses.rloo_advantages(tok, 3).sum(0), torch.zeros(2))  # baselines cancel in a group


def test_dynamic_sampling_drops_the_groups_without_variance():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert losses.dynamic_sampling_keep(r, 2).tolist() == [False, False, True, True, False, False]


def test_reverse_cumsum_and_masked_statistics():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(losses.reverse_cumsum(x), torch.tensor([[6.0, 5.0, 3.0], [15.0, 11.0, 6.0]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert losses.masked_mean(x, mask) == pytest.approx(7 / 3)
    assert losses.masked_var(x, mask) == pytest.approx(np.var([1, 2, 4], ddof=1))
    w = losses.masked_whiten(x, mask)
    assert losses.masked_mean(w, mask) == pytest.approx(0, abs=1e-6)
    assert losses.masked_var(w, mask) == pytest.approx(1, abs=1e-6)
    kept = losses.masked_whiten(x, mask, shift_mean=False)
    assert losses.masked_mean(kept, mask) == pytest.approx(7 / 3, abs=1e-6)


def test_kl_estimators_closed_forms_and_k3_is_nonnegative():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = ref - logp
    assert torch.allclose(losses.kl_estimate(logp, ref, "k1"), -d)
    assert torch.allclose(losses.kl_estimate(logp, ref, "k2"), d**2 / 2)
    assert torch.allclose(losses.kl_estimate(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert (losses.kl_estimate(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="allowed values"):
        losses.kl_estimate(logp, ref, "k4")


def test_clipping_is_asymmetric():
    logp = torch.log(torch.tensor([[1.25, 0.7]]))  # ratios 1.25 and 0.7 against old log-probs 0
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    pos, neg = torch.tensor([1.0]), torch.tensor([-1.0])
    loss_pos, stats = losses.clipped_surrogate(logp, old, pos, mask, 0.2, 0.28, "token_mean")
    assert loss_pos.item() == pytest.approx(-(1.25 + 0.7) / 2)  # 1.25 < 1 + 0.28: not clipped
    assert losses.clipped_surrogate(logp, old, pos, mask, 0.28, 0.2, "token_mean")[0].item() == pytest.approx(
        -(1.2 + 0.7) / 2
    )
    loss_neg, stats = losses.clipped_surrogate(logp, old, neg, mask, 0.2, 0.28, "token_mean")
    assert loss_neg.item() == pytest.approx((1.25 + 0.8) / 2)  # min(-0.7, -0.8): the clipped term
    assert stats["clip_low_fraction"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="allowed values"):
        losses.clipped_surrogate(logp, old, pos, mask, 0.2, 0.2, "seq")


def test_dpo_is_log2_at_the_reference_and_its_gradient_favours_the_chosen():
    pc = torch.tensor([-3.0, -5.0], requires_grad=True)
    pr = torch.tensor([-4.0, -2.0], requires_grad=True)
    l, rc, rr = losses.dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.1)
    assert torch.allclose(l, torch.full((2,), math.log(2)))
    assert torch.equal(rc, torch.zeros(2)) and torch.equal(rr, torch.zeros(2))
    l.sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # descent raises log pi(y_w) and lowers log pi(y_l)
    ref_c, ref_r = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -2.5])
    l2, _, _ = losses.dpo_loss(pc.detach(), pr.detach(), ref_c, ref_r, beta=0.5)
    closed = -torch.nn.functional.logsigmoid(0.5 * ((pc.detach() - ref_c) - (pr.detach() - ref_r)))
    assert torch.allclose(l2, closed)


# ---------------------------------------------------------------- TRL 1.16 parity


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    """A tiny GRPOTrainer on the addition task whose reward function returns preset rewards; its loss inputs
    are recorded."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = WORLD.tokenizer()
    model = build_model(SPEC, seed=0)
    prompts = [" ".join(["<bos>", *ex.prompt]) for ex in WORLD.sample("addition", 8, np.random.default_rng(0))]
    preset = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5])

    def reward(completions, **_):
        return preset[: len(completions)].tolist()

    class Recording(GRPOTrainer):
        seen: list = []

        def _compute_loss(self, model, inputs):
            self.seen.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
            return super()._compute_loss(model, inputs)

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    trainer = Recording(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tok,
    )
    trainer.train()
    return trainer, preset


def test_group_advantages_equal_trls_on_its_own_rollout(grpo):
    trainer, preset = grpo
    # TRL shuffles the generation batch before the loss sees it: compare the advantages as multisets
    theirs = trainer.seen[0]["advantages"].sort().values
    ours = losses.group_advantages(preset, 4, scale="group")
    torch.testing.assert_close(ours.sort().values, theirs, atol=1e-6, rtol=0)
    batch_scaled = losses.group_advantages(preset, 4, scale="batch").sort().values
    assert not torch.allclose(batch_scaled, theirs, atol=1e-3)


def _loss_inputs(trainer, seed: int):
    """Prompt/completion tensors as TRL lays them out (prompts left-padded, completions right-padded), with
    old log-probs moved away from the current ones so some ratios leave the clipping band."""
    tok = trainer.processing_class
    g = torch.Generator().manual_seed(seed)
    exs = WORLD.sample("addition", 6, np.random.default_rng(seed))
    prompt = encode_words(tok, [ex.prompt for ex in exs])
    comp_len = [4, 2, 3, 4, 1, 4]
    completion = torch.randint(4, 16, (6, 4), generator=g)
    cmask = torch.tensor([[1] * n + [0] * (4 - n) for n in comp_len])
    completion = torch.where(cmask.bool(), completion, torch.full_like(completion, tok.pad_token_id))
    ids = torch.cat([prompt["input_ids"], completion], 1)
    mask = torch.cat([prompt["attention_mask"], cmask], 1)
    with torch.no_grad():
        logp = sequence_logprobs(trainer.model, ids, mask)[:, prompt["input_ids"].shape[1] :]
    old = (logp + 0.4 * torch.randn(logp.shape, generator=g)) * cmask
    adv = torch.randn(6, generator=g)
    ref = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * cmask
    inputs = {
        "prompt_ids": prompt["input_ids"],
        "prompt_mask": prompt["attention_mask"],
        "completion_ids": completion,
        "completion_mask": cmask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": cmask.sum(),
    }
    return inputs, ids, mask, prompt["input_ids"].shape[1]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize(("beta", "weighted"), [(0.0, False), (0.04, False), (0.04, True)])
def test_clipped_surrogate_equals_trls_grpo_loss(grpo, loss_type, beta, weighted):
    trainer, _ = grpo
    trainer.loss_type, trainer.beta = loss_type, beta
    trainer.args.use_bias_correction_kl = weighted
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    inputs, ids, mask, p = _loss_inputs(trainer, seed=7)
    theirs = trainer._compute_loss(trainer.model, inputs)
    logp = sequence_logprobs(trainer.model, ids, mask)[:, p:]
    kl = losses.kl_estimate(logp, inputs["ref_per_token_logps"], "k3")
    ours, stats = losses.clipped_surrogate(
        logp,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        inputs["completion_mask"],
        eps_low=trainer.epsilon_low,
        eps_high=trainer.epsilon_high,
        aggregation=losses.TRL_LOSS_TYPES[loss_type],
        max_completion_length=trainer.max_completion_length,
        kl=kl,
        kl_coef=beta,
        kl_importance_weighted=weighted,
    )
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert stats["clip_low_fraction"] + stats["clip_high_fraction"] > 0  # the band was really tested
    swapped, _ = losses.clipped_surrogate(
        logp,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        inputs["completion_mask"],
        eps_low=trainer.epsilon_high,
        eps_high=trainer.epsilon_low,
        aggregation=losses.TRL_LOSS_TYPES[loss_type],
        max_completion_length=trainer.max_completion_length,
        kl=kl,
        kl_coef=beta,
        kl_importance_weighted=weighted,
    )
    assert abs(swapped.item() - theirs.item()) > 1e-4


def test_dpo_loss_equals_trls_dpo_trainer(tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tok = WORLD.tokenizer()
    policy = build_model(SPEC, seed=1)
    ref = build_model(SPEC, seed=2)
    exs = WORLD.sample("addition", 4, np.random.default_rng(3))
    rows = [
        {"prompt": " ".join(ex.prompt), "chosen": " ".join(ex.answer), "rejected": " ".join(ex.answer[::-1])}
        for ex in exs
    ]
    args = DPOConfig(
        output_dir=str(tmp_path), beta=0.1, use_cpu=True, report_to=[], max_steps=1, per_device_train_batch_size=4
    )
    trainer = DPOTrainer(
        model=policy, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    # chosen rows then rejected rows, with the completion (answer + EOS) masked in
    prompts = [ex.prompt for ex in exs]
    completions = [ex.answer for ex in exs] + [ex.answer[::-1] for ex in exs]
    seqs = [(*p, *c) for p, c in zip(prompts * 2, completions)]
    batch = encode_words(tok, seqs, add_eos=True)
    assert batch["attention_mask"].all()  # every row has one length here: no padding side to agree on
    ids = batch["input_ids"]
    cmask = torch.zeros_like(ids)
    cmask[:, -4:] = 1  # three answer digits + EOS
    inputs = {"input_ids": ids, "attention_mask": batch["attention_mask"], "completion_mask": cmask}
    trainer.model.train()
    theirs = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    with torch.no_grad():
        ref_lp = (sequence_logprobs(ref, ids, batch["attention_mask"]) * cmask).sum(1)
    pol_lp = (sequence_logprobs(trainer.model, ids, batch["attention_mask"]) * cmask).sum(1)
    ours, _, _ = losses.dpo_loss(pol_lp[:4], pol_lp[4:], ref_lp[:4], ref_lp[4:], beta=0.1)
    torch.testing.assert_close(ours.mean(), theirs, atol=1e-6, rtol=0)
    assert abs(ours.mean().item() - math.log(2)) > 1e-3  # policy and reference differ: not the trivial value
    same, _, _ = losses.dpo_loss(pol_lp[:4], pol_lp[4:], ref_lp[:4], ref_lp[4:], beta=0.2)
    assert abs(same.mean().item() - theirs.item()) > 1e-4
