"""DOUBT at paper scale (`source.kind: benchmarks`), one function per rule: the MLLMs, the judge LLM, the sentence
encoder and the NLI model downloaded at pinned Hub commits, the benchmarks' parquet files at pinned dataset commits,
the official question rendering (`benchmarks`), and per (MLLM, benchmark) the code's generation protocol on GPUs:
ans0 (T = t_answer), the plain set A (n_max at T, top-k / top-p), the object list (T = t_answer, once) and the OUB
set B (n_max at T on question + bridge + objects). Labels: multiple-choice on the CPU, free-form by the judge LLM on
a GPU (the code's prompt). Embedding with the pinned encoder (the code's nli-roberta-large), bidirectional
entailment between every item's distinct answers (the NLI model, for semantic entropy), then the same detectors as
the smoke scale (`methods`), scored per item on the CPU, AUROC and detection accuracy at the official thresholds
(0.48 for DOUBT, 1.0 for entropy).

Generation goes through transformers' `AutoProcessor` and `AutoModelForImageTextToText` with the processor's chat
template (LLaVA-1.5, LLaVA-NeXT and Qwen2-VL are native transformers models), sharded over several GPUs of one node
where an entry asks for them (`placement`); InternVL2 runs its snapshot's own remote code (`InternVLChat`). The
scripts only pass paths and params; the smoke scale's stages are `stages`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.core.resume import row_journal
from paperflow.doubt import benchmarks as bm
from paperflow.doubt import methods as M
from paperflow.doubt import metrics

log = logging.getLogger(__name__)
SLUG = "doubt"
SETS = ("A", "B")
LABEL_MODES = ("official", "strict")


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


def item_id(idx: Any) -> Any:
    """An item's `idx` as the plain Python value a journal row holds (numpy integers are not JSON)."""
    return idx.item() if hasattr(idx, "item") else idx


def item_seed(seed: int, tag: str, idx: Any) -> int:
    """The seed of one item's generations in a job: the job's seed, the job's kind (`tag`) and the item's id,
    through a stable hash (not Python's salted one). Each item is seeded on its own, so it samples the same
    whichever items ran before it: a job resumed from its journal samples what an uninterrupted one does."""
    import zlib

    return (int(seed) + zlib.crc32(f"{tag}:{item_id(idx)}".encode())) % 2**32


# model types whose transformers processor carries a video processor, which imports torchvision
NEEDS_TORCHVISION = ("qwen2_vl", "qwen2_5_vl", "internvl")


def require_processor_deps(folder: str, hub: str) -> None:
    """Refuse, by name, an MLLM whose processor cannot load in this env: Qwen2-VL's and InternVL's processors
    (transformers 5) build a video processor that imports torchvision. envs/lm.yaml carries torchvision (torch's
    pair), so the sample job loads them; an env without it (this checkout's CPU venv) stops here, not deep inside
    transformers."""
    import importlib.util

    model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    if model_type in NEEDS_TORCHVISION and importlib.util.find_spec("torchvision") is None:
        raise RuntimeError(
            f"{hub} (model_type {model_type}): its transformers processor imports torchvision (the video processor), "
            "which this env lacks; run the sample rule in its conda env (envs/lm.yaml carries torchvision)"
        )


def placement(spec: Mapping[str, Any], key: str, visible: int) -> dict[str, Any]:
    """from_pretrained's placement arguments for an MLLM entry (spec section 6: 26B and 72B models on several GPUs of
    one node): {} for `gpus` 1 (the model is moved to the one device), else `device_map="auto"` over GPUs
    0..gpus-1 with `max_memory_per_gpu` on each and nothing on the CPU (the kit's `sharding.max_memory`).
    `visible` is the number of CUDA devices the job sees; fewer than `gpus` is refused naming the key."""
    from paperflow.core.lm.sharding import max_memory

    gpus = int(spec.get("gpus", 1))
    if gpus <= 1:
        return {}
    if spec.get("device") != "cuda":
        raise ConfigError(f"{key}.gpus = {gpus} shards the model over GPUs: {key}.device must be 'cuda'")
    if "max_memory_per_gpu" not in spec:
        raise ConfigError(f"{key}.max_memory_per_gpu is missing: {key}.gpus = {gpus} shards the model over GPUs")
    memory = max_memory(gpus, str(spec["max_memory_per_gpu"]), f"{key}.gpus", visible=visible)
    return {"device_map": "auto", "max_memory": memory}


