"""The compiled CPU decoding step: beam search's per-step work on a CPU in C++ (csrc/cpu_step.cpp), not Python.

On a CPU the eager step (the model's incremental decoder, then DecodeStep's masks and the search's top-k) costs
about 70 small ATen kernels and a few milliseconds of Python per step besides its matrix products
(docs/benchmarks.md, "CPU beam search"). This module runs the same arithmetic with far fewer passes:

- `PackedModel.get(model)`: a BART model's weights laid out once for the CPU's fastest matrix products
  (`gemm_backend`): oneDNN's packed fp32 linears (`torch.ops.mkldnn._linear_pointwise`, GELU and residual adds
  as post-ops) where torch's MKL is slower (every non-Intel CPU, as CTranslate2 decides: measured 1.0-1.5x on a
  Zen 3 AVX2 EPYC, 2-9x on a Zen 5 AVX-512 EPYC, docs/benchmarks.md), torch's dense linears on Intel CPUs, the
  model's own dynamic int8 linears under `--compute-type int8`. Kept per model until a parameter changes.
- `PackedModel.encode`: the encoder pass on the real tokens with those products (one Python pass per layer:
  it runs once per batch).
- `CompiledSteps`: the decoder, one C++ call per step for every layer (embedding, layer norms, attention over a
  cache that is never gathered, cross-attention, feed-forward, output projection), and `reorder`, which rewrites
  the cache's row table instead of copying the cache.
- `beam_candidates`: the candidate step in one pass per row (log-softmax, masks, beam-score add, top-k), exact.

The extension is built on first use with torch's cpp_extension (ninja and the system C++ compiler) into torch's
extension cache, under a name that hashes the source, torch's version and this CPU's flags, so a cache shared by
machines never gives one CPU another's binary. Where it cannot be built (no compiler, no ninja) the eager step
runs and one line says why. `SEQTRAIN_CPU_STEP=eager` turns the compiled step off, `SEQTRAIN_CPU_GEMM=mkl` or
`onednn` overrides the product backend.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrain.models.bart import BARTModel
from seqtrain.models.cpu_products import ACTS, LinearSpec, gemm_backend, run_linear
from seqtrain.models.int8 import Int8Linear
from seqtrain.models.lora import LoRALinear
from seqtrain.models.transformer import ACTIVATIONS, make_positions
from seqtrain.models.varlen import varlen_attention

logger = logging.getLogger("seqtrain.generate")

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "cpu_step.cpp")

_ext: Any = None
_ext_error: str | None = None


def mode() -> str:
    """SEQTRAIN_CPU_STEP: `auto` (default: compiled where it applies), `compiled` (an error where it cannot be
    built) or `eager`."""
    value = os.environ.get("SEQTRAIN_CPU_STEP", "auto").strip().lower() or "auto"
    if value not in ("auto", "compiled", "eager"):
        raise ValueError(f"SEQTRAIN_CPU_STEP must be auto, compiled or eager, got {value!r}")
    return value


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def extension_name() -> str:
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(torch.__version__.encode())
    digest.update(_cpu_flags().encode())
    return "seqtrain_cpu_step_" + digest.hexdigest()[:16]


def _missing_tool() -> str | None:
    if shutil.which("ninja") is None:
        try:  # the `ninja` wheel puts its binary beside the interpreter
            import ninja  # noqa: F401  (only to find its bin folder; torch's loader runs the binary)

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            return "ninja is not installed"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on PATH"
    return None


def _first_error(e: Exception) -> str:
    """The compiler's first `error:` line of a failed build, else the exception's first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    return (errors or lines or [type(e).__name__])[0][:300]


def _built(name: str) -> bool:
    """Whether the extension cache already holds this build (torch's own rule for its folder)."""
    from torch.utils import cpp_extension  # (on first use: it imports setuptools, ~0.5 s)

    return os.path.exists(os.path.join(cpp_extension._get_build_directory(name, verbose=False), f"{name}.so"))


