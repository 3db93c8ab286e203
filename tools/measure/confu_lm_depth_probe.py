"""Where ConFu's depth-4 acceptance went on the cpu scale's real target (issue 49): decode the test prompts of a
finished cpu run (`results/cpu/confu/lm`) with the ConFu head as the pipeline does and with its future vector left
out of the drafted rows (`Controls(slot=False)`: the same head drafting as EAGLE-3 would), and print the acceptance
per depth of each. Greedy, batch 1, the pipeline's tree and token budget. A diagnostic, not a pipeline stage:

    .venv/bin/python tools/measure/confu_lm_depth_probe.py [--results results/cpu/confu/lm] [--target smollm2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from paperflow.confu import paper
from paperflow.confu.cached_decoding import CachedSpecDecoder
from paperflow.confu.claims import depth_acceptance
from paperflow.confu.decoding import Controls, TreeConfig
from paperflow.confu.model import load_head
from paperflow.core.config import load_paper_config
from paperflow.core.io import read_frame


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/cpu/confu/lm")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--method", default="confu")
    args = ap.parse_args()
    lm = load_paper_config("confu", "cpu")["pretrained_cpu"]
    target, dec = lm["targets"][args.target], lm["decoding"]
    root = Path(args.results)
    model, tok, device = paper.load_target(str(root / "models" / args.target / "pretrained.json"), target, args.target)
    head = load_head(str(root / "models" / args.target / f"{args.method}.safetensors"))
    tree = TreeConfig(int(dec["nodes"]), int(dec["top_k"]), int(dec["depth"]))
    test, _ = read_frame(str(root / "data" / args.target / "test_prompts.parquet"))
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id)
    for label, controls in (("f in the drafted rows (as run)", Controls()), ("f left out", Controls(slot=False))):
        decoder = CachedSpecDecoder(model, head, tree, tuple(int(i) for i in target["feature_layers"]), controls)
        accepted = []
        for q in test.itertuples(index=False):
            ids = torch.tensor([list(q.prompt_ids)])
            got = decoder.decode(
                ids,
                torch.ones_like(ids),
                max_new_tokens=int(dec["max_new_tokens"]),
                temperature=0.0,
                uniforms=torch.zeros(1, int(dec["max_new_tokens"])),
                eos=eos,
                pad=pad,
            )
            accepted.append([int(a) for a in got.accepted[0]])
        flat = np.concatenate([np.asarray(a) for a in accepted])
        per_depth = ", ".join(f"{a:.3f}" for a in depth_acceptance(accepted, tree.depth))
        print(
            f"{args.method}, {label}: cycles {len(flat)}, tau {1 + flat.mean():.3f}, acceptance per depth {per_depth}"
        )


if __name__ == "__main__":
    main()
