"""VL-Uncertainty (Zhang et al., arXiv 2411.11919), the baseline DOUBT's code descends from, at DOUBT's paper scale,
following its official code (github.com/Ruiyang-061X/VL-Uncertainty at 793f911: VL_Uncertainty.py,
util/visual_perturbation.py, util/misc.py, llm/Qwen.py, run/run_<benchmark>.sh):

- perturbed prompts, k per item ("progressively" paired: the i-th blurred image with the i-th rephrased question):
  the image Gaussian-blurred with PIL at the benchmark's radii (`ImageFilter.GaussianBlur(radius)`), and the
  question's first line rephrased by the LLM (Qwen2.5-3B-Instruct, llm/Qwen.py's chat: system message, top-p 0.8,
  repetition penalty 1.05, 256 new tokens) with the code's instruction at the temperatures 0.1 ... 0.5, the rest of
  the question (a multiple-choice question's options and instruction) kept as it was (`merge`);
- one answer of the MLLM under test per perturbed prompt (its `generate`: the code's answer settings, 32 new tokens,
  at the run script's sampling temperature for that MLLM and benchmark);
- clusters: multiple choice by the first integer of the answer (-1 when there is none or it is not a choice; all
  -1 answers share one cluster), free-form by bidirectional entailment (greedy, first member; here the NLI judge of
  `entailment`, see `score`); the entropy U = -sum_c (n_c / k) log2 (n_c / k); hallucination iff U >= 1.0.

ans0 and its label are DOUBT's (`paper.sample`, `label` / `judge`): every detector is ranked against the same
labels. One function per rule; the scripts pass paths and params."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame
from paperflow.core.resume import row_journal
from paperflow.doubt import benchmarks as bm
from paperflow.doubt.methods import SE_THRESHOLD

METHOD = "vl_uncertainty"
DESCRIPTION = (
    "VL-Uncertainty: entropy (log2) of the answers to k blurred-image x LLM-rephrased-question prompts; clusters by "
    "parsed choice (multiple choice) or bidirectional NLI entailment (free-form)"
)
_INTEGER = re.compile(r"\d+")


def blur(image, radius: float):
    """The image Gaussian-blurred as util/visual_perturbation.image_blurring does it: PIL's GaussianBlur with
    standard deviation `radius` (an extended box blur, three passes per axis). No fallback: an image PIL cannot
    blur is an error here (the code returns it unblurred)."""
    from PIL import ImageFilter

    return image.filter(ImageFilter.GaussianBlur(radius=float(radius)))


def first_line(question: str) -> str:
    """The part of the question the LLM rephrases (util/misc.parse_original_question)."""
    return question.split("\n")[0]


def merge(rephrased: str, question: str) -> str:
    """The rephrased first line followed by the question's other lines (util/misc.merge_question)."""
    return rephrased + "\n" + "\n".join(question.split("\n")[1:])


def instruction(template: str, question: str) -> str:
    return template.replace("{question}", first_line(question))


def radii(vlu: Mapping[str, Any], bench: str) -> list[float]:
    table = vlu["blur_radii"]
    if bench not in table:
        raise ConfigError(f"vl_uncertainty.blur_radii has no entry for the benchmark {bench!r}")
    return [float(r) for r in table[bench]]


def temperature(vlu: Mapping[str, Any], vlm: str, bench: str) -> float:
    """The MLLM's sampling temperature on the perturbed prompts: run/run_<bench>.sh's --sampling_temp for that
    MLLM (`temperature.<bench>.<vlm>`), else the benchmark's `default`."""
    table = vlu["temperature"]
    if bench not in table:
        raise ConfigError(f"vl_uncertainty.temperature has no entry for the benchmark {bench!r}")
    return float(table[bench].get(vlm, table[bench]["default"]))


