"""Speculative decoding with a draft tree verified by the target in one pass (spec sections 2a, 2b.3, 8 and 9),
batched over prompts: every row drafts a tree of the same shape, so one forward serves the batch.

A cycle:
1. Draft (EAGLE-2's dynamic tree): the root's top_k children, then `depth` - 1 expansions; each expands the top_k
   nodes of the last depth by cumulative draft log-probability into top_k children each. All expanded candidates
   are reranked by score and the best `nodes` form the tree (the score falls along a path, so the tree is closed
   under ancestors; a tie goes to the shallower node). One draft forward per depth.
2. Verify: the target reads [soft prompts] + committed tokens + the tree's nodes + (ConFu) one contemplate token
   for the root and for every node, in ONE forward under the tree's ancestor mask.
3. Accept: from the root, the target's token is drawn (argmax at T = 0; at T > 0 the inverse CDF of its tempered
   softmax at the row's next pre-drawn uniform); if a child carries it, descend and repeat, else it is the bonus
   token. This is rejection sampling with point-mass proposals (the tree's children are chosen, not sampled), so
   the output is the target's own sample path, token for token, with the same uniforms: lossless by construction.
4. ConFu: f for the next cycle is the contemplate token's output at the last accepted node (the root's when no
   node was accepted).

The committed tokens live left-aligned in a buffer (position = column); the target's features of every committed
token but the last (the bonus, which the target has not read yet) are kept for the draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from paperflow.confu.model import DraftHead, control
from paperflow.confu.training import causal_allowed
from paperflow.core.lm.sampling import inverse_cdf, masked_forward


@dataclass(frozen=True)
class TreeConfig:
    nodes: int  # T, the tree budget
    top_k: int
    depth: int  # D

    def __post_init__(self):
        if self.top_k < 1 or self.depth < 1 or self.nodes < 1:
            raise ValueError(f"tree: nodes, top_k and depth must be >= 1, got {self}")
        most = self.top_k + (self.depth - 1) * self.top_k**2
        if self.nodes > most:
            raise ValueError(
                f"tree: nodes {self.nodes} > the {most} candidates top_k {self.top_k} x depth {self.depth} give"
            )


@dataclass
class Controls:
    """Evaluation-time switches: `f` normal | zero | shuffle (ConFu's future vector; shuffle rolls it across the
    batch's rows), `features` normal | shuffle (the target features the draft reads, rolled across rows: (b)'s
    control), `slot` (False: ConFu's f left out of the drafted rows), `leak` (regular tokens see the soft prompts and
    contemplate tokens: the losslessness control)."""

    f: str = "normal"
    features: str = "normal"
    slot: bool = True
    leak: bool = False


@dataclass
class Decoded:
    tokens: list[list[int]]  # per prompt, the generated tokens (EOS included when reached)
    cycles: np.ndarray  # [B] target verification forwards
    accepted: list[list[int]]  # per prompt, accepted draft nodes per cycle
    target_forwards: int = 0  # batched verification passes (prefill excluded)
    draft_forwards: int = 0
    extra: dict = field(default_factory=dict)


def _left_align(ids: torch.Tensor, mask: torch.Tensor, width: int, pad: int):
    """Left-padded prompts -> a [B, width] buffer with each row's tokens from column 0, and the lengths."""
    lengths = mask.long().sum(1)
    buf = torch.full((ids.shape[0], width), pad, dtype=torch.long)
    for b in range(ids.shape[0]):
        buf[b, : lengths[b]] = ids[b, mask[b].bool()]
    return buf, lengths


