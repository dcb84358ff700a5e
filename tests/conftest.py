"""Fixtures shared by the test modules (helpers that are not fixtures live in tests/utils.py)."""

import os
import pathlib

import pytest

from tests.utils import FAIRSEQ_TINY, SAMPLE, make_toy_databin


@pytest.fixture
def sample_dir() -> pathlib.Path:
    return SAMPLE


@pytest.fixture
def fairseq_tiny() -> pathlib.Path:
    if not (FAIRSEQ_TINY / "checkpoint_last.pt").exists():
        pytest.skip(
            f"fairseq fixture not found at {FAIRSEQ_TINY} "
            "(it lives in ../shared, present in CI, absent in a user's clone)"
        )
    return FAIRSEQ_TINY


@pytest.fixture(scope="session")
def toy_databin(tmp_path_factory):
    """toy_databin(n_train=200, n_valid=40, seed=0): the toy data-bin of that size (tests.utils.make_toy_databin),
    built once per test run; tests only read it."""
    built = {}

    def get(n_train: int = 200, n_valid: int = 40, seed: int = 0) -> str:
        key = (n_train, n_valid, seed)
        if key not in built:
            built[key] = make_toy_databin(tmp_path_factory.mktemp("toy"), *key)
        return built[key]

    return get


@pytest.fixture(scope="session")
def databin(toy_databin) -> str:
    """The 200-example toy data-bin (4 updates an epoch at --max-tokens 512). A module that needs another size
    overrides this fixture with toy_databin(n_train, n_valid)."""
    return toy_databin()


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; none on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded machine their spin-waits cost seconds."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    # an explicit choice, so seqtrain-train's own (seqtrain.host_cpu.fit_threads) keeps the tests' one
    # thread, in this process and in the commands the tests start
    env = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(n)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)


@pytest.fixture(autouse=True)
def _cuda_kernel_choices_restored():
    """A Trainer sets process-wide kernel choices (on CUDA TF32 and cuDNN attention; with --deterministic,
    deterministic algorithms, cuDNN's flags and CUBLAS_WORKSPACE_CONFIG: seqtrain.cuda); each test starts from
    torch's defaults, so a test comparing fp32 results is not run in TF32 by an earlier one, nor a speed test
    under deterministic kernels."""
    import os

    import torch

    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.backends.cuda.enable_cudnn_sdp(saved[2])
    torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[5:7]
    if saved[7] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[7]


@pytest.fixture
def python_sigint():
    """Python's usual SIGINT handler: a shell starts background jobs (and so CI steps, sometimes) with SIGINT
    ignored, and an ignored signal rightly stays ignored by the graceful stop."""
    import signal

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, outer)
