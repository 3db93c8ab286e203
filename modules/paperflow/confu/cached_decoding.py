"""The paper path's speculative decoder: `SpecDecoder`'s draft tree and acceptance rule, with the target's KV cache
kept across cycles (EAGLE's practice), at batch 1.

The uncached `SpecDecoder.decode` re-reads [soft prompts] + every committed token + the tree in each cycle; here:
1. Prefill once: ConFu's soft prompts (causal among themselves) and the prompt but its last token (causal, blind to
   the soft prompts) go into a `transformers.DynamicCache`.
2. Each cycle the target reads only the new positions against the cache: the last committed token (the tree's root,
   not read yet: the previous cycle's bonus, or the prompt's last token), the `nodes` drafted tokens and, for ConFu,
   one contemplate token for the root and for every node. Positions: the root at its column L - 1, a node at
   L - 1 + depth, a contemplate token one further (as in `SpecDecoder._verify`). Mask: regular tokens see the cached
   prefix (not the soft prompts), the root and their tree ancestors; contemplate tokens see the soft prompts, the
   prefix, the root and their node's ancestors; every row itself. The same pattern as the uncached pass, so the
   logits are the same up to floating-point summation order.
3. Accept with `SpecDecoder._walk` (argmax at T = 0, the inverse CDF at the row's uniforms at T > 0).
4. The cache keeps the soft prompts, the prefix, the root and the accepted path's entries (gathered in path order,
   which is position order), the rest is cut; the new bonus token is the next cycle's root.

The draft builds `SpecDecoder._draft`'s tree with the same builder (`decoding.grow_tree`) and its one decoder
layer's keys and values cached too: a committed row is run once, each depth runs only its k new rows, and the
tree rows are cut after the cycle.

The smoke scale keeps `SpecDecoder.decode` (batched, uncached); the tests hold this decoder to it (same tokens,
accepted depths, cycles, trees and draft inputs) and to the target's greedy output.
"""

from __future__ import annotations

import numpy as np
import torch

from paperflow.confu.decoding import Decoded, SpecDecoder, _left_align, _parents, grow_tree
from paperflow.confu.model import control
from paperflow.core.lm.sampling import cache_argument


