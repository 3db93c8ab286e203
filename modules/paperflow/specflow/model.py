"""The smoke's stand-in VLM (spec section 7): the kit's tiny CLIP-vision encoder (transformers' CLIPVisionModel, eager
attention so that [CLS] attention weights come back), a Linear projector g, and a small causal reader standing in for
the LLM, fed [visual tokens; learned query] and classifying from the query position.

The reader is a classifier head over embeddings, not a language model (the kit's factory builds token-id LMs), so it
is written here: pre-LN blocks with an explicit causal attention that can return the query's attention (FastV).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from paperflow.specflow.baselines import Tokens
from paperflow.specflow.settings import encoder_spec


def build_encoder(cfg: Mapping[str, Any], seed: int):
    from paperflow.core.lm.models import build_model

    model = build_model(encoder_spec(cfg), seed)
    model.set_attn_implementation("eager")  # SDPA returns no attention weights (spec section 9)
    return model


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, L, d) -> (x', attention (B, heads, L, L)), causal."""
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        x = x + self.out((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x)), attn


class Reader(nn.Module):
    """[visual tokens; query] -> logits from the query position. `fastv_keep=K` prunes the visual tokens after
    block `fastv_layer` (1-based: blocks 1..fastv_layer see every token) to the K with the largest query attention
    in block `fastv_layer` (heads averaged), the FastV analogue (LLaVA: K = 2 of 32 layers)."""

    def __init__(self, d: int, heads: int, layers: int, n_classes: int, fastv_layer: int = 1):
        super().__init__()
        if not 1 <= fastv_layer < layers:
            raise ValueError(f"fastv_layer {fastv_layer} must leave at least one of the {layers} blocks after the cut")
        self.fastv_layer = fastv_layer
        self.query = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, n_classes)

    def forward(self, tokens: torch.Tensor, fastv_keep: int | None = None) -> torch.Tensor:
        x = torch.cat([tokens, self.query.expand(len(tokens), -1, -1)], dim=1)
        attn = None  # the previous block's attention
        for i, block in enumerate(self.blocks):
            if fastv_keep is not None and i == self.fastv_layer and attn is not None:
                received = attn[:, :, -1, :-1].mean(1)  # the query's attention to each visual token
                keep = received.topk(fastv_keep, dim=1).indices.sort(dim=1).values
                visual = x[:, :-1].gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))
                x = torch.cat([visual, x[:, -1:]], dim=1)
            x, attn = block(x)
        return self.head(self.ln(x[:, -1]))


def build_reader(rd: Mapping[str, Any], n_classes: int) -> Reader:
    return Reader(rd["hidden_size"], rd["heads"], rd["layers"], n_classes, int(rd.get("fastv_layer", 1)))


def random_subsets(gen: torch.Generator, batch: int, n: int, budget: int) -> torch.Tensor:
    """(batch, budget) sorted indices of `budget` tokens drawn without replacement per row (the original order kept,
    as every selection method keeps it)."""
    return torch.rand(batch, n, generator=gen).argsort(dim=1)[:, :budget].sort(dim=1).values


