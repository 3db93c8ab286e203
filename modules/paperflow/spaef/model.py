"""SpaEF's networks in plain torch: a GAT layer (PyG GATConv semantics, self-loops added), the
adjacency graph autoencoder of the spot graph (§2.2.4), the feature autoencoder FeatAE and the
gated spot/gene fusion with ZINB heads (§2.4), and the ZINB log-likelihood."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

DENSE_MAX_NODES = 2048  # above this size never the dense N x N attention path


def use_dense(n_nodes: int, n_edges: int, width: int) -> bool:
    """Which attention path is cheaper (both give the same result): the dense one handles N^2 scores
    per head, the edge one E messages of `width` numbers per head, and on CPU a message costs about
    twice a dense score."""
    return n_nodes <= DENSE_MAX_NODES and 2 * n_nodes ** 2 <= n_edges * width


def with_self_loops(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """(2, E) source->target edges without self-loops, plus one self-loop per node."""
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(n, device=edge_index.device).repeat(2, 1)
    return torch.cat([edge_index[:, keep], loops], dim=1)


class GATConv(nn.Module):
    """Graph attention (Velickovic et al. 2018) as in PyG: messages flow source -> target,
    softmax over each target's in-edges, heads concatenated or averaged. Expects self-loops in
    `edge_index` (see with_self_loops)."""

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, concat: bool = True, dropout: float = 0.0):
        super().__init__()
        self.heads, self.out_dim, self.concat, self.dropout = heads, out_dim, concat, dropout
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        n, in_dim = x.shape
        weight = self.lin.weight.view(self.heads, self.out_dim, in_dim)  # W_h
        # scores a_h . W_h x_j = (W_h^T a_h) . x_j, (N, H)
        a_src = x @ torch.einsum("hdi,hd->ih", weight, self.att_src[0])
        a_dst = x @ torch.einsum("hdi,hd->ih", weight, self.att_dst[0])
        # sum_j alpha_ij W_h x_j = W_h sum_j alpha_ij x_j: attend over whichever is narrower, x_j or W_h x_j
        project_first = self.out_dim <= in_dim
        values = self.lin(x).view(n, self.heads, self.out_dim) if project_first else x[:, None, :].expand(n, self.heads, in_dim)
        attend = self._dense if use_dense(n, edge_index.shape[1], values.shape[-1]) else self._edges
        out = attend(values, a_src, a_dst, edge_index)
        if not project_first:
            out = torch.einsum("nhi,hdi->nhd", out, weight)
        out = out.reshape(n, -1) if self.concat else out.mean(1)
        return out + self.bias

    def _edges(self, h, a_src, a_dst, edge_index):
        """Edge-list attention: gather per edge, softmax per target, scatter-add (any graph size)."""
        n = h.shape[0]
        src, dst = edge_index
        score = F.leaky_relu(a_src[src] + a_dst[dst], 0.2)  # (E, H)
        peak = torch.full((n, self.heads), -torch.inf, device=h.device, dtype=h.dtype)
        peak = peak.scatter_reduce(0, dst[:, None].expand_as(score), score, reduce="amax", include_self=True)
        alpha = torch.exp(score - peak[dst])
        alpha = alpha / torch.zeros_like(peak).index_add_(0, dst, alpha)[dst]
        alpha = F.dropout(alpha, self.dropout, self.training)
        return torch.zeros_like(h).index_add_(0, dst, h[src] * alpha[..., None])

    def _dense(self, h, a_src, a_dst, edge_index):
        """The same attention as a masked (H, N, N) softmax and one batched matmul (fast for small graphs)."""
        n = h.shape[0]
        mask = torch.zeros(n, n, dtype=torch.bool, device=h.device)
        mask[edge_index[1], edge_index[0]] = True  # row = target, column = source
        score = F.leaky_relu(a_dst.T[:, :, None] + a_src.T[:, None, :], 0.2).masked_fill(~mask, -torch.inf)
        alpha = F.dropout(torch.softmax(score, dim=-1), self.dropout, self.training)
        return torch.bmm(alpha, h.transpose(0, 1)).transpose(0, 1)


class AdjacencyAE(nn.Module):
    """§2.2.4: GAT(d -> heads x hidden, concat) -> ELU -> dropout -> GAT(-> latent, 1 head) -> ELU -> dropout = Z;
    logits Z Z^T. `double_sigmoid` reproduces the released code, which applies a sigmoid before
    BCE-with-logits."""

    def __init__(self, in_dim: int, hidden: int, heads: int, latent: int, dropout: float, double_sigmoid: bool = False):
        super().__init__()
        self.gat1 = GATConv(in_dim, hidden, heads, concat=True)
        self.gat2 = GATConv(hidden * heads, latent, 1, concat=True)
        self.dropout, self.double_sigmoid = dropout, double_sigmoid

    def encode(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.dropout(F.elu(self.gat1(x, edge_index)), self.dropout, self.training)
        return F.dropout(F.elu(self.gat2(h, edge_index)), self.dropout, self.training)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encode(x, edge_index)
        logits = z @ z.T
        return (torch.sigmoid(logits) if self.double_sigmoid else logits), z


class FeatAE(nn.Module):
    """§2.4 feature autoencoder: GAT(in -> h1, concat) -> Linear(h1*heads -> h1) -> GAT(h1 -> h2, concat)
    -> Linear(h2*heads -> latent) | Linear(latent -> h2*heads) -> GAT(-> h1, concat) -> Linear(h1*heads -> h1)
    -> GAT(h1 -> in, heads averaged) -> ReLU; ELU and dropout between layers."""

    def __init__(self, in_dim: int, hidden: Sequence[int], latent: int, heads: int, dropout: float):
        super().__init__()
        h1, h2 = hidden
        self.enc = nn.ModuleList([GATConv(in_dim, h1, heads), nn.Linear(h1 * heads, h1), GATConv(h1, h2, heads), nn.Linear(h2 * heads, latent)])
        self.dec = nn.ModuleList([nn.Linear(latent, h2 * heads), GATConv(h2 * heads, h1, heads), nn.Linear(h1 * heads, h1),
                                  GATConv(h1, in_dim, heads, concat=False)])
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        layers = [*self.enc, *self.dec]
        for i, layer in enumerate(layers):
            x = layer(x, edge_index) if isinstance(layer, GATConv) else layer(x)
            if i < len(layers) - 1:
                x = F.dropout(F.elu(x), self.dropout, self.training)
        return F.relu(x)


def zinb_loglik(x: torch.Tensor, mu: torch.Tensor, theta: torch.Tensor, pi: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Element-wise ZINB log-likelihood (§2.4): log(pi + (1-pi) NB(0)) at x < 1e-8, else log(1-pi) + log NB(x);
    NaN -> 0 as in the released code."""
    log_theta_mu = torch.log(theta + mu + eps)
    nb_zero = theta * (torch.log(theta + eps) - log_theta_mu)
    log_nb = (torch.lgamma(x + theta) - torch.lgamma(x + 1.0) - torch.lgamma(theta)
              + nb_zero + x * (torch.log(mu + eps) - log_theta_mu))
    zero = torch.log(pi + (1.0 - pi) * torch.exp(nb_zero) + eps)
    nonzero = torch.log(1.0 - pi + eps) + log_nb
    return torch.nan_to_num(torch.where(x < 1e-8, zero, nonzero), nan=0.0)


