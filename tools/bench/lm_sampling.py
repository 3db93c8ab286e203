"""Benchmark: tokens per second of the kit's sampler (paperflow.core.lm.sampling.sample) against transformers'
`model.generate` on the same batch, greedy and at T = 1, for tiny digit-world models.

    .venv/bin/python tools/bench/lm_sampling.py [--batch 64] [--new-tokens 32] [--threads 1] [--repeats 3]
        [--arch llama|qwen2] [--sizes tiny small]

Not a test: timings depend on the machine. EOS is masked out of the logits so both generate every token. The
"T = 1 + hook" row runs the sampler with a hook that replaces nothing (the per-step cost of the hook path).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sample
from paperflow.core.lm.tokenizer import encode_words

SIZES = {  # grouped-query attention, as the papers' smoke configs (Qwen2's default of 32 KV heads fits neither)
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "small": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _idle_hook(state):
    return None


def _ours(model, tok, batch, new_tokens: int, temperature: float, hook=None):
    return sample(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        max_new_tokens=new_tokens,
        temperature=temperature,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        hook=hook,
    )


@torch.no_grad()
def _generate(model, tok, batch, new_tokens: int, temperature: float):
    return model.generate(
        **batch,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=temperature > 0,
        temperature=temperature or None,
        top_k=None,
        top_p=None,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", choices=("llama", "qwen2"), default="llama")
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world = DigitWorld.from_config({"sorting": {"min_len": 8, "max_len": 12}})
    tok = world.tokenizer()
    batch = encode_words(tok, [ex.prompt for ex in world.sample("sorting", args.batch, np.random.default_rng(0))])
    no_eos = torch.zeros(len(tok))
    no_eos[tok.eos_token_id] = -1e9
    print(
        f"{args.arch}, batch {args.batch}, prompts of {batch['input_ids'].shape[1]} columns, "
        f"{args.new_tokens} new tokens, {args.threads} thread(s), best of {args.repeats}"
    )
    print("| model | decoding | ours tok/s | generate tok/s | ours / generate |\n|---|---|---|---|---|")
    n = args.batch * args.new_tokens
    for name in args.sizes:
        size = SIZES[name]
        spec = {"arch": args.arch, "vocab_size": len(tok), "max_position_embeddings": 64, **size}
        model = build_model(spec, seed=0).eval()
        model.lm_head.register_forward_hook(lambda mod, inp, out: out + no_eos)
        label = f"{name} ({size['hidden_size']} x {size['num_hidden_layers']})"
        rows = (("greedy", 0.0, None), ("T = 1", 1.0, None), ("T = 1 + hook", 1.0, _idle_hook))
        for decoding, temperature, hook in rows:
            ours = _best(functools.partial(_ours, model, tok, batch, args.new_tokens, temperature, hook), args.repeats)
            theirs = _best(functools.partial(_generate, model, tok, batch, args.new_tokens, temperature), args.repeats)
            print(f"| {label} | {decoding} | {n / ours:,.0f} | {n / theirs:,.0f} | {theirs / ours:.2f} |")


if __name__ == "__main__":
    main()
