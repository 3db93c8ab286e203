"""ConFu (spec sections 10 and 11): lossless tree decoding against plain greedy decoding, transformers' `generate`
and assisted generation; the sample path at T = 1 and the two-token law (chi-square); the no-leak invariant of the
soft prompts and contemplate tokens (and its negative control); the reduction of ConFu to EAGLE-3; one-pass tree
verification against per-path verification, for regular and contemplate tokens; anchor training against full
insertion; training-time test against the inference-time draft chain; the metrics' closed forms (tau = D + 1 for
a perfect chain draft, tau = 1 for an always-wrong one); the metrics table and the config's claims judged on it;
config errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import chisquare

from paperflow.confu import training as tr
from paperflow.confu.claims import depth_acceptance, metrics_table, tau
from paperflow.confu.decoding import Controls, SpecDecoder, TreeConfig, ancestors
from paperflow.confu.model import DraftConfig, DraftHead, load_head, save_head
from paperflow.confu.problems import make_problems, world_of
from paperflow.confu.stages import uniforms
from paperflow.core.claims import CONTROL_HOLDS, HELD, INCONCLUSIVE, NO_DATA, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import masked_forward, position_ids_from_mask, sample

WORLD = DigitWorld.from_config({"sorting": {"min_len": 4, "max_len": 7}, "key_value": {"n_pairs": 3, "n_queries": 3}})
TOK = WORLD.tokenizer()
V = len(TOK)
H = 32
LAYERS = (1, 2, 3)
EOS, PAD = TOK.eos_token_id, TOK.pad_token_id


def _target(seed: int = 0):
    spec = {
        "arch": "llama",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 64,
    }
    return build_model(spec, seed).eval()


def _head(target, kind: str, seed: int = 1, **kw):
    cfg = DraftConfig(kind, H, V, LAYERS, 4, 64, 64, **kw)
    head = DraftHead(cfg, target.get_input_embeddings().weight, seed=seed).eval()
    if kind == "confu":  # random heads draft near-uniformly; sharpen so that trees hold deep nodes
        with torch.no_grad():
            head.body.lm_head.weight.mul_(30)
        _grow_f_path(head)
    return head


def _grow_f_path(head, seed: int = 2):
    """What training does to a new ConFu head: its f path (fc_f and the [f] experts, zero at first) becomes live."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.fc_f.weight.copy_(torch.randn(head.fc_f.weight.shape, generator=g) * 0.3)
        head.moe_f.experts.copy_(torch.randn(head.moe_f.experts.shape, generator=g) * 0.3)
    return head


