"""SpecFlow inside LLaVA-1.5 (transformers' `LlavaForConditionalGeneration`), the paper-scale model side.

Pruning happens once, between the projector and the language model (spec section 2): the CLIP tower runs with eager
attention so that the seed layer's attention comes back (SDPA returns none; section 9), the projector maps that
layer's patch features to Z (LLaVA's `vision_feature_layer`, [CLS] dropped), a condensation method of
`paperflow.specflow` (the same numpy functions as the smoke) maps Z to the K (+ 2 sinks) tokens fed, and those are
spliced into the prompt's embeddings where `<image>` stands. The language model then runs unmodified (SDPA/Flash
attention, its own contiguous positions; sinks last), through `generate(inputs_embeds=...)`.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paperflow.specflow.baselines import Tokens

IMAGE = "<image>"
# LLaVA-1.5's eval conversation (`--conv-mode vicuna_v1` of its eval scripts): the system line, then one turn
SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
PROMPT = SYSTEM + " USER: <image>\n{question} ASSISTANT:"


@dataclass
class Llava:
    """The model, its tokenizer and image processor, the seed layer and the patch grid."""

    model: Any
    tokenizer: Any
    image_processor: Any
    layer: int
    grid: tuple[int, int]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load(folder: str, dtype: str, device) -> Llava:
    """LLaVA from a downloaded snapshot (offline), its vision tower switched to eager attention."""
    from transformers import AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))
    model.model.vision_tower.set_attn_implementation("eager")
    model = model.to(device).eval()
    layer = model.config.vision_feature_layer
    if not isinstance(layer, int) or layer >= 0 or model.config.vision_feature_select_strategy != "default":
        raise ValueError(
            f"{folder}: vision_feature_layer {layer!r} / strategy {model.config.vision_feature_select_strategy!r}; "
            "the pruning hook reads one negative layer with the [CLS] token dropped (LLaVA-1.5: -2, 'default')"
        )
    vc = model.config.vision_config
    side = vc.image_size // vc.patch_size
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    return Llava(model, tokenizer, processor, layer, (side, side))


def pixels(llava: Llava, image: bytes) -> torch.Tensor:
    """(1, 3, S, S) pixel values of one encoded image, by the model's own image processor."""
    from PIL import Image

    img = Image.open(io.BytesIO(image)).convert("RGB")
    out = llava.image_processor(images=img, return_tensors="pt")["pixel_values"]
    return out.to(llava.device, dtype=llava.model.dtype)


@torch.no_grad()
def vision_tokens(llava: Llava, pixel_values: torch.Tensor) -> Tokens:
    """The `Tokens` every method reads (float64 numpy, batch of one image): Z = projector(seed-layer patch features),
    the seed layer's [CLS] -> patch attention (heads averaged and per head), its head-averaged keys ([CLS] first)
    and patch -> patch attention."""
    tower = llava.model.model.vision_tower
    attn_layer = tower.encoder.layers[llava.layer]
    store: dict[str, torch.Tensor] = {}
    hook = attn_layer.self_attn.k_proj.register_forward_hook(lambda mod, args, out: store.__setitem__("keys", out))
    try:
        out = tower(pixel_values=pixel_values, output_hidden_states=True, output_attentions=True, return_dict=True)
    finally:
        hook.remove()
    z = llava.model.model.multi_modal_projector(out.hidden_states[llava.layer][:, 1:])
    a = out.attentions[llava.layer].float()  # (1, H, N + 1, N + 1)
    heads = a.shape[1]
    keys = store["keys"].float()
    keys = keys.view(*keys.shape[:2], heads, -1).mean(2)
    arrays = {
        "z": z.float(),
        "cls": a[:, :, 0, 1:].mean(1),
        "cls_heads": a[:, :, 0, 1:],
        "keys": keys,
        "attn": a[:, :, 1:, 1:].mean(1),
    }
    return Tokens(**{k: v.cpu().numpy().astype(np.float64) for k, v in arrays.items()}, grid=llava.grid)


def prompt_embeds(llava: Llava, question: str, fed: torch.Tensor) -> torch.Tensor:
    """(1, L, d) input embeddings of the LLaVA prompt with the fed visual tokens (1, K', d) where `<image>` is."""
    before, after = PROMPT.format(question=question).split(IMAGE)
    tok = llava.tokenizer
    ids_before = tok(before, return_tensors="pt")["input_ids"]  # with BOS
    ids_after = tok(after, add_special_tokens=False, return_tensors="pt")["input_ids"]
    embed = llava.model.get_input_embeddings()
    parts = [
        embed(ids_before.to(llava.device)),
        fed.to(device=embed.weight.device, dtype=embed.weight.dtype),
        embed(ids_after.to(llava.device)),
    ]
    return torch.cat(parts, dim=1)


@torch.no_grad()
def answer(
    llava: Llava,
    image: bytes,
    question: str,
    method: str,
    budget: int,
    cfg: Mapping[str, Any],
    seed: int,
    max_new_tokens: int,
) -> dict[str, Any]:
    """Greedy answer of LLaVA to one question with its image condensed by `method` to `budget` selected tokens:
    the text, the visual tokens fed (K, K + 2 with sinks) and the condensation's time (ms)."""
    from paperflow.specflow.stages import condense

    toks = vision_tokens(llava, pixels(llava, image))
    t0 = time.perf_counter()
    fed, _, fastv = condense(method, toks, budget, cfg, seed)
    prune_ms = 1000 * (time.perf_counter() - t0)
    if fastv is not None:
        raise ValueError(f"method {method!r} prunes inside the language model; it is not wired at paper scale")
    embeds = prompt_embeds(llava, question, torch.from_numpy(np.ascontiguousarray(fed)))
    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    tok = llava.tokenizer
    out = llava.model.generate(
        inputs_embeds=embeds, attention_mask=mask, max_new_tokens=int(max_new_tokens), do_sample=False,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )  # fmt: skip
    text = tok.decode(out[0], skip_special_tokens=True).strip()
    return {"prediction": text, "k_fed": int(fed.shape[1]), "prune_ms": prune_ms}
