"""Section 5: the model checks seed 000 prints, run on the project's own layers and preset.

* one encoder layer (seed 000's fixture: width 4, 2 full-width heads, feed-forward 8): shape kept,
  per-position mean 0 and standard deviation 1 after the layer norm, eval deterministic, train not;
* the ``lab-toy`` preset (the seed's full-model test: 6 layers, width 4, 4 heads, 7,131 parameters):
  output shape, rows that sum to 1, the attention dictionary, and the two exact zeros that shapes
  alone would not show: no decoder self-attention weight above the diagonal, no cross-attention weight
  on the padded source position.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.lab import figures
from attnlab.lab.html import Section, check, code, figure, heading, matrix, para, table
from attnlab.nn import Decoder, DecoderLayer, Encoder, EncoderLayer, causal_mask, from_keep_mask, padding_mask
from attnlab.presets import MODEL_PRESETS, build_preset

SEED = 10  # the seed's keras.utils.set_random_seed(10)
SOURCE = [[2, 1, 4, 3, 0]]  # the trailing 0 is padding
TARGET = [[3, 2, 1, 0, 0]]
STACK_IDS = [[2, 1, 4, 3, 0], [2, 3, 4, 0, 0]]  # seed 000's encoder-stack input: (2, 5) with padding
STACK_TARGET = [[3, 2, 1]]  # seed 000's input to its stand-alone two-layer decoder (vocabulary 33, 6 positions)
SEED_DROPOUT_DIFFERENCE = 0.2646  # seed 000's "largest difference between the two training calls" (Keras weights)


def encoder_layer_demo() -> tuple[dict, str]:
    """Seed 000's encoder-layer fixture: (numbers, HTML); the silent-bugs section reuses its dropout figure."""
    torch.manual_seed(SEED)
    layer = EncoderLayer(4, 2, 8, head_dim=4)  # Keras key_dim=embedding_dim: each head is 4 wide
    x = torch.tensor([[[1.0, 0.0, 1.0, 1.0]] * 3])  # (1, 3, 4)
    mask = from_keep_mask(torch.tensor([[1.0, 1.0, 0.0]]))[:, None, None, :]  # (1, 1, 1, 3)
    layer.eval()
    with torch.no_grad():
        a, _ = layer(x, attend_mask=mask)
        b, _ = layer(x, attend_mask=mask)
        layer.train()
        c, _ = layer(x, attend_mask=mask)
        d, _ = layer(x, attend_mask=mask)
    layer.eval()
    mean = a[0].mean(-1)
    std = a[0].std(-1, unbiased=False)  # the population std, as np.std in the seed
    eval_same, train_same = bool(torch.equal(a, b)), bool(torch.equal(c, d))
    train_diff = float((c - d).abs().max())
    body = heading("One encoder layer")
    body += code(f"in {tuple(x.shape)} -> out {tuple(a.shape)}\n"
                 f"per-position mean: {[round(v, 6) + 0.0 for v in mean.tolist()]}\n"
                 f"per-position std:  {[round(v, 4) for v in std.tolist()]}")
    body += check(eval_same, "two calls in eval mode give identical outputs (dropout off)")
    body += check(not train_same, f"two calls in train mode differ (dropout on): largest difference {train_diff:.4f}")
    body += para(f"The seed's Keras layer printed {SEED_DROPOUT_DIFFERENCE} here: the size of the difference depends on",
                 "the layer's random weights and on which units dropout zeroes, which no two libraries draw alike;",
                 "what must agree is that eval mode gives 0 and train mode does not.")
    numbers = {"output_shape": list(a.shape), "mean": mean.tolist(), "std": std.tolist(),
               "eval_identical": eval_same, "train_identical": train_same, "train_max_difference": train_diff}
    return numbers, body