def _prompts(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    exs = WORLD.sample("sorting", n // 2, rng) + WORLD.sample("key_value", n - n // 2, rng)
    return WORLD.encode(TOK, exs)


def _decode(target, head, enc, temperature=0.0, max_new=10, controls=None, tree=(6, 2, 3), seed=3):
    dec = SpecDecoder(target, head, TreeConfig(*tree), LAYERS, controls)
    u = uniforms(enc.prompt_ids.shape[0], max_new, seed)
    return dec.decode(
        enc.prompt_ids, enc.prompt_mask, max_new_tokens=max_new, temperature=temperature, uniforms=u, eos=EOS, pad=PAD
    )


def _kit(target, enc, temperature, max_new=10, seed=3, eos=EOS):
    g = torch.Generator().manual_seed(seed) if temperature else None
    r = sample(
        target,
        enc.prompt_ids,
        enc.prompt_mask,
        max_new_tokens=max_new,
        temperature=temperature,
        generator=g,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    return [[int(t) for t, m in zip(row, mk) if m] for row, mk in zip(r.completion_ids, r.completion_mask)]


# ---------------------------------------------------------------- acceptance check 1 and section 11: lossless, T = 0
@pytest.mark.parametrize("kind", ["vanilla", "eagle3", "confu"])
def test_greedy_tree_decoding_equals_plain_greedy_generate_and_assisted_generation(kind):
    target = _target()
    enc = _prompts()
    out = _decode(target, _head(target, kind), enc)
    assert out.tokens == _kit(target, enc, 0.0)
    assert sum(map(sum, out.accepted)) > 0  # the drafts were accepted sometimes: the tree path was exercised
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=EOS, pad_token_id=PAD)
    assistant = build_model({"arch": "llama", **_spec_keys(target), "num_hidden_layers": 1}, 5)
    for i in range(4):
        ids = enc.prompt_ids[i : i + 1][:, enc.prompt_mask[i].bool()]
        plain = model_tokens(target.generate(ids, generation_config=gen), ids)
        helped = model_tokens(target.generate(ids, generation_config=gen, assistant_model=assistant.eval()), ids)
        assert out.tokens[i] == plain == helped


def _spec_keys(target):
    c = target.config
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "max_position_embeddings": c.max_position_embeddings,
    }


def model_tokens(generated, ids):
    row = generated[0, ids.shape[1] :].tolist()
    return row[: row.index(EOS) + 1] if EOS in row else row


# ---------------------------------------------------------------- acceptance check 2: T = 1
@pytest.mark.parametrize("kind", ["eagle3", "confu"])
def test_sampling_follows_the_targets_own_sample_path_with_the_same_uniforms(kind):
    target = _target()
    enc = _prompts()
    out = _decode(target, _head(target, kind), enc, temperature=1.0)
    assert out.tokens == _kit(target, enc, 1.0)


@pytest.mark.parametrize("kind", ["eagle3", "confu"])
def test_first_two_tokens_follow_the_targets_law_chi_square(kind):
    """20k decodings of one prefix at T = 1 (with and without contemplate tokens): the empirical law of the first
    two tokens against p(t1) p(t2 | t1) computed from the target, chi-square p > 0.01."""
    target = _target(seed=4)
    enc = _prompts(1)
    n = 10_000  # the spec's 20k halved for CI time; the sample-path test above checks every draw exactly
    ids, mask = enc.prompt_ids.repeat(n, 1), enc.prompt_mask.repeat(n, 1)
    dec = SpecDecoder(target, _head(target, kind), TreeConfig(4, 2, 2), LAYERS)
    u = torch.rand(n, 2, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    out = dec.decode(ids, mask, max_new_tokens=2, temperature=1.0, uniforms=u, eos=-1, pad=PAD)
    pairs = np.array([t[:2] for t in out.tokens])
    with torch.no_grad():
        p1 = torch.softmax(target(input_ids=enc.prompt_ids).logits[0, -1].double(), -1)
        ext = torch.cat([enc.prompt_ids.repeat(V, 1), torch.arange(V)[:, None]], 1)
        p2 = torch.softmax(target(input_ids=ext).logits[:, -1].double(), -1)
    law = (p1[:, None] * p2).numpy().ravel()
    counts = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
    big = law * n >= 5
    obs, exp = counts[big], law[big] * n
    if (~big).any():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, law[~big].sum() * n)
    assert chisquare(obs, exp).pvalue > 0.01
    assert sum(map(sum, out.accepted)) > 0


# ---------------------------------------------------------------- acceptance check 3: no leak
def test_soft_prompts_and_contemplate_tokens_leave_the_regular_logits_unchanged_and_the_leak_control_does_not():
    target = _target()
    head = _head(target, "confu")
    enc = _prompts(6)
    ids, mask = enc.prompt_ids, enc.prompt_mask
    feats = tr.target_pass(target, ids, mask, LAYERS)
    anchors = torch.tensor([[ids.shape[1] - 2, ids.shape[1] - 1, -1]] * ids.shape[0])
    with torch.no_grad():
        logits, _ = tr.contemplate_pass(target, head, ids, mask, feats.features, anchors, LAYERS)
        leaked, _ = tr.contemplate_pass(target, head, ids, mask, feats.features, anchors, LAYERS, leak=True)
    real = mask.bool()
    assert (logits[real] - feats.logits[real]).abs().max() < 1e-5
    assert (leaked[real] - feats.logits[real]).abs().max() > 1e-3


def test_a_leaking_verifier_loses_losslessness():
    target = _target()
    enc = _prompts(16)
    head = _head(target, "confu")
    assert _decode(target, head, enc).tokens == _kit(target, enc, 0.0)
    assert _decode(target, head, enc, controls=Controls(leak=True)).tokens != _kit(target, enc, 0.0)


# ---------------------------------------------------------------- acceptance check 4: reductions
def test_a_new_confu_head_drafts_and_trains_exactly_as_the_eagle3_head_it_was_built_from(tmp_path):
    """The f path starts at zero: ConFu built from an EAGLE-3 head drafts the same trees and, in training-time test
    with anchors, gives the same logits and the same loss (every row trained, those without f as EAGLE-3 trains
    them). Once its f path is live (the negative control), the training logits differ."""
    target = _target()
    eagle = _head(target, "eagle3")
    path = save_head(eagle, tmp_path / "e3.safetensors", {"seed": 1})
    confu = load_head(path, kind="confu")
    enc = _prompts()
    a = _decode(target, eagle, enc)
    for ctl in (None, Controls(slot=False), Controls(f="shuffle")):
        b = _decode(target, confu, enc, controls=ctl)
        assert a.tokens == b.tokens and a.accepted == b.accepted and (a.cycles == b.cycles).all()
    ids, mask = enc.prompt_ids, enc.prompt_mask
    resp = tr.response_mask(mask, mask.sum(1) - 5)
    anchors = tr.sample_anchors(mask[:, 1:].bool(), 3, torch.Generator().manual_seed(0))
    la, loss_a = _ttt_logits(eagle, target, ids, mask, resp, None, window=3, steps=3)
    lb, loss_b = _ttt_logits(confu, target, ids, mask, resp, anchors, window=3, steps=3)
    for x, y in zip(la, lb):
        assert torch.equal(x, y)
    assert torch.equal(loss_a, loss_b)
    lc, loss_c = _ttt_logits(_grow_f_path(confu), target, ids, mask, resp, anchors, window=3, steps=3)
    assert torch.equal(la[0], lc[0])  # the root rows read g alone
    assert not torch.allclose(la[1], lc[1], atol=1e-3) and not torch.allclose(loss_a, loss_c)


def test_confus_loss_covers_every_row_not_only_those_an_anchor_covers(tmp_path):
    """With the f path live and one anchor near the end, the rows no anchor covers still carry loss (their logits
    get gradient), and with no anchor at all ConFu's loss is EAGLE-3's from the same weights."""
    target = _target()
    eagle = _head(target, "eagle3")
    confu = _grow_f_path(load_head(save_head(eagle, tmp_path / "e3.safetensors", {"seed": 1}), kind="confu"))
    enc = _prompts(4)
    ids, mask = enc.prompt_ids, enc.prompt_mask
    m = ids.shape[1] - 1
    resp = tr.response_mask(mask, mask.sum(1) - 8)
    one = torch.full((ids.shape[0], 1), m - 4)
    covered = tr.future_index(one, m, 1, 1) >= 0
    got = []
    orig = confu.run

    def capture(*a, **k):
        out = orig(*a, **k)
        out[1].retain_grad()
        got.append(out[1])
        return out

    confu.run = capture
    loss, _ = tr.ttt_loss(confu, target, ids, mask, resp, steps=2, decay=0.8, layers=LAYERS, anchors=one, window=1)
    confu.run = orig
    loss.backward()
    trained = got[1].grad.abs().sum(-1) > 0  # step 1's rows that carry loss
    assert (trained & covered).any() and (trained & ~covered).sum() > (trained & covered).sum()
    none = torch.full_like(one, -1)
    l_none, _ = tr.ttt_loss(confu, target, ids, mask, resp, steps=2, decay=0.8, layers=LAYERS, anchors=none)
    l_eagle, _ = tr.ttt_loss(eagle, target, ids, mask, resp, steps=2, decay=0.8, layers=LAYERS)
    assert torch.equal(l_none, l_eagle) and not torch.allclose(loss, l_none, atol=1e-4)


@pytest.mark.parametrize("kind", ["eagle3", "confu"])
def test_gradient_checkpointing_gives_the_same_loss_and_head_gradients(kind):
    """`draft.gradient_checkpointing` (the paper scale's memory saver: the contemplate pass's target layers and each
    TTT step's LM head and soft cross-entropy recomputed in the backward pass) changes neither the loss, the logs
    nor any gradient of the head; the memory it saves is measured by tools/measure/confu_step_memory.py."""
    target = _target()
    head = _head(target, kind)
    enc = _prompts(4)
    ids, mask = enc.prompt_ids, enc.prompt_mask
    resp = tr.response_mask(mask, mask.sum(1) - 8)
    m = ids.shape[1] - 1
    anchors = torch.tensor([[m - 9, m - 5], [m - 6, -1], [m - 4, m - 8], [m - 7, m - 3]]) if kind == "confu" else None
    got = []
    for ck in (False, True):
        head.zero_grad(set_to_none=True)
        loss, logs = tr.ttt_loss(
            head, target, ids, mask, resp, steps=3, decay=0.8, layers=LAYERS, anchors=anchors, window=2, checkpoint=ck
        )
        loss.backward()
        grads = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
        got.append((loss.detach(), logs, grads))
    (l0, logs0, g0), (l1, logs1, g1) = got
    assert torch.allclose(l0, l1, rtol=1e-6, atol=1e-7) and logs0 == logs1
    assert g0.keys() == g1.keys() and len(g0) > 5
    if kind == "confu":
        assert {"soft", "moe_con.experts", "fc_f.weight"} <= g0.keys()  # through the checkpointed target layers
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-5, atol=1e-7), n
    assert all(not hasattr(layer, "__dict__") or "forward" not in vars(layer) for layer in target.modules())