def extension() -> Any:
    """The compiled module, built on first use (once per machine and source); None where it cannot be built,
    the reason logged once."""
    global _ext, _ext_error
    if _ext is not None or _ext_error is not None:
        return _ext
    reason = _missing_tool()
    if reason is None:
        try:
            from torch.utils import cpp_extension  # (imported on first use: it loads setuptools)

            name = extension_name()
            if not _built(name):
                logger.info(
                    "building the compiled CPU decoding step (once per machine and version, ~1 minute)"
                )
            _ext = cpp_extension.load(
                name=name,
                sources=[SOURCE],
                extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except Exception as e:  # a failed build falls back to the eager step, with its error said
            reason = f"building it failed: {_first_error(e)}"
    if _ext is None:
        _ext_error = reason
        logger.warning(
            f"the compiled CPU decoding step is unavailable ({reason}); decoding with the eager step"
        )
    return _ext


def unavailable_reason() -> str | None:
    """Why `extension()` returned None (None while it has not been tried or where it was built)."""
    return _ext_error


def _weight(m: nn.Module) -> Tensor:
    return m.effective_weight() if isinstance(m, LoRALinear) else m.weight


def _spec(backend: str, rows: int, *layers: nn.Module, fused: nn.Module | None = None) -> LinearSpec:
    """One projection of several linears of the same input (their outputs side by side); with int8, the
    model's own (fused) quantized linear."""
    if backend == "int8":
        module = fused if fused is not None else layers[0]
        assert isinstance(module, Int8Linear)
        return LinearSpec.int8(module.packed, module.out_features)
    weight = torch.cat([_weight(m) for m in layers]) if len(layers) > 1 else _weight(layers[0])
    biases = [m.bias for m in layers]
    bias = None if any(b is None for b in biases) else (torch.cat(biases) if len(biases) > 1 else biases[0])
    return LinearSpec.of(weight, bias, backend, rows)


@dataclass
class _Norm:
    weight: Tensor
    bias: Tensor
    eps: float

    @classmethod
    def of(cls, m: nn.LayerNorm) -> _Norm:
        return cls(m.weight.detach().contiguous(), m.bias.detach().contiguous(), float(m.eps))

    def __call__(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


# ------------------------------------------------------------------------------------------------ the model
_PACKS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], PackedModel]] = (
    weakref.WeakKeyDictionary()
)


def _why_not(model: nn.Module) -> str | None:
    """Why the compiled step does not apply to `model` (None: it does)."""
    if not isinstance(model, BARTModel):
        return "not one BART model"
    if model.training:
        return "in training mode"
    if torch.is_autocast_enabled("cpu"):
        return "under autocast"
    for p in model.parameters():
        if p.device.type != "cpu" or p.dtype != torch.float32:
            return "not fp32 on the CPU"
        if hasattr(p, "_local_tensor"):  # a DTensor: FSDP shards (ROUGE validation of an FSDP run)
            return "sharded parameters"
    names = {fn: name for name, fn in ACTIVATIONS.items()}
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        if names.get(layer.activation) not in ACTS:
            return f"activation {names.get(layer.activation)}"
    return None


def _key(model: nn.Module, backend: str, rows: int) -> tuple[Any, ...]:
    """What the packed weights depend on: every parameter's storage and contents (the extension's fingerprint:
    a version counter misses torch's fused AdamW, which updates in place without counting) and the int8 linears
    the model holds."""
    params = list(model.parameters())
    storage = tuple((p.data_ptr(), p.numel()) for p in params)
    int8 = tuple(id(m) for m in model.modules() if isinstance(m, Int8Linear))
    return (backend, rows, storage, extension().fingerprint([p.detach() for p in params]), int8)