def _stack_and_decoder_layer_demo() -> tuple[dict, str]:
    """Seed 000's encoder-stack call, its decoder layer with a target shorter than the source, its two-layer decoder."""
    torch.manual_seed(SEED)
    # The seed's encoder: two layers of two full-width heads (Keras key_dim = embedding_dim), vocabulary 32.
    encoder = Encoder(32, 4, 2, 2, 8, max_positions=5, head_dim=4).eval()
    ids = torch.tensor(STACK_IDS)  # (2, 5), zeros are padding
    layer = DecoderLayer(4, 2, 8, head_dim=4).eval()  # two full-width heads, as the seed's Keras layer
    target = torch.from_numpy(np.random.default_rng(0).random((2, 3, 4)).astype(np.float32))  # the seed's target_x
    with torch.no_grad():
        states, _ = encoder(ids, attend_mask=padding_mask(ids))  # (2, 5, 4)
        # against the encoder output, as the seed runs it: 3 target positions, 5 source positions
        layer_out, self_w, cross_w = layer(target, states, self_attend_mask=causal_mask(3),
                                           memory_attend_mask=padding_mask(ids), need_weights=True)
    padded_norms = [round(float(v), 4) for v in states[ids == 0].norm(dim=-1)]
    body = heading("The encoder stack and a decoder layer")
    body += code(f"encoder(ids {tuple(ids.shape)}) -> {tuple(states.shape)}\n"
                 f"norms of the outputs at the {len(padded_norms)} padded positions: {padded_norms} "
                 "(layer-normalised: sqrt(d) = 2, like every position)")
    body += check(min(padded_norms) > 0, "padded positions still get output vectors: the padding mask hides them as "
                                         "keys, it does not zero them; later masks and the loss ignore them")
    body += code(f"decoder layer, target {tuple(target.shape)}, memory = the encoder output {tuple(states.shape)}:\n"
                 f"  output                  {tuple(layer_out.shape)}  (batch, target, d_model)\n"
                 f"  self-attention weights  {tuple(self_w.shape)}  (batch, heads, target, target)\n"
                 f"  cross-attention weights {tuple(cross_w.shape)}  (batch, heads, target, source)")
    body += check(self_w.shape[-1] == 3 and cross_w.shape[-1] == 5,
                  "cross-attention weights are (target, source) = (3, 5) and self-attention's (target, target) = "
                  "(3, 3): a cross-attention padding mask has the source's key axis (silent bug 2 shows what a "
                  "target's mask does)")
    block1 = self_w[0, 0]  # (3, 3): batch 0, head 0
    body += matrix(block1.numpy(), 3, row_labels=[f"target {i}" for i in range(3)],
                   col_labels=[f"target {j}" for j in range(3)],
                   caption="block 1 (masked self-attention), batch 0, head 0: the look-ahead structure")
    body += check(float(torch.triu(block1, 1).sum()) == 0.0 and float(block1[0, 0]) == 1.0,
                  "row 0 puts all its weight on position 0 and nothing lies above the diagonal, as in the seed (its "
                  "values below the diagonal come from its Keras weights and are not reproduced here)")
    # Seed 000's stand-alone decoder: two layers over the first sentence's encoder states.
    torch.manual_seed(SEED)
    decoder = Decoder(33, 4, 2, 2, 8, max_positions=6, head_dim=4).eval()
    target_ids = torch.tensor(STACK_TARGET)  # (1, 3)
    with torch.no_grad():
        decoded, weights = decoder(target_ids, states[:1], self_attend_mask=causal_mask(3),
                                   memory_attend_mask=padding_mask(ids[:1]), need_weights=True)
    # every layer and head: the weight above the diagonal, and on the source's padded column
    above = float(sum(torch.triu(w, 1).sum() for k, w in weights.items() if k.endswith("_self_att")))
    on_pad = float(sum(w[..., ids[0] == 0].sum() for k, w in weights.items() if k.endswith("_decenc_att")))
    body += code(f"decoder (2 layers) on target {STACK_TARGET[0]} and the first sentence's encoder states:\n"
                 f"decoded: {tuple(decoded.shape)} | weight tensors: {len(weights)} ({', '.join(weights)})\n"
                 f"all layers and heads: weight above the diagonal {above}; weight on the padded source column {on_pad}")
    body += check(len(weights) == 4 and above == 0.0 and on_pad == 0.0,
                  "two weight tensors per layer, as the seed counts; after the stack the self-attention is still "
                  "triangular and the cross-attention leaves the source padding at exactly 0")
    top_self, top_cross = weights["decoder_layer2_block1_self_att"][0, 0], weights["decoder_layer2_block2_decenc_att"][0, 0]
    body += para("Seed 000 prints layer 2, head 0 of both from its Keras weights (self-attention rows [1, 0, 0],",
                 "[0.506, 0.494, 0], [0.382, 0.349, 0.269]); those values are not reproduced here. attnlab's own",
                 "weights give other numbers, with the same zeros:")
    targets = [f"target {t}" for t in range(top_self.shape[0])]
    body += matrix(top_self.numpy(), 3, row_labels=targets, col_labels=[f"key {t}" for t in range(top_self.shape[1])],
                   caption="layer 2, head 0, self-attention (rows: target positions)")
    sources = [f"source {s}" + (" (pad)" if s == top_cross.shape[1] - 1 else "") for s in range(top_cross.shape[1])]
    body += matrix(top_cross.numpy(), 3, row_labels=targets, col_labels=sources,
                   caption="layer 2, head 0, cross-attention (columns: source positions, the last one padding)")
    numbers = {"encoder": {"layers": len(encoder.layers), "vocab_size": encoder.embed.vocab_size,
                           "heads": encoder.layers[0].self_attn.num_heads},
               "layer_cross_on_padded_source": float((cross_w * (ids == 0)[:, None, None, :]).sum()),
               "encoder_output_shape": list(states.shape), "padded_output_norms": padded_norms,
               "decoder_layer_output_shape": list(layer_out.shape), "decoder_self_attention_shape": list(self_w.shape),
               "decoder_cross_attention_shape": list(cross_w.shape), "block1_head0": block1.tolist(),
               "decoder_stack": {"output_shape": list(decoded.shape), "weight_tensors": sorted(weights),
                                 "above_diagonal": above, "on_padded_source": on_pad,
                                 "layer2_head0_self": top_self.tolist(), "layer2_head0_cross": top_cross.tolist()}}
    return numbers, body