def _ttt_logits(head, target, ids, mask, resp, anchors, window=1, steps=2):
    got = []
    orig = head.run

    def capture(*a, **k):
        out = orig(*a, **k)
        got.append(out[1][:, : ids.shape[1] - 1].detach())
        return out

    head.run = capture
    loss, logs = tr.ttt_loss(
        head, target, ids, mask, resp, steps=steps, decay=0.8, layers=LAYERS, anchors=anchors, window=window
    )
    head.run = orig
    return got, loss


def test_anchor_training_with_every_anchor_and_l_1_equals_full_insertion_one_anchor_at_a_time():
    """K_train = N, l = 1: every row sees the f of its own context; the result equals running each anchor alone
    (contemplate tokens do not see each other, so inserting all of them at once changes nothing)."""
    target = _target()
    head = _head(target, "confu")
    enc = _prompts(4)
    ids, mask = enc.prompt_ids, enc.prompt_mask
    m = ids.shape[1] - 1
    resp = torch.ones_like(mask) * mask
    rows = torch.arange(m - 1)[None].expand(ids.shape[0], -1)
    every = rows.masked_fill(~mask[:, : m - 1].bool(), -1)
    full, _ = _ttt_logits(head, target, ids, mask, resp, every, steps=2)
    none, _ = _ttt_logits(head, target, ids, mask, resp, torch.full_like(every, -1), steps=2)
    for j in range(3, m - 1):  # row (1, j) drafts from the root j - 1 and reads that anchor's f
        one = torch.where(mask[:, j - 1 : j].bool(), torch.full((ids.shape[0], 1), j - 1), -1)
        alone, _ = _ttt_logits(head, target, ids, mask, resp, one, steps=2)
        assert torch.allclose(full[1][:, j], alone[1][:, j], atol=1e-5), j
        assert not torch.allclose(full[1][:, j], none[1][:, j], atol=1e-4), j  # f does enter the row