class PackedModel:
    """A BARTModel's weights prepared for the CPU step (see the module docstring)."""

    @classmethod
    def get(cls, model: nn.Module, rows: int = 128) -> PackedModel | None:
        """The model's packed weights (made once, until a parameter changes), or None where the compiled step
        does not apply. `rows`: the product's expected row count (oneDNN's packing hint)."""
        if _why_not(model) is not None:
            return None
        int8 = any(isinstance(m, Int8Linear) for m in model.modules())
        backend = "int8" if int8 else gemm_backend()
        key = _key(model, backend, rows)
        hit = _PACKS.get(model)
        if hit is not None and hit[0] == key:
            return hit[1]
        packed = cls(model, backend, rows)
        _PACKS[model] = (key, packed)
        return packed

    def __init__(self, model: BARTModel, backend: str, rows: int):
        self.model, self.backend = model, backend
        enc, dec = model.encoder, model.decoder
        names = {fn: name for name, fn in ACTIVATIONS.items()}
        self.act = names[dec.layers[0].activation] if len(dec.layers) else "none"
        self.enc_act = names[enc.layers[0].activation] if len(enc.layers) else "none"
        lin = lambda *ms, fused=None: _spec(backend, rows, *ms, fused=fused)  # noqa: E731
        self.encoder_layers = []
        for layer in enc.layers:
            a = layer.self_attn
            self.encoder_layers.append(
                (
                    lin(a.q_proj, a.k_proj, a.v_proj, fused=a.int8_qkv),
                    lin(a.out_proj),
                    lin(layer.fc1),
                    lin(layer.fc2),
                    _Norm.of(layer.self_attn_layer_norm),
                    _Norm.of(layer.final_layer_norm),
                    layer.normalize_before,
                    a.num_heads,
                )
            )
        self.enc_final = None if enc.layer_norm is None else _Norm.of(enc.layer_norm)
        self.decoder_layers = []
        for layer in dec.layers:
            a, c = layer.self_attn, layer.encoder_attn
            self.decoder_layers.append(
                (
                    lin(a.q_proj, a.k_proj, a.v_proj, fused=a.int8_qkv),
                    lin(a.out_proj),
                    lin(c.q_proj),
                    lin(c.k_proj, c.v_proj, fused=c.int8_kv),
                    lin(c.out_proj),
                    lin(layer.fc1),
                    lin(layer.fc2),
                    _Norm.of(layer.self_attn_layer_norm),
                    _Norm.of(layer.encoder_attn_layer_norm),
                    _Norm.of(layer.final_layer_norm),
                )
            )
        self.output = lin(dec.output_projection)
        self.heads = dec.layers[0].self_attn.num_heads if len(dec.layers) else 1
        self.pre_norm = bool(len(dec.layers) and dec.layers[0].normalize_before)
        self._native: Any = None

    # -------------------------------------------------------------- encoder
    @torch.no_grad()
    def encode(self, src_tokens: Tensor, src_lengths: Tensor | None = None) -> dict[str, Tensor]:
        """The encoder pass (the model's `encoder(src_tokens)` output: B x S x C, zeros at the pads, and the B x S
        pad mask) with the packed products, on the real tokens only."""
        enc = self.model.encoder
        b, s = src_tokens.shape
        padding_mask = src_tokens.eq(enc.padding_idx)
        keep = ~padding_mask
        lengths: list[int] = keep.sum(1).tolist()
        rows = torch.nonzero(keep.view(-1)).squeeze(1)
        positions = make_positions(src_tokens, enc.padding_idx).view(-1).index_select(0, rows)
        x = enc._embed(src_tokens.view(-1).index_select(0, rows), enc.embed_positions.weight[positions])
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        longest = max(lengths, default=0)
        n = x.size(0)
        for qkv, out, fc1, fc2, n1, n2, pre, heads in self.encoder_layers:
            h = n1(x) if pre else x
            q, k, v = run_linear(qkv, h).view(n, 3, heads, -1).unbind(1)
            o = varlen_attention(q, k, v, cu, cu, longest, longest, False, 0.0, cu, cu).reshape(n, -1)
            x = run_linear(out, o, residual=x)
            x = x if pre else n1(x)
            h = n2(x) if pre else x
            x = run_linear(fc2, run_linear(fc1, h, self.enc_act), residual=x)
            x = x if pre else n2(x)
        if self.enc_final is not None:
            x = self.enc_final(x)
        out_ = x.new_zeros(b * s, x.size(-1)).index_copy_(0, rows, x).view(b, s, -1)
        return {"encoder_out": out_, "encoder_padding_mask": padding_mask}

    # -------------------------------------------------------------- decoder
    def native_decoder(self) -> Any:
        """A new C++ Decoder over these weights (one per batch: it holds the batch's cache)."""
        ext = extension()
        if ext is None:
            return None
        if self._native is None:
            native = lambda s: ext.Linear(s.kind, s.weight, s.bias, s.packed, s.out)  # noqa: E731
            layers = [([native(s) for s in specs[:7]], specs[7:]) for specs in self.decoder_layers]
            self._native = (layers, native(self.output))
        layers, output = self._native
        dec = self.model.decoder
        final = dec.layer_norm
        d = ext.Decoder(
            self.heads,
            self.pre_norm,
            ACTS[self.act],
            float(dec.embed_scale),
            dec.embed_tokens.weight.detach(),
            dec.embed_positions.weight.detach(),
            dec.layernorm_embedding.weight.detach(),
            dec.layernorm_embedding.bias.detach(),
            float(dec.layernorm_embedding.eps),
            None if final is None else final.weight.detach(),
            None if final is None else final.bias.detach(),
            1e-5 if final is None else float(final.eps),
            output,
        )
        for linears, norms in layers:
            d.add_layer(*linears, *(x for nm in norms for x in (nm.weight, nm.bias, nm.eps)))
        return d


