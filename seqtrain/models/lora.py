"""LoRA adapters (--lora-rank R): chosen projections compute W x + b + (alpha / R) * B A dropout(x), with W and b
frozen and only A (R x in) and B (out x R) trained (Hu et al., 2021; peft's initialisation: A Kaiming-uniform,
B zero, so training starts from the pretrained model exactly).

A small module of our own rather than peft: seqtrain's layers read some weights directly (q, k and v as one
fused projection, the feed-forward block's custom autograd function), which a wrapper around the module's
forward (peft's LoraLayer) would not see. `LoRALinear` keeps the Linear's own `weight` and `bias` (so state-dict
names stay fairseq's, and the adapters are `NAME.lora_A` / `NAME.lora_B` beside them) and tells the fused paths
its effective weight and its adapter term. `merge_lora` folds the adapters into plain Linears for generation
and exports (fairseq and Hugging Face know nothing of adapters).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrain.errors import SeqtrainError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")


class LoRALinear(nn.Linear):
    lora_A: nn.Parameter
    lora_B: nn.Parameter

    @classmethod
    def wrapping(cls, linear: nn.Linear, rank: int, alpha: float, dropout: float) -> LoRALinear:
        """A LoRALinear that holds `linear`'s own weight and bias Parameters, with new adapters."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.lora_A = nn.Parameter(torch.empty(rank, linear.in_features, device=linear.weight.device))
        new.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank, device=linear.weight.device))
        nn.init.kaiming_uniform_(new.lora_A, a=math.sqrt(5))
        new.lora_scaling = alpha / rank
        new.lora_dropout = dropout
        return new

    def effective_weight(self) -> Tensor:
        return self.weight + (self.lora_B @ self.lora_A) * self.lora_scaling

    def lora_term(self, x: Tensor) -> Tensor:
        if self.lora_dropout and self.training:
            x = F.dropout(x, self.lora_dropout, True)
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.lora_scaling

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return F.linear(x, self.weight, self.bias) + self.lora_term(x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_rank={self.lora_A.shape[0]}, lora_scaling={self.lora_scaling:g}"


def parse_targets(value: str | None) -> tuple[str, ...]:
    names = tuple(x.strip() for x in (value or "q_proj,v_proj").split(",") if x.strip())
    bad = [n for n in names if n not in LORA_TARGETS]
    if bad or not names:
        what = ",".join(bad) or repr(value)
        raise SeqtrainError(f"--lora-modules: {what}: choose from {','.join(LORA_TARGETS)}")
    return names


def apply_lora(model: nn.Module, rank: int, alpha: float, dropout: float, targets: tuple[str, ...]) -> int:
    """Replace every Linear named in `targets` (inside the encoder and decoder layers) with a LoRALinear;
    returns how many."""
    if rank < 1:
        raise SeqtrainError(f"--lora-rank must be >= 1 to add adapters, got {rank}")
    found = [
        (module, child_name, child)
        for name, module in list(model.named_modules())
        if ".layers." in f".{name}."
        for child_name, child in list(module.named_children())
        if child_name in targets and type(child) is nn.Linear
    ]
    # checked before any adapter is allocated: beyond the narrowest side of a projection, B A has no higher
    # rank than the projection itself, and a rank of millions only allocates (10^7 tried to take 1.3 GB)
    narrowest = min((min(c.in_features, c.out_features) for _, _, c in found), default=rank)
    if rank > narrowest:
        raise SeqtrainError(
            f"--lora-rank {rank}: above the narrowest projection it adapts ({narrowest}); give at most {narrowest}"
        )
    for module, child_name, child in found:
        setattr(module, child_name, LoRALinear.wrapping(child, rank, alpha, dropout))
    return len(found)


def is_lora_key(name: str) -> bool:
    return name.endswith((".lora_A", ".lora_B"))


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its Linear (W + (alpha / R) B A), leaving plain Linears; returns how many (the
    caller's record of the model then says lora_rank 0: it has none left)."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                plain = nn.Linear(
                    child.in_features, child.out_features, bias=child.bias is not None, device="meta"
                )
                with torch.no_grad():
                    plain.weight = nn.Parameter(child.effective_weight().detach().clone())
                    if child.bias is not None:
                        plain.bias = nn.Parameter(child.bias.detach().clone())
                setattr(module, child_name, plain)
                count += 1
    return count