class CachedSpecDecoder(SpecDecoder):
    """`SpecDecoder` with KV caches: one prefill, then per cycle the target reads 1 + nodes regular tokens (+ 1 +
    nodes contemplate tokens for ConFu) against its cache, the draft only its new rows. Batch 1 (the paper path's
    setting)."""

    def _forward(self, cache, inputs, allowed, positions):
        """The target on `inputs` [1, q, h] at `positions` [1, q] against `cache` (appended to), `allowed`
        [1, q, cached + q]. Returns (logits float [1, q, V], features [1, q, F])."""
        out = self.target(
            inputs_embeds=inputs,
            attention_mask=allowed[:, None],
            position_ids=positions,
            output_hidden_states=True,
            use_cache=True,
            **{cache_argument(self.target): cache},
        )
        return out.logits.float(), torch.cat([out.hidden_states[int(i)] for i in self.layers], -1)

    def _step(self, cache, buf, length, feats, tokens, anc, depth):
        """One verification pass against the cache ([soft] + committed[:length - 1]): the root (committed token
        length - 1), the tree's nodes and (ConFu) the contemplate tokens. Returns (root logits [1, V], node logits
        [1, T, V], root features [1, F], node features [1, T, F], f candidates [1, 1 + T, h] or None)."""
        dev = buf.device
        t = tokens.shape[1]
        ns = self.head.cfg.n_soft if self.confu else 0
        nc = (1 + t) if self.confu else 0
        past = cache.get_seq_length()
        if past != ns + length - 1:
            raise RuntimeError(f"target cache holds {past} positions, expected {ns + length - 1}")
        parts = [self.emb(buf[:, length - 1 : length]), self.emb(tokens)]
        if nc:
            last_known = feats[:, max(length - 2, 0)][:, None]
            parts.append(self.head.moe_con(last_known).expand(-1, nc, -1))
        inputs = torch.cat(parts, 1)
        q = 1 + t + nc
        allowed = torch.zeros(1, q, past + q, dtype=torch.bool, device=dev)
        allowed[:, :, ns:past] = True  # every new row sees the committed prefix
        allowed[:, :, past] = True  # and the root
        allowed[:, 1 : 1 + t, past + 1 : past + 1 + t] = anc
        if nc:
            c0 = past + 1 + t  # the contemplate tokens' first key column
            allowed[:, 1 + t :, :ns] = True
            allowed[:, 2 + t :, past + 1 : past + 1 + t] = anc
            allowed[:, :, past:] |= torch.eye(q, dtype=torch.bool, device=dev)
            allowed[:, 1 + t :, c0:] = torch.eye(nc, dtype=torch.bool, device=dev)
        root_pos = torch.full((1, 1), length - 1, dtype=torch.long, device=dev)
        pos = [root_pos, root_pos + depth]
        if nc:
            pos += [root_pos + 1, root_pos + 1 + depth]
        logits, fe = self._forward(cache, inputs, allowed, torch.cat(pos, 1))
        f = self.head.fc_f(fe[:, 1 + t :]) if nc else None
        return logits[:, 0], logits[:, 1 : 1 + t], fe[:, 0], fe[:, 1 : 1 + t], f

    # ---------------------------------------------------------------- draft side, with the draft layer's cache
    def _draft(self, buf, lengths, feats, f):
        """`SpecDecoder._draft` (same tree) with the draft layer's keys and values cached: a prefix row j (reads
        x_{j+1} and g_j, committed) is run once, in the cycle that commits it; within a cycle each depth runs only
        its k new tree rows. The draft has one decoder layer, so a row's keys and values depend on its own input
        alone (ConFu's f enters only the drafted rows). After the tree is drafted, the tree rows are cut from the
        cache."""
        head, k, big_d = self.head, self.tree.top_k, self.tree.depth
        dev = buf.device
        cache, c = self._dcache, self._drows
        root = int(lengths[0]) - 2  # the root row: reads the last committed token and the features before it
        if cache.get_seq_length() != c or root < c:
            raise RuntimeError(f"draft cache holds {cache.get_seq_length()} rows (expected {c}), root row {root}")
        g = head.g(control(feats[:, c : root + 1], self.controls.features))
        new_in = head.fuse(buf[:, c + 1 : root + 2], g)  # rows c .. root
        n_new = root + 1 - c
        future = 0.0  # what f adds to each drafted row's input (ConFu; EAGLE-3 rows otherwise)
        if self.confu and self.controls.slot:
            future = head.future(new_in[:, -1:], control(f, self.controls.f))
        allowed = torch.zeros(1, n_new, c + n_new, dtype=torch.bool, device=dev)
        allowed[:, :, :c] = True
        allowed[:, :, c:] = torch.tril(torch.ones(n_new, n_new, dtype=torch.bool, device=dev))
        hid, logits = head.run(new_in, allowed, torch.arange(c, root + 1, device=dev)[None], cache=cache)
        self._drows = root + 1
        base = root + 1  # the cache's first tree row
        root_logp = torch.log_softmax(logits[:, n_new - 1 : n_new].float(), -1)  # [1, 1, V]

        def run_rows(tokens, parent_h, depth, tree_anc, n_old):
            # only the k new tree rows, against the cached prefix rows and the tree rows so far
            allowed = torch.zeros(1, k, base + n_old + k, dtype=torch.bool, device=dev)
            allowed[:, :, :base] = True  # the prefix rows up to the root row
            allowed[:, :, base:] = tree_anc[:, n_old:]
            return head.run(head.fuse(tokens, parent_h) + future, allowed, root + depth, cache=cache)

        pool = grow_tree(root_logp, hid[:, n_new - 1 : n_new], run_rows, k, big_d)
        self._keep(cache, torch.arange(self._drows, device=dev))  # the tree rows go
        return self._select(*pool)

    @staticmethod
    def _keep(cache, keep: torch.Tensor) -> None:
        """Keep only the cache positions `keep` (ascending) in every layer."""
        for layer in cache.layers:
            if type(layer).__name__ != "DynamicLayer":
                raise TypeError(f"target cache layer {type(layer).__name__}: only full (non-sliding) layers are kept")
            layer.keys = layer.keys.index_select(-2, keep.to(layer.keys.device))
            layer.values = layer.values.index_select(-2, keep.to(layer.values.device))

    @torch.no_grad()
    def decode(self, ids, mask, *, max_new_tokens: int, temperature: float, uniforms: torch.Tensor, eos: int, pad: int):
        """As `SpecDecoder.decode` (same arguments, same `Decoded`), for one prompt; `extra["target_tokens"]` lists
        the tokens the target read per forward (the prefill first)."""
        from transformers import DynamicCache

        if ids.shape[0] != 1:
            raise ValueError(f"CachedSpecDecoder decodes one prompt at a time (batch 1), got {ids.shape[0]}")
        if self.controls.leak:
            raise ValueError("CachedSpecDecoder has no leak control (its cached prefix never sees the soft prompts)")
        width = int(mask.sum(1).max()) + max_new_tokens + 1
        buf, lengths = _left_align(ids, mask, width, pad)
        length = int(lengths[0])
        if length < 2:
            raise ValueError("CachedSpecDecoder needs a prompt of at least two tokens")
        dev = buf.device
        ns = self.head.cfg.n_soft if self.confu else 0
        cache = DynamicCache()
        self._dcache, self._drows = DynamicCache(), 0  # the draft layer's cache (`_draft`)
        # prefill: [soft] + the prompt but its last token, the soft prompts causal, the prompt causal and blind to them
        m = length - 1
        inputs = [self.emb(buf[:, :m])]
        if ns:
            inputs.insert(0, self.head.soft[None])
        allowed = torch.zeros(1, ns + m, ns + m, dtype=torch.bool, device=dev)
        allowed[:, :ns, :ns] = torch.tril(torch.ones(ns, ns, dtype=torch.bool, device=dev))
        allowed[:, ns:, ns:] = torch.tril(torch.ones(m, m, dtype=torch.bool, device=dev))
        pos = torch.cat([torch.arange(ns, device=dev), torch.arange(m, device=dev)])[None]
        _, fe = self._forward(cache, torch.cat(inputs, 1), allowed, pos)
        feats = torch.zeros(1, width, fe.shape[-1], dtype=fe.dtype, device=dev)
        feats[:, :m] = fe[:, ns:]
        seen = [ns + m]
        generated, accepted, cycles = [], [], np.zeros(1, dtype=int)
        n_forwards = n_draft = 0
        empty = torch.zeros(1, 0, dtype=torch.long)
        root, _, froot, _, f = self._step(
            cache, buf, length, feats, empty, torch.zeros(1, 0, 0, dtype=torch.bool), empty
        )
        seen.append(1 + (1 if self.confu else 0))
        feats[:, length - 1] = froot
        first = int(self._draw(root, temperature, uniforms[:, 0])[0])
        self._keep(cache, torch.arange(ns + length, device=dev))  # the root stays, its contemplate token goes
        buf[0, length] = first
        length += 1
        generated.append(first)
        f = f[:, :1] if f is not None else None
        done = first == eos or len(generated) >= max_new_tokens
        while not done:
            if self.head is not None:
                tokens, anc, depth = self._draft(buf, torch.tensor([length]), feats, f)
                n_draft += self.tree.depth
            else:
                tokens, anc, depth = empty, torch.zeros(1, 0, 0, dtype=torch.bool), empty
            before = cache.get_seq_length()
            root, node_logits, froot, fnodes, fcand = self._step(cache, buf, length, feats, tokens, anc, depth)
            seen.append(cache.get_seq_length() - before)
            n_forwards += 1
            parent = _parents(anc, depth)
            gen_done = torch.tensor([len(generated)])
            path, bonus = self._walk(root, node_logits, tokens, parent, temperature, uniforms, gen_done)
            nodes = path[0]
            cycles[0] += 1
            accepted.append(len(nodes))
            new = [int(tokens[0, n]) for n in nodes] + [int(bonus[0])]
            new = new[: max_new_tokens - len(generated)]
            if eos in new:
                new = new[: new.index(eos) + 1]
                done = True
            last = length - 1
            buf[0, length : length + len(new)] = torch.tensor(new)
            feats[:, last] = froot
            for q, n in enumerate(nodes[: len(new) - 1] if len(new) > len(nodes) else nodes[: len(new)]):
                feats[:, length + q] = fnodes[:, n]
            # the cache: [soft] + prefix + root, then the accepted nodes' entries; the rest of the tree is cut
            keep = torch.cat([torch.arange(before + 1), before + 1 + torch.tensor(nodes, dtype=torch.long)])
            self._keep(cache, keep.to(dev))
            length += len(new)
            generated += new
            if len(generated) >= max_new_tokens:
                done = True
            if fcand is not None:
                f[:, 0] = fcand[:, 1 + nodes[-1]] if nodes else fcand[:, 0]
        return Decoded([generated], cycles, [accepted], n_forwards, n_draft, extra={"target_tokens": seen})
