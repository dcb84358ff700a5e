"""seqtrain.cuda's --deterministic settings: what set_deterministic sets, when it refuses (a cuBLAS setting that is
not deterministic, or one it would set after CUDA started), and the one-line errors for torch's refusals; the
vocabulary products' row alignment (align_rows, padded_weight)."""

from __future__ import annotations

import pytest
import torch

from seqtrain import cuda
from seqtrain.cuda import CUBLAS_VAR, nondeterministic_error, set_deterministic, strictly_deterministic
from seqtrain.errors import SeqtrainError


def test_set_deterministic_sets_every_setting(monkeypatch):
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    torch.backends.cudnn.benchmark = True
    set_deterministic()  # (conftest's fixture puts torch's settings back after the test)
    assert torch.are_deterministic_algorithms_enabled() and strictly_deterministic()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert cuda.os.environ[CUBLAS_VAR] == ":4096:8"


def test_a_deterministic_cublas_setting_of_the_user_is_kept(monkeypatch):
    monkeypatch.setenv(CUBLAS_VAR, ":16:8")
    set_deterministic()
    assert cuda.os.environ[CUBLAS_VAR] == ":16:8"


def test_other_cublas_settings_are_refused(monkeypatch):
    monkeypatch.setenv(CUBLAS_VAR, ":0:0")
    with pytest.raises(SeqtrainError, match=r"^--deterministic: CUBLAS_WORKSPACE_CONFIG=':0:0' is not a"):
        set_deterministic()
    assert not torch.are_deterministic_algorithms_enabled()  # refused before anything was set


def test_too_late_to_set_the_cublas_variable_is_one_line(monkeypatch):
    """With CUDA started in this process, cuBLAS may have read its environment already (the CUDA case,
    simulated on the CPU)."""
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(SeqtrainError) as e:
        set_deterministic()
    assert str(e.value) == (
        "--deterministic: CUBLAS_WORKSPACE_CONFIG must be set before CUDA starts in this process (cuBLAS reads "
        "it once); export CUBLAS_WORKSPACE_CONFIG=:4096:8 before launching"
    )
    assert CUBLAS_VAR not in cuda.os.environ


def test_torch_refusals_become_one_line_naming_the_flag(monkeypatch):
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    set_deterministic()
    with pytest.raises(RuntimeError) as e:
        torch.zeros(2).put_(torch.tensor([1]), torch.ones(1))  # no deterministic kernel, on the CPU too
    err = nondeterministic_error(e.value)
    assert str(err).startswith("--deterministic: put_ has no deterministic implementation in torch ")
    assert "\n" not in str(err)
    cublas = RuntimeError(
        "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
        "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because it "
        "uses CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an "
        "environment variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or ..."
    )
    assert str(nondeterministic_error(cublas)) == (
        "--deterministic: cuBLAS is not deterministic without CUBLAS_WORKSPACE_CONFIG; export "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8 before launching"
    )
    assert nondeterministic_error(RuntimeError("shape mismatch")) is None
    assert nondeterministic_error(ValueError("use_deterministic_algorithms")) is None


def test_align_rows_pads_on_cuda_only_unless_asked():
    assert cuda.align_rows(torch.device("cpu")) == 1
    assert cuda.align_rows(torch.device("cuda")) == cuda.CUDA_ALIGN_ROWS == 8
    assert cuda.align_rows(torch.device("cpu"), 64) == 64 and cuda.align_rows(torch.device("cuda"), 1) == 1


def test_the_padded_weight_is_one_cast_with_zero_rows_after_the_vocabulary():
    w = torch.randn(11, 4, dtype=torch.float32, requires_grad=True)
    p = cuda.padded_weight(w, 8, torch.bfloat16)
    assert p.shape == (16, 4) and p.dtype == torch.bfloat16 and not p.requires_grad
    assert torch.equal(p[:11], w.detach().bfloat16()) and not p[11:].any()
    assert cuda.padded_weight(w, 1, torch.float32).shape == (11, 4)
