"""Training the target and the draft heads: the target's SFT, the target pass that the draft learns from, the
training-time-test unroll of EAGLE-3 as one attention pattern, and ConFu's anchors, contemplate tokens and
future-vector replication (spec sections 2a, 2b.4 and 7).

Training-time test (L steps) in one pass per step. Rows of block i are draft positions j = 0..N-2; row (i, j)
reads the token x_{j+1} and, for i = 0, the target's g_j, for i > 0 the draft's own output at row (i-1, j-1); it
predicts x_{j+2} against the target's distribution at position j+1. Row (i, j) sees the block-0 rows k <= j - i
(the prefix whose features the target has computed) and the rows (s, j - i + s), s = 1..i (its own earlier draft
steps): exactly what the draft sees at depth i + 1 of a tree whose root is at position j - i. The loss of step i
is weighted decay^i.

ConFu: K anchors a per sequence. The target reads [soft prompts] + x + one contemplate token per anchor; [con]_a
has position a + 1, sees x_<=a, the soft prompts and itself; no regular token sees either. f_a = fc_f([con]_a's
features). A drafted row (i >= 1, j) whose root j - i lies within l of an anchor a (the latest a <= j - i with
j - i - a < l: replication) has w_in([e_f; f_a]) added to its input, as every drafted row of a tree has the f of
its root; every other row is an EAGLE-3 row, and every row is trained. The block-0 rows (roots and the committed
prefix the later rows attend to) read g alone, so no row's keys depend on an f its inference twin does not see.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint

from paperflow.confu.model import DraftHead, control, new_cache
from paperflow.core.lm.sampling import masked_forward, position_ids_from_mask


@dataclass
class TargetPass:
    logits: torch.Tensor  # [B, N, V]
    features: torch.Tensor  # [B, N, F] concatenated feature layers


def causal_allowed(mask: torch.Tensor) -> torch.Tensor:
    """[B, N, N]: each real column sees the real columns up to it; every row sees itself."""
    n = mask.shape[1]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=mask.device))
    return causal & mask.bool()[:, None, :] | torch.eye(n, dtype=torch.bool, device=mask.device)


@torch.no_grad()
def target_pass(target, ids: torch.Tensor, mask: torch.Tensor, layers: Sequence[int]) -> TargetPass:
    out = masked_forward(target, causal_allowed(mask), position_ids_from_mask(mask), input_ids=ids, layers=layers)
    return TargetPass(out.logits.float(), out.features)


def ttt_allowed(real: torch.Tensor, blocks: int) -> torch.Tensor:
    """The draft rows' attention pattern [B, R, R] (R = blocks * M) for `blocks` unrolled steps over rows with
    `real` [B, M] (row k real: its token and features exist)."""
    b, m = real.shape
    dev = real.device
    qb = torch.arange(blocks, device=dev).repeat_interleave(m)
    qj = torch.arange(m, device=dev).repeat(blocks)
    ctx = qj - qb  # the row's real context j - i
    key_b, key_j = qb[None, :], qj[None, :]
    see0 = (key_b == 0) & (key_j <= ctx[:, None])
    seen_diag = (key_b >= 1) & (key_b <= qb[:, None]) & (key_j == ctx[:, None] + key_b)
    allowed = (see0 | seen_diag)[None] & real[:, key_j[0]][:, None, :]
    return allowed | torch.eye(blocks * m, dtype=torch.bool, device=dev)


def future_index(anchors: torch.Tensor, m: int, step: int, window: int) -> torch.Tensor:
    """[B, M]: for the rows (step, j) of training-time test, the index into `anchors` [B, K] (-1: none) of the
    anchor whose f the row reads: the latest a <= j - step with j - step - a < window (f replicated over l =
    `window` roots, section 2b.4); -1 where none, and for step 0 (the root rows read g alone, as in EAGLE-3)."""
    b, k = anchors.shape
    if step == 0 or k == 0:
        return torch.full((b, m), -1, dtype=torch.long, device=anchors.device)
    ctx = (torch.arange(m, device=anchors.device) - step)[None, :, None]  # [1, M, 1]
    a = anchors[:, None, :]  # [B, 1, K]
    cond = (a >= 0) & (a <= ctx) & (ctx - a < window) & (ctx >= 0)
    latest = torch.where(cond, a, -1)
    best = latest.argmax(-1)
    return torch.where(latest.amax(-1) >= 0, best, -1)


def sample_anchors(valid: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """K distinct anchor rows per sequence, uniformly among the `valid` ones [B, M]; -1 where fewer exist."""
    scores = torch.rand(valid.shape, generator=generator).masked_fill(~valid, -1.0)
    top, idx = scores.topk(min(k, valid.shape[1]), dim=-1)
    return torch.where(top >= 0, idx, -1)


@contextlib.contextmanager
def checkpointed_layers(model) -> Iterator[None]:
    """Gradient checkpointing of `model`'s decoder layers (transformers' GradientCheckpointingLayer modules) while
    the context is open: each layer keeps only its inputs for the backward pass and recomputes its activations
    there (torch.utils.checkpoint, non-reentrant), so a differentiable pass through a frozen target holds one
    hidden state per layer instead of every layer's activations. The same values and gradients (the recompute
    repeats the forward); works with the target in eval mode, unlike `gradient_checkpointing_enable`."""
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    def wrap(forward):
        def run(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.forward = wrap(layer.forward)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the instance attribute; the class's forward again


def contemplate_pass(
    target, head: DraftHead, ids, mask, features, anchors, layers, leak: bool = False, checkpoint: bool = False
):
    """The target on [soft prompts] + x + [con]_a per anchor (module docstring), differentiable in the soft prompts
    and the [con] MoE. Returns (regular-position logits [B, N, V], f [B, K, h]). `leak` lets regular tokens see
    the soft prompts and contemplate tokens (the bug section 9 warns of; the no-leak test's negative control).
    `checkpoint`: the target's decoder layers under gradient checkpointing (`checkpointed_layers`)."""
    b, n = ids.shape
    ns, k = head.cfg.n_soft, anchors.shape[1]
    dev = ids.device
    pos = position_ids_from_mask(mask)
    safe_a = anchors.clamp(min=1)
    router_in = features.gather(1, (safe_a - 1)[..., None].expand(-1, -1, features.shape[-1]))
    con_emb = head.moe_con(router_in)
    emb = target.get_input_embeddings()
    inputs = torch.cat([head.soft[None].expand(b, -1, -1), emb(ids), con_emb], 1)
    r = ns + n + k
    allowed = torch.zeros(b, r, r, dtype=torch.bool, device=dev)
    allowed[:, :ns, :ns] = torch.tril(torch.ones(ns, ns, dtype=torch.bool, device=dev))
    allowed[:, ns : ns + n, ns : ns + n] = causal_allowed(mask)
    cols = torch.arange(n, device=dev)
    allowed[:, ns + n :, ns : ns + n] = (cols[None, None, :] <= anchors[:, :, None]) & mask.bool()[:, None, :]
    allowed[:, ns + n :, :ns] = True
    if leak:
        allowed[:, ns : ns + n, :ns] = True
        allowed[:, ns : ns + n, ns + n :] = True
    allowed |= torch.eye(r, dtype=torch.bool, device=dev)
    positions = torch.cat(
        [torch.arange(ns, device=dev)[None].expand(b, -1), pos, pos.gather(1, anchors.clamp(min=0)) + 1], 1
    )
    with checkpointed_layers(target) if checkpoint else contextlib.nullcontext():
        out = masked_forward(target, allowed, positions, inputs_embeds=inputs, layers=layers)
    f = head.fc_f(out.features[:, ns + n :])
    return out.logits[:, ns : ns + n], f


def ttt_loss(
    head: DraftHead,
    target,
    ids: torch.Tensor,
    mask: torch.Tensor,
    response: torch.Tensor,
    *,
    steps: int,
    decay: float,
    layers: Sequence[int],
    anchors: torch.Tensor | None = None,
    window: int = 1,
    f_mode: str = "normal",
    checkpoint: bool = False,
):
    """The draft's distillation loss with training-time test (soft cross-entropy to the target's softmax), and
    per-step accuracy (the draft's argmax equals the target's) as logs. `response` [B, N] marks the tokens the
    draft is trained to predict. ConFu heads need `anchors` [B, K] (rows; -1 none). `f_mode` zero/shuffle is the
    training-side form of the control (unused by the pipeline, kept for tests).

    `checkpoint` (`draft.gradient_checkpointing`, the paper scale): the same loss and gradients with less memory:
    the contemplate pass's target layers are checkpointed (`checkpointed_layers`), and each TTT step's LM head and
    soft cross-entropy are recomputed in the backward pass, so no step keeps its [B, N, V] log-softmax."""
    tp = target_pass(target, ids, mask, layers)
    features = tp.features
    b, n = ids.shape
    m = n - 1
    real = mask[:, :m].bool()
    pos = position_ids_from_mask(mask)[:, :m]
    tokens = ids[:, 1:]
    g = head.g(features[:, :m])
    fused0 = head.fuse(tokens, g)
    # row j predicts x_{j+2} from the target's distribution at j + 1; the last row has nothing to predict
    goal = torch.zeros(b, m, tp.logits.shape[-1])
    goal[:, : m - 1] = torch.softmax(tp.logits[:, 1:m], -1)
    del tp  # the target's [B, N, V] logits are not needed past the goal
    predicts = torch.zeros(b, m, dtype=torch.bool)
    predicts[:, : m - 1] = response[:, 2:].bool()
    confu = head.cfg.kind == "confu"
    if confu:
        if anchors is None:
            raise ValueError("a ConFu head trains with anchors")
        # only f: the pass's logits (and their graph) are dropped at once
        f = contemplate_pass(target, head, ids, mask, features, anchors, layers, checkpoint=checkpoint)[1]
        f = control(f, f_mode)
        a = anchors.clamp(min=0)
        future = head.future(fused0.gather(1, a[..., None].expand(-1, -1, fused0.shape[-1])), f)  # [B, K, h]
    # step i feeds only block i's rows; earlier blocks' keys and values come from the cache
    cache = new_cache(head)
    prev = None
    total = torch.zeros(())
    logs: dict[str, Any] = {}
    rows = torch.arange(m)
    for i in range(steps):
        allowed = ttt_allowed(real, i + 1)
        query = torch.arange(i * m, (i + 1) * m)
        if i == 0:
            inputs = fused0
        else:
            shifted = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1)
            inputs = head.fuse(tokens, shifted)
            if confu:  # a drafted row reads the f of the anchor that covers its root
                idx = future_index(anchors, m, i, window)
                got = future.gather(1, idx.clamp(min=0)[..., None].expand(-1, -1, future.shape[-1]))
                inputs = inputs + got * (idx >= 0)[..., None].to(got.dtype)
        if checkpoint:
            hidden, _ = head.run(inputs, allowed[:, query], pos, cache, logits=False)
            ce, guess = torch.utils.checkpoint.checkpoint(_soft_ce, head, hidden[:, :m], goal, use_reentrant=False)
        else:
            hidden, logits = head.run(inputs, allowed[:, query], pos, cache)
            ce, guess = _soft_ce(head, None, goal, logits[:, :m])
        prev = hidden[:, :m]
        # every row is trained, those without an anchor's f exactly as EAGLE-3 trains them
        ok = predicts & (rows[None, :] - i >= 0) & real.gather(1, (rows - i).clamp(min=0)[None].expand(b, -1))
        count = ok.sum().clamp(min=1)
        total = total + decay**i * (ce * ok).sum() / count
        hit = (guess == goal.argmax(-1)) & ok
        logs[f"acc_step{i}"] = float(hit.sum() / count)
    return total, logs


