"""The loss identities of spec sections 7 (ii) and 10.1-10.2, on one batch of real torchgfn trajectories:
L_ST(lam = 0) summed over the batch equals torchgfn's DB loss (sum reduction), and n * L_ST with the
DC-only weighting equals torchgfn's TB loss with the same log Z, P_F and P_B. The same two gaps with the method's
own low-pass filter (Tikhonov, lam = FILTERED_LAM) in place of lam = 0 and of the DC-only weighting are the
claims' control: they are not identities, so a check that finds them below tolerance too is blind to the filter."""

from __future__ import annotations

import torch
from gfn.gflownet import DBGFlowNet, TBGFlowNet
from gfn.samplers import Sampler

from paperflow.st_gfn.models import make_estimators, transition_log_rewards
from paperflow.st_gfn.residuals import residuals
from paperflow.st_gfn.spectral import dc_only, spectral_loss_per_trajectory, tikhonov

FILTERED_LAM = 2.0  # the spec's lam of st_gfn (section 7), the filter of the identities' control


def identity_gaps(env, hidden: int, layers: int, batch: int, seed: int, time_features: int = 0) -> dict[str, float]:
    """Absolute gaps |sum L_ST(0) - DB_sum| and |mean n L_ST(dc) - TB| in float64 on one sampled batch, and the
    same gaps with the Tikhonov filter at FILTERED_LAM in place of lam = 0 and of DC-only (`filtered_*`)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(seed)
        pf, pb, log_f = make_estimators(env, hidden, layers, time_features, dtype=torch.float64)
        pf, pb, log_f = pf.double(), pb.double(), log_f.double()
        with torch.no_grad():
            trajectories = Sampler(estimator=pf).sample_trajectories(env, n=batch, epsilon=0.1)
        log_r = trajectories.log_rewards.double() + torch.randn(batch, dtype=torch.float64)
        lengths = trajectories.terminating_idx
        db = DBGFlowNet(pf=pf, pb=pb, logF=log_f)
        db_sum = db.loss(
            env, trajectories.to_transitions(), reduction="sum", log_rewards=transition_log_rewards(trajectories, log_r)
        )
        delta_db = residuals(pf, pb, log_f, trajectories, log_r)
        st0 = spectral_loss_per_trajectory(delta_db, lengths, tikhonov(0.0)).sum()
        tb = TBGFlowNet(pf=pf, pb=pb, init_logZ=0.37)
        tb_loss = tb.loss(env, trajectories, log_rewards=log_r)
        delta_tb = residuals(pf, pb, log_f, trajectories, log_r, log_z=tb.logZ)
        dc = (lengths.double() * spectral_loss_per_trajectory(delta_tb, lengths, dc_only())).mean()
        filtered = tikhonov(FILTERED_LAM)
        st_f = spectral_loss_per_trajectory(delta_db, lengths, filtered).sum()
        tb_f = (lengths.double() * spectral_loss_per_trajectory(delta_tb, lengths, filtered)).mean()
        gaps = {
            "lam0_db_gap": st0 - db_sum,
            "dc_tb_gap": dc - tb_loss,
            "filtered_db_gap": st_f - db_sum,
            "filtered_tb_gap": tb_f - tb_loss,
            "db_sum": db_sum,
            "tb_loss": tb_loss,
        }
        return {k: abs(float(v.detach())) if k.endswith("gap") else float(v.detach()) for k, v in gaps.items()}
    finally:
        torch.set_default_dtype(previous)