def check_device_map(device_map: Mapping[str, Any], key: str) -> None:
    """Refuse a sharded model that accelerate put partly on the CPU or disk (it would run, slowly and silently)."""
    from paperflow.core.lm.sharding import check_placement

    check_placement(device_map, key, hint=f"raise {key}.gpus or {key}.max_memory_per_gpu")


def load_vlm_model(folder: str, spec: Mapping[str, Any], key: str, device):
    """An MLLM snapshot as transformers' native image-text-to-text model (LLaVA, LLaVA-NeXT, Qwen2-VL, InternVL),
    offline, in `spec.dtype`, in eval mode: on `device`, or sharded over `spec.gpus` GPUs (`placement`)."""
    import torch
    from transformers import AutoModelForImageTextToText

    place = placement(spec, key, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    model = AutoModelForImageTextToText.from_pretrained(
        folder, local_files_only=True, dtype=getattr(torch, spec["dtype"]), **place
    )
    if place:
        check_device_map(model.hf_device_map, key)
    else:
        model.to(device)
    return model.eval()


class VLM:
    """A pinned MLLM loaded offline from its snapshot: chat-templated prompts with one image, sampled generation of
    the new tokens only, left-padded batches of `batch_size` rows."""

    def __init__(self, info: Mapping[str, str], spec: Mapping[str, Any], device, key: str = "vlms"):
        import torch
        from transformers import AutoProcessor

        from paperflow.core.lm.models import require_pinned

        require_pinned(info["hub"], info["revision"])
        require_processor_deps(info["folder"], info["hub"])
        self.processor = AutoProcessor.from_pretrained(
            info["folder"], local_files_only=True, **dict(spec.get("processor") or {})
        )
        self.processor.tokenizer.padding_side = "left"
        self.dtype = getattr(torch, spec["dtype"])
        self.model = load_vlm_model(info["folder"], spec, key, device)
        self.device, self.image_first, self.batch_size = (
            self.model.device,  # sharded: the inputs go where the embeddings are
            bool(spec["image_first"]),
            int(spec["batch_size"]),
        )

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


# InternVL2 (remote code): the Python modules its snapshot's modeling code imports (InternViT's DropPath from timm,
# einops; InternLM2's slow tokenizer from sentencepiece)
REMOTE_CODE_DEPS = {"internvl_chat": ("timm", "einops", "sentencepiece")}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def closest_grid(aspect: float, width: int, height: int, size: int, max_tiles: int) -> tuple[int, int]:
    """InternVL's tiling grid (lvlm/InternVL.py, the model card's dynamic_preprocess): among the (columns, rows)
    grids of 1..max_tiles tiles, ordered by tile count, the one whose aspect ratio is closest to the image's; on a
    tie the larger grid wins when the image has more than half its pixels."""
    grids = sorted(
        {
            (i, j)
            for n in range(1, max_tiles + 1)
            for i in range(1, n + 1)
            for j in range(1, n + 1)
            if i * j <= max_tiles
        },
        key=lambda g: g[0] * g[1],
    )
    best, best_diff = (1, 1), float("inf")
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and width * height > 0.5 * size * size * grid[0] * grid[1]:
            best = grid
    return best


def internvl_tiles(image, size: int = 448, max_tiles: int = 4):
    """[tiles, 3, size, size] float32 pixels as InternVL2's load_image(image, max_num=max_tiles) makes them: the
    image resized to its closest grid of size x size tiles, cut row by row, plus a thumbnail when there are several
    tiles; each tile scaled to [0, 1] and normalised by the ImageNet mean and std."""
    import torch

    image = image.convert("RGB")
    width, height = image.size
    cols, rows = closest_grid(width / height, width, height, size, max_tiles)
    resized = image.resize((size * cols, size * rows))
    tiles = [
        resized.crop((c * size, r * size, (c + 1) * size, (r + 1) * size)) for r in range(rows) for c in range(cols)
    ]
    if len(tiles) > 1:
        tiles.append(image.resize((size, size)))
    mean, std = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)
    arrays = [((np.asarray(t, dtype=np.float64) / 255.0 - mean) / std).transpose(2, 0, 1) for t in tiles]
    return torch.from_numpy(np.stack(arrays).astype(np.float32))