def test_training_time_test_with_a_cache_equals_recomputing_every_step():
    target = _target()
    enc = _prompts(4)
    ids, mask = enc.prompt_ids, enc.prompt_mask
    resp = tr.response_mask(mask, mask.sum(1) - 4)
    for kind, anchors in (("eagle3", None), ("confu", torch.tensor([[3, 6], [2, -1], [4, 7], [5, -1]]))):
        head = _head(target, kind)
        got, _ = _ttt_logits(head, target, ids, mask, resp, anchors, window=3, steps=3)
        m = ids.shape[1] - 1
        tp = tr.target_pass(target, ids, mask, LAYERS)
        real, pos, tokens = mask[:, :m].bool(), position_ids_from_mask(mask)[:, :m], ids[:, 1:]
        fused0 = head.fuse(tokens, head.g(tp.features[:, :m]))
        if anchors is not None:
            _, f = tr.contemplate_pass(target, head, ids, mask, tp.features, anchors, LAYERS)
            a = anchors.clamp(min=0)
            future = head.future(fused0.gather(1, a[..., None].expand(-1, -1, H)), f)
        blocks, prev = [fused0], None
        for i in range(3):
            if i:
                x = head.fuse(tokens, torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1))
                if anchors is not None:  # row (i, j) adds the f of the anchor covering its root j - i (l = 3)
                    for b in range(x.shape[0]):
                        for j in range(m):
                            ctx = j - i
                            near = [k for k, av in enumerate(anchors[b].tolist()) if 0 <= av <= ctx < av + 3]
                            if near:
                                x[b, j] = x[b, j] + future[b, max(near, key=lambda k: int(anchors[b, k]))]
                blocks.append(x)
            allowed = tr.ttt_allowed(real, i + 1)
            h, lg = head.run(torch.cat(blocks, 1), allowed, torch.cat([pos] * (i + 1), 1))
            prev = h[:, i * m : (i + 1) * m]
            assert torch.allclose(got[i], lg[:, i * m : (i + 1) * m], atol=1e-5), (kind, i)


