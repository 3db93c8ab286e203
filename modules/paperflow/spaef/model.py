"""SpaEF's networks in plain torch: a GAT layer (PyG GATConv semantics, self-loops added), the
adjacency graph autoencoder of the spot graph (§2.2.4), the feature autoencoder FeatAE and the
gated spot/gene fusion with ZINB heads (§2.4), and the ZINB log-likelihood."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

# CSR products are what this module uses them for (fixed graphs, checked once in Adjacency), not a beta experiment
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)

DENSE_MAX_NODES = 2048  # above this size never the dense N x N attention path


def use_dense(n_nodes: int, n_edges: int, width: int) -> bool:
    """Which attention path is cheaper (both give the same result): the dense one handles N^2 scores
    per head, the sparse one E messages of `width` numbers per head through CSR products; on CPU the
    sparse path wins unless the graph is nearly complete (measured in workflows/spaef/README.md, Runtime)."""
    return n_nodes <= DENSE_MAX_NODES and 4 * n_nodes**2 <= n_edges * width


def with_self_loops(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """(2, E) source->target edges without self-loops, plus one self-loop per node."""
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(n, device=edge_index.device).repeat(2, 1)
    return torch.cat([edge_index[:, keep], loops], dim=1)


class Adjacency(nn.Module):
    """A fixed graph in the layouts the attention paths need, built once per graph: the edges in CSR order
    (sorted by target, then source) with their row pointers, and the permutation that puts them in the
    transpose's CSR order (sorted by source); `mask()` gives the dense target x source mask. Buffers, so
    the graph moves with the model (`.to(device)`)."""

    def __init__(self, edge_index: torch.Tensor, n: int):
        super().__init__()
        edge_index = torch.as_tensor(edge_index, dtype=torch.int64)
        src, dst = edge_index
        order = torch.argsort(dst * n + src)
        src, dst = src[order], dst[order]
        t_perm = torch.argsort(src * n + dst)
        self.n, self.n_edges = n, int(src.numel())
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        self.register_buffer("crow", _row_pointers(dst, n))
        self.register_buffer("t_perm", t_perm)
        self.register_buffer("t_crow", _row_pointers(src[t_perm], n))
        self.register_buffer("t_col", dst[t_perm])

    def mask(self) -> torch.Tensor:
        mask = torch.zeros(self.n, self.n, dtype=torch.bool, device=self.src.device)
        mask[self.dst, self.src] = True  # row = target, column = source
        return mask


def _row_pointers(rows: torch.Tensor, n: int) -> torch.Tensor:
    crow = torch.zeros(n + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    return crow


def as_adjacency(graph: Adjacency | torch.Tensor, n: int) -> Adjacency:
    return graph if isinstance(graph, Adjacency) else Adjacency(graph, n)


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    n = crow.numel() - 1
    return torch.sparse_csr_tensor(crow, col, values.contiguous(), (n, n), check_invariants=False)


class _Aggregate(torch.autograd.Function):
    """out[i, h] = sum_j alpha[(i <- j), h] v[j, h] as one CSR sparse x dense product per head; backward:
    dv = A^T dout (the transpose's CSR) and dalpha = dout v^T sampled at the edges (SDDMM). The same sums
    as gather + scatter-add over the edge list, without materialising the (E, H, D) messages."""

    @staticmethod
    def forward(
        ctx, alpha: torch.Tensor, v: torch.Tensor, adj: Adjacency
    ) -> torch.Tensor:  # alpha (E, H) CSR order, v (N, H, D)
        ctx.adj = adj
        ctx.save_for_backward(alpha, v)
        return torch.stack([_csr(adj.crow, adj.src, alpha[:, k]) @ v[:, k].contiguous() for k in range(v.shape[1])], 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        alpha, v = ctx.saved_tensors
        adj, heads = ctx.adj, v.shape[1]
        d_alpha = d_v = None
        if ctx.needs_input_grad[1]:
            d_v = torch.stack(
                [_csr(adj.t_crow, adj.t_col, alpha[adj.t_perm, k]) @ grad[:, k].contiguous() for k in range(heads)], 1
            )
        if ctx.needs_input_grad[0]:
            pattern = _csr(adj.crow, adj.src, torch.zeros(adj.n_edges, dtype=v.dtype, device=v.device))
            d_alpha = torch.stack(
                [
                    torch.sparse.sampled_addmm(
                        pattern, grad[:, k].contiguous(), v[:, k].T.contiguous(), beta=0.0
                    ).values()
                    for k in range(heads)
                ],
                1,
            )
        return d_alpha, d_v, None


class GATConv(nn.Module):
    """Graph attention (Velickovic et al. 2018) as in PyG: messages flow source -> target,
    softmax over each target's in-edges, heads concatenated or averaged. Expects self-loops in the
    graph (see with_self_loops); the graph is an `Adjacency` or a (2, E) edge_index."""

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, concat: bool = True, dropout: float = 0.0):
        super().__init__()
        self.heads, self.out_dim, self.concat, self.dropout = heads, out_dim, concat, dropout
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        bound = (6.0 / (heads + out_dim)) ** 0.5  # PyG's glorot on the (1, heads, out_dim) attention vectors
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)

    def forward(self, x: torch.Tensor, graph: Adjacency | torch.Tensor) -> torch.Tensor:
        n, in_dim = x.shape
        adj = as_adjacency(graph, n)
        weight = self.lin.weight.view(self.heads, self.out_dim, in_dim)  # W_h
        # scores a_h . W_h x_j = (W_h^T a_h) . x_j, (N, H)
        a_src = x @ torch.einsum("hdi,hd->ih", weight, self.att_src[0])
        a_dst = x @ torch.einsum("hdi,hd->ih", weight, self.att_dst[0])
        # sum_j alpha_ij W_h x_j = W_h sum_j alpha_ij x_j: attend over whichever is narrower, x_j or W_h x_j
        project_first = self.out_dim <= in_dim
        values = (
            self.lin(x).view(n, self.heads, self.out_dim)
            if project_first
            else x[:, None, :].expand(n, self.heads, in_dim)
        )
        attend = self._dense if use_dense(n, adj.n_edges, values.shape[-1]) else self._sparse
        out = attend(values, a_src, a_dst, adj)
        if not project_first:
            out = torch.einsum("nhi,hdi->nhd", out, weight)
        out = out.reshape(n, -1) if self.concat else out.mean(1)
        return out + self.bias

    def _attention(self, a_src, a_dst, src, dst, n):
        """Per-edge attention weights (E, H): leaky-ReLU scores, softmax over each target's in-edges."""
        score = F.leaky_relu(a_src[src] + a_dst[dst], 0.2)  # (E, H)
        peak = torch.full((n, self.heads), -torch.inf, device=score.device, dtype=score.dtype)
        peak = peak.scatter_reduce(0, dst[:, None].expand_as(score), score, reduce="amax", include_self=True)
        alpha = torch.exp(score - peak[dst])
        alpha = alpha / torch.zeros_like(peak).index_add_(0, dst, alpha)[dst]
        return F.dropout(alpha, self.dropout, self.training)

    def _sparse(self, h, a_src, a_dst, adj: Adjacency):
        """Sparse attention: weights per edge, then one CSR product per head (any graph size)."""
        alpha = self._attention(a_src, a_dst, adj.src, adj.dst, adj.n)
        return _Aggregate.apply(alpha, h, adj)

    def _edges(self, h, a_src, a_dst, edge_index):
        """Edge-list attention as PyG computes it: gather per edge, softmax per target, scatter-add. The
        reference the other two paths are tested against."""
        src, dst = edge_index
        alpha = self._attention(a_src, a_dst, src, dst, h.shape[0])
        return torch.zeros_like(h).index_add_(0, dst, h[src] * alpha[..., None])

    def _dense(self, h, a_src, a_dst, adj: Adjacency | torch.Tensor):
        """The same attention as a masked (H, N, N) softmax and one batched matmul (fast for dense graphs)."""
        n = h.shape[0]
        mask = as_adjacency(adj, n).mask()
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

    def encode(self, x: torch.Tensor, edge_index: Adjacency | torch.Tensor) -> torch.Tensor:
        edge_index = as_adjacency(edge_index, x.shape[0])
        h = F.dropout(F.elu(self.gat1(x, edge_index)), self.dropout, self.training)
        return F.dropout(F.elu(self.gat2(h, edge_index)), self.dropout, self.training)

    def forward(self, x: torch.Tensor, edge_index: Adjacency | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encode(x, edge_index)
        logits = z @ z.T
        return (torch.sigmoid(logits) if self.double_sigmoid else logits), z


class FeatAE(nn.Module):
    """§2.4 feature autoencoder: GAT(in -> h1, concat) -> Linear(h1*heads -> h1) -> GAT(h1 -> h2, concat)
    -> Linear(h2*heads -> latent) | Linear(latent -> h2*heads) -> GAT(-> h1, concat) -> Linear(h1*heads -> h1)
    -> GAT(h1 -> in, heads averaged) -> ReLU; ELU and dropout between layers, except on the latent,
    which the released code leaves linear (no ELU, no dropout). The linear layers start as the released
    code starts them: Xavier-normal weights, zero biases (torch's default init makes the eight-layer
    stack's output nearly constant across spots at the start, see workflows/spaef/README.md, issue 31)."""

    def __init__(self, in_dim: int, hidden: Sequence[int], latent: int, heads: int, dropout: float):
        super().__init__()
        h1, h2 = hidden
        self.enc = nn.ModuleList(
            [
                GATConv(in_dim, h1, heads),
                nn.Linear(h1 * heads, h1),
                GATConv(h1, h2, heads),
                nn.Linear(h2 * heads, latent),
            ]
        )
        self.dec = nn.ModuleList(
            [
                nn.Linear(latent, h2 * heads),
                GATConv(h2 * heads, h1, heads),
                nn.Linear(h1 * heads, h1),
                GATConv(h1, in_dim, heads, concat=False),
            ]
        )
        self.dropout = dropout
        for layer in (*self.enc, *self.dec):
            if isinstance(layer, nn.Linear):
                nn.init.xavier_normal_(layer.weight)
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, edge_index: Adjacency | torch.Tensor) -> torch.Tensor:
        edge_index = as_adjacency(edge_index, x.shape[0])
        layers = [*self.enc, *self.dec]
        latent = len(self.enc) - 1
        for i, layer in enumerate(layers):
            x = layer(x, edge_index) if isinstance(layer, GATConv) else layer(x)
            if i < len(layers) - 1 and i != latent:
                x = F.dropout(F.elu(x), self.dropout, self.training)
        return F.relu(x)


def zinb_loglik(
    x: torch.Tensor, mu: torch.Tensor, theta: torch.Tensor, pi: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """Element-wise ZINB log-likelihood (§2.4): log(pi + (1-pi) NB(0)) at x < 1e-8, else log(1-pi) + log NB(x);
    NaN -> 0 as in the released code."""
    log_theta_mu = torch.log(theta + mu + eps)
    nb_zero = theta * (torch.log(theta + eps) - log_theta_mu)
    log_nb = (
        torch.lgamma(x + theta)
        - torch.lgamma(x + 1.0)
        - torch.lgamma(theta)
        + nb_zero
        + x * (torch.log(mu + eps) - log_theta_mu)
    )
    zero = torch.log(pi + (1.0 - pi) * torch.exp(nb_zero) + eps)
    nonzero = torch.log(1.0 - pi + eps) + log_nb
    return torch.nan_to_num(torch.where(x < 1e-8, zero, nonzero), nan=0.0)


def zinb_loss(
    x: torch.Tensor, mu: torch.Tensor, theta: torch.Tensor, pi: torch.Tensor, mu_penalty: float
) -> torch.Tensor:
    return -zinb_loglik(x, mu, theta, pi).mean() + mu_penalty * (mu**2).mean()


FUSIONS = ("learned", "entry", "spot", "gene", "half")


class SpaEF(nn.Module):
    """Spot branch FeatAE on (X, E_spot), gene branch FeatAE on (X^T, E_gene); gate
    w = sigmoid(W_f (R_s + R_g) + b_f), one weight per spot ('learned', the released code) or per
    entry ('entry'); fixed gates 'spot' (w = 1), 'gene' (w = 0), 'half' (w = 0.5). ZINB heads on F."""

    def __init__(
        self,
        n_spots: int,
        n_genes: int,
        hidden: Sequence[int],
        latent: int,
        heads: int,
        dropout: float,
        fusion: str = "learned",
    ):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion {fusion!r} not in {FUSIONS}")
        self.fusion = fusion
        self.spot_ae = FeatAE(n_genes, hidden, latent, heads, dropout) if fusion != "gene" else None
        self.gene_ae = FeatAE(n_spots, hidden, latent, heads, dropout) if fusion != "spot" else None
        self.gate = nn.Linear(n_genes, n_genes if fusion == "entry" else 1) if fusion in ("learned", "entry") else None
        self.heads = nn.ModuleDict({k: nn.Linear(n_genes, n_genes) for k in ("mu", "theta", "pi")})
        for head in (*self.heads.values(), *([self.gate] if self.gate is not None else [])):
            nn.init.xavier_uniform_(head.weight)  # the ZINB heads and the gate, as the released code
            nn.init.zeros_(head.bias)

    def weight(
        self, r_s: torch.Tensor | None, r_g: torch.Tensor | None, force: float | None = None
    ) -> torch.Tensor | float:
        if force is not None:
            return force
        if self.fusion == "spot":
            return 1.0
        if self.fusion == "gene":
            return 0.0
        if self.fusion == "half":
            return 0.5
        return torch.sigmoid(self.gate(r_s + r_g))

    def forward(
        self, x: torch.Tensor, spot_edges: torch.Tensor, gene_edges: torch.Tensor, force_w: float | None = None
    ) -> dict[str, torch.Tensor]:
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
