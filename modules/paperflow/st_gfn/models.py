"""Estimators (torchgfn's), the baselines (torchgfn's TB, DB, SubTB) and the spectral GFlowNet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from gfn.containers import Trajectories
from gfn.estimators import DiscretePolicyEstimator, ScalarEstimator
from gfn.gflownet import DBGFlowNet, SubTBGFlowNet, TBGFlowNet
from gfn.gym import HyperGrid
from gfn.utils.modules import MLP
from torch import nn

from paperflow.st_gfn.envs import make_preprocessor
from paperflow.st_gfn.residuals import residuals
from paperflow.st_gfn.settings import known_method
from paperflow.st_gfn.spectral import make_filter, reduce_trajectories, spectral_loss_per_trajectory


def make_estimators(env: HyperGrid, hidden: int, layers: int, time_features: int, dtype: torch.dtype | None = None):
    """P_F and P_B share an MLP trunk (spec 2.4); log F is a separate MLP. `dtype`: the preprocessor's
    output dtype (float64 for the identity checks)."""
    pre = make_preprocessor(env, time_features)
    pre.target_dtype = dtype
    module_pf = MLP(input_dim=pre.output_dim, output_dim=env.n_actions, hidden_dim=hidden, n_hidden_layers=layers)
    module_pb = MLP(
        input_dim=pre.output_dim,
        output_dim=env.n_actions - 1,
        hidden_dim=hidden,
        n_hidden_layers=layers,
        trunk=module_pf.trunk,
    )
    module_f = MLP(input_dim=pre.output_dim, output_dim=1, hidden_dim=hidden, n_hidden_layers=layers)
    pf = DiscretePolicyEstimator(module_pf, env.n_actions, is_backward=False, preprocessor=pre)
    pb = DiscretePolicyEstimator(module_pb, env.n_actions, is_backward=True, preprocessor=pre)
    log_f = ScalarEstimator(module_f, preprocessor=pre)
    return pf, pb, log_f


class SpectralGFlowNet(nn.Module):
    """ST-GFN [R]: the spectral loss of the per-step residuals (spec 2.2), optional edge intrinsic rewards."""

    def __init__(
        self,
        pf,
        pb,
        log_f,
        filter_kind: str,
        lam: float,
        omega_c: float,
        order: int,
        s0_flow: str,
        pad_to_max: bool,
        length_weighting: bool,
    ) -> None:
        super().__init__()
        self.pf, self.pb, self.logF = pf, pb, log_f
        self.logZ = nn.Parameter(torch.tensor(0.0)) if s0_flow == "logz" else None
        self.weight = make_filter(filter_kind, lam=lam, omega_c=omega_c, order=order)
        self.pad_to_max, self.length_weighting = pad_to_max, length_weighting

    def loss(
        self, env, trajectories: Trajectories, log_rewards: torch.Tensor, intrinsic: torch.Tensor | None = None
    ) -> torch.Tensor:
        delta = residuals(self.pf, self.pb, self.logF, trajectories, log_rewards, self.logZ, intrinsic)
        lengths = trajectories.terminating_idx
        per_traj = spectral_loss_per_trajectory(delta, lengths, self.weight, self.pad_to_max)
        return reduce_trajectories(per_traj, lengths, self.length_weighting)


def time_features_of(method: Mapping[str, Any]) -> int:
    """K Fourier frequencies of the step index an st_gfn method sets (0: none); the baselines take none."""
    return int(method["time_features"]) if method["kind"] == "st_gfn" else 0


def make_gflownet(env: HyperGrid, method: Mapping[str, Any], model: Mapping[str, Any]) -> nn.Module:
    known_method(method)
    kind = method["kind"]
    time_features = time_features_of(method)
    pf, pb, log_f = make_estimators(env, model["hidden"], model["layers"], time_features)
    if kind == "tb":
        return TBGFlowNet(pf=pf, pb=pb, init_logZ=0.0)
    if kind == "db":
        return DBGFlowNet(pf=pf, pb=pb, logF=log_f)
    if kind == "subtb":
        return SubTBGFlowNet(pf=pf, pb=pb, logF=log_f, weighting="geometric_within", lamda=float(method["lamda"]))
    if kind == "st_gfn":
        return SpectralGFlowNet(
            pf,
            pb,
            log_f,
            method["filter"],
            float(method["lam"]),
            float(method["omega_c"]),
            int(method["order"]),
            method["s0_flow"],
            bool(method["pad_to_max"]),
            bool(method["length_weighting"]),
        )
    raise ValueError(f"unknown method kind {kind!r}")


def optimizer(gflownet: nn.Module, lr: float, lr_logz: float) -> torch.optim.Optimizer:
    """Adam, with its own learning rate for log Z (spec 2.4). The log Z group comes first, as log Z does in
    `named_parameters()` (a module's own parameters precede its children's), so clipping over the optimizer's
    parameters (Lightning) sums the gradient norms in the order `clip_grad_norm_(gflownet.parameters())` does."""
    logz = [p for n, p in gflownet.named_parameters() if n == "logZ"]
    rest = [p for n, p in gflownet.named_parameters() if n != "logZ"]
    return torch.optim.Adam(([{"params": logz, "lr": lr_logz}] if logz else []) + [{"params": rest, "lr": lr}])


def batch_loss(
    gflownet: nn.Module, env, trajectories: Trajectories, log_rewards: torch.Tensor, intrinsic: torch.Tensor | None
) -> torch.Tensor:
    """The method's loss on one batch; torchgfn baselines get the (noisy) observed log rewards."""
    if isinstance(gflownet, SpectralGFlowNet):
        return gflownet.loss(env, trajectories, log_rewards, intrinsic)
    if isinstance(gflownet, DBGFlowNet):
        transitions = trajectories.to_transitions()
        per_transition = transition_log_rewards(trajectories, log_rewards)
        if per_transition.shape[0] != transitions.n_transitions:
            raise RuntimeError("transition layout of this torchgfn version differs from (time, batch) masking")
        return gflownet.loss(env, transitions, log_rewards=per_transition)
    return gflownet.loss(env, trajectories, log_rewards=log_rewards)


def transition_log_rewards(trajectories: Trajectories, log_rewards: torch.Tensor) -> torch.Tensor:
    """Per-transition log rewards in `Trajectories.to_transitions()` order, with each trajectory's
    observed log reward on its terminating transition (others are unused by DB)."""
    mask = ~trajectories.actions.is_dummy
    return log_rewards[None, :].expand(mask.shape[0], -1)[mask]
