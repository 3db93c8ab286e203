"""Zeroth-order optimisers on one perturbation API (spec sections 2.1-2.3): MeZO, LOZO, LOZO-M and LOZO+.

A direction D is a list of per-parameter pieces, dense (z, a tensor of the parameter's shape) or low-rank
(U, V with D_W = U V^T for a matrix W of shape (m, n): U is m x r, V is n x r, as the LOZO code orients it,
V in the `param.size(1)` space). Every optimiser takes one step on a batch through `loss_fn()`, the loss of the
model as it stands on that step's batch (one forward, counted by the caller's ForwardCounter):

    c = [L(theta + eps D) - L(theta - eps D)] / (2 eps)        # two forwards, same batch, theta restored
    theta <- theta - lr (c D + wd theta)                          # wd on matrices only (LOZO / MeZO code)

theta is restored after each side either from a copy of every parameter (`restore: copy`, bit for bit; the
tiny/smoke scales) or in place (`restore: inplace`, the paper scale): each side is undone by subtracting what it
added, +eps D, -eps D | -eps D, +eps D, D regenerated from its seeds (MeZO) or from the kept factors (LOZO's U V^T,
formed one matrix at a time), so no parameter-sized copy of the model is held (MeZO's inference-level memory).
An undo is exact wherever round(round(w + x) - x) = w, most elements; elsewhere w moves by an ulp of its dtype. The
MeZO and LOZO codes use +eps D, -2 eps D, +eps D (one regeneration fewer), which leaves several times more
elements moved in fp16 (workflows/lozo_plus/README.md, side by side).

All noise comes from `torch.Generator`s seeded from (run seed, step, purpose), never from the global stream, so
two runs with the same seed see the same perturbations whatever else draws random numbers. MeZO regenerates its
z from the step's seed for each of its uses (the seed trick: z is never stored whole). No 1/r factor in
the low-rank estimator (the official LOZO code's form; the config scales LOZO's learning rate instead).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

Piece = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # (parameter, z or U, None or V)
LossFn = Callable[[], float]

STEP, REFRESH, PROBE, CANDIDATE, SELECT = range(5)  # purposes of the seeded generators
METHODS = ("mezo", "lozo", "lozom", "lozoplus", "lozoplus_random")
RESTORE = ("copy", "inplace")


@dataclass(frozen=True)
class Settings:
    """Every knob of the ZO family; a method reads the ones it uses (spec sections 2 and 9)."""

    lr: float
    eps: float = 1e-3
    weight_decay: float = 0.0
    rank: int = 2  # LOZO's r
    nu: int = 50  # lazy interval: V is kept for nu steps
    beta: float = 0.9  # LOZO-M momentum
    candidates: int = 8  # LOZO+ K
    kappa: float = 0.5  # LOZO+ adaptive threshold tau = kappa * max_k |c_k|
    r_max: int = 2  # LOZO+ largest retained rank
    select: bool = True  # False: LOZO+ is LOZO (fresh Gaussian V, no candidate passes)
    selection: str = "greedy"  # greedy (largest |c| first) | random (the negative control: same rank, random members)
    threshold_mode: str = "pool_max"  # pool_max | ema (tau relative to an EMA of past |c| instead)
    candidate_rank: int = 1  # columns per candidate (r_max with one kept is reading (i) of spec section 9)
    shared_probe: bool = True  # one probe u per matrix for all K candidates (common random numbers; README)
    score_vectors: bool = False  # perturb the 1-D parameters while scoring candidates (spec 9: off)
    kappa_lazy: float = 0.0  # early refresh when |c_t| < kappa_lazy * EMA(|c|); 0 = off
    skip_small_steps: bool = False  # reading (iii): skip lazy updates with |c_t| < kappa * EMA(|c|)
    ema: float = 0.9  # the EMA of |c| used by threshold_mode ema, kappa_lazy and skip_small_steps
    restore: str = "copy"  # copy (theta restored bit for bit from a copy) | inplace (each side undone in place)

    def __post_init__(self):
        if self.restore not in RESTORE:
            raise ValueError(f"zo.restore {self.restore!r}: choose one of {RESTORE}")


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (run seed, step, purpose, ...), stable across platforms."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def generator(*keys: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on `device` (the parameters' one: noise is drawn where it is used) seeded from the keys."""
    return torch.Generator(device=device).manual_seed(derive_seed(*keys))