def _soft_ce(head: DraftHead, hidden, goal: torch.Tensor, logits: torch.Tensor | None = None):
    """Per row: the soft cross-entropy of the draft's logits (the LM head of `hidden` unless `logits` are given)
    to the target's distribution `goal`, and the draft's argmax."""
    if logits is None:
        logits = head.body.lm_head(hidden)
    step_logits = logits.float()
    return -(goal * torch.log_softmax(step_logits, -1)).sum(-1), step_logits.argmax(-1)


def response_mask(mask: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
    """1 on the response tokens of left-padded rows whose first `prompt_lengths` real tokens are the prompt."""
    real_index = mask.long().cumsum(1) - 1
    return (mask.bool() & (real_index >= prompt_lengths[:, None])).long()


# ------------------------------------------------------------------ the draft-training loop (every scale)
def unpadded(data: Mapping[str, torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    """The sequences of a left-padded set (`stages.regenerate`'s input_ids, attention_mask, prompt_lengths) as
    `train_draft` reads them: (ids without the padding, prompt length) per row."""
    rows = zip(data["input_ids"], data["attention_mask"], data["prompt_lengths"].tolist())
    return [(ids[mask.bool()], int(plen)) for ids, mask, plen in rows]


def padded_batch(seqs: Sequence[tuple[torch.Tensor, int]], idx: Sequence[int], pad: int, max_length: int):
    """Left-padded ids, mask and response mask of the sequences `idx` (each cut to `max_length`), as wide as the
    longest of them."""
    cut = [seqs[i][0][:max_length] for i in idx]
    width = max(len(s) for s in cut)
    ids = torch.full((len(cut), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(cut):
        ids[r, width - len(s) :] = s
        mask[r, width - len(s) :] = 1
    plen = torch.tensor([min(seqs[i][1], max_length) for i in idx])
    return ids, mask, response_mask(mask, plen)


def batch_seed(seed: int, rank: int = 0) -> int:
    """The batch generator's seed of `seed` on `rank`: rank 0 draws the batches a one-process run draws (smoke, cpu,
    tiny), the other ranks their own. (The paper scale used seed * 1009 + rank before issue 49; it had never run.)"""
    return int(seed) * 7 + 3 + 1_000_003 * int(rank)


def train_draft(
    method: str,
    target,
    seqs: Sequence[tuple[torch.Tensor, int]],
    cfg: Mapping[str, Any],
    seed: int,
    *,
    init: str | None = None,
    pad: int,
    max_length: int,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    rank: int = 0,
    world: int = 1,
    checkpoint: Callable[[Mapping[str, Any]], Any] | None = None,
) -> tuple[DraftHead, list[dict[str, float]]]:
    """Train `method`'s head (settings.METHODS: kind, steps, lr, start) on the frozen `target`; the one loop of every
    scale (smoke, cpu and tiny through `workflows/confu/scripts/train.py`, the paper through `paper_train.run`).

    `seqs`: (ids, prompt length) per regenerated sequence (`unpadded` of a padded set, `paper_train.load_data`);
    each step draws `draft.batch_size` of them, left-pads them with `pad` (cut to `max_length`) and minimises
    `ttt_loss` under the `device` context and `dtype`'s autocast. `cfg`: the `target.model`, `draft` and `confu`
    blocks (`stages.draft_config`; `paper.head_config` at paper scale). `init`: the EAGLE-3 head a continued method
    starts from. With `world` > 1 (torchrun) the gradients are averaged across the ranks before each clipped AdamW
    step, so the head stays identical on every rank, and each rank draws its own batches (`batch_seed`).
    `checkpoint(objects)`: the loop's LoopCheckpoint, given the objects to save (head, optimizer, batches).
    Returns (head in eval mode, history rows)."""
    from paperflow.confu.model import load_head
    from paperflow.confu.paper import autocast
    from paperflow.confu.settings import method_of
    from paperflow.confu.stages import _one_expert, draft_config
    from paperflow.core.loop import GeneratorState, run_loop

    device = torch.device(device)
    m = method_of(method, cfg)
    d = cfg["draft"]
    if m.start == "eagle3":
        if not init:
            raise ValueError(f"{method} starts from the EAGLE-3 head; none given")
        head = load_head(init, kind=m.kind)
    else:
        embedding = target.get_input_embeddings().weight.float()
        head = DraftHead(draft_config(m.kind, cfg, target.config.vocab_size), embedding, seed=seed)
    if m.kind == "confu" and m.n_expert is not None:  # the static-embedding ablation: one expert
        head = _one_expert(head)
    head = head.to(device).train()
    for p in target.parameters():
        p.requires_grad_(False)
    params = head.trainable()
    opt = torch.optim.AdamW(params, lr=float(m.lr), weight_decay=0.0)
    g = torch.Generator().manual_seed(batch_seed(seed, rank))
    layers = tuple(int(i) for i in d["feature_layers"])

    def step(i: int):
        idx = torch.randint(0, len(seqs), (int(d["batch_size"]),), generator=g).tolist()
        ids, mask, resp = padded_batch(seqs, idx, pad, int(max_length))
        anchors = None
        if m.kind == "confu":
            valid = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
            valid[:, : ids.shape[1] - 2] = resp[:, 2:].bool()  # rows j that predict a response token x_{j+2}
            anchors = sample_anchors(valid, int(m.anchors), g).to(device)
        with torch.device(device), autocast(device, dtype):
            loss, logs = ttt_loss(
                head,
                target,
                ids.to(device),
                mask.to(device),
                resp.to(device),
                steps=int(d["ttt_steps"]),
                decay=float(d["ttt_decay"]),
                layers=layers,
                anchors=anchors,
                window=int(m.window),
                checkpoint="gradient_checkpointing" in d and bool(d["gradient_checkpointing"]),
            )
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if world > 1:
            import torch.distributed as dist

            for p in params:
                if p.grad is None:  # a part this kind leaves unused (vanilla's feature projection)
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= world
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach(), logs

    objects = {"head": head, "optimizer": opt, "batches": GeneratorState(g)}
    desc = f"{method} seed {seed}" + (f" rank {rank}" if world > 1 else "")
    rows = run_loop(step, None, int(m.steps), desc=desc, checkpoint=checkpoint(objects) if checkpoint else None)
    return head.eval(), rows
