"""Section 6: seed 003's parameter summaries, recounted with the project's own layers.

Seed 003 builds one encoder layer and one decoder layer at the paper's sizes (d_model 512, h 8 heads,
d_ff 2048) and prints Keras's ``summary()`` of each: 2,233,536 and 2,365,312 parameters. Its attention
projects to d_k = d_v = 64 *in all* (8 per head), not 64 per head as the paper does, which is why one
attention block holds 131,776 parameters instead of the paper's 1,050,624. This section builds the same
layers (``head_dim=8``), counts each sub-layer with :func:`attnlab.summary.summarize`, and compares them
with the seed's printed rows. The encoder layer agrees exactly; the decoder layer has 1,024 more, one
LayerNorm, because the seed's printed graph applies one AddNormalization to two sub-layers (its
``add_normalization_32`` is fed four inputs and no ``add_normalization_33`` appears): a parameter
summary is how a shared normalisation shows. Each sub-layer's output shape is measured on a batch of one
5-token sequence, as the seed's summaries show them for its (None, 5, 512) inputs. The whole model (n = 6, vocabularies of 20) is counted too,
against the "more than 27 million" a reader of the seed reports.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.lab.html import Section, check, para, table
from attnlab.nn import DecoderLayer, EncoderLayer
from attnlab.presets import MODEL_PRESETS, build_preset
from attnlab.summary import summarize, total_parameters

D_MODEL, HEADS, D_FF = 512, 8, 2048
D_K = 64  # seed 003's d_k = d_v: the width of all heads together

#: Seed 003's printed summaries: attnlab's sub-layer -> the Keras row (name, parameters) that does its job.
SEED_ENCODER_ROWS = {"self_attn": ("multi_head_attention_18", 131_776),
                     "attn_block.norm": ("add_normalization_30", 1_024),
                     "ffn": ("feed_forward_12", 2_099_712), "ffn_block.norm": ("add_normalization_31", 1_024)}
SEED_DECODER_ROWS = {"self_attn": ("multi_head_attention_19", 131_776),
                     "self_block.norm": ("add_normalization_32", 1_024),
                     "cross_attn": ("multi_head_attention_20", 131_776),
                     # no row: the seed's graph applies add_normalization_32 here a second time
                     "ffn": ("feed_forward_13", 2_099_712), "ffn_block.norm": ("add_normalization_34", 1_024)}
SEED_ENCODER_TOTAL, SEED_DECODER_TOTAL = 2_233_536, 2_365_312
SEED_MODEL_FLOOR = 27_000_000  # "our model has more 27 million parameters" (a reader's comment in seed 003)
SEED_LENGTH = 5  # the seed's summaries are built for (None, 5, 512) inputs


def _rows(layer) -> list[tuple[str, int]]:
    """(sub-layer name, parameters) of one layer, in the order the data passes through them."""
    return [(row.name, row.parameters) for row in summarize(layer, expand=True)]


def _output_shapes(layer: nn.Module, names: list[str], *inputs: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """The shape of what each named sub-layer returns (its first output: attention also returns weights) when
    ``layer`` runs on ``inputs``, caught with forward hooks."""
    shapes: dict[str, tuple[int, ...]] = {}
    modules = dict(layer.named_modules())

    def catch(name: str):
        def hook(module, args, output):
            shapes[name] = tuple((output[0] if isinstance(output, tuple) else output).shape)
        return hook

    handles = [modules[name].register_forward_hook(catch(name)) for name in names]
    try:
        with torch.no_grad():
            layer.eval()(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return shapes


def _side_by_side(ours: list[tuple[str, int]], shapes: dict[str, tuple[int, ...]],
                  seed: dict[str, tuple[str, int]]) -> list[tuple[str, str, str, str, str]]:
    """Table rows pairing our sub-layers with the seed's printed ones (a note where the seed has none)."""
    missing = ("(none: the first norm is reused)", None)
    return [(name, str(shapes[name]), f"{count:,}", seed.get(name, missing)[0],
             f"{seed[name][1]:,}" if name in seed else "") for name, count in ours]