LOW_PRECISION = (torch.float16, torch.bfloat16)


def noise_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype a direction for `p` is drawn and applied in: float32 for half-precision weights (spec 9: eps = 1e-3
    is below fp16's resolution for most weights, so the perturbation is formed in fp32 and rounded once)."""
    return torch.float32 if p.dtype in LOW_PRECISION else p.dtype


def split_parameters(params: Iterable[torch.nn.Parameter]) -> tuple[list, list]:
    """(matrices, vectors): parameters with ndim >= 2 get low-rank perturbations, the rest full Gaussians."""
    params = list(params)
    return [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]


@torch.no_grad()
def add_direction(pieces: Iterable[Piece], scale: float) -> None:
    """theta += scale * D, piece by piece (a low-rank piece as an addmm, never the dense U V^T stored). A
    half-precision parameter takes its fp32 piece computed in fp32 and rounded once (U V^T formed for that one
    matrix only)."""
    for p, a, b in pieces:
        if p.dtype in LOW_PRECISION:
            p.add_(a if b is None else a @ b.T, alpha=scale)
        elif b is None:
            p.add_(a, alpha=scale)
        else:
            p.addmm_(a, b.T, alpha=scale)


class ZeroOrder:
    """The shared two-point machinery; subclasses say what the direction is and how the update uses c."""

    def __init__(self, params: Iterable[torch.nn.Parameter], settings: Settings, seed: int):
        self.params = list(params)
        self.matrices, self.vectors = split_parameters(self.params)
        self.s = settings
        self.seed = int(seed)
        self.t = 0
        self.device = self.params[0].device  # noise is drawn on the first parameter's device (randn)

    def noise(self, *keys: int) -> torch.Generator:
        return generator(self.seed, *keys, device=self.device)

    def randn(self, *shape: int, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # drawn on the first parameter's device from one stream, then moved to `like`'s: a model sharded over several
        # GPUs (device_map) takes the directions an unsharded run takes (a no-op move on one device)
        return torch.randn(*shape, generator=generator, dtype=noise_dtype(like), device=self.device).to(like.device)

    # -- the API every method shares ------------------------------------------------------------------------
    def pieces(self) -> Iterator[Piece]:
        """This step's direction D (regenerated from seeds on every call)."""
        raise NotImplementedError

    def step_cost(self) -> int:
        """Forward passes the next step will spend."""
        return 2

    def subspaces(self) -> dict[torch.Tensor, torch.Tensor]:
        """Matrix -> the n x r basis its perturbation lives in this step (empty for full-space methods)."""
        return {}

    @torch.no_grad()
    def two_point(self, loss_fn: LossFn, pieces: Callable[[], Iterable[Piece]]) -> tuple[float, float, float]:
        """(c, L+, L-) along the direction `pieces()`; theta is restored after each side, bit for bit from a copy
        (`restore: copy`) or in place without one (`restore: inplace`: each side undone by subtracting what it
        added, D regenerated: +eps D, -eps D, -eps D, +eps D)."""
        eps = self.s.eps
        if self.s.restore == "inplace":
            add_direction(pieces(), eps)
            plus = float(loss_fn())
            add_direction(pieces(), -eps)  # undo: theta again up to one rounding (most elements exactly)
            add_direction(pieces(), -eps)
            minus = float(loss_fn())
            add_direction(pieces(), eps)  # undo
            return (plus - minus) / (2 * eps), plus, minus
        backup = [p.detach().clone() for p in self.params]

        def restore():
            for p, b in zip(self.params, backup):
                p.copy_(b)

        add_direction(pieces(), self.s.eps)
        plus = float(loss_fn())
        restore()
        add_direction(pieces(), -self.s.eps)
        minus = float(loss_fn())
        restore()
        return (plus - minus) / (2 * self.s.eps), plus, minus

    @torch.no_grad()
    def decay(self) -> None:
        if self.s.weight_decay:
            for p in self.matrices:
                p.mul_(1 - self.s.lr * self.s.weight_decay)

    def update(self, c: float) -> None:
        """theta <- theta - lr (c D + wd theta)."""
        self.decay()
        add_direction(self.pieces(), -self.s.lr * c)

    def step(self, loss_fn: LossFn, probe: Callable[[ZeroOrder, float], None] | None = None) -> dict[str, float]:
        """One ZO step on the batch `loss_fn` sees; `probe(self, c)` runs after the measurement, before the update
        (the capture-ratio probe reads theta_t and this step's subspace)."""
        logs = self.prepare(loss_fn)
        c, plus, minus = self.two_point(loss_fn, self.pieces)
        if probe is not None:
            probe(self, c)
        self.apply(c)
        self.t += 1
        return {**logs, "c": c, "loss_plus": plus, "loss_minus": minus}

    def prepare(self, loss_fn: LossFn) -> dict[str, float]:
        """Work before the step's measurement (LOZO's refresh of V, LOZO+'s candidate scoring)."""
        return {}

    def apply(self, c: float) -> None:
        self.update(c)

    # -- resume (paperflow.core.loop.LoopCheckpoint): the state between two steps ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the next step reads besides the parameters (tensors and plain values, for torch's weights_only):
        the step counter (every direction's seed) and, in subclasses, LOZO's kept V and its refresh state."""
        return {"t": self.t, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"ZO checkpoint of seed {state['seed']} loaded into a run of seed {self.seed}")
        self.t = int(state["t"])

    def _on_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Saved per-matrix factors (loaded on the CPU) moved to their matrices' devices."""
        return [x.to(p.device) for x, p in zip(tensors, self.matrices, strict=True)]


class MeZO(ZeroOrder):
    """MeZO (spec 2.1): z ~ N(0, I_d) over every parameter, regenerated from the step's seed on each use."""

    def pieces(self) -> Iterator[Piece]:
        g = self.noise(self.t, STEP)
        for p in self.params:
            yield p, self.randn(*p.shape, like=p, generator=g), None


class LOZO(ZeroOrder):
    """LOZO (spec 2.2): matrices get U_t V^T (V kept for nu steps, U fresh), 1-D parameters a full Gaussian."""

    def __init__(self, params, settings: Settings, seed: int):
        super().__init__(params, settings, seed)
        self.V: list[torch.Tensor] = []
        self.last_refresh: int | None = None
        self.force_refresh = False
        self.abs_c_ema: float | None = None
        self._U: list[torch.Tensor] = []
        self._z: list[torch.Tensor] = []

    def refresh_due(self) -> bool:
        return self.last_refresh is None or self.force_refresh or self.t - self.last_refresh >= self.s.nu

    def draw_v(self) -> list[torch.Tensor]:
        """r fresh Gaussian columns per matrix (n x r)."""
        g = self.noise(self.t, REFRESH)
        return [self.randn(p.shape[1], self.s.rank, like=p, generator=g) for p in self.matrices]

    def refresh(self, loss_fn: LossFn) -> dict[str, float]:
        self.V = self.draw_v()
        return {}

    def prepare(self, loss_fn: LossFn) -> dict[str, float]:
        logs = {"refresh": 0.0}
        if self.refresh_due():
            logs = {**self.refresh(loss_fn), "refresh": 1.0}
            self.last_refresh, self.force_refresh = self.t, False
        g = self.noise(self.t, STEP)
        self._U = [self.randn(p.shape[0], v.shape[1], like=p, generator=g) for p, v in zip(self.matrices, self.V)]
        self._z = [self.randn(*p.shape, like=p, generator=g) for p in self.vectors]
        return {**logs, "rank": float(np.mean([v.shape[1] for v in self.V]))}

    def pieces(self) -> Iterator[Piece]:
        yield from zip(self.matrices, self._U, self.V)
        yield from ((p, z, None) for p, z in zip(self.vectors, self._z))

    def subspaces(self) -> dict[torch.Tensor, torch.Tensor]:
        return dict(zip(self.matrices, self.V))

    def state_dict(self) -> dict[str, Any]:
        """The kept V (r columns per matrix), the last refresh's step, a pending early refresh and the EMA of |c|;
        U and the vectors' z are drawn afresh by each step's `prepare`."""
        return {
            **super().state_dict(),
            "V": list(self.V),
            "last_refresh": self.last_refresh,
            "force_refresh": self.force_refresh,
            "abs_c_ema": self.abs_c_ema,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.V = self._on_device(state["V"]) if state["V"] else []
        self.last_refresh = None if state["last_refresh"] is None else int(state["last_refresh"])
        self.force_refresh = bool(state["force_refresh"])
        self.abs_c_ema = None if state["abs_c_ema"] is None else float(state["abs_c_ema"])

    def apply(self, c: float) -> None:
        """The update, after tracking the EMA of |c| (early refresh and skipped small steps read it, spec 9)."""
        before, e = self.abs_c_ema, self.s.ema
        self.abs_c_ema = abs(c) if before is None else e * before + (1 - e) * abs(c)
        if before is not None and abs(c) < self.s.kappa_lazy * before:
            self.force_refresh = True
        if self.s.skip_small_steps and before is not None and abs(c) < self.s.kappa * before:
            return
        self.update(c)


class LOZOM(LOZO):
    """LOZO-M (spec 2.2): N_t = beta N_{t-1} + (1 - beta) c U_t per matrix, W <- W - lr N_t V^T; on a new V the
    momentum is carried over, N <- N V_old^T V_new / n. 1-D parameters take the plain LOZO step."""

    def __init__(self, params, settings: Settings, seed: int):
        super().__init__(params, settings, seed)
        self.N: list[torch.Tensor] | None = None

    def refresh(self, loss_fn: LossFn) -> dict[str, float]:
        old = self.V
        super().refresh(loss_fn)
        if self.N is not None:
            self.N = [n_ @ (vo.T @ vn) / vo.shape[0] for n_, vo, vn in zip(self.N, old, self.V)]
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "N": None if self.N is None else list(self.N)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.N = None if state["N"] is None else self._on_device(state["N"])

    @torch.no_grad()
    def update(self, c: float) -> None:
        b = self.s.beta
        if self.N is None:
            self.N = [torch.zeros_like(u) for u in self._U]
        self.N = [b * n_ + (1 - b) * c * u for n_, u in zip(self.N, self._U)]
        self.decay()
        add_direction(((p, n_, v) for p, n_, v in zip(self.matrices, self.N, self.V)), -self.s.lr)
        add_direction(((p, z, None) for p, z in zip(self.vectors, self._z)), -self.s.lr * c)


@dataclass
class Refresh:
    """What one LOZO+ refresh measured: the candidates' scores, the order, the kept set and the threshold."""

    scores: list[float]
    order: list[int]
    kept: list[int]
    tau: float


class LOZOPlus(LOZO):
    """LOZO+ (reconstructed, spec 2.3): at a refresh, K candidate column sets v_k (per matrix) are scored by the
    two-point estimate along u v_k^T (2K forwards, same theta and batch); the candidates are ordered by |c_k| and
    the greedy prefix with |c_k| >= tau (at most r_max columns, at least one candidate) becomes V_S; theta takes
    the step (1/|S|) sum_{k in S} c_k u v_k^T from the measurements already made. Between refreshes it is LOZO
    inside span(V_S). `select=False` is LOZO exactly; `selection="random"` keeps as many candidates as the greedy
    rule would, chosen at random (the section-11 negative control)."""

    def __init__(self, params, settings: Settings, seed: int):
        super().__init__(params, settings, seed)
        self.last: Refresh | None = None
        self._pending: list = []  # the refresh's kept (u, v_k, c_k / |S|), applied with the step's update

    def step_cost(self) -> int:
        extra = 2 * self.s.candidates if (self.s.select and self.refresh_due()) else 0
        return 2 + extra

    def candidate_pieces(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]]:
        """Per candidate k: (u per matrix, v_k per matrix, z_k per vector)."""
        s, g = self.s, self.noise(self.t, CANDIDATE)
        cr = s.candidate_rank
        shared = None
        if s.shared_probe:
            gp = self.noise(self.t, PROBE)
            shared = [self.randn(p.shape[0], cr, like=p, generator=gp) for p in self.matrices]
        out = []
        for _ in range(s.candidates):
            v = [self.randn(p.shape[1], cr, like=p, generator=g) for p in self.matrices]
            u = (
                shared
                if shared is not None
                else [self.randn(p.shape[0], cr, like=p, generator=g) for p in self.matrices]
            )
            z = [self.randn(*p.shape, like=p, generator=g) for p in self.vectors] if s.score_vectors else []
            out.append((u, v, z))
        return out

    def choose(self, scores: Sequence[float]) -> Refresh:
        """The greedy prefix above the adaptive threshold (or, for the control, as many chosen at random)."""
        s = self.s
        mags = np.abs(np.asarray(scores, float))
        order = [int(i) for i in np.argsort(-mags, kind="stable")]
        ref = mags.max() if s.threshold_mode == "pool_max" or self.abs_c_ema is None else self.abs_c_ema
        tau = s.kappa * float(ref)
        most = max(1, s.r_max // s.candidate_rank)
        kept = [k for k in order if mags[k] >= tau][:most] or order[:1]
        if s.selection == "random":
            rng = np.random.default_rng(derive_seed(self.seed, self.t, SELECT))
            order = [int(i) for i in rng.permutation(len(scores))]
            kept = order[: len(kept)]
        return Refresh([float(x) for x in scores], order, kept, tau)

    def refresh(self, loss_fn: LossFn) -> dict[str, float]:
        if not self.s.select:
            return super().refresh(loss_fn)
        cands = self.candidate_pieces()
        scores = []
        for u, v, z in cands:

            def pieces(u=u, v=v, z=z):
                yield from zip(self.matrices, u, v)
                yield from ((p, zz, None) for p, zz in zip(self.vectors, z))

            scores.append(self.two_point(loss_fn, pieces)[0])
        r = self.choose(scores)
        self.last = r
        self._pending = [(cands[k][0], cands[k][1], r.scores[k] / len(r.kept)) for k in r.kept]
        self.V = [torch.cat([cands[k][1][i] for k in r.kept], 1) for i in range(len(self.matrices))]
        top = max(abs(x) for x in scores)
        return {"kept": float(len(r.kept)), "tau": r.tau, "max_abs_c": top}

    def state_dict(self) -> dict[str, Any]:
        """LOZO's state and the last refresh's measurement (its pending step is taken within the refresh's own step,
        so none is left between steps)."""
        if self._pending:
            raise RuntimeError("LOZO+ state taken inside a step: its refresh's step is still pending")
        last = None if self.last is None else vars(self.last).copy()
        return {**super().state_dict(), "last": last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.last = None if state["last"] is None else Refresh(**state["last"])
        self._pending = []

    def apply(self, c: float) -> None:
        """The refresh's step (1/|S|) sum_{k in S} c_k u v_k^T, taken here with the lazy step's, so that the
        step's measurement and probe both read theta_t, where the candidates were scored."""
        for u, v, ck in self._pending:
            add_direction(zip(self.matrices, u, v), -self.s.lr * ck)
        self._pending = []
        super().apply(c)


def make(method: str, params, settings: Settings, seed: int) -> ZeroOrder:
    """The optimiser of `method` (lozoplus_random: LOZO+ with random selection, the negative control)."""
    if method == "mezo":
        return MeZO(params, settings, seed)
    if method == "lozo":
        return LOZO(params, settings, seed)
    if method == "lozom":
        return LOZOM(params, settings, seed)
    if method == "lozoplus":
        return LOZOPlus(params, settings, seed)
    if method == "lozoplus_random":
        return LOZOPlus(params, replace(settings, selection="random"), seed)
    raise ValueError(f"ZO method {method!r}: choose one of {METHODS}")


def settings_from(cfg: dict[str, Any], method: str) -> Settings:
    """The Settings of `method` from the config's `zo` block (shared keys) and its per-method learning rate."""
    lr = float(cfg["lr"]["lozoplus" if method == "lozoplus_random" else method])
    return Settings(lr=lr, **dict(cfg["zo"]))


def capture_ratio(grads: Sequence[torch.Tensor], bases: Sequence[torch.Tensor]) -> tuple[float, float]:
    """(energy-weighted rho, unweighted mean rho) of gradients G_W against span(V_W) (spec 7, amended in 11):
    rho = sqrt(sum_W ||G_W P_V||^2 / sum_W ||G_W||^2), and the mean over W of ||G_W P_V|| / ||G_W||."""
    num, den, per = 0.0, 0.0, []
    for g, v in zip(grads, bases):
        q, _ = torch.linalg.qr(v.double())
        proj = float((g.double() @ q).pow(2).sum())
        total = float(g.double().pow(2).sum())
        num, den = num + proj, den + total
        if total > 0:
            per.append(math.sqrt(proj / total))
    return (math.sqrt(num / den) if den > 0 else float("nan")), (float(np.mean(per)) if per else float("nan"))