def rephrase(
    judge_json: str,
    spec: Mapping[str, Any],
    vlu: Mapping[str, Any],
    items_path: str,
    seed: int,
    journal: str | Path | None = None,
):
    """Per item, the LLM's rephrasings of the question's first line, one per temperature of
    `vlu.rephrase_temperatures` (in order), and the perturbed questions (`merge`). Columns: idx, rephrased,
    questions. Each item is seeded by its id (`paper.item_seed`) and its row goes to the `journal` file (the job's
    checkpoint folder) as it finishes, so a rerun rephrases only the items left, as an uninterrupted run does."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all
    from paperflow.doubt.paper import ChatLLM, _info, item_id, item_seed

    device = pick(spec["device"], key="judge.device")
    items = read_frame(items_path)[0]
    asks = [(item_id(idx), question) for idx, question in zip(items["idx"], items["question"])]
    with row_journal(journal, key="idx") as done:
        todo = done.todo(asks, key=lambda a: a[0])
        if todo:
            llm = ChatLLM(_info(judge_json), spec, device)
        for idx, question in todo:
            seed_all(item_seed(seed, "rephrase", idx))
            prompt = instruction(vlu["instruction"], question)
            replies = [llm.reply(prompt, t) for t in vlu["rephrase_temperatures"]]
            done.append({"idx": idx, "rephrased": replies, "questions": [merge(r, question) for r in replies]})
        rows = done.complete([idx for idx, _ in asks])
    return pd.DataFrame(rows, columns=["idx", "rephrased", "questions"])


def sample(
    name: str,
    bench: str,
    vlm_json: str,
    spec: Mapping[str, Any],
    items_path: str,
    perturb_path: str,
    vlu: Mapping[str, Any],
    seed: int,
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """One answer of the MLLM per perturbed prompt of each item: the i-th blurred image (`radii`) with the i-th
    rephrased question, at the run script's temperature, with the code's answer settings (`answer_generation`) and
    `vlu.max_new_tokens`. Columns: idx, P (the k answers in pair order), seed. Each item is seeded by its id
    (`paper.item_seed`) and its row goes to the `journal` file (the job's checkpoint folder) as it finishes, so a
    rerun samples only the items left, as an uninterrupted run does."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all
    from paperflow.doubt.paper import _info, item_id, item_seed, load_vlm

    device = pick(spec["device"], key=f"vlms.{name}.device")
    items = read_frame(items_path)[0]
    perturbed = read_frame(perturb_path)[0]
    if list(perturbed["idx"]) != list(items["idx"]):
        raise ValueError(f"{perturb_path}: its items are not those of {items_path}")
    levels = radii(vlu, bench)
    t, length = temperature(vlu, name, bench), int(vlu["max_new_tokens"])
    kw = dict(spec.get("answer_generation") or {})
    pairs = list(zip(items.to_dict("records"), perturbed["questions"]))
    for r, questions in pairs:
        if len(questions) != len(levels):
            raise ValueError(f"item {r['idx']}: {len(questions)} rephrasings for {len(levels)} blur radii")
    with row_journal(journal, key="idx") as done:
        todo = done.todo(pairs, key=lambda p: item_id(p[0]["idx"]))
        if todo:
            vlm = load_vlm(_info(vlm_json), spec, device, key=f"vlms.{name}")
        for r, questions in todo:
            seed_all(item_seed(seed, "perturbed", r["idx"]))
            image = bm.load_image(r["image"])
            answers = [vlm.generate(q, blur(image, rad), 1, t, length, **kw)[0] for q, rad in zip(questions, levels)]
            done.append({"idx": item_id(r["idx"]), "P": answers})
        rows = done.complete([item_id(r["idx"]) for r, _ in pairs])
    return pd.DataFrame(rows, columns=["idx", "P"]).assign(seed=int(seed))


def num_choices(question: str) -> int:
    """The options of a rendered multiple-choice question (the code's sample['num_c'])."""
    return len(bm._CHOICE_LINE.findall(question))


def choice_clusters(answers: Sequence[str], num_c: int) -> list[int]:
    """VL-Uncertainty's multiple-choice clusters: the answer's first integer (all its digits: "10" is 10) when it
    is a choice index, else -1 (one cluster for every unparsable or out-of-range answer)."""
    out = []
    for a in answers:
        m = _INTEGER.search(a)
        out.append(int(m.group()) if m is not None and int(m.group()) < num_c else -1)
    return out


def entail(
    nli_json: str, spec: Mapping[str, Any], items_path: str, perturbed_path: str, journal: str | Path | None = None
) -> pd.DataFrame:
    """Free-form benchmarks: per item, the NLI judge's bidirectional entailment between its distinct perturbed
    answers (raw strings), "question answer" on both sides where `condition_on_question` (the original question:
    the perturbed ones differ per answer). Columns: idx, answers (sorted distinct strings), same (flattened). Each
    item's row goes to the `journal` file (the job's checkpoint folder) as it is judged; a rerun judges the rest."""
    from paperflow.core.device import pick
    from paperflow.core.lm.models import require_pinned
    from paperflow.doubt import entailment
    from paperflow.doubt.paper import _info, item_id

    info = _info(nli_json)
    require_pinned(info["hub"], info["revision"])
    device = pick(spec["device"], key="nli.device")
    question = read_frame(items_path)[0].set_index("idx")["question"]
    frame = read_frame(perturbed_path)[0]
    asks = [(item_id(idx), list(answers)) for idx, answers in zip(frame["idx"], frame["P"])]
    with row_journal(journal, key="idx") as done:
        todo = done.todo(asks, key=lambda a: a[0])
        if todo:
            model, tok = entailment.load_nli(info["folder"], device, spec.get("dtype", "float32"))
        for idx, answers in todo:
            strings = sorted(set(answers))
            prefix = f"{question[idx]} " if spec["condition_on_question"] else ""
            judge = entailment.NLIJudge(model, tok, device, int(spec["batch_size"]), prefix)
            same = entailment.equivalence(strings, judge).ravel().tolist()
            done.append({"idx": idx, "answers": strings, "same": same})
        rows = done.complete([idx for idx, _ in asks])
    return pd.DataFrame(rows, columns=["idx", "answers", "same"])


def clusters(kind: str, question: str, answers: Sequence[str], judged: Mapping[str, Any] | None) -> list[int]:
    """An item's clusters: parsed choice (multiple choice) or greedy bidirectional entailment over the judged
    equivalence of its distinct answers (free-form)."""
    from paperflow.doubt.scores import greedy_clusters

    if kind == bm.MULTI_CHOICE:
        return choice_clusters(answers, num_choices(question))
    if judged is None:
        raise ValueError("a free-form benchmark's VL-Uncertainty clusters by entailment: pass its entail output")
    strings = list(judged["answers"])
    if set(answers) - set(strings):
        raise ValueError(f"item {judged['idx']}: answers {sorted(set(answers) - set(strings))} were not judged")
    k = len(strings)
    same = np.asarray(judged["same"], dtype=bool).reshape(k, k)
    index = {a: i for i, a in enumerate(strings)}
    return greedy_clusters([index[a] for a in answers], same)


def score(items_path: str, perturbed_path: str, seed: int, entail_path: str | None = None) -> pd.DataFrame:
    """VL-Uncertainty's score on every item: U over its k perturbed answers (higher = more likely wrong), flag U >=
    1.0. The same columns as `paper.score` (n = k, one repetition: the k answers are the whole set)."""
    from paperflow.doubt.scores import semantic_entropy

    items = read_frame(items_path)[0]
    frame = read_frame(perturbed_path)[0]
    question = items.set_index("idx")["question"]
    kind = items["kind"].iloc[0] if len(items) else bm.FREE_FORM
    judged = None
    if kind != bm.MULTI_CHOICE:
        if entail_path is None:
            raise ValueError(f"{METHOD} on a free-form benchmark clusters by entailment: pass the entail output")
        judged = read_frame(entail_path)[0]
        if list(judged["idx"]) != list(frame["idx"]):
            raise ValueError(f"{entail_path}: its items are not those of {perturbed_path}")
    sizes = {len(a) for a in frame["P"]}
    if len(sizes) > 1:
        raise ValueError(f"{perturbed_path}: items have different numbers of perturbed answers {sorted(sizes)}")
    u = np.array(
        [
            semantic_entropy(
                clusters(kind, question[idx], list(answers), None if judged is None else judged.iloc[i].to_dict())
            )
            for i, (idx, answers) in enumerate(zip(frame["idx"], frame["P"]))
        ]
    )
    return pd.DataFrame(
        {
            "seed": int(seed),
            "n": sizes.pop() if sizes else 0,
            "rep": 0,
            "item": np.arange(len(u)),
            "score": u,
            "flag": (u >= SE_THRESHOLD).astype(float),
            "method": METHOD,
        }
    )