class SpecDecoder:
    """Speculative decoding of `target` with `head` (None: target-only decoding through the same verifier)."""

    def __init__(self, target, head: DraftHead | None, tree: TreeConfig, layers: Sequence[int], controls=None):
        self.target, self.head, self.tree, self.layers = target, head, tree, tuple(layers)
        self.controls = controls or Controls()
        self.confu = head is not None and head.cfg.kind == "confu"
        self.emb = target.get_input_embeddings()

    # ---------------------------------------------------------------- target side
    def _verify(self, buf, lengths, feats, tokens, parent_anc, depth):
        """One target pass over [soft] + buffer + tree nodes + (ConFu) contemplate tokens. Returns (root logits
        [B, V], node logits [B, T, V], features of buffer columns [B, W, F] and nodes [B, T, F], f candidates
        [B, 1 + T, h] or None)."""
        b, w = buf.shape
        t = tokens.shape[1]
        dev = buf.device
        ns = self.head.cfg.n_soft if self.confu else 0
        nc = (1 + t) if self.confu else 0
        cols = torch.arange(w, device=dev)
        inside = cols[None, :] < lengths[:, None]  # [B, W]
        parts = []
        if ns:
            parts.append(self.head.soft[None].expand(b, -1, -1))
        parts += [self.emb(buf), self.emb(tokens)]
        if nc:
            last_known = feats.gather(1, (lengths - 2).clamp(min=0)[:, None, None].expand(-1, 1, feats.shape[-1]))
            parts.append(self.head.moe_con(last_known).expand(-1, nc, -1))
        inputs = torch.cat(parts, 1)
        r = ns + w + t + nc
        s0, s1, s2 = ns, ns + w, ns + w + t  # where the buffer, the nodes and the contemplate tokens start
        allowed = torch.zeros(b, r, r, dtype=torch.bool, device=dev)
        allowed[:, :ns, :ns] = torch.tril(torch.ones(ns, ns, dtype=torch.bool, device=dev))
        causal = torch.tril(torch.ones(w, w, dtype=torch.bool, device=dev))
        allowed[:, s0:s1, s0:s1] = causal[None] & inside[:, None, :]
        allowed[:, s1:s2, s0:s1] = inside[:, None, :]
        allowed[:, s1:s2, s1:s2] = parent_anc
        if nc:
            allowed[:, s2:, s0:s1] = inside[:, None, :]
            allowed[:, s2:, :ns] = True
            allowed[:, s2 + 1 :, s1:s2] = parent_anc
            if self.controls.leak:
                allowed[:, s0:s2, :ns] = True
                allowed[:, s0:s2, s2:] = True
        allowed |= torch.eye(r, dtype=torch.bool, device=dev)
        last = (lengths - 1)[:, None]
        pos = [cols[None].expand(b, -1), last + depth]
        if ns:
            pos.insert(0, torch.arange(ns, device=dev)[None].expand(b, -1))
        if nc:
            pos.append(torch.cat([last + 1, last + 1 + depth], 1))
        out = masked_forward(self.target, allowed, torch.cat(pos, 1), inputs_embeds=inputs, layers=self.layers)
        logits, fe = out.logits.float(), out.features
        root = logits[:, s0:s1].gather(1, last[..., None].expand(-1, 1, logits.shape[-1]))[:, 0]
        f = self.head.fc_f(fe[:, s2:]) if nc else None
        return root, logits[:, s1:s2], fe[:, s0:s1], fe[:, s1:s2], f

    # ---------------------------------------------------------------- draft side
    def _draft(self, buf, lengths, feats, f):
        """The tree: tokens [B, T], ancestor-or-self matrix [B, T, T], depth [B, T] (1 = the root's children)."""
        head, k, big_d = self.head, self.tree.top_k, self.tree.depth
        b, w = buf.shape
        dev = buf.device
        m = w - 1
        rows = torch.arange(m, device=dev)
        real = rows[None, :] <= (lengths - 2)[:, None]  # row j reads x_{j+1} and g_j
        g = head.g(control(feats[:, :m], self.controls.features))
        prefix_in = head.fuse(buf[:, 1:], g)
        root_row = (lengths - 2).clamp(min=0)
        future = 0.0  # what f adds to each drafted row's input (ConFu; EAGLE-3 rows otherwise)
        if self.confu and self.controls.slot:
            router = prefix_in.gather(1, root_row[:, None, None].expand(-1, 1, prefix_in.shape[-1]))
            future = head.future(router, control(f, self.controls.f))  # [B, 1, h]
        inputs = [prefix_in]
        positions = [rows[None].expand(b, -1)]
        base = m
        hid, logits = self._draft_pass(inputs, positions, real, root_row, torch.zeros(b, 0, 0, dtype=torch.bool))
        root = root_row[:, None, None]
        root_logp = torch.log_softmax(logits.gather(1, root.expand(-1, 1, logits.shape[-1])).float(), -1)
        root_hidden = hid.gather(1, root.expand(-1, 1, hid.shape[-1]))

        def run_rows(tokens, parent_h, depth, tree_anc, n_old):
            # the whole draft again: the prefix rows, the tree rows so far and the k new ones
            inputs.append(head.fuse(tokens, parent_h) + future)
            positions.append(root_row[:, None] + depth)
            hid, logits = self._draft_pass(inputs, positions, real, root_row, tree_anc)
            return hid[:, base + n_old :], logits[:, base + n_old :]

        pool = grow_tree(root_logp, root_hidden, run_rows, k, big_d)
        return self._select(*pool)

    def _draft_pass(self, inputs, positions, real, root_row, tree_anc):
        x = torch.cat(inputs, 1)
        pos = torch.cat(positions, 1)
        b, r = x.shape[:2]
        m = real.shape[1]
        dev = x.device
        allowed = torch.zeros(b, r, r, dtype=torch.bool, device=dev)
        rows = torch.arange(m, device=dev)
        allowed[:, :m, :m] = torch.tril(torch.ones(m, m, dtype=torch.bool, device=dev))[None] & real[:, None, :]
        n = r - m
        if n:
            upto_root = (rows[None, :] <= root_row[:, None]) & real
            allowed[:, m:, :m] = upto_root[:, None, :]
            allowed[:, m:, m:] = tree_anc
        allowed |= torch.eye(r, dtype=torch.bool, device=dev)
        return self.head.run(x, allowed, pos)

    def _select(self, tok, par, dep, score):
        """The best `nodes` of the pool [B, P] as a tree: tokens, ancestor-or-self matrix, depths."""
        b, p = tok.shape
        t = self.tree.nodes
        # best T by score, ties to the shallower node; then ordered by depth so parents precede children
        key = score - 1e-6 * dep.float()
        chosen = key.topk(t, dim=-1).indices
        order = (dep.gather(1, chosen) * p + torch.arange(t)[None]).argsort(1)
        chosen = chosen.gather(1, order)
        index_in_tree = torch.full((b, p), -1, dtype=torch.long)
        index_in_tree.scatter_(1, chosen, torch.arange(t)[None].expand(b, -1))
        tokens = tok.gather(1, chosen)
        parent_pool = par.gather(1, chosen)
        parent = torch.where(parent_pool >= 0, index_in_tree.gather(1, parent_pool.clamp(min=0)), -1)
        if bool(((parent_pool >= 0) & (parent < 0)).any()):
            raise RuntimeError("draft tree not closed under ancestors")
        depth = dep.gather(1, chosen)
        return tokens, ancestors(parent), depth

    # ---------------------------------------------------------------- the loop
    @torch.no_grad()
    def decode(self, ids, mask, *, max_new_tokens: int, temperature: float, uniforms: torch.Tensor, eos: int, pad: int):
        """Decode left-padded prompts; `uniforms` [B, max_new_tokens] float64 are the draws of the target's
        tokens (token g of a row uses column g). Without a head every cycle verifies an empty tree."""
        b = ids.shape[0]
        width = int(mask.sum(1).max()) + max_new_tokens + 1
        buf, lengths = _left_align(ids, mask, width, pad)
        feats = None
        f = None
        generated = [[] for _ in range(b)]
        accepted = [[] for _ in range(b)]
        cycles = np.zeros(b, dtype=int)
        done = torch.zeros(b, dtype=torch.bool)
        n_forwards = n_draft = 0
        # prefill: the prompt (and ConFu's root contemplate token) -> the first token, features, f
        empty = torch.zeros(b, 0, dtype=torch.long)
        no_anc = torch.zeros(b, 0, 0, dtype=torch.bool)
        # the contemplate token's router reads the features of the token before the last: a plain pass first
        cols = torch.arange(width)[None]
        plain = masked_forward(
            self.target,
            causal_allowed((cols < lengths[:, None]).long()),
            cols.expand(b, -1),
            input_ids=buf,
            layers=self.layers,
        )
        root, _, feats, _, f = self._verify(buf, lengths, plain.features, empty, no_anc, empty)
        first = self._draw(root, temperature, uniforms[:, 0])
        buf[torch.arange(b), lengths] = first
        lengths = lengths + 1
        for i in range(b):
            generated[i].append(int(first[i]))
        done |= first == eos
        done |= torch.tensor([len(g) >= max_new_tokens for g in generated])
        f = f[:, :1] if f is not None else None
        while not bool(done.all()):
            live = (~done).nonzero().flatten()
            if self.head is not None:
                f_live = f[live] if f is not None else None
                tokens, anc, depth = self._draft(buf[live], lengths[live], feats[live], f_live)
                n_draft += self.tree.depth
            else:
                tokens = torch.zeros(len(live), 0, dtype=torch.long)
                anc = torch.zeros(len(live), 0, 0, dtype=torch.bool)
                depth = torch.zeros(len(live), 0, dtype=torch.long)
            root, node_logits, fbuf, fnodes, fcand = self._verify(
                buf[live], lengths[live], feats[live], tokens, anc, depth
            )
            n_forwards += 1
            parent = _parents(anc, depth)
            gen_done = torch.tensor([len(generated[i]) for i in live.tolist()])
            path, bonus = self._walk(root, node_logits, tokens, parent, temperature, uniforms[live], gen_done)
            for r, i in enumerate(live.tolist()):
                cycles[i] += 1
                nodes = path[r]
                accepted[i].append(len(nodes))
                new = [int(tokens[r, n]) for n in nodes] + [int(bonus[r])]
                room = max_new_tokens - len(generated[i])
                new = new[:room]
                if eos in new:
                    new = new[: new.index(eos) + 1]
                    done[i] = True
                L = int(lengths[i])
                buf[i, L : L + len(new)] = torch.tensor(new)
                # features: the buffer's up to the old last token, then the accepted nodes'
                feats[i, :L] = fbuf[r, :L]
                for q, n in enumerate(nodes[: len(new) - 1] if len(new) > len(nodes) else nodes[: len(new)]):
                    feats[i, L + q] = fnodes[r, n]
                lengths[i] = L + len(new)
                generated[i] += new
                if len(generated[i]) >= max_new_tokens:
                    done[i] = True
                if fcand is not None:
                    f[i, 0] = fcand[r, 1 + nodes[-1]] if nodes else fcand[r, 0]
        return Decoded(generated, cycles, accepted, n_forwards, n_draft)

    def _draw(self, logits, temperature, u):
        if temperature == 0:
            return logits.argmax(-1)
        logp = torch.log_softmax(logits.float() / temperature if temperature != 1 else logits.float(), -1)
        return inverse_cdf(logp, u.double().reshape(-1, 1).contiguous())

    def _walk(self, root, node_logits, tokens, parent, temperature, uniforms, generated):
        """Accepted node indices per row and the bonus token (step 3 of the module docstring)."""
        b, t = tokens.shape
        cur = torch.full((b,), -1, dtype=torch.long)
        stopped = torch.zeros(b, dtype=torch.bool)
        path = [[] for _ in range(b)]
        bonus = torch.zeros(b, dtype=torch.long)
        width = uniforms.shape[1]
        for step in range(self.tree.depth + 1 if t else 1):
            logits = (
                root
                if step == 0
                else node_logits.gather(1, cur.clamp(min=0)[:, None, None].expand(-1, 1, node_logits.shape[-1]))[:, 0]
            )
            col = (generated + step).clamp(max=width - 1)
            draw = self._draw(logits, temperature, uniforms.gather(1, col[:, None])[:, 0])
            match = (parent == cur[:, None]) & (tokens == draw[:, None]) if t else torch.zeros(b, 0, dtype=torch.bool)
            found = match.any(1) & ~stopped
            newly_stopped = ~found & ~stopped
            bonus = torch.where(newly_stopped, draw, bonus)
            stopped |= newly_stopped
            nxt = match.float().argmax(1) if t else cur
            for r in found.nonzero().flatten().tolist():
                path[r].append(int(nxt[r]))
            cur = torch.where(found, nxt, cur)
            if bool(stopped.all()):
                break
        return path, bonus