def test_training_time_test_rows_are_the_inference_draft_chain():
    """Row (i, j) of the unroll equals the draft at depth i + 1 of a chain whose root is at position j - i and
    whose drafted tokens are the sequence's own: the training pattern is what the tree sees."""
    target = _target()
    head = _head(target, "eagle3")
    ids = torch.tensor([[1, 4, 9, 7, 5, 6, 8, 10, 11, 12]])
    mask = torch.ones_like(ids)
    got, _ = _ttt_logits(head, target, ids, mask, mask, None, steps=3)
    tp = tr.target_pass(target, ids, mask, LAYERS)
    root = 4  # the chain's root row j - i: x_0..x_5 committed (features up to x_4), drafting x_6, x_7, x_8
    inputs = [head.fuse(ids[:, 1 : root + 2], head.g(tp.features[:, : root + 1]))]
    positions = [torch.arange(root + 1)[None]]
    hidden = None
    for i in range(3):
        if i:
            inputs.append(head.fuse(ids[:, root + 1 + i : root + 2 + i], hidden))
            positions.append(torch.tensor([[root + i]]))
        x, pos = torch.cat(inputs, 1), torch.cat(positions, 1)
        n = x.shape[1]
        allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))[None]
        h, lg = head.run(x, allowed, pos)
        hidden = h[:, -1:]
        assert torch.allclose(lg[0, -1], got[i][0, root + i], atol=1e-5), i


# ---------------------------------------------------------------- acceptance check 5: one-pass tree verification
def test_one_pass_verification_equals_each_path_alone_for_nodes_and_contemplate_tokens():
    target = _target()
    head = _head(target, "confu")
    dec = SpecDecoder(target, head, TreeConfig(5, 2, 3), LAYERS)
    prefix = torch.tensor([[1, 4, 9, 7, 5, 6]])
    width, length = 9, torch.tensor([6])
    buf = torch.cat([prefix, torch.zeros(1, width - 6, dtype=torch.long)], 1)
    tokens = torch.tensor([[8, 10, 11, 12, 13]])
    parent = torch.tensor([[-1, -1, 0, 0, 2]])
    depth = torch.tensor([[1, 1, 2, 2, 3]])
    feats = tr.target_pass(target, buf, (torch.arange(width) < 6).long()[None], LAYERS).features
    root, nodes, _, _, f = dec._verify(buf, length, feats, tokens, ancestors(parent), depth)
    with torch.no_grad():
        assert torch.allclose(root[0], target(input_ids=prefix).logits[0, -1], atol=1e-5)
        for i in range(5):
            path, j = [], i
            while j >= 0:
                path.insert(0, int(tokens[0, j]))
                j = int(parent[0, j])
            seq = torch.cat([prefix, torch.tensor([path])], 1)
            assert torch.allclose(nodes[0, i], target(input_ids=seq).logits[0, -1], atol=1e-5), i
            # node i's contemplate token equals a contemplate pass on its path alone (anchor = its last token),
            # with the same [con] embedding (routed by the features of the prefix's second-to-last token)
            mask = torch.ones_like(seq)
            fe = tr.target_pass(target, seq, mask, LAYERS).features
            fe[:, seq.shape[1] - 2] = feats[:, 4]
            _, f_alone = tr.contemplate_pass(target, head, seq, mask, fe, torch.tensor([[seq.shape[1] - 1]]), LAYERS)
            assert torch.allclose(f[0, 1 + i], f_alone[0, 0], atol=1e-5), i


