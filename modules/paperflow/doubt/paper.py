"""DOUBT at paper scale (`source.kind: benchmarks`), one function per rule: the MLLMs, the judge LLM and the sentence
encoder downloaded at pinned Hub commits, the benchmarks' parquet files at pinned dataset commits, the official
question rendering (`benchmarks`), and per (MLLM, benchmark) the code's generation protocol on a GPU: ans0
(T = t_answer), the plain set A (n_max at T, top-k / top-p), the object list (T = t_answer, once) and the OUB set B
(n_max at T on question + bridge + objects). Labels: multiple-choice on the CPU, free-form by the judge LLM on a
GPU (the code's prompt). Embedding with the pinned encoder (the code's nli-roberta-large), then the same detectors
as the smoke scale (`methods`), scored per item on the CPU, AUROC and detection accuracy at the official
thresholds (0.48 for DOUBT, 1.0 for entropy).

Generation goes through transformers' `AutoProcessor` and `AutoModelForImageTextToText` with the processor's chat
template (LLaVA-1.5, LLaVA-NeXT and Qwen2-VL are native transformers models). The scripts only pass paths and
params; the smoke scale's stages are `stages`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.doubt import benchmarks as bm
from paperflow.doubt import methods as M
from paperflow.doubt import metrics

log = logging.getLogger(__name__)
SLUG = "doubt"
SETS = ("A", "B")
LABEL_MODES = ("official", "strict")


def download_model(spec: Mapping[str, Any], key: str, cache: str, out: str) -> dict[str, str]:
    """A model repo's files (`spec.files`) at its pinned commit (`<key>.revision`, else the lock file) into the
    cache; `out` (JSON) names the commit and the folder, which every later rule loads offline."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub = spec["hub"]
    revision = pinned_revision(hub, spec["revision"], slug=SLUG, key=f"{key}.revision", repo_type="model")
    folder = snapshot_folder(cache, "model", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(spec["files"]))
    doc = {"hub": hub, "revision": revision, "folder": str(folder)}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def download_benchmark(name: str, bench: Mapping[str, Any], cache: str, out: str) -> int:
    """A benchmark's parquet files (only those its reader needs) at the pinned dataset commit, read into the items
    the code evaluates (rendered question, encoded image, gt, kind), written with their origin. Returns the rows."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub = bench["hub"]
    key = f"benchmarks.{name}.revision"
    revision = pinned_revision(hub, bench["revision"], slug=SLUG, key=key, repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=bm.hub_patterns(name, bench), repo_type="dataset")
    frame = bm.READERS[name](folder, bench)
    write_frame(out, frame, {"benchmark": name, "hub": hub, "revision": revision, "kind": bm.KIND_OF[name]})
    return len(frame)


def preprocess(raw: str, limit: int | None, out: str) -> int:
    """The items sampled (the first `limit` of them, all with null) without the gt: the sampling job never sees
    it. Returns the rows."""
    frame, meta = read_frame(raw)
    frame = frame if limit is None else frame.head(int(limit))
    write_frame(out, frame.drop(columns=["gt"]), meta)
    return len(frame)


def _info(path: str) -> dict[str, str]:
    return json.loads(Path(path).read_text())


# model types whose transformers processor carries a video processor, which imports torchvision
NEEDS_TORCHVISION = ("qwen2_vl", "qwen2_5_vl")


def require_processor_deps(folder: str, hub: str) -> None:
    """Refuse, by name, an MLLM whose processor cannot load here: Qwen2-VL's processor (transformers 5) builds a
    video processor that imports torchvision, which envs/lm.yaml does not carry (README: paper scale)."""
    import importlib.util

    model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    if model_type in NEEDS_TORCHVISION and importlib.util.find_spec("torchvision") is None:
        raise RuntimeError(
            f"{hub} (model_type {model_type}): its transformers processor imports torchvision (the video processor), "
            "which this env lacks; run the sample rule in an env with torchvision matching torch (README: paper scale)"
        )


class VLM:
    """A pinned MLLM loaded offline from its snapshot: chat-templated prompts with one image, sampled generation of
    the new tokens only, left-padded batches of `batch_size` rows."""

    def __init__(self, info: Mapping[str, str], spec: Mapping[str, Any], device):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from paperflow.core.lm.models import require_pinned

        require_pinned(info["hub"], info["revision"])
        require_processor_deps(info["folder"], info["hub"])
        self.processor = AutoProcessor.from_pretrained(
            info["folder"], local_files_only=True, **dict(spec.get("processor") or {})
        )
        self.processor.tokenizer.padding_side = "left"
        self.dtype = getattr(torch, spec["dtype"])
        self.model = AutoModelForImageTextToText.from_pretrained(
            info["folder"], local_files_only=True, dtype=self.dtype
        ).to(device)
        self.model.eval()
        self.device, self.image_first, self.batch_size = device, bool(spec["image_first"]), int(spec["batch_size"])

    def prompt(self, text: str) -> str:
        content = [{"type": "text", "text": text}, {"type": "image"}]
        conversation = [{"role": "user", "content": content[::-1] if self.image_first else content}]
        return self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)

    def generate(self, text: str, image, n: int, temperature: float, max_new_tokens: int, **kw) -> list[str]:
        """`n` sampled answers to one (question, image), in batches of `batch_size`."""
        import torch

        prompt, out = self.prompt(text), []
        for start in range(0, n, self.batch_size):
            b = min(self.batch_size, n - start)
            inputs = self.processor(images=[image] * b, text=[prompt] * b, return_tensors="pt", padding=True)
            inputs = inputs.to(self.device)
            if "pixel_values" in inputs:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
            with torch.inference_mode():
                ids = self.model.generate(
                    **inputs, do_sample=True, temperature=float(temperature), max_new_tokens=int(max_new_tokens), **kw
                )
            new = ids[:, inputs["input_ids"].shape[1] :]
            out += [s.strip() for s in self.processor.batch_decode(new, skip_special_tokens=True)]
        return out


def sample(
    name: str, vlm_json: str, spec: Mapping[str, Any], items_path: str, sampling: Mapping[str, Any], seed: int
) -> pd.DataFrame:
    """Per item (spec section 2, the code's order): ans0, the plain set A, the object list, the OUB set B."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all

    device = pick(spec["device"], key=f"vlms.{name}.device")
    items = read_frame(items_path)[0]
    seed_all(int(seed) * 1000 + int(sampling["seed"]))
    vlm = VLM(_info(vlm_json), spec, device)
    n, t, t0, length = (
        int(sampling["n_max"]),
        float(sampling["temperature"]),
        float(sampling["t_answer"]),
        int(sampling["max_new_tokens"]),
    )
    answer_kw = dict(spec.get("answer_generation") or {})
    sample_kw = {
        "top_k": int(sampling["top_k"]),
        "top_p": float(sampling["top_p"]),
        **(spec.get("sampling_generation") or {}),
    }
    rows = []
    for k, r in enumerate(items.to_dict("records")):
        image = bm.load_image(r["image"])
        ans0 = vlm.generate(r["question"], image, 1, t0, length, **answer_kw)[0]
        plain = vlm.generate(r["question"], image, n, t, length, **sample_kw)
        objects = vlm.generate(bm.LIST_PROMPT, image, 1, t0, length, **answer_kw)[0]
        oub = vlm.generate(bm.oub_prompt(r["question"], objects), image, n, t, length, **sample_kw)
        rows.append({"idx": r["idx"], "ans0": ans0, "objects_pred": objects, "A": plain, "B": oub})
        if k % 50 == 0:
            log.info("item %d / %d", k + 1, len(items))
    return pd.DataFrame(rows).assign(seed=int(seed))


def label_multi_choice(raw: str, samples: str) -> pd.DataFrame:
    """Correctness of every ans0 of a multiple-choice benchmark, official and strict (`benchmarks`)."""
    gt = read_frame(raw)[0].set_index("idx")["gt"]
    frame = read_frame(samples)[0]
    marks = [bm.label_multi_choice(a, int(gt[i])) for i, a in zip(frame["idx"], frame["ans0"])]
    return pd.DataFrame(
        {
            "idx": frame["idx"],
            "reply": None,
            **{f"correct_{m}": [x[j] for x in marks] for j, m in enumerate(LABEL_MODES)},
        }
    )


def judge(judge_json: str, spec: Mapping[str, Any], raw: str, samples: str, seed: int) -> pd.DataFrame:
    """The judge LLM's verdict on every ans0 of a free-form benchmark (the code's prompt, system message and
    sampling), official and strict labels from its reply."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paperflow.core.device import pick
    from paperflow.core.lm.models import require_pinned
    from paperflow.core.seeding import seed_all

    info = _info(judge_json)
    require_pinned(info["hub"], info["revision"])
    device = pick(spec["device"], key="judge.device")
    seed_all(int(seed))
    tok = AutoTokenizer.from_pretrained(info["folder"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        info["folder"], local_files_only=True, dtype=getattr(torch, spec["dtype"])
    ).to(device)
    model.eval()
    gt = read_frame(raw)[0].set_index("idx")["gt"]
    frame = read_frame(samples)[0]
    replies = []
    for i, ans in zip(frame["idx"], frame["ans0"]):
        messages = [
            {"role": "system", "content": bm.JUDGE_SYSTEM},
            {"role": "user", "content": bm.JUDGE_PROMPT.format(gt=gt[i], ans=ans)},
        ]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = tok([text], return_tensors="pt").to(device)
        with torch.inference_mode():
            ids = model.generate(
                **inputs,
                do_sample=True,
                temperature=float(spec["temperature"]),
                top_p=float(spec["top_p"]),
                repetition_penalty=float(spec["repetition_penalty"]),
                max_new_tokens=int(spec["max_new_tokens"]),
            )
        replies.append(tok.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    marks = [bm.label_judge(r) for r in replies]
    return pd.DataFrame(
        {
            "idx": frame["idx"],
            "reply": replies,
            **{f"correct_{m}": [x[j] for x in marks] for j, m in enumerate(LABEL_MODES)},
        }
    )


def answer_texts(items: pd.DataFrame, samples: pd.DataFrame) -> dict[str, list[list[str]]]:
    """The strings each set embeds: multiple-choice answers mapped to their choice's sentence, free-form raw."""
    question = items.set_index("idx")["question"]
    kind = items["kind"].iloc[0] if len(items) else bm.FREE_FORM
    out = {}
    for s in SETS:
        if kind == bm.MULTI_CHOICE:
            out[s] = [bm.map_answers(list(a), question[i]) for i, a in zip(samples["idx"], samples[s])]
        else:
            out[s] = [list(a) for a in samples[s]]
    return out


def embed(encoder_json: str, spec: Mapping[str, Any], items_path: str, samples: str) -> pd.DataFrame:
    """The pinned sentence encoder's embeddings of every distinct string the sets embed (float32)."""
    from sentence_transformers import SentenceTransformer

    from paperflow.core.device import pick
    from paperflow.core.lm.models import require_pinned

    info = _info(encoder_json)
    require_pinned(info["hub"], info["revision"])
    device = pick(spec["device"], key="encoder.device")
    texts = answer_texts(read_frame(items_path)[0], read_frame(samples)[0])
    strings = sorted({a for s in SETS for row in texts[s] for a in row})
    model = SentenceTransformer(info["folder"], device=str(device), local_files_only=True)
    vectors = model.encode(strings, batch_size=int(spec["batch_size"]), convert_to_numpy=True)
    return pd.DataFrame({"answer": strings, "vector": list(np.asarray(vectors, dtype=np.float32))})


def score(
    method: str, items_path: str, samples: str, embeddings: str, scoring: Mapping[str, Any], seed: int, chunk: int = 100
) -> pd.DataFrame:
    """One detector's scores on every item at every n of `scoring.ns`, computed per block of `chunk` items (the
    Gram matrices stay block-sized). Columns as the smoke scale's, `item` the row in the samples file."""
    frame = read_frame(samples)[0]
    texts = answer_texts(read_frame(items_path)[0], frame)
    table = read_frame(embeddings)[0]
    vectors = dict(zip(table["answer"], table["vector"]))
    out = []
    for start in range(0, len(frame), chunk):
        rows = range(start, min(start + chunk, len(frame)))
        strings = sorted({a for s in SETS for i in rows for a in texts[s][i]})
        index = {a: k for k, a in enumerate(strings)}
        scorer = M.Scorer(strings, np.stack([np.asarray(vectors[a]) for a in strings]), judge_threshold=1.0)
        sets = {s: np.array([[index[a] for a in texts[s][i]] for i in rows]) for s in SETS}
        part = M.score_seed(M.METHODS[method], int(seed), sets, scorer, scoring["ns"], int(scoring["reps"]))
        out.append(part.assign(item=part["item"] + start))
    return pd.concat(out, ignore_index=True).assign(method=method)


def evaluate(labels: Mapping[tuple, str], score_files: Mapping[tuple, str]) -> pd.DataFrame:
    """Per (vlm, benchmark, seed, method, n, label mode): AUROC (mean and std over sub-samplings) and detection
    accuracy at the official threshold. `labels[(vlm, bench, seed)]` and `score_files[(vlm, bench, seed, method)]`
    are paths."""
    rows = []
    for (vlm, bench, seed, method), path in sorted(score_files.items()):
        marks = read_frame(labels[(vlm, bench, seed)])[0]
        table = read_frame(path)[0]
        for mode in LABEL_MODES:
            wrong = ~marks[f"correct_{mode}"].to_numpy(dtype=bool)
            for n, g in table.groupby("n"):
                reps = [r.sort_values("item") for _, r in g.groupby("rep")]
                aucs = [metrics.auroc(wrong, r["score"].to_numpy()) for r in reps]
                has_flag = not reps[0]["flag"].isna().all()
                accs = [metrics.detection_accuracy(wrong, r["flag"].to_numpy() == 1) for r in reps]
                rows.append(
                    {
                        "vlm": vlm,
                        "benchmark": bench,
                        "seed": int(seed),
                        "method": method,
                        "n": int(n),
                        "label_mode": mode,
                        "auroc": float(np.mean(aucs)),
                        "auroc_std_subsamples": float(np.std(aucs)),
                        "detection_accuracy": float(np.mean(accs)) if has_flag else np.nan,
                        "wrong_rate": float(wrong.mean()),
                        "items": len(wrong),
                    }
                )
    return pd.DataFrame(rows)