def for_model(model: nn.Module) -> PackedModel | None:
    """The model's prepared weights when generation on the CPU takes the compiled step (SEQTRAIN_CPU_STEP is not
    `eager`, the extension is built, the model is one fp32 or int8 BART model on the CPU in eval mode); None:
    the eager step."""
    setting = mode()
    if setting == "eager" or _why_not(model) is not None:
        return None
    if extension() is None:
        if setting == "compiled":
            raise RuntimeError(
                f"SEQTRAIN_CPU_STEP=compiled: the compiled CPU step is unavailable ({_ext_error})"
            )
        return None
    packed = PackedModel.get(model)
    global _said
    if not _said:  # once a process: which step CPU generation takes
        _said = True
        logger.info(f"CPU decoding: the compiled step ({packed.backend} products)")
    return packed


_said = False


class CompiledSteps:
    """The decoder of one batch's beam search through the C++ step, with the interface of the eager loop's
    (`logits`, `reorder`): rows may be `beam` times the sentences; finished sentences simply stop appearing in the
    reorders (their encoder keys and values stay where they are, each row knows its sentence)."""

    def __init__(
        self, packed: PackedModel, native: Any, encoder_out: dict[str, Tensor], rows: int, max_rows: int
    ):
        memory = encoder_out["encoder_out"]
        valid = ~encoder_out["encoder_padding_mask"]
        b = memory.size(0)
        self.decoder = native
        self.pad = packed.model.decoder.padding_idx
        row_sent = torch.arange(rows) // max(1, rows // b)
        native.begin(memory.contiguous(), valid, row_sent, max_rows)

    def logits(self, prev_output_tokens: Tensor) -> Tensor:
        """The next token's logits of every row (R x 1 x V) for prefixes `prev_output_tokens` (R x t)."""
        t = prev_output_tokens.size(1)
        return self.decoder.step(prev_output_tokens[:, -1], self.pad + t).unsqueeze(1)

    def reorder(self, new_order: Tensor, encoder_order: Tensor | None) -> None:
        self.decoder.reorder(new_order)

    def search(
        self, body: Any, beams: Any, bos: int
    ) -> list[list[tuple[float, list[int], list[float]]]] | None:
        """Plain beam search of the whole batch in C++ (csrc/cpu_step.cpp's `search`: the eager loop's rules with
        the fused candidate step; `body` a DecodeStep that is `fusable`): per sentence its finished hypotheses
        (final score, tokens, positional scores) in the order they finished; None when a logit was not finite."""
        return extension().search(
            self.decoder,
            list(beams.max_lens_host),
            body.beam,
            bos,
            body.eos,
            body.pad,
            body.unk,
            body.min_len,
            float(body.len_penalty),
            bool(body.normalize_scores),
            float(body.unk_penalty),
            float(body.temperature),
            0 if body.ngram_blocker is None else body.ngram_blocker.n,
        )


def beam_candidates(
    logits: Tensor,
    prev: Tensor | None,
    k: int,
    temperature: float,
    pad: int,
    unk: int,
    unk_penalty: float,
    eos: int,
    ban_eos: bool,
    at_max: Tensor,
    history: Tensor,
    ngram: int,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The candidate step (csrc/cpu_step.cpp's beam_candidates): (scores, tokens, beams), each n x k, or None
    when the extension is unavailable or a logit is not finite (the generic path then decides)."""
    ext = extension()
    if ext is None:
        return None
    out = ext.beam_candidates(
        logits.contiguous(),
        prev if prev is not None else torch.empty(0, dtype=logits.dtype),
        k,
        temperature,
        pad,
        unk,
        unk_penalty,
        eos,
        ban_eos,
        at_max,
        history,
        ngram,
    )
    return tuple(out) if out else None


def main() -> None:
    """`python -m seqtrain.generation.cpu_step`: build the extension now (scripts/setup_env.sh does, so the first
    generation does not wait for the compiler) and say which step CPU generation takes."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ext = extension()
    if ext is not None:
        print(f"compiled CPU decoding step: ready ({extension_name()}; fp32 products: {gemm_backend()})")
    else:
        print(f"compiled CPU decoding step: unavailable ({_ext_error}); CPU generation takes the eager step")


if __name__ == "__main__":
    main()
