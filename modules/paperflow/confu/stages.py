"""ConFu's stages, one function per rule (the scripts pass paths and params): the digit-world problems, the target
trained once and shared by every draft seed (with its regenerated draft data and the lossless references), the draft
heads' shape (trained by `training.train_draft`, the loop of every scale), and the speculative-decoding
evaluation."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.confu.problems import examples, world_of
from paperflow.core.lm.digitworld import Example
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sample, sequence_logprobs
from paperflow.core.loop import run_loop

log = logging.getLogger(__name__)


def target_spec(cfg: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    return {"arch": "llama", **cfg["target"]["model"], "vocab_size": vocab_size}


# ------------------------------------------------------------------ target
def train_target(problems: pd.DataFrame, cfg: Mapping[str, Any], seed: int):
    """SFT of the target on gold answers (token-mean NLL over answer + EOS); returns (model, history rows)."""
    world = world_of(cfg["data"])
    tok = world.tokenizer()
    tc = cfg["target"]["train"]
    train = examples(problems[problems.split == "train"])
    torch.manual_seed(seed)
    model = build_model(target_spec(cfg, len(tok)), seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(tc["lr"]), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=float(tc["lr"]), total_steps=int(tc["steps"]), pct_start=0.1
    )
    rng = np.random.default_rng(seed)

    def step(i: int):
        idx = rng.integers(0, len(train), int(tc["batch_size"]))
        b = world.encode(tok, [train[j] for j in idx]).sft()
        logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"])
        m = b["completion_mask"].float()
        return -(logp * m).sum() / m.sum()

    rows = run_loop(step, opt, int(tc["steps"]), scheduler=sched, grad_clip=1.0, desc=f"target seed {seed}")
    return model.eval(), rows


def greedy_exact(model, problems: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.Series:
    """Exact-match accuracy of greedy decoding per task (the spec's >= 98% sanity target on sort)."""
    world = world_of(cfg["data"])
    tok = world.tokenizer()
    out = {}
    for task, sub in problems.groupby("task"):
        enc = world.encode(tok, examples(sub))
        r = sample(
            model,
            enc.prompt_ids,
            enc.prompt_mask,
            max_new_tokens=enc.answer_ids.shape[1],
            temperature=0,
            generator=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        out[task] = float(enc.rewards(r.completion_ids).mean())
    return pd.Series(out)


@torch.no_grad()
def regenerate(model, prompts: Sequence[Example], cfg: Mapping[str, Any], chunk: int = 512) -> dict[str, torch.Tensor]:
    """The target's greedy continuations of the draft-training prompts (EAGLE-3's practice): left-padded
    prompt + response ids, mask, and each row's prompt length."""
    world = world_of(cfg["data"])
    tok = world.tokenizer()
    max_new = int(cfg["decoding"]["max_new_tokens"])
    seqs, plens = [], []
    for i in range(0, len(prompts), chunk):
        enc = world.encode(tok, list(prompts[i : i + chunk]))
        r = sample(
            model,
            enc.prompt_ids,
            enc.prompt_mask,
            max_new_tokens=max_new,
            temperature=0,
            generator=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        for row, m in zip(r.sequences, r.attention_mask):
            seqs.append(row[m.bool()])
        plens += enc.prompt_mask.sum(1).tolist()
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = s
        mask[i, width - len(s) :] = 1
    return {"input_ids": ids, "attention_mask": mask, "prompt_lengths": torch.tensor(plens)}


def uniforms(n: int, width: int, seed: int) -> torch.Tensor:
    """[n, width] float64 draws in the order the kit's `sample` makes them (one [n, 1] draw per step), so that the
    target-only sample path with generator seed `seed` is the reference of every method at T > 0."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.rand(n, 1, generator=g, dtype=torch.float64) for _ in range(width)], 1)


@torch.no_grad()
def references(model, test: pd.DataFrame, cfg: Mapping[str, Any], seeds: Sequence[int]) -> pd.DataFrame:
    """The lossless references per draft seed and test prompt: the kit's greedy decoding, its sample path at each
    T > 0 (with the uniforms every method will use at that seed), and on the first `n_reference` prompts
    transformers' `generate` greedy and `generate(assistant_model=...)` with a one-layer assistant (an independent
    lossless implementation; computed once, the same at every seed)."""
    from transformers import GenerationConfig

    world = world_of(cfg["data"])
    tok = world.tokenizer()
    dec = cfg["decoding"]
    max_new = int(dec["max_new_tokens"])
    enc = world.encode(tok, examples(test))

    def completions(r):
        return [[int(t) for t, m in zip(row, mk) if m] for row, mk in zip(r.completion_ids, r.completion_mask)]

    n_ref = min(int(dec["n_reference"]), len(test))
    spec = {**target_spec(cfg, len(tok)), "num_hidden_layers": 1}
    assistant = build_model(spec, int(cfg["target"]["seed"]) + 7919).eval()
    gen = GenerationConfig(
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        num_assistant_tokens=4,
    )
    hf, assisted = [], []
    for i in range(n_ref):
        ids = enc.prompt_ids[i : i + 1][:, enc.prompt_mask[i].bool()]
        plain = model.generate(ids, generation_config=gen)[0, ids.shape[1] :].tolist()
        helped = model.generate(ids, generation_config=gen, assistant_model=assistant)[0, ids.shape[1] :].tolist()
        hf.append(_cut(plain, tok.eos_token_id))
        assisted.append(_cut(helped, tok.eos_token_id))
    frames = []
    for seed in seeds:
        out = pd.DataFrame({"seed": int(seed), "row": range(len(test)), "task": test.task.to_numpy()})
        for temp in dec["temperatures"]:
            g = torch.Generator().manual_seed(eval_seed(seed, temp))
            r = sample(
                model,
                enc.prompt_ids,
                enc.prompt_mask,
                max_new_tokens=max_new,
                temperature=float(temp),
                generator=g,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
            out[f"ref_T{temp}"] = completions(r)
        out["hf_greedy"] = hf + [None] * (len(test) - n_ref)
        out["hf_assisted"] = assisted + [None] * (len(test) - n_ref)
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def _cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def eval_seed(seed: int, temperature: float) -> int:
    """The generator seed of the sample-path reference of (seed, T)."""
    return 100_003 * int(seed) + int(round(1000 * float(temperature)))


# ------------------------------------------------------------------ drafts
def draft_config(kind: str, cfg: Mapping[str, Any], vocab_size: int):
    from paperflow.confu.model import DraftConfig

    d, c, t = cfg["draft"], cfg["confu"], cfg["target"]["model"]
    return DraftConfig(
        kind=kind,
        hidden_size=int(t["hidden_size"]),
        vocab_size=vocab_size,
        feature_layers=tuple(d["feature_layers"]),
        heads=int(d["heads"]),
        intermediate_size=int(d["intermediate_size"]),
        max_positions=int(t["max_position_embeddings"]),
        n_soft=int(c["n_soft"]),
        n_expert=int(c["n_expert"]),
        k_expert=int(c["k_expert"]),
    )


def _one_expert(head):
    from dataclasses import replace

    from paperflow.confu.model import DraftHead

    cfg = replace(head.cfg, n_expert=1, k_expert=1)
    new = DraftHead(cfg, head.embed.weight, seed=0)
    state = {k: v for k, v in head.state_dict().items() if not k.startswith(("moe_con", "moe_f"))}
    new.load_state_dict(state, strict=False)
    return new


# ------------------------------------------------------------------ evaluation
def evaluate(
    method: str,
    target,
    head,
    test: pd.DataFrame,
    refs: pd.DataFrame,
    cfg: Mapping[str, Any],
    seed: int,
    controls: Mapping[str, Any] | None = None,
    temperatures=None,
) -> pd.DataFrame:
    """Speculative decoding of every test prompt at every temperature: per prompt the tokens, the cycles, the
    accepted depth of each cycle and whether the output equals the reference (greedy at T = 0, the target's own
    sample path with the same uniforms at T > 0)."""
    from paperflow.confu.decoding import Controls, SpecDecoder, TreeConfig
    from paperflow.confu.model import cost_ratio

    world = world_of(cfg["data"])
    tok = world.tokenizer()
    dec = cfg["decoding"]
    tree = TreeConfig(int(dec["nodes"]), int(dec["top_k"]), int(dec["depth"]))
    ctl = Controls(**(controls or {}))
    decoder = SpecDecoder(target, head, tree, tuple(cfg["draft"]["feature_layers"]), ctl)
    enc = world.encode(tok, examples(test))
    max_new = int(dec["max_new_tokens"])
    rows = []
    for temp in dec["temperatures"] if temperatures is None else [t for t in dec["temperatures"] if t in temperatures]:
        u = uniforms(len(test), max_new, eval_seed(seed, temp))
        t0 = time.perf_counter()
        out = decoder.decode(
            enc.prompt_ids,
            enc.prompt_mask,
            max_new_tokens=max_new,
            temperature=float(temp),
            uniforms=u,
            eos=tok.eos_token_id,
            pad=tok.pad_token_id,
        )
        secs = time.perf_counter() - t0
        ref = refs[f"ref_T{temp}"].tolist()
        for i in range(len(test)):
            rows.append(
                {
                    "method": method,
                    "seed": seed,
                    "temperature": float(temp),
                    "row": i,
                    "task": test.task.iloc[i],
                    "tokens": len(out.tokens[i]),
                    "new_after_prefill": len(out.tokens[i]) - 1,
                    "cycles": int(out.cycles[i]),
                    "accepted": list(out.accepted[i]),
                    "lossless": list(map(int, out.tokens[i])) == list(map(int, ref[i])),
                    "hf_greedy_equal": None
                    if temp != 0 or refs.hf_greedy.iloc[i] is None
                    else list(map(int, out.tokens[i])) == list(map(int, refs.hf_greedy.iloc[i])),
                    "hf_assisted_equal": None
                    if temp != 0 or refs.hf_assisted.iloc[i] is None
                    else list(map(int, out.tokens[i])) == list(map(int, refs.hf_assisted.iloc[i])),
                    "seconds": secs / len(test),
                    "c_draft": cost_ratio(head, target),
                }
            )
    return pd.DataFrame(rows)
