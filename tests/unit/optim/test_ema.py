"""EMA of the weights (seqtrain.optim.ema): fairseq's update rule, start update and update frequency, tied
weights, fp32 shadows, the swap used for validation, and the checkpoint state."""

from __future__ import annotations

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.optim.ema import EMA
from tests.utils import FP32


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight  # tied, as BART's embeddings
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("version", torch.tensor([3.0]))


def move(model: torch.nn.Module, step: int) -> None:
    """A stand-in for an optimizer update: every weight changes by a seeded amount."""
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
        model.version += 1


def test_fairseqs_rule_with_start_update_and_update_freq():
    torch.manual_seed(0)
    model = Tied()
    ema = EMA(model, decay=0.9, start_update=2, update_freq=2)
    ref = {k: v.clone() for k, v in model.state_dict().items()}  # fairseq's EMA model, by hand
    counter = 0
    for update in range(1, 8):
        move(model, update)
        ema.step(model, update)
        counter += 1
        if counter == 2:  # every second update
            counter = 0
            d = 0.0 if update < 2 else 0.9
            for k, v in model.state_dict().items():
                if "version" not in k:
                    ref[k] = ref[k] * d + v * (1 - d)
    for k in ("embed.weight", "fc.weight", "fc.bias"):
        assert torch.allclose(ema.shadow[k], ref[k], **FP32), k
    # the tied weight has one shadow, and version entries never move
    assert ema.shadow["out.weight"] is ema.shadow["embed.weight"]
    assert ema.shadow["version"].item() == 3.0 and model.version.item() == 10.0
    assert ema.counter == 1  # the 7th update is waiting for the 8th


def test_decay_zero_before_start_copies_the_weights_exactly():
    model = Tied()
    ema = EMA(model, decay=0.5, start_update=10)
    move(model, 1)
    with torch.no_grad():
        model.fc.weight[0, 0] = float("inf")  # a copy, not 0 * ema + 1 * w (0 * inf would be nan)
    ema.step(model, 1)
    assert torch.equal(ema.shadow["fc.weight"], model.fc.weight)


def test_fp32_shadow_of_a_half_model():
    model = Tied().half()
    ema = EMA(model, decay=0.999, fp32=True)
    for update in range(1, 4):
        move(model, update)
        ema.step(model, update)
    assert (
        ema.fp32_params["fc.weight"].dtype == torch.float32 and ema.shadow["fc.weight"].dtype == torch.float16
    )
    assert torch.equal(ema.shadow["fc.weight"], ema.fp32_params["fc.weight"].half())


def test_validation_swap_restores_the_weights_bit_for_bit():
    torch.manual_seed(1)
    model = Tied()
    ema = EMA(model, decay=0.5)
    move(model, 1)
    ema.step(model, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.tensor([[1, 2]])
    with ema.applied_to(model):
        assert torch.equal(model.fc.weight, ema.shadow["fc.weight"]) and torch.equal(
            model.out.weight, model.embed.weight
        )
        inside = model.out(model.fc(model.embed(x)))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    outside = model.out(model.fc(model.embed(x)))
    assert not torch.equal(inside, outside)


def test_checkpoint_state_round_trip_keeps_the_counter():
    model = Tied()
    ema = EMA(model, decay=0.9, update_freq=3, fp32=True)
    for update in range(1, 5):
        move(model, update)
        ema.step(model, update)
    shadow, counter, fp32 = ema.state()
    assert counter == 1 and set(shadow) == set(ema.shadow) and set(fp32) == set(ema.fp32_params)
    again = EMA(Tied(), decay=0.9, update_freq=3, fp32=True)
    again.load(shadow, counter, fp32, "c.pt")
    assert again.counter == 1
    assert all(torch.equal(again.shadow[k], ema.shadow[k]) for k in ema.shadow)
    assert all(torch.equal(again.fp32_params[k], ema.fp32_params[k]) for k in ema.fp32_params)
    broken = {k: v for k, v in shadow.items() if k != "fc.bias"}
    with pytest.raises(SeqtrainError, match=r"^c.pt: its EMA \(extra_state\['ema'\]\) does not match"):
        again.load(broken, counter, fp32, "c.pt")


@pytest.mark.cuda
def test_the_update_does_not_sync_with_the_host():
    model = Tied().cuda()
    ema = EMA(model, decay=0.9)
    torch.cuda.set_sync_debug_mode("error")
    try:
        ema.step(model, 1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