def test_ancestors_of_a_tree():
    anc = ancestors(torch.tensor([[-1, -1, 0, 2, 1]]))
    want = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [0, 1, 0, 0, 1]]).bool()
    assert torch.equal(anc[0], want)


# ---------------------------------------------------------------- acceptance check 6 and section 11: metrics
class _Oracle(SpecDecoder):
    """A chain draft that proposes the target's own greedy tokens (`wrong`: a token the target never picks)."""

    wrong = False

    def _draft(self, buf, lengths, feats, f):
        b = buf.shape[0]
        seq = [buf[i, : lengths[i]] for i in range(b)]
        toks = []
        with torch.no_grad():
            for _ in range(self.tree.depth):
                nxt = []
                for i in range(b):
                    logits = self.target(input_ids=seq[i][None]).logits[0, -1]
                    t = int(logits.argmin()) if self.wrong else int(logits.argmax())
                    nxt.append(t)
                    seq[i] = torch.cat([seq[i], torch.tensor([int(logits.argmax())])])
                toks.append(nxt)
        tokens = torch.tensor(toks).T
        d = self.tree.depth
        parent = torch.arange(-1, d - 1)[None].expand(b, -1)
        return tokens, ancestors(parent), torch.arange(1, d + 1)[None].expand(b, -1)


@pytest.mark.parametrize("wrong, expected", [(False, 4.0), (True, 1.0)])
def test_tau_is_depth_plus_one_for_a_perfect_chain_draft_and_one_for_an_always_wrong_one(wrong, expected):
    target = _target()
    enc = _prompts(4)
    dec = _Oracle(target, _head(target, "eagle3"), TreeConfig(3, 1, 3), LAYERS)
    dec.wrong = wrong
    max_new = 1 + 3 * 4
    out = dec.decode(
        enc.prompt_ids,
        enc.prompt_mask,
        max_new_tokens=max_new,
        temperature=0.0,
        uniforms=uniforms(4, max_new, 0),
        eos=-1,
        pad=PAD,
    )
    frame = pd.DataFrame({"new_after_prefill": [len(t) - 1 for t in out.tokens], "cycles": out.cycles})
    assert tau(frame) == expected
    assert frame.new_after_prefill.sum() / out.cycles.sum() == expected
    assert all(a == (0 if wrong else 3) for acc in out.accepted for a in acc)
    assert out.tokens == _kit(target, enc, 0.0, max_new, eos=None)  # lossless whatever the draft


def test_depth_acceptance():
    assert depth_acceptance([[0, 1, 2], [2, 3]], 3) == [4 / 5, 3 / 4, 1 / 3]


CLAIM_SEEDS, N_PROMPTS = list(range(5)), 12


def _eval_frame(tau_of: dict[str, float], leak_lossless: float = 0.2) -> pd.DataFrame:
    """Evaluation rows of every variant: per (seed, prompt) tau = `tau_of[variant]` with a small prompt wobble
    (10 cycles each), accepted depths [1, 2, 3] per prompt, lossless except the leaking control's share."""
    rows = []
    for seed in CLAIM_SEEDS:
        for variant, base in tau_of.items():
            temps = (0.0, 1.0) if variant in ("confu", "eagle3_extra") else (0.0,)
            for temp in temps:
                for row in range(N_PROMPTS):
                    wobble = 0.05 * np.sin(3.1 * row + 1.3 * seed + len(variant))
                    lossless = row >= N_PROMPTS * leak_lossless if variant == "confu_leak" else True
                    rows.append(
                        {
                            "variant": variant,
                            "temperature": temp,
                            "seed": seed,
                            "row": row,
                            "task": "sorting",
                            "new_after_prefill": 10 * (base + wobble),
                            "cycles": 10,
                            "accepted": [1, 2, 3],
                            "lossless": lossless,
                        }
                    )
    return pd.DataFrame(rows)