def parameters_section() -> Section:
    """Section 6: seed 003's encoder and decoder layer summaries and the whole model's total."""
    encoder = EncoderLayer(D_MODEL, HEADS, D_FF, head_dim=D_K // HEADS)
    decoder = DecoderLayer(D_MODEL, HEADS, D_FF, head_dim=D_K // HEADS)
    enc_rows, dec_rows = _rows(encoder), _rows(decoder)
    x = torch.randn(1, SEED_LENGTH, D_MODEL, generator=torch.Generator().manual_seed(0))
    enc_shapes = _output_shapes(encoder, [name for name, _ in enc_rows], x)
    dec_shapes = _output_shapes(decoder, [name for name, _ in dec_rows], x, x)  # (the target, the memory)
    shapes_as_seed = {*enc_shapes.values(), *dec_shapes.values()} == {(1, SEED_LENGTH, D_MODEL)}
    enc_total, dec_total = total_parameters(summarize(encoder)), total_parameters(summarize(decoder))
    model = build_preset("seed003")
    model_total = model.num_parameters()
    norm = dict(dec_rows)["self_block.norm"]
    layers = MODEL_PRESETS["seed003"].kwargs["num_layers"]

    header = ["attnlab sub-layer", "output shape", "parameters", "seed 003's Keras row", "parameters"]
    body = para(f"Seed 003 prints Keras summaries of one encoder layer and one decoder layer at d_model = {D_MODEL},",
                f"h = {HEADS}, d_ff = {D_FF}, with d_k = d_v = {D_K}: the queries, keys and values of <i>all</i> heads",
                f"together are {D_K} wide, {D_K // HEADS} per head (the paper has {D_MODEL // HEADS} per head). Here the",
                f"same layers are built from attnlab's core with <code>head_dim={D_K // HEADS}</code> and counted sub-layer",
                "by sub-layer (<code>attnlab summary --preset seed003 --expand</code> prints the whole model this way),",
                f"each row with the shape its sub-layer returns for a batch of one {SEED_LENGTH}-token sequence, where the",
                f"seed's rows say (None, {SEED_LENGTH}, {D_MODEL}).")
    body += para(f"One attention block: W<sub>q</sub>, W<sub>k</sub>, W<sub>v</sub> are {D_MODEL} &times; {D_K} plus",
                 f"{D_K} biases each and W<sub>o</sub> is {D_K} &times; {D_MODEL} plus {D_MODEL}:",
                 f"3 &times; {D_MODEL * D_K + D_K:,} + {D_K * D_MODEL + D_MODEL:,} = {dict(enc_rows)['self_attn']:,}.",
                 f"The feed-forward is {D_MODEL} &times; {D_FF} + {D_FF} + {D_FF} &times; {D_MODEL} + {D_MODEL} =",
                 f"{dict(enc_rows)['ffn']:,}; a LayerNorm has a gain and a shift per feature, 2 &times; {D_MODEL} =",
                 f"{norm:,}. <a href=\"#bugs\">The silent bugs</a> (bug 6) count the block at the other head widths.")
    body += table(header, _side_by_side(enc_rows, enc_shapes, SEED_ENCODER_ROWS)
                  + [("encoder layer, total", "", f"{enc_total:,}", "Total params", f"{SEED_ENCODER_TOTAL:,}")])
    body += check(enc_total == SEED_ENCODER_TOTAL, f"the encoder layer has {enc_total:,} parameters, as the seed prints")
    body += table(header, _side_by_side(dec_rows, dec_shapes, SEED_DECODER_ROWS)
                  + [("decoder layer, total", "", f"{dec_total:,}", "Total params", f"{SEED_DECODER_TOTAL:,}")])
    body += check(dec_total - SEED_DECODER_TOTAL == norm,
                  f"the decoder layer has {dec_total:,}: {dec_total - SEED_DECODER_TOTAL:,} more than the seed's "
                  f"{SEED_DECODER_TOTAL:,}, exactly one LayerNorm")
    body += check(shapes_as_seed, f"every sub-layer of both layers returns (1, {SEED_LENGTH}, {D_MODEL}) for a batch of "
                                  f"one {SEED_LENGTH}-token sequence: the seed's (None, {SEED_LENGTH}, {D_MODEL}) rows")
    body += para("The seed's decoder graph shows why: <code>add_normalization_32</code> takes four inputs (it is",
                 "applied after self-attention <i>and</i> after cross-attention) and no <code>add_normalization_33</code>",
                 "appears. Its decoder layer reuses one normalisation for two sub-layers, so the two share a gain and",
                 "a shift. Nothing raises and every shape is right; only a parameter count, sub-layer by sub-layer,",
                 "shows it. attnlab's decoder layer has its three norms (<code>self_block</code>,",
                 "<code>cross_block</code>, <code>ffn_block</code>).")
    tables = model.encoder.embed.tokens.weight.numel() + model.decoder.embed.tokens.weight.numel()
    body += para(f"The whole model (<code>--preset seed003</code>: {layers}",
                 "encoder and decoder layers, vocabularies of 20, the output projection). Seed 003 gives no",
                 "count of its own, only a reader's \u201cmore than 27 million\u201d. attnlab trains its two token",
                 f"tables ({tables:,} parameters) and its sinusoidal positions hold none; a model that keeps fixed",
                 "sine tables for its words and positions counts them as non-trainable instead, so totals of",
                 "the same architecture differ by its tables:")
    body += table(["model", "parameters"], [("attnlab's seed003 preset", f"{model_total:,}"),
                                            ("the same, one norm shared in each decoder layer (as seed 003's layer)",
                                             f"{model_total - layers * norm:,}")])
    body += check(model_total > SEED_MODEL_FLOOR,
                  f"{model_total:,} parameters: 'more than 27 million', as a reader of seed 003 counts")

    numbers = {
        "d_model": D_MODEL, "heads": HEADS, "d_ff": D_FF, "d_k": D_K,
        "encoder_layer": {"rows": dict(enc_rows), "total": enc_total, "equals_seed": enc_total == SEED_ENCODER_TOTAL,
                          "output_shapes": {name: list(shape) for name, shape in enc_shapes.items()}},
        "decoder_layer": {"rows": dict(dec_rows), "total": dec_total,
                          "difference": dec_total - SEED_DECODER_TOTAL,
                          "output_shapes": {name: list(shape) for name, shape in dec_shapes.items()}},
        "model_total": model_total,
        "model_total_shared_norm": model_total - layers * norm,
    }
    highlights = [("seed 003 layers: encoder / decoder parameters",
                   f"{enc_total:,} / {dec_total:,} (the seed's {SEED_DECODER_TOTAL:,} shares one norm: "
                   f"{dec_total - SEED_DECODER_TOTAL:,} fewer)")]
    return Section("parameters", "Parameter summaries", numbers, body, highlights)