def zinb_loss(x: torch.Tensor, mu: torch.Tensor, theta: torch.Tensor, pi: torch.Tensor, mu_penalty: float) -> torch.Tensor:
    return -zinb_loglik(x, mu, theta, pi).mean() + mu_penalty * (mu ** 2).mean()


FUSIONS = ("learned", "entry", "spot", "gene", "half")


class SpaEF(nn.Module):
    """Spot branch FeatAE on (X, E_spot), gene branch FeatAE on (X^T, E_gene); gate
    w = sigmoid(W_f (R_s + R_g) + b_f), one weight per spot ('learned', the released code) or per
    entry ('entry'); fixed gates 'spot' (w = 1), 'gene' (w = 0), 'half' (w = 0.5). ZINB heads on F."""

    def __init__(self, n_spots: int, n_genes: int, hidden: Sequence[int], latent: int, heads: int, dropout: float, fusion: str = "learned"):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion {fusion!r} not in {FUSIONS}")
        self.fusion = fusion
        self.spot_ae = FeatAE(n_genes, hidden, latent, heads, dropout) if fusion != "gene" else None
        self.gene_ae = FeatAE(n_spots, hidden, latent, heads, dropout) if fusion != "spot" else None
        self.gate = nn.Linear(n_genes, n_genes if fusion == "entry" else 1) if fusion in ("learned", "entry") else None
        self.heads = nn.ModuleDict({k: nn.Linear(n_genes, n_genes) for k in ("mu", "theta", "pi")})
        for head in self.heads.values():
            nn.init.xavier_uniform_(head.weight)
            nn.init.zeros_(head.bias)

    def weight(self, r_s: torch.Tensor | None, r_g: torch.Tensor | None, force: float | None = None) -> torch.Tensor | float:
        if force is not None:
            return force
        if self.fusion == "spot":
            return 1.0
        if self.fusion == "gene":
            return 0.0
        if self.fusion == "half":
            return 0.5
        return torch.sigmoid(self.gate(r_s + r_g))

    def forward(self, x: torch.Tensor, spot_edges: torch.Tensor, gene_edges: torch.Tensor, force_w: float | None = None) -> dict[str, torch.Tensor]:
        r_s = self.spot_ae(x, spot_edges) if self.spot_ae is not None else None
        r_g = self.gene_ae(x.T, gene_edges).T if self.gene_ae is not None else None
        w = self.weight(r_s, r_g, force_w)
        if r_g is None:
            fused = r_s
        elif r_s is None:
            fused = r_g
        else:
            fused = w * r_s + (1.0 - w) * r_g
        return {
            "mu": torch.clamp(F.softplus(self.heads["mu"](fused)), 1e-3, 1e3),
            "theta": torch.clamp(F.softplus(self.heads["theta"](fused)), 1e-4, 1e3),
            "pi": torch.clamp(torch.sigmoid(self.heads["pi"](fused)), 1e-3, 1 - 1e-3),
            "w": w if isinstance(w, torch.Tensor) else torch.full((x.shape[0], 1), float(w)),
        }