GOOD = {
    "vanilla": 2.0,
    "eagle3": 2.4,
    "eagle3_features_shuffled": 1.4,
    "eagle3_extra": 2.5,
    "confu": 2.75,
    "confu_f_shuffled": 2.5,
    "confu_leak": 2.7,
}


def _verdicts(frame: pd.DataFrame) -> dict:
    table = metrics_table(frame, {"decoding": {"depth": 3}}, "smoke")
    specs = parse_claims(load_paper_config("confu", "smoke")["claims"], "config/confu.yaml")
    return {v.id: v for v in judge_all(specs, table, "smoke")}


def test_the_metrics_table_holds_seed_taus_per_prompt_taus_and_the_worst_lossless_share():
    frame = _eval_frame(GOOD)
    table = metrics_table(frame, {"decoding": {"depth": 3}}, "smoke")
    seed0 = frame[(frame.seed == 0) & (frame.variant == "confu") & (frame.temperature == 0)]
    got = table[(table.seed == 0) & (table.method == "confu") & (table.metric == "T0/tau")].value.item()
    assert got == pytest.approx(tau(seed0))
    assert (table[table.metric == "T0/tau_prompt"].groupby(["seed", "method"]).size() == N_PROMPTS).all()
    assert set(table[table.metric == "T1/tau"].method) == {"confu", "eagle3_extra"}
    every = table[(table.method == "every_method") & (table.metric == "T0/lossless")]
    assert list(every.value) == [1.0] * len(CLAIM_SEEDS)  # the leaking control is not one of the four methods


def test_gated_claims_hold_when_the_methods_are_better_and_their_controls_are_not():
    found = _verdicts(_eval_frame(GOOD))
    assert {k: v.verdict for k, v in found.items() if v.gated} == {
        "b_eagle3_vs_vanilla": HELD,
        "c_confu_vs_eagle3_extra": HELD,
    }
    c = found["c_confu_vs_eagle3_extra"]
    assert c.central and c.unit == "item" and c.n_units == len(CLAIM_SEEDS) * N_PROMPTS
    assert c.value == pytest.approx(1.1, abs=0.01) and c.ci_low > 1
    assert c.control["method"] == "confu_f_shuffled" and c.control["verdict"] != HELD
    assert found["a_lossless_greedy"].verdict == HELD and not found["a_lossless_greedy"].gated  # a test, reported
    assert found["a_lossless_greedy"].control["verdict"] == REFUTED  # the leaking mask loses losslessness
    assert found["b_eagle3_vs_vanilla"].control["verdict"] == REFUTED


def test_confu_that_ignores_f_is_void_and_a_lossy_method_refutes_a():
    ignored = _verdicts(_eval_frame(GOOD | {"confu_f_shuffled": 2.75}))
    assert ignored["c_confu_vs_eagle3_extra"].verdict == CONTROL_HOLDS
    assert not ignored["c_confu_vs_eagle3_extra"].held
    frame = _eval_frame(GOOD)
    frame.loc[(frame.variant == "eagle3") & (frame.seed == 3) & (frame.row == 0), "lossless"] = False
    assert _verdicts(frame)["a_lossless_greedy"].verdict == REFUTED  # one prompt of one seed is enough


def test_equal_taus_do_not_hold_and_a_missing_seed_gives_no_data():
    same = _verdicts(_eval_frame(GOOD | {"confu": 2.5, "eagle3": 2.0}))
    assert same["c_confu_vs_eagle3_extra"].verdict in (INCONCLUSIVE, REFUTED)
    assert same["b_eagle3_vs_vanilla"].verdict == REFUTED
    frame = _eval_frame(GOOD)
    frame = frame[~((frame.variant == "confu") & (frame.seed == 2))]
    assert _verdicts(frame)["c_confu_vs_eagle3_extra"].verdict == NO_DATA


