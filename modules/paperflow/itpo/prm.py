"""The implicit PRM (spec section 2.2, PRIME-style): pi_phi trainable and pi_ref frozen, both copies of the initial
policy. Token reward r_t = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t)) on assistant tokens; the PRM is
trained by BCE(sigmoid(beta * sum_t q_t), s) on the outcome s. Log-probs come from the kit's `sequence_logprobs`
on the repacked histories."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paperflow.core.lm.sampling import sequence_logprobs


def implicit_logits(prm, ref_logp: torch.Tensor, input_ids, attention_mask, response_mask, beta: float):
    """beta * sum over assistant tokens of q_t, per row [N] (differentiable in the PRM)."""
    q = sequence_logprobs(prm, input_ids, attention_mask) - ref_logp
    return beta * (q * response_mask.to(q.dtype)).sum(1)


def prm_loss(prm, ref_logp, input_ids, attention_mask, response_mask, targets: torch.Tensor, beta: float):
    """BCE of sigmoid(beta * sum q) against the outcome (mean over rows)."""
    logits = implicit_logits(prm, ref_logp, input_ids, attention_mask, response_mask, beta)
    return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))


def update_prm(
    prm, optimizer, ref_logp, input_ids, attention_mask, response_mask, targets, beta, minibatches: int, grad_clip
) -> float:
    """One pass over the batch in `minibatches` AdamW steps (grad-clip `grad_clip`); the mean loss."""
    prm.train()
    losses = []
    for rows in torch.arange(input_ids.shape[0]).chunk(minibatches):
        loss = prm_loss(
            prm, ref_logp[rows], input_ids[rows], attention_mask[rows], response_mask[rows], targets[rows], beta
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prm.parameters(), grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    return sum(losses) / len(losses)


@torch.no_grad()
def token_rewards(prm, ref_logp, input_ids, attention_mask, response_mask, beta: float) -> torch.Tensor:
    """r_t = beta * q_t on assistant tokens, 0 elsewhere [N, L] (before the batch norm)."""
    q = sequence_logprobs(prm, input_ids, attention_mask) - ref_logp
    return beta * q * response_mask.to(q.dtype)
