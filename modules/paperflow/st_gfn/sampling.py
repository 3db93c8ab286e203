"""Forward sampling of torchgfn HyperGrid trajectories with one tensor loop per batch.

torchgfn's `Sampler.sample_trajectories` spends most of a small run in per-step Python overhead
(States/Actions containers, `Categorical` construction, the environment's masked step), about 70% of a
smoke training job. `HyperGridSampler` does the same draws with plain tensors: what depends on the state
alone (encoding, mask, uniform log-probability) is tabulated once, and each step computes the same
epsilon-uniform mixture in log space as torchgfn's `DiscretePolicyEstimator`, makes the same
`torch.multinomial` call (one draw per active row, in row order) and HyperGrid's step. P_F's module runs
on the active rows of each step, as in torchgfn, or, when the grid has fewer states than a batch's
steps could visit, once per batch on every state (`tabulate`). With the same torch seed and policy it
returns the same `gfn.containers.Trajectories` as torchgfn's sampler: tests/papers/test_st_gfn_sampling.py
checks states, actions, lengths, masks and rewards for equality. In the tabulated mode that equality
rests on the module's rows being the same whichever batch they are computed in; a last-bit difference
(matrix kernels can differ between batch sizes) would change a draw only if its uniform number fell
within that difference of a category boundary.
"""

from __future__ import annotations

import torch
from gfn.containers import Trajectories
from gfn.estimators import DiscretePolicyEstimator
from gfn.gym import HyperGrid
from gfn.samplers import Sampler


class HyperGridSampler:
    """Epsilon-greedy forward sampler for a HyperGrid built with `store_all_states=True`.

    The loop carries each trajectory's current state as its index in torchgfn's canonical order (-1 once
    it has exited to the sink); what depends on the state alone (its encoding, forward mask, uniform
    log-probability, coordinates) is tabulated once per sampler."""

    def __init__(self, env: HyperGrid, pf: DiscretePolicyEstimator) -> None:
        if not isinstance(env, HyperGrid):
            raise TypeError(f"HyperGridSampler needs a torchgfn HyperGrid, got {type(env).__name__}")
        if pf.is_backward:
            raise ValueError("HyperGridSampler samples forward trajectories; got a backward estimator")
        if env.all_states is None:
            raise ValueError("HyperGridSampler needs the env's enumerated states (HyperGrid(store_all_states=True))")
        self.env, self.pf = env, pf
        states = env.all_states
        order = torch.argsort(env.get_states_indices(states))
        states = states[order]
        self.coords = states.tensor  # (n_states, ndim), row = state index
        self.encoding = pf.preprocessor(states)  # what pf.forward feeds its module
        masks = states.forward_masks  # increments inside the grid, exit
        self.invalid = ~masks
        count = masks.sum(dim=-1, keepdim=True).to(torch.get_default_dtype())
        self.log_uniform = -torch.log(count)  # torchgfn's _uniform_log_probs
        self.exit_action = int(env.exit_action.item())
        base = env.height ** torch.arange(env.ndim - 1, -1, -1, device=self.coords.device)
        self.index_step = torch.cat([base, base.new_zeros(1)])  # index increment of each action

    def tabulate(self, n: int) -> bool:
        """Evaluate the policy once on every state of the grid when that is fewer module rows than the
        per-step evaluations of n trajectories could need (n x the longest trajectory)."""
        return self.env.n_states <= n * (self.env.ndim * (self.env.height - 1) + 1)

    def action_probabilities(self, index: torch.Tensor, epsilon: float) -> torch.Tensor:
        """P_F mixed with the uniform policy over valid actions, (k, n_actions), at k (non-sink) state
        indices: the operations of torchgfn's `_compute_logits_for_distribution` and `Categorical(logits=)`."""
        return self._probabilities(index, *self._mixture_weights(epsilon))

    def _mixture_weights(self, epsilon: float) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        """(log(1 - eps), log eps) in the policy's dtype, as torchgfn computes them; (None, None) at eps = 0."""
        if epsilon == 0:
            return None, None
        dtype = next(self.pf.module.parameters()).dtype  # the dtype of the module's logits
        eps = torch.as_tensor(epsilon, dtype=dtype, device=self.encoding.device)
        return torch.log1p(-eps), torch.log(eps)

    def _probabilities(self, index: torch.Tensor, log_keep: torch.Tensor | None, log_eps: torch.Tensor | None):
        logits = self.pf.module(self.encoding[index])
        invalid = self.invalid[index]
        log_p = torch.log_softmax(logits.masked_fill(invalid, -float("inf")), dim=-1)
        if log_keep is not None:
            mixed = torch.logaddexp(log_p + log_keep, self.log_uniform[index].to(log_p.dtype) + log_eps)
            log_p = mixed.masked_fill(invalid, -float("inf"))
        return torch.softmax(log_p - log_p.logsumexp(dim=-1, keepdim=True), dim=-1)

    @torch.no_grad()
    def sample_trajectories(self, env: HyperGrid, n: int, epsilon: float = 0.0) -> Trajectories:
        """n complete trajectories from s_0 (the signature of torchgfn's `Sampler.sample_trajectories`)."""
        if env is not self.env:
            raise ValueError("sample_trajectories was given another env than the sampler was built for")
        device = self.encoding.device
        dummy = int(env.dummy_action.item())
        index = torch.full((n,), int(env.get_states_indices(env.s0[None])[0]), dtype=torch.long, device=device)
        indices, actions = [index], []
        active = torch.arange(n, device=device)
        weights = self._mixture_weights(epsilon)
        table = (
            self._probabilities(torch.arange(self.env.n_states, device=device), *weights) if self.tabulate(n) else None
        )
        while active.numel() > 0:
            current = index[active]
            probs = table[current] if table is not None else self._probabilities(current, *weights)
            chosen = torch.multinomial(probs, 1, True).squeeze(-1)
            action = torch.full((n,), dummy, dtype=torch.long, device=device)
            action[active] = chosen
            index = index.clone()
            index[active] = torch.where(chosen == self.exit_action, -1, current + self.index_step[chosen])
            indices.append(index)
            actions.append(action)
            active = (index >= 0).nonzero().squeeze(-1)
        visited = torch.stack(indices)  # (T + 1, n), -1 at the sink
        states = torch.where(visited[..., None] >= 0, self.coords[visited.clamp_min(0)], env.sf)
        return Trajectories(
            env=env,
            states=env.States(states),
            actions=env.Actions(torch.stack(actions)[..., None]),
            terminating_idx=(visited >= 0).sum(0),
            is_backward=False,
        )


def make_sampler(env, pf: DiscretePolicyEstimator):
    """The tensor-loop sampler on a HyperGrid, torchgfn's `Sampler` on every other environment."""
    if isinstance(env, HyperGrid):
        return HyperGridSampler(env, pf)
    return Sampler(estimator=pf)