def grow_pool(pool, logp, parent_score, parent_idx, k: int, depth: int):
    """One level of the draft tree: each of the P frontier nodes proposes its top-k tokens (logp [B, P, V]); the
    B x P k candidates join the pool (token, parent pool index, depth, cumulative log-prob; `pool` is a 4-tuple of
    [B, n] tensors or of Nones at the root) and the k best by cumulative log-prob become the next frontier.
    Returns the grown pool's four tensors and the frontier's pool indices [B, k]."""
    top_lp, top_tok = logp.topk(k, dim=-1)  # [B, P, k]
    cand_score = (parent_score[..., None] + top_lp).flatten(1)
    cand_tok = top_tok.flatten(1)
    cand_par = parent_idx[..., None].expand(-1, -1, k).flatten(1)
    new = (cand_tok, cand_par, torch.full_like(cand_tok, depth), cand_score)
    first = 0 if pool[0] is None else pool[0].shape[1]
    grown = new if pool[0] is None else tuple(torch.cat(pair, 1) for pair in zip(pool, new))
    return (*grown, first + cand_score.topk(k, dim=-1).indices)


def grow_tree(root_logp, root_hidden, run_rows, k: int, depth: int):
    """The draft tree's pool, grown depth by depth: the one tree builder of the uncached and the cached decoder
    (`SpecDecoder._draft`, `CachedSpecDecoder._draft`), which differ only in how the draft runs the new rows.

    root_logp [B, 1, V], root_hidden [B, 1, H]: the draft's law and output at the root row. At depth d > 1 the k
    frontier nodes of depth d - 1 become tree rows: `run_rows(tokens [B, k], parent_h [B, k, H], depths [B, k],
    tree_anc [B, n + k, n + k], n)` runs them (n: the tree rows before them; tree_anc: ancestor-or-self among all
    tree rows) and returns their outputs and logits [B, k, H], [B, k, V]. Returns the pool's (tokens, parent pool
    index, depth, cumulative log-prob), [B, P] each, for `SpecDecoder._select`."""
    b, dev = root_logp.shape[0], root_logp.device
    pool = (None, None, None, None)
    logp = root_logp
    parent_score = torch.zeros(b, 1, device=dev)
    parent_idx = torch.full((b, 1), -1, dtype=torch.long, device=dev)
    row_of = torch.full((b, k + (depth - 1) * k * k), -1, dtype=torch.long, device=dev)  # pool index -> tree row
    tree_anc = torch.zeros(b, 0, 0, dtype=torch.bool, device=dev)
    hidden_rows = root_hidden[:, :0]
    frontier = None  # pool indices [B, k]
    for d in range(1, depth + 1):
        if d > 1:
            pool_tok, pool_par, pool_depth, pool_score = pool
            n_old = tree_anc.shape[1]
            grown = torch.zeros(b, n_old + k, n_old + k, dtype=torch.bool, device=dev)
            grown[:, :n_old, :n_old] = tree_anc
            if d > 2:  # the parents are tree rows: their outputs and ancestors
                prow = row_of.gather(1, pool_par.gather(1, frontier))  # [B, k]
                parent_h = hidden_rows.gather(1, prow[..., None].expand(-1, -1, hidden_rows.shape[-1]))
                grown[:, n_old:, :n_old] = tree_anc.gather(1, prow[..., None].expand(-1, -1, n_old))
            else:  # the depth-1 nodes' parent is the root row
                parent_h = root_hidden.expand(-1, k, -1)
            grown[:, n_old:, n_old:] = torch.eye(k, dtype=torch.bool, device=dev)
            tree_anc = grown
            row_of.scatter_(1, frontier, (n_old + torch.arange(k, device=dev)).expand(b, -1))
            hid, logits = run_rows(pool_tok.gather(1, frontier), parent_h, pool_depth.gather(1, frontier), grown, n_old)
            hidden_rows = torch.cat([hidden_rows, hid], 1)
            logp = torch.log_softmax(logits.float(), -1)  # [B, k, V]
            parent_score = pool_score.gather(1, frontier)
            parent_idx = frontier
        *pool, frontier = grow_pool(pool, logp, parent_score, parent_idx, k, d)
        pool = tuple(pool)
    return pool


def ancestors(parent: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix [B, T, T] from parent indices [B, T] (-1: a child of the root; parents first)."""
    b, t = parent.shape
    anc = torch.eye(t, dtype=torch.bool).repeat(b, 1, 1)
    for i in range(t):
        p = parent[:, i]
        has = p >= 0
        if bool(has.any()):
            rows = anc[torch.arange(b), p.clamp(min=0)]
            anc[:, i] |= rows & has[:, None]
    return anc


def _parents(anc: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Parent index per node from the ancestor matrix and depths (-1 for depth 1)."""
    b, t = depth.shape
    if t == 0:
        return torch.zeros(b, 0, dtype=torch.long)
    is_parent = anc & (depth[:, None, :] == depth[:, :, None] - 1)
    return torch.where(is_parent.any(-1), is_parent.float().argmax(-1), -1)
