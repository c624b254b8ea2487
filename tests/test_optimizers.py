"""The engine's optimizers: Muon (as torch computes it, in float32) for the layers' matrices beside AdamW."""

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import DecoderLM
from attnlab.training.optimizers import Chain, Muon, build_optimizer, hidden_matrices, needed_state, orthogonalize


@pytest.mark.parametrize("shape", [(64, 16), (16, 64), (32, 32)])
def test_newton_schulz_brings_every_singular_value_near_one(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    g[:, 0] *= 30  # one direction far larger than the others: SGD's steps follow it
    singular = torch.linalg.svdvals(orthogonalize(g))
    assert singular.min() > 0.5 and singular.max() < 1.5, singular  # (the quintic does not converge to exactly 1)
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 15


def test_muon_steps_as_torchs_own_muon_up_to_its_bfloat16_rounding():
    """torch.optim.Muon computes Newton-Schulz in bfloat16 (950 ms a step on a CPU without bfloat16 units); this
    one in float32: the same update to the rounding of bfloat16."""
    torch.manual_seed(0)
    weights = [torch.randn(48, 16), torch.randn(16, 16), torch.randn(16, 64)]
    grads = [torch.randn_like(w) for w in weights]
    moved = []
    for make in (lambda ps: Muon(ps, lr=0.02, weight_decay=0.1),
                 lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        optimizer = make(params)
        for _ in range(3):  # the momentum buffer too
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
        moved.append([p.detach() - w for p, w in zip(params, weights)])
    for ours, theirs in zip(*moved):
        assert (ours - theirs).norm() < 0.03 * theirs.norm()
        assert theirs.norm() > 0.1  # a real step was compared


def test_muon_takes_the_attention_and_feed_forward_matrices_and_adamw_the_rest():
    model = DecoderLM(vocab_size=11, d_model=8, num_layers=2, num_heads=2, max_positions=8, bias=True)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)].split(".", 3)[-1] for p in hidden_matrices(model)) == sorted(
        ["self_attn.in_proj.weight", "self_attn.out_proj.weight", "ffn.up.weight", "ffn.down.weight"] * 2)
    optimizer = build_optimizer(model, "muon", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), fused=True)
    assert isinstance(optimizer, Chain) and isinstance(optimizer.optimizers[0], Muon)
    adamw_params = [p for group in optimizer.optimizers[1].param_groups for p in group["params"]]
    assert any(p is model.lm_head.weight for p in adamw_params)  # the tied embedding and output layer: AdamW
    assert len(adamw_params) + 8 == len(list(model.parameters()))  # every parameter once
    assert {g["weight_decay"] for g in optimizer.optimizers[1].param_groups} == {0.1, 0.0}  # none on biases, norms
    assert needed_state(optimizer) == [frozenset({"momentum_buffer"})] * 8 + [
        frozenset({"step", "exp_avg", "exp_avg_sq"})] * len(adamw_params)
    for group in optimizer.param_groups:  # the engine's schedule sets the rate of every group through the chain
        group["lr"] = 0.5
    assert all(g["lr"] == 0.5 for o in optimizer.optimizers for g in o.param_groups)


def test_muon_refuses_a_model_without_attnlab_layers():
    with pytest.raises(AttnlabError, match="this model has none: use AdamW"):
        build_optimizer(torch.nn.Linear(4, 4), "muon", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), fused=True)
    with pytest.raises(ValueError, match="Muon takes 2-D parameters"):
        Muon([torch.nn.Parameter(torch.zeros(3))])
