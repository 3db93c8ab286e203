"""The draft heads of ConFu's comparison (spec sections 2a, 2b and 9), built beside a frozen kit target.

EAGLE-3 head: the target's hidden states of three layers, concatenated (3h) and reduced by `fc` (3h -> h), give
g_t; the draft input at position t is `w_in`([emb(x_{t+1}); g_t]) (2h -> h) through ONE Llama decoder layer (a kit
model with one layer), its final norm and LM head. The token embedding is the target's, copied and frozen. In
training-time test and in the tree, a later draft step replaces g by the draft's own output at its parent.

`vanilla` is the same head with the features switched off (g = 0): a one-layer LM over the target's embeddings.

ConFu adds (section 2b; the reconstructed choices are named in the README):
- `soft`: n_sp soft-prompt embeddings, fed to the target in front of the sequence; only contemplate tokens see
  them (input-embedding prompts, the `soft_prompt: embeddings` choice of section 9);
- `moe_con`: the contemplate token's input embedding, a gate-weighted sum of the top-k of n_expert learnt
  embeddings, routed by the target's concatenated features of the last token whose features are known;
- `fc_f`: the future vector f = fc_f([con]'s concatenated features);
- `moe_f`: the [f] embedding e_f, routed by the draft's fused input at the root row; `w_in`([e_f; f]) is added to
  the input of every drafted row (depth >= 2 of the tree, steps >= 1 of training-time test; the root row reads the
  target's g as in EAGLE-3). `fc_f` and the [f] experts start at zero, so a new ConFu head drafts exactly as the
  EAGLE-3 head it is built from and training grows the f path from there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import cache_argument

KINDS = ("vanilla", "eagle3", "confu")


def new_cache(head: DraftHead):
    from transformers import DynamicCache

    return DynamicCache(config=head.body.config)


@dataclass(frozen=True)
class DraftConfig:
    """The head's shape: `kind` (vanilla | eagle3 | confu), the target's hidden size, vocabulary and feature
    layers, the draft layer's heads and MLP width, and ConFu's parts (ignored by the other kinds)."""

    kind: str
    hidden_size: int
    vocab_size: int
    feature_layers: tuple[int, ...]
    heads: int
    intermediate_size: int
    max_positions: int
    n_soft: int = 4
    n_expert: int = 4
    k_expert: int = 2

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"draft kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not 1 <= self.k_expert <= self.n_expert:
            raise ValueError(f"need 1 <= k_expert <= n_expert, got {self.k_expert}, {self.n_expert}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DraftConfig:
        return cls(**{**d, "feature_layers": tuple(d["feature_layers"])})


class MoEEmbedding(nn.Module):
    """A gate-weighted sum of the top-k of n learnt embeddings, routed by a linear layer on `router_in` (section
    2b.2). With one expert it is that expert's embedding whatever the input."""

    def __init__(self, router_in: int, hidden: int, n_expert: int, k_expert: int):
        super().__init__()
        self.router = nn.Linear(router_in, n_expert, bias=False)
        self.experts = nn.Parameter(torch.randn(n_expert, hidden) * 0.02)
        self.k = k_expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = torch.softmax(self.router(x), dim=-1)
        top, idx = gates.topk(self.k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        return (top[..., None] * self.experts[idx]).sum(-2)


class DraftHead(nn.Module):
    def __init__(self, cfg: DraftConfig, embedding: torch.Tensor, seed: int):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.body = build_model(
                {
                    "arch": "llama",
                    "vocab_size": cfg.vocab_size,
                    "hidden_size": h,
                    "intermediate_size": cfg.intermediate_size,
                    "num_hidden_layers": 1,
                    "num_attention_heads": cfg.heads,
                    "num_key_value_heads": cfg.heads,
                    "max_position_embeddings": cfg.max_positions,
                    "tie_word_embeddings": False,
                },
                seed=seed,
            )
            self.fc = nn.Linear(len(cfg.feature_layers) * h, h, bias=False)
            self.w_in = nn.Linear(2 * h, h, bias=False)
            if cfg.kind == "confu":
                feat = len(cfg.feature_layers) * h
                self.soft = nn.Parameter(torch.randn(cfg.n_soft, h) * 0.02)
                self.moe_con = MoEEmbedding(feat, h, cfg.n_expert, cfg.k_expert)
                self.fc_f = nn.Linear(feat, h, bias=False)
                self.moe_f = MoEEmbedding(h, h, cfg.n_expert, cfg.k_expert)
                # the f path starts at zero (f = 0, e_f = 0): a new ConFu head drafts exactly as its EAGLE-3 head
                nn.init.zeros_(self.fc_f.weight)
                nn.init.zeros_(self.moe_f.experts)
        self.embed = nn.Embedding.from_pretrained(embedding.detach().clone(), freeze=True)

    @property
    def uses_features(self) -> bool:
        return self.cfg.kind != "vanilla"

    def g(self, features: torch.Tensor) -> torch.Tensor:
        """g_t from the target's concatenated features (zeros for the vanilla head)."""
        g = self.fc(features)
        return g if self.uses_features else torch.zeros_like(g)

    def fuse(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The draft layer's input w_in([emb(token); hidden])."""
        return self.w_in(torch.cat([self.embed(tokens), hidden], -1))

    def future(self, router_in: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """What the future vector adds to a drafted row's input: w_in([e_f; f]), e_f routed by the root row's fused
        input `router_in` (zero while fc_f and the [f] experts are at their zero initialisation)."""
        return self.w_in(torch.cat([self.moe_f(router_in), f], -1))

    def run(
        self, inputs: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, cache=None, logits: bool = True
    ):
        """(hidden [B, R, h] after the final norm, logits [B, R, V]) of the draft rows `inputs` [B, R, h]. With a
        transformers `cache` holding earlier rows' keys and values, `allowed` [B, R, cached + R] spans them too
        (one decoder layer: a row's keys and values depend on its input alone, so cached rows never change).
        `logits=False` returns None for the logits (the caller applies the LM head itself)."""
        extra = {} if cache is None else {cache_argument(self.body.model): cache, "use_cache": True}
        out = self.body.model(inputs_embeds=inputs, attention_mask=allowed[:, None], position_ids=positions, **extra)
        hidden = out.last_hidden_state
        return hidden, self.body.lm_head(hidden) if logits else None

    def trainable(self, part: str = "all") -> list[nn.Parameter]:
        """The parameters a stage trains: `all` (every one but the frozen embedding)."""
        return [p for n, p in self.named_parameters() if p.requires_grad and not n.startswith("embed")]


def control(x: torch.Tensor, mode: str) -> torch.Tensor:
    """A negative control on a per-prompt tensor (ConFu's f, the target features the draft reads): `normal` leaves
    it, `zero` zeroes it, `shuffle` rolls it one row across the batch (each prompt gets another's)."""
    if mode == "normal":
        return x
    if mode == "zero":
        return torch.zeros_like(x)
    if mode == "shuffle":
        return x.roll(1, dims=0)
    raise ValueError(f"control mode {mode!r}: normal | zero | shuffle")


def cost_ratio(head: DraftHead, target) -> float:
    """c_draft of the cost-model speed-up (spec section 8): the draft's per-token multiply-adds over the target's,
    counted as the parameters of their matrices outside the embeddings (one multiply-add per weight per token)."""

    def weights(module, skip: Sequence[str]) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if p.dim() == 2 and not any(s in n for s in skip))

    draft = weights(head.body, ("embed_tokens",)) + head.fc.weight.numel() + head.w_in.weight.numel()
    return draft / weights(target, ("embed_tokens",))


def save_head(head: DraftHead, path: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
    """The head's weights (the frozen embedding included) and its config in one safetensors file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in head.state_dict().items()}
    info = {"draft_config": json.dumps(asdict(head.cfg)), "meta": json.dumps(dict(meta or {}))}
    save_file(state, str(path), metadata=info)
    return path


def load_head(path: str | Path, kind: str | None = None) -> DraftHead:
    """A head saved by `save_head`; with `kind`, rebuilt as that kind (a ConFu head initialised from an EAGLE-3
    checkpoint: the shared parts loaded, ConFu's own parts freshly initialised with the seed in the file's meta)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        state = {k: fh.get_tensor(k) for k in fh.keys()}
    cfg = DraftConfig.from_dict(json.loads(meta["draft_config"]))
    seed = int(json.loads(meta["meta"]).get("seed", 0))
    if kind is not None and kind != cfg.kind:
        cfg = DraftConfig.from_dict({**asdict(cfg), "kind": kind})
    head = DraftHead(cfg, state["embed.weight"], seed=seed)
    missing, unexpected = head.load_state_dict(state, strict=False)
    extra = [k for k in missing if k.split(".")[0] not in ("soft", "moe_con", "fc_f", "moe_f")]
    if unexpected or extra:
        raise ValueError(
            f"{path}: checkpoint does not match a {cfg.kind} head (missing {extra}, unexpected {unexpected})"
        )
    return head.eval()


def head_meta(path: str | Path) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return json.loads(fh.metadata()["meta"])