def model_section() -> Section:
    """Section 5: the encoder layer, the encoder stack, a decoder layer and the lab-toy transformer."""
    layer_numbers, body = encoder_layer_demo()
    stack_numbers, stack_body = _stack_and_decoder_layer_demo()
    body += stack_body

    torch.manual_seed(SEED)
    model = build_preset("lab-toy").eval()
    src, tgt = torch.tensor(SOURCE), torch.tensor(TARGET)
    with torch.no_grad():
        probs = model.probabilities(src, tgt)  # (1, 5, 35)
        _, attention = model(src, tgt, return_attention=True)
        again = model.probabilities(src, tgt)
        model.train()
        train_a, train_b = model.probabilities(src, tgt), model.probabilities(src, tgt)
    model.eval()
    params = model.num_parameters()
    row_sums = probs.sum(-1)  # (1, 5)
    self_keys = [k for k in attention if k.endswith("_self_att")]
    cross_keys = [k for k in attention if k.endswith("_decenc_att")]
    # Every head of every layer: total weight strictly above the diagonal, and on source column 4 (padding).
    above = float(sum(torch.triu(attention[k], diagonal=1).sum() for k in self_keys))
    pad_cols = (src == 0)[0]
    on_pad = float(sum(attention[k][..., pad_cols].sum() for k in cross_keys))
    last = len(self_keys)
    self_map = attention[f"decoder_layer{last}_block1_self_att"][0, 0]
    cross_map = attention[f"decoder_layer{last}_block2_decenc_att"][0, 0]
    eval_same, train_same = bool(torch.equal(probs, again)), bool(torch.equal(train_a, train_b))
    train_diff = float((train_a - train_b).abs().max())

    body += heading("The full transformer (preset lab-toy)")
    body += para(MODEL_PRESETS["lab-toy"].source + ".")
    body += code(
        f"source {SOURCE[0]}   target {TARGET[0]}   (0 = padding)\n"
        f"output shape: {tuple(probs.shape)}  (batch, target positions, target vocabulary)\n"
        f"row sums: {[round(v, 6) for v in row_sums[0].tolist()]}\n"
        f"trainable parameters: {params:,}"
    )
    body += para("Each output row is a softmax over the target vocabulary, so it sums to 1 by construction: the row",
                 "sums above show the output is probabilities, not logits, and prove nothing about the masks.")
    body += check(params == 7131, f"{params:,} parameters, as the seed's Keras model counts")
    body += table(["attention tensor", "shape"], [(k, str(tuple(v.shape))) for k, v in attention.items()])
    body += heading("Two exact zeros")
    body += para("The shapes above would be the same without any mask. The masks show only in the values:")
    body += check(above == 0.0, f"decoder self-attention weight above the diagonal, all layers and heads: {above}")
    body += check(on_pad == 0.0, f"cross-attention weight on the padded source position, all layers and heads: {on_pad}")
    body += figure(figures.attention_maps([self_map.numpy(), cross_map.numpy()],
                                          [f"layer {last}, head 0: self-attention", f"layer {last}, head 0: cross-attention"],
                                          ["target position", "source position"], "target position"),
                   "the last decoder layer's self- and cross-attention weights for head 0",
                   "Self-attention is lower triangular (target positions 3 and 4 are padding, so their columns are "
                   "hidden too: seed 000 passes the look-ahead mask alone here, attnlab also hides target padding, "
                   "as seed 003 does); cross-attention leaves source position 4, the padding, at 0.")
    body += heading("Eval against train mode")
    body += check(eval_same, "two forward passes in eval mode are identical")
    body += check(not train_same, f"two passes in train mode differ (dropout 0.1): largest difference of the output "
                                  f"probabilities {train_diff:.4f}")

    numbers = {
        "encoder_layer": layer_numbers,
        "encoder_stack_and_decoder_layer": stack_numbers,
        "preset": "lab-toy",
        "output_shape": list(probs.shape),
        "row_sums": row_sums[0].tolist(),
        "parameters": params,
        "attention_shapes": {k: list(v.shape) for k, v in attention.items()},
        "self_attention_above_diagonal": above,
        "cross_attention_on_padding": on_pad,
        "self_attention_last_layer_head0": self_map.tolist(),
        "cross_attention_last_layer_head0": cross_map.tolist(),
        "eval_identical": eval_same,
        "train_identical": train_same,
        "train_max_difference": train_diff,
    }
    highlights = [("lab-toy parameters", f"{params:,}"),
                  ("self-attention above diagonal / cross-attention on padding", f"{above} / {on_pad}")]
    return Section("model", "The model", numbers, body, highlights)