class StandIn(nn.Module):
    """Encoder (features of `seed_layer`, a negative index as LLaVA's select_layer = -2; [CLS] dropped) ->
    projector -> reader. `cls_head` reads the label from the seed layer's [CLS] (after the encoder's
    post_layernorm): CLIP's [CLS] is trained by its contrastive loss, which is what makes its attention a saliency
    map; without a loss on it, our [CLS] would get no gradient and its attention would be arbitrary."""

    def __init__(self, cfg: Mapping[str, Any], n_classes: int, seed: int):
        super().__init__()
        enc, rd = cfg["encoder"], cfg["reader"]
        self.seed_layer = int(enc["seed_layer"])
        self.encoder = build_encoder(enc, seed)
        # the layers above the seed layer never reach the reader (as LLaVA's last CLIP layer): not built or run
        layers = self.encoder.encoder.layers
        self.encoder.encoder.layers = layers[: len(layers) + self.seed_layer + 1]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 10_000)
            self.projector = nn.Linear(enc["hidden_size"], rd["hidden_size"])
            self.reader = build_reader(rd, n_classes)
            self.cls_head = nn.Linear(enc["hidden_size"], n_classes)

    def features(self, pixels: torch.Tensor, attentions: bool = False):
        out = self.encoder(pixel_values=pixels, output_hidden_states=True, output_attentions=attentions)
        z = self.projector(out.hidden_states[-1][:, 1:])  # the seed layer's output (pre post_layernorm)
        return z, out

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reader logits, [CLS]-head logits)."""
        z, out = self.features(pixels)
        cls = self.encoder.post_layernorm(out.hidden_states[-1][:, 0])
        return self.reader(z), self.cls_head(cls)


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """(n, H, W, 3) in [0, 1] -> (n, 3, H, W) standardised with fixed (per-dataset-free) constants."""
    return torch.from_numpy((images.transpose(0, 3, 1, 2) - 0.4) / 0.25).float()


def train_standin(
    cfg: Mapping[str, Any],
    images: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    seed: int,
    train: Mapping[str, Any],
    budgets: Sequence[int] = (),
) -> tuple[StandIn, list[dict[str, float]]]:
    """End-to-end training on full 64-token inputs (AdamW; cross-entropy of the reader + of the [CLS] head), epochs
    over shuffled batches, one-cycle learning rate. With `budgets`, the reader also reads, every step, a random
    subset of each budget K of every scene's tokens (one cross-entropy per budget, averaged with the full-token
    one), so that it can read K tokens; the encoder's features are detached there (the encoder is trained by the
    full-token and [CLS] losses only, as a vision tower that never saw pruning)."""
    from paperflow.core.loop import run_loop
    from paperflow.core.seeding import seed_all

    seed_all(seed)
    model = StandIn(cfg, n_classes, seed)
    x, y = to_pixels(images), torch.from_numpy(labels).long()
    bs = int(train["batch_size"])
    per_epoch = int(np.ceil(len(x) / bs))
    gen = np.random.default_rng(seed)
    tgen = torch.Generator().manual_seed(seed + 20_000)
    order: list[np.ndarray] = []

    def step(i: int):
        if i % per_epoch == 0:
            order[:] = np.array_split(gen.permutation(len(x)), per_epoch)
        idx = torch.from_numpy(order[i % per_epoch])
        z, out = model.features(x[idx])
        logits = model.reader(z)
        cls_logits = model.cls_head(model.encoder.post_layernorm(out.hidden_states[-1][:, 0]))
        reader_loss = nn.functional.cross_entropy(logits, y[idx])
        if budgets:
            zd = z.detach()
            for k in budgets:
                keep = random_subsets(tgen, len(idx), zd.shape[1], int(k))
                sub = zd.gather(1, keep[..., None].expand(-1, -1, zd.shape[-1]))
                reader_loss = reader_loss + nn.functional.cross_entropy(model.reader(sub), y[idx])
            reader_loss = reader_loss / (1 + len(budgets))
        cls_loss = nn.functional.cross_entropy(cls_logits, y[idx])
        acc = float((logits.argmax(1) == y[idx]).float().mean())
        return reader_loss + cls_loss, {
            "reader_loss": reader_loss.detach(),
            "cls_loss": cls_loss.detach(),
            "accuracy": acc,
        }

    opt = torch.optim.AdamW(model.parameters(), lr=float(train["lr"]), weight_decay=float(train["weight_decay"]))
    steps = int(train["epochs"]) * per_epoch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=float(train["lr"]), total_steps=steps, pct_start=0.15)
    rows = run_loop(step, opt, steps, grad_clip=1.0, scheduler=sched, desc=f"seed {seed}")
    return model.eval(), rows


def key_hook(model: StandIn, store: dict[str, torch.Tensor]):
    """Records the seed layer's keys (the k_proj output) into store['keys']."""
    layer = model.encoder.encoder.layers[-1]  # the seed layer (the last one kept)
    return layer.self_attn.k_proj.register_forward_hook(lambda mod, args, out: store.__setitem__("keys", out))


@torch.no_grad()
def extract(model: StandIn, images: np.ndarray, grid: tuple[int, int], batch: int = 250) -> Tokens:
    """Tokens of the test split: z, the seed layer's [CLS] attention (per head and averaged), its head-averaged keys
    and patch -> patch attention."""
    store: dict[str, torch.Tensor] = {}
    hook = key_hook(model, store)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("z", "cls", "cls_heads", "keys", "attn")}
    heads = model.encoder.config.num_attention_heads
    try:
        for i in range(0, len(images), batch):
            z, out = model.features(to_pixels(images[i : i + batch]), attentions=True)
            a = out.attentions[-1]  # (B, H, N+1, N+1)
            keys = store["keys"]
            keys = keys.view(*keys.shape[:2], heads, -1).mean(2)
            parts["z"].append(z.numpy())
            parts["cls_heads"].append(a[:, :, 0, 1:].numpy())
            parts["cls"].append(a[:, :, 0, 1:].mean(1).numpy())
            parts["keys"].append(keys.numpy())
            parts["attn"].append(a[:, :, 1:, 1:].mean(1).numpy())
    finally:
        hook.remove()
    return Tokens(**{k: np.concatenate(v).astype(np.float64) for k, v in parts.items()}, grid=grid)


@torch.no_grad()
def read(reader: Reader, tokens: np.ndarray, fastv_keep: int | None = None) -> np.ndarray:
    """Predicted classes of the reader on fed tokens (B, K, d)."""
    logits = reader(torch.from_numpy(np.ascontiguousarray(tokens)).float(), fastv_keep=fastv_keep)
    return logits.argmax(1).numpy()
