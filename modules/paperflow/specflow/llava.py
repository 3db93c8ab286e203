"""SpecFlow inside LLaVA-1.5 (transformers' `LlavaForConditionalGeneration`), the paper-scale model side.

Pruning happens once, between the projector and the language model (spec section 2): the CLIP tower runs with eager
attention so that the seed layer's attention comes back (SDPA returns none; section 9), the projector maps that
layer's patch features to Z (LLaVA's `vision_feature_layer`, [CLS] dropped), a condensation method of
`paperflow.specflow` (the same numpy functions as the smoke) maps Z to the K (+ 2 sinks) tokens fed, and those are
spliced into the prompt's embeddings where `<image>` stands. The language model then runs unmodified (SDPA/Flash
attention, its own contiguous positions; sinks last), through `generate(inputs_embeds=...)`.

FastV (`fastv`) prunes inside the language model instead (`fastv_generate`): all N projector tokens are fed, the
first `fastv_layer` (K = 2) decoder layers run on the whole prompt, the image tokens are ranked by the attention the
prompt's last token pays them in layer K (1-based; heads averaged, as the official FastV code does with
`last_layer_attention_avg_last_tok`), and only the top `budget` of them (the same budget as every other method) go on
through layers K + 1 .. L, their original positions kept. Generation then decodes greedily on that pruned KV cache
(layers <= K hold the whole prompt, layers > K the pruned one).
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
    the text, the visual tokens fed (K, K + 2 with sinks; FastV: the K image tokens layers > K see, all N being
    fed to layers <= K) and the condensation's time (ms; FastV ranks inside the language model, not timed here)."""
    from paperflow.specflow.stages import condense

    layer = int(cfg["pretrained"]["fastv_layer"]) if method == "fastv" else 0
    toks = vision_tokens(llava, pixels(llava, image))
    t0 = time.perf_counter()
    fed, _, fastv = condense(method, toks, budget, cfg, seed)
    prune_ms = 1000 * (time.perf_counter() - t0)
    embeds = prompt_embeds(llava, question, torch.from_numpy(np.ascontiguousarray(fed)))
    tok = llava.tokenizer
    if fastv is not None:  # all N tokens fed; the top `budget` survive past the language model's layer K
        start = image_start(llava, question)
        ids, _ = fastv_generate(llava, embeds, start, int(fed.shape[1]), int(fastv), layer, max_new_tokens)
        text = tok.decode(ids, skip_special_tokens=True).strip()
        return {"prediction": text, "k_fed": int(fastv), "prune_ms": prune_ms}
    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    out = llava.model.generate(
        inputs_embeds=embeds,
        attention_mask=mask,
        max_new_tokens=int(max_new_tokens),
        do_sample=False,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    text = tok.decode(out[0], skip_special_tokens=True).strip()
    return {"prediction": text, "k_fed": int(fed.shape[1]), "prune_ms": prune_ms}


def image_start(llava: Llava, question: str) -> int:
    """The prompt position of the first visual token (the BOS-prefixed tokens before `<image>`)."""
    before = PROMPT.format(question=question).split(IMAGE)[0]
    return int(llava.tokenizer(before, return_tensors="pt")["input_ids"].shape[1])


def _causal_mask(n: int, like: torch.Tensor) -> torch.Tensor:
    """(1, 1, n, n) additive causal mask (0 on and below the diagonal), explicit so that every attention
    implementation (eager, SDPA) applies it to the pruned sequence too."""
    mask = torch.full((n, n), torch.finfo(like.dtype).min, dtype=like.dtype, device=like.device)
    return torch.triu(mask, diagonal=1)[None, None]


def last_token_attention(attn_module, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(L,) attention of the sequence's last token over all L tokens in one Llama attention layer, heads averaged:
    softmax(q_last k^T * scaling) with the layer's own projections and rotary embedding (what the layer's eager
    attention returns in its last row; computed here so that the layer itself may run SDPA)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    head_dim = attn_module.head_dim
    q = attn_module.q_proj(normed[:, -1:]).view(1, 1, -1, head_dim).transpose(1, 2)
    k = attn_module.k_proj(normed).view(1, normed.shape[1], -1, head_dim).transpose(1, 2)
    q, _ = apply_rotary_pos_emb(q, q, cos[:, -1:], sin[:, -1:])
    _, k = apply_rotary_pos_emb(k, k, cos, sin)
    k = repeat_kv(k, attn_module.num_key_value_groups)
    scores = torch.matmul(q.float(), k.float().transpose(2, 3)) * attn_module.scaling
    return torch.softmax(scores, dim=-1)[0, :, 0].mean(0)


def fastv_keep(attention: torch.Tensor, start: int, n_image: int, budget: int) -> torch.Tensor:
    """Sorted prompt positions FastV keeps: every text position and the `budget` image positions (of
    start .. start + n_image - 1) with the highest attention (`torch.topk`, as the official code)."""
    if not 1 <= budget <= n_image:
        raise ValueError(f"FastV budget {budget} outside 1..{n_image} (the visual tokens fed)")
    image = attention[start : start + n_image]
    top = torch.topk(image, budget, sorted=True).indices + start
    length = attention.shape[0]
    text = torch.cat([torch.arange(start), torch.arange(start + n_image, length)]).to(top.device)
    return torch.cat([text, top]).sort().values


@torch.no_grad()
def fastv_generate(
    llava: Llava,
    embeds: torch.Tensor,
    start: int,
    n_image: int,
    budget: int,
    layer: int,
    max_new_tokens: int,
) -> tuple[list[int], dict[str, Any]]:
    """Greedy decoding of LLaVA's language model with FastV: the prompt embeddings (1, L, d) run through decoder
    layers 1..`layer` whole; the last token's head-averaged attention in layer `layer` ranks the image tokens
    (positions start .. start + n_image - 1); layers `layer` + 1 .. run on the text and the top `budget` image
    tokens only (original RoPE positions); each new token is decoded on that pruned KV cache at position L + t.
    Returns the new token ids (stopping after EOS) and {"kept": prompt positions kept, "logits": (T, V) logits of
    each decoding step, "cache": per-layer KV lengths after the prefill}."""
    from transformers import DynamicCache

    lm = llava.model.model.language_model
    layers = lm.layers[: lm.config.num_hidden_layers]
    if not 1 <= layer < len(layers):
        raise ValueError(f"pretrained.fastv_layer {layer} must lie in 1..{len(layers) - 1} (the decoder's layers)")
    head = llava.model.lm_head
    device = embeds.device
    length = embeds.shape[1]
    cache = DynamicCache(config=lm.config)
    hidden = embeds.to(head.weight.dtype)
    positions = torch.arange(length, device=device)[None]
    kept = torch.arange(length, device=device)
    for i, decoder in enumerate(layers):
        cos, sin = lm.rotary_emb(hidden, position_ids=positions)
        if i == layer - 1:  # the ranking layer: its last-token attention over the whole prompt
            normed = decoder.input_layernorm(hidden)
            attention = last_token_attention(decoder.self_attn, normed, cos, sin)
        if i == layer:
            kept = fastv_keep(attention, start, n_image, budget).to(device)
            hidden, positions = hidden[:, kept], positions[:, kept]
            cos, sin = cos[:, kept], sin[:, kept]
        hidden = decoder(
            hidden,
            attention_mask=_causal_mask(hidden.shape[1], hidden),
            position_ids=positions,
            cache=cache,
            use_cache=True,
            position_embeddings=(cos, sin),
        )
    logits = head(lm.norm(hidden[:, -1:]))[0, -1]
    info = {"kept": kept.cpu(), "cache": [int(cache.layers[i].keys.shape[-2]) for i in range(len(layers))]}
    steps = [logits]
    eos = llava.model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    embed = llava.model.get_input_embeddings()
    out: list[int] = []
    for t in range(int(max_new_tokens)):
        token = int(logits.argmax())
        out.append(token)
        if token in eos or t == int(max_new_tokens) - 1:
            break
        hidden = embed(torch.tensor([[token]], device=device)).to(head.weight.dtype)
        pos = torch.tensor([[length + t]], device=device)
        cos, sin = lm.rotary_emb(hidden, position_ids=pos)
        for decoder in layers:  # one query over each layer's own (full or pruned) cache: no mask needed
            hidden = decoder(
                hidden,
                attention_mask=None,
                position_ids=pos,
                cache=cache,
                use_cache=True,
                position_embeddings=(cos, sin),
            )
        logits = head(lm.norm(hidden))[0, -1]
        steps.append(logits)
    info["logits"] = torch.stack(steps).float().cpu()
    return out, info