class InternVLChat:
    """InternVL2 through its snapshot's own code (trust_remote_code: modeling_internvl_chat.py at the pinned
    commit), as lvlm/InternVL.py runs it: the image cut into at most `max_tiles` 448-pixel tiles and a thumbnail,
    one `model.chat(tokenizer, pixel_values, question, generation_config)` per answer (the code samples one at a
    time)."""

    def __init__(self, model, tokenizer, spec: Mapping[str, Any], device):
        import torch

        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.dtype = getattr(torch, spec["dtype"])
        self.size, self.max_tiles = int(spec.get("image_size", 448)), int(spec["max_tiles"])

    @classmethod
    def load(cls, info: Mapping[str, str], spec: Mapping[str, Any], device, key: str) -> InternVLChat:
        import importlib.util

        import torch
        from transformers import AutoModel, AutoTokenizer

        from paperflow.core.lm.models import require_pinned

        require_pinned(info["hub"], info["revision"])
        missing = [m for m in REMOTE_CODE_DEPS["internvl_chat"] if importlib.util.find_spec(m) is None]
        if missing:
            raise RuntimeError(
                f"{key} ({info['hub']}): its remote modeling code imports {missing}, which this env lacks"
            )
        folder = info["folder"]
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True, use_fast=False, local_files_only=True)
        place = placement(spec, key, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        model = AutoModel.from_pretrained(
            folder, dtype=getattr(torch, spec["dtype"]), trust_remote_code=True, local_files_only=True, **place
        )
        if place:
            check_device_map(model.hf_device_map, key)
        else:
            model.to(device)
        # the vision tower sits on the first GPU (device_map) or the one device: the pixels go there
        return cls(model.eval(), tok, spec, next(model.parameters()).device)

    def generate(self, text: str, image, n: int, temperature: float, max_new_tokens: int, **kw) -> list[str]:
        """`n` sampled answers to one (question, image), one chat call each (the code's generation_config)."""
        import torch

        pixels = internvl_tiles(image, self.size, self.max_tiles).to(self.dtype).to(self.device)
        config = {"max_new_tokens": int(max_new_tokens), "do_sample": True, "temperature": float(temperature), **kw}
        with torch.inference_mode():
            return [self.model.chat(self.tokenizer, pixels, text, dict(config)).strip() for _ in range(n)]


BACKENDS = ("native", "internvl_chat")


def load_vlm(info: Mapping[str, str], spec: Mapping[str, Any], device, key: str):
    """The sampler of an MLLM entry by its `backend`: transformers' native model and processor (`VLM`), or
    InternVL2's remote code (`InternVLChat`)."""
    backend = spec.get("backend", "native")
    if backend == "native":
        return VLM(info, spec, device, key=key)
    if backend == "internvl_chat":
        return InternVLChat.load(info, spec, device, key)
    raise ConfigError(f"{key}.backend = {backend!r}; choose one of {list(BACKENDS)}")


SAMPLE_COLUMNS = ("idx", "ans0", "objects_pred", "A", "B")


def sample(
    name: str,
    vlm_json: str,
    spec: Mapping[str, Any],
    items_path: str,
    sampling: Mapping[str, Any],
    seed: int,
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """Per item (spec section 2, the code's order): ans0, the plain set A, the object list, the OUB set B. Each
    item is seeded by its id (`item_seed`) and its row goes to the `journal` file (the job's checkpoint folder) as
    it finishes, so a rerun samples only the items left, as an uninterrupted run does (None: a scratch journal,
    nothing resumes)."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all

    device = pick(spec["device"], key=f"vlms.{name}.device")
    items = read_frame(items_path)[0]
    base = int(seed) * 1000 + int(sampling["seed"])
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
    records = items.to_dict("records")
    with row_journal(journal, key="idx") as done:
        todo = done.todo(records, key=lambda r: item_id(r["idx"]))
        if todo:
            log.info("%d of %d items to sample (%d in the journal)", len(todo), len(records), len(done))
            vlm = load_vlm(_info(vlm_json), spec, device, key=f"vlms.{name}")
        for k, r in enumerate(todo):
            seed_all(item_seed(base, "sample", r["idx"]))
            image = bm.load_image(r["image"])
            ans0 = vlm.generate(r["question"], image, 1, t0, length, **answer_kw)[0]
            plain = vlm.generate(r["question"], image, n, t, length, **sample_kw)
            objects = vlm.generate(bm.LIST_PROMPT, image, 1, t0, length, **answer_kw)[0]
            oub = vlm.generate(bm.oub_prompt(r["question"], objects), image, n, t, length, **sample_kw)
            done.append({"idx": item_id(r["idx"]), "ans0": ans0, "objects_pred": objects, "A": plain, "B": oub})
            if k % 50 == 0:
                log.info("item %d / %d", k + 1, len(todo))
        rows = done.complete([item_id(r["idx"]) for r in records])
    return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS)).assign(seed=int(seed))


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


class ChatLLM:
    """The instruction LLM of llm/Qwen.py (Qwen2.5-3B-Instruct: the free-form judge, and VL-Uncertainty's
    rephraser), loaded offline from its pinned snapshot: one reply per user message, with the code's system
    message, sampling at the given temperature with `spec.top_p`, `spec.repetition_penalty` and
    `spec.max_new_tokens`, the new tokens decoded."""

    def __init__(self, info: Mapping[str, str], spec: Mapping[str, Any], device):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from paperflow.core.lm.models import require_pinned

        require_pinned(info["hub"], info["revision"])
        self.spec, self.device = spec, device
        self.tok = AutoTokenizer.from_pretrained(info["folder"], local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(
            info["folder"], local_files_only=True, dtype=getattr(torch, spec["dtype"])
        ).to(device)
        self.model.eval()

    def reply(self, user: str, temperature: float) -> str:
        import torch

        messages = [{"role": "system", "content": bm.JUDGE_SYSTEM}, {"role": "user", "content": user}]
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = self.tok([text], return_tensors="pt").to(self.device)
        with torch.inference_mode():
            ids = self.model.generate(
                **inputs,
                do_sample=True,
                temperature=float(temperature),
                top_p=float(self.spec["top_p"]),
                repetition_penalty=float(self.spec["repetition_penalty"]),
                max_new_tokens=int(self.spec["max_new_tokens"]),
            )
        return self.tok.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def judge(
    judge_json: str, spec: Mapping[str, Any], raw: str, samples: str, seed: int, journal: str | Path | None = None
) -> pd.DataFrame:
    """The judge LLM's verdict on every ans0 of a free-form benchmark (the code's prompt, system message and
    sampling), official and strict labels from its reply. Each reply is seeded by its item's id (`item_seed`) and
    goes to the `journal` file (the job's checkpoint folder) as it comes, so a rerun asks only the items left."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all

    device = pick(spec["device"], key="judge.device")
    gt = read_frame(raw)[0].set_index("idx")["gt"]
    frame = read_frame(samples)[0]
    asks = [(item_id(i), ans) for i, ans in zip(frame["idx"], frame["ans0"])]
    with row_journal(journal, key="idx") as done:
        todo = done.todo(asks, key=lambda a: a[0])
        if todo:
            llm = ChatLLM(_info(judge_json), spec, device)
        for i, ans in todo:
            seed_all(item_seed(seed, "judge", i))
            done.append({"idx": i, "reply": llm.reply(bm.JUDGE_PROMPT.format(gt=gt[i], ans=ans), spec["temperature"])})
        replies = [r["reply"] for r in done.complete([i for i, _ in asks])]
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


ENTAILMENT_STATISTICS = ("se",)  # the detectors whose clusters come from the entailment judge at paper scale


VL_UNCERTAINTY = "vl_uncertainty"  # paper scale only: answers to perturbed prompts (`paperflow.doubt.vl_uncertainty`)
PAPER_METHODS = (*M.METHODS, VL_UNCERTAINTY)


def needs_entailment(method: str) -> bool:
    """Whether the method's clusters come from the NLI judge over the plain / OUB sets (the `entail` rule).
    VL-Uncertainty has its own entailment rule over its perturbed answers (free-form benchmarks only)."""
    if method == VL_UNCERTAINTY:
        return False
    return M.METHODS[method].statistic in ENTAILMENT_STATISTICS


def entail(
    nli_json: str, spec: Mapping[str, Any], items_path: str, samples: str, journal: str | Path | None = None
) -> pd.DataFrame:
    """Per item, the NLI judge's bidirectional entailment between every two of its distinct answer strings (those
    the sets embed, A and B together), "question answer" pairs where `condition_on_question` (Kuhn et al.).
    Columns: idx, answers (sorted distinct strings), same (the flattened [k, k] equivalence). Each item's row goes
    to the `journal` file (the job's checkpoint folder) as it is judged, so a rerun judges only the items left."""
    from paperflow.core.device import pick
    from paperflow.core.lm.models import require_pinned
    from paperflow.doubt import entailment

    info = _info(nli_json)
    require_pinned(info["hub"], info["revision"])
    device = pick(spec["device"], key="nli.device")
    items = read_frame(items_path)[0]
    frame = read_frame(samples)[0]
    texts = answer_texts(items, frame)
    question = items.set_index("idx")["question"]
    ids = [item_id(idx) for idx in frame["idx"]]
    with row_journal(journal, key="idx") as done:
        todo = done.todo(list(enumerate(ids)), key=lambda t: t[1])
        if todo:
            model, tok = entailment.load_nli(info["folder"], device, spec.get("dtype", "float32"))
        for i, idx in todo:
            strings = sorted({a for s in SETS for a in texts[s][i]})
            prefix = f"{question[idx]} " if spec["condition_on_question"] else ""
            judge = entailment.NLIJudge(model, tok, device, int(spec["batch_size"]), prefix)
            same = entailment.equivalence(strings, judge)
            done.append({"idx": idx, "answers": strings, "same": same.ravel().tolist()})
        rows = done.complete(ids)
    return pd.DataFrame(rows, columns=["idx", "answers", "same"])


def score(
    method: str,
    items_path: str,
    samples: str,
    embeddings: str,
    scoring: Mapping[str, Any],
    seed: int,
    chunk: int = 100,
    entail_path: str | None = None,
) -> pd.DataFrame:
    """One detector's scores on every item at every n of `scoring.ns`, computed per block of `chunk` items (the
    Gram matrices stay block-sized). Semantic entropy's clusters come from the entailment judge's per-item
    equivalence (`entail_path`, the `entail` rule's output), scored one item at a time. Columns as the smoke
    scale's, `item` the row in the samples file."""
    frame = read_frame(samples)[0]
    texts = answer_texts(read_frame(items_path)[0], frame)
    table = read_frame(embeddings)[0]
    vectors = dict(zip(table["answer"], table["vector"]))
    judged = None
    if needs_entailment(method):
        if entail_path is None:
            raise ValueError(f"method {method} clusters by entailment: pass the entail rule's output")
        judged = read_frame(entail_path)[0]
        if list(judged["idx"]) != list(frame["idx"]):
            raise ValueError(f"{entail_path}: its items are not those of {samples}")
        chunk = 1
    out = []
    for start in range(0, len(frame), chunk):
        rows = range(start, min(start + chunk, len(frame)))
        strings = sorted({a for s in SETS for i in rows for a in texts[s][i]})
        same = None
        if judged is not None:
            if list(judged["answers"].iloc[start]) != strings:
                raise ValueError(f"{entail_path}: item {frame['idx'].iloc[start]} was judged on other answers")
            same = np.asarray(judged["same"].iloc[start], dtype=bool).reshape(len(strings), len(strings))
        index = {a: k for k, a in enumerate(strings)}
        vec = np.stack([np.asarray(vectors[a]) for a in strings])
        scorer = M.Scorer(strings, vec, judge_threshold=1.0, same=same)
        sets = {s: np.array([[index[a] for a in texts[s][i]] for i in rows]) for s in SETS}
        part = M.score_seed(M.METHODS[method], int(seed), sets, scorer, scoring["ns"], int(scoring["reps"]))
        out.append(part.assign(item=part["item"] + start))
    return pd.concat(out, ignore_index=True).assign(method=method)


def evaluate(labels: Mapping[tuple, str], score_files: Mapping[tuple, str]) -> pd.DataFrame:
    """Per (vlm, benchmark, seed, method, n, label mode): AUROC (mean and std over sub-samplings) and detection
    accuracy at the official threshold; `full_set` marks the method's largest n (its whole answer set).
    `labels[(vlm, bench, seed)]` and `score_files[(vlm, bench, seed, method)]` are paths."""
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
                        # the method's whole set (n_max; VL-Uncertainty: its perturbations), not a sub-sample
                        "full_set": bool(n == table["n"].max()),
                    }
                )
    return pd.DataFrame(rows)
