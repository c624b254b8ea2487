"""The optimizers the engine steps: AdamW, or Muon for the transformer layers' matrices beside AdamW for the rest.

Muon (Keller Jordan, 2024; torch's ``torch.optim.Muon`` since 2.9) replaces each hidden matrix's momentum by the
nearest orthogonal matrix, found with five Newton-Schulz iterations, before the step: every direction of the
update moves by the same amount, where AdamW's steps follow the gradient's few large directions. It is meant for
the 2-D weights inside the layers; embeddings, output layers, biases and norms stay with AdamW (as its authors
apply it). On character-level Shakespeare it reached a validation loss that AdamW needed 2.4 times the steps for
(``notes/issue6.md``).

:class:`Muon` is torch's algorithm, with its defaults and its ``adjust_lr_fn="match_rms_adamw"`` scaling (the
update's RMS matched to AdamW's, so that one learning rate and weight decay serve both), computed in the
parameters' own precision: torch's runs the iterations in bfloat16, which a CPU without bfloat16 units emulates at
a few GFLOP/s (one step of the 3-layer ``shakespeare-fast`` model took 950 ms there, against 2 ms for AdamW).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward

#: The optimizers ``TrainConfig.optimizer`` names.
OPTIMIZERS = ("adamw", "muon")
#: Newton-Schulz coefficients (torch's and Keller Jordan's): the quintic that grows fastest at zero.
NS_COEFFICIENTS, NS_STEPS = (3.4445, -4.775, 2.0315), 5


def orthogonalize(update: Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> Tensor:
    """(m, n) -> (m, n): ``update`` with its singular values pushed towards 1 (into about 0.5..1.5) by Newton-Schulz.

    Works on the wide orientation (fewer rows than columns), so that the Gram matrix is the smaller one; scaled
    first so that no singular value exceeds 1, where the iteration converges.
    """
    a, b, c = NS_COEFFICIENTS
    tall = update.shape[0] > update.shape[1]
    x = update.T if tall else update
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Momentum, orthogonalised, for 2-D parameters (see the module docstring for the algorithm's source).

    Per step: ``buf = momentum * buf + (1 - momentum) * grad``; the update is ``orthogonalize(grad + momentum *
    (buf - grad))`` (Nesterov) scaled by ``0.2 * sqrt(max(rows, cols))``; decoupled weight decay ``lr * wd``.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 weight_decay: float = 0.1, momentum: float = 0.95) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        for group in self.param_groups:
            if any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon takes 2-D parameters (matrices) only")

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = orthogonalize(p.grad.lerp(buf, momentum))
                p.mul_(1 - lr * decay)
                p.add_(update, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weights of the linear layers inside the attention and feed-forward blocks: what Muon updates."""
    return [module.weight for block in model.modules() if isinstance(block, MultiHeadAttention | FeedForward)
            for module in block.modules() if isinstance(module, nn.Linear)]


def decay_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices only, not on biases, norms or position tables' gains."""
    decay, no_decay = [], []
    for p in params:
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Chain:
    """Optimizers over disjoint parameters, stepped as one.

    ``param_groups`` lists every optimizer's groups (the very dicts, so a learning rate set there is theirs), and
    the state dict numbers the parameters across them in order, as one optimizer's would: a checkpoint stores it
    as it stores AdamW's.
    """

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def _sizes(self) -> list[tuple[int, int]]:
        """(parameters, groups) of each optimizer."""
        return [(sum(len(g["params"]) for g in o.param_groups), len(o.param_groups)) for o in self.optimizers]

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, Any] = {}
        groups: list[dict[str, Any]] = []
        offset = 0
        for optimizer, (count, _) in zip(self.optimizers, self._sizes(), strict=True):
            own = optimizer.state_dict()
            state |= {index + offset: value for index, value in own["state"].items()}
            groups += [{**group, "params": [i + offset for i in group["params"]]} for group in own["param_groups"]]
            offset += count
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sizes = self._sizes()
        if len(state_dict["param_groups"]) != sum(groups for _, groups in sizes):
            raise ValueError(f"the state holds {len(state_dict['param_groups'])} parameter groups, these optimizers "
                             f"{sum(groups for _, groups in sizes)}")
        offset = first_group = 0
        for optimizer, (count, groups) in zip(self.optimizers, sizes, strict=True):
            own = state_dict["param_groups"][first_group:first_group + groups]
            optimizer.load_state_dict({
                "state": {i - offset: v for i, v in state_dict["state"].items() if offset <= i < offset + count},
                "param_groups": [{**group, "params": [i - offset for i in group["params"]]} for group in own],
            })
            offset, first_group = offset + count, first_group + groups


def build_optimizer(model: nn.Module, name: str, *, lr: float, weight_decay: float, betas: tuple[float, float],
                    fused: bool) -> torch.optim.Optimizer | Chain:
    """The optimizer ``name`` (see :data:`OPTIMIZERS`) over ``model``'s trainable parameters.

    ``"muon"``: :class:`Muon` on :func:`hidden_matrices`, AdamW (``betas``, weight decay on the other matrices)
    on the rest, one learning rate for both (see :class:`Muon`). ``fused``: AdamW's fused kernel, which updates
    each parameter in one pass (on the CPU the foreach path falls back to one op per tensor per update term and
    costs about three times as much: issue 6's benchmark).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(decay_groups(trainable, weight_decay), lr=lr, betas=betas, fused=fused)
    if name != "muon":
        raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    hidden = {id(p) for p in hidden_matrices(model) if p.requires_grad}
    if not hidden:
        raise AttnlabError("Muon updates the matrices of attnlab's attention and feed-forward blocks, and this "
                           "model has none: use AdamW")
    matrices = [p for p in trainable if id(p) in hidden]
    rest = [p for p in trainable if id(p) not in hidden]
    adamw = torch.optim.AdamW(decay_groups(rest, weight_decay), lr=lr, betas=betas, fused=fused)
    return Chain(Muon(matrices, lr=lr, weight_decay=weight_decay), adamw)


def needed_state(optimizer: torch.optim.Optimizer | Chain) -> list[frozenset[str]]:
    """For each parameter, in state-dict order, the state entries a step reads (empty where not known): a
    checkpoint that lacks one is damaged."""
    if isinstance(optimizer, Chain):
        return [keys for inner in optimizer.optimizers for keys in needed_state(inner)]
    keys = (frozenset({"step", "exp_avg", "exp_avg_sq"}) if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
            else frozenset({"momentum_buffer"}) if isinstance(optimizer, Muon) else frozenset())
    return [keys for group in optimizer.param_groups for _ in group["params"]]