def test_the_shuffled_f_control_changes_confus_drafts_and_zero_f_differs_from_no_slot():
    target = _target()
    head = _head(target, "confu")
    enc = _prompts(12)
    width = 24
    from paperflow.confu.decoding import _left_align

    buf, lengths = _left_align(enc.prompt_ids, enc.prompt_mask, width, PAD)
    feats = tr.target_pass(target, buf, (torch.arange(width)[None] < lengths[:, None]).long(), LAYERS).features
    f = torch.randn(12, 1, H, generator=torch.Generator().manual_seed(0))
    trees = {}
    for name, ctl in {"normal": Controls(), "shuffle": Controls(f="shuffle"), "noslot": Controls(slot=False)}.items():
        dec = SpecDecoder(target, head, TreeConfig(6, 2, 3), LAYERS, ctl)
        with torch.no_grad():
            trees[name] = dec._draft(buf, lengths, feats, f)[0]
    assert not torch.equal(trees["normal"], trees["shuffle"])
    assert not torch.equal(trees["normal"], trees["noslot"])
    assert _decode(target, head, enc, controls=Controls(f="shuffle")).tokens == _kit(target, enc, 0.0)


# ---------------------------------------------------------------- data and config
def test_problems_are_disjoint_and_answers_follow_from_prompts():
    data = {
        "tasks": {"sorting": {"min_len": 3, "max_len": 5}, "key_value": {"n_pairs": 3, "n_queries": 2}},
        "n_train": 200,
        "n_test": 20,
        "seed": 0,
    }
    frame = make_problems(data)
    test = set(frame[frame.split == "test"].prompt)
    assert not test & set(frame[frame.split == "train"].prompt)
    world = world_of(data)
    for row in frame.itertuples():
        if row.task == "sorting":
            assert row.answer.split() == sorted(row.prompt.split()[1:-1])
        assert set((row.prompt + " " + row.answer).split()) <= set(world.tokenizer().get_vocab())


def test_config_errors_name_the_key_and_the_allowed_values(tmp_path):
    import shutil

    import yaml

    from paperflow.confu.settings import check

    cfg = load_paper_config("confu", "smoke")
    with pytest.raises(ConfigError, match="unknown method 'confuu'.*choose from"):
        check({**cfg, "methods": [*cfg["methods"], "confuu"]}, "confu.yaml")
    with pytest.raises(ConfigError, match=r"feature_layers \[4\] must lie in 1..3"):
        check({**cfg, "draft": {**cfg["draft"], "feature_layers": [1, 4]}}, "confu.yaml")
    with pytest.raises(ConfigError, match="must include"):
        check({**cfg, "methods": ["vanilla", "eagle3"]}, "confu.yaml")
    with pytest.raises(ConfigError, match="decoding.nodes 99"):
        check({**cfg, "decoding": {**cfg["decoding"], "nodes": 99}}, "confu.yaml")
    root = tmp_path / "repo"
    shutil.copytree("config", root / "config")
    doc = yaml.safe_load((root / "config" / "confu.yaml").read_text())
    doc["defaults"]["draft"]["ttt_stepz"] = 3
    (root / "config" / "confu.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="ttt_stepz"):
        load_paper_config("confu", "smoke", root=root)


def test_head_checkpoints_round_trip(tmp_path):
    target = _target()
    head = _head(target, "confu")
    path = save_head(head, tmp_path / "h.safetensors", {"seed": 1})
    back = load_head(path)
    for (k, v), (k2, v2) in zip(head.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


def test_masked_forward_of_the_kit_is_what_the_verifier_uses():
    target = _target()
    ids = torch.tensor([[1, 4, 5, 6]])
    allowed = torch.tril(torch.ones(1, 4, 4, dtype=torch.bool))
    out = masked_forward(target, allowed, torch.arange(4)[None], input_ids=ids, layers=LAYERS)
    assert out.features.shape == (1, 4, 3 * H)
