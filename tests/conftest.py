import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "debdesc-sample"
SHARED = REPO.parent / "shared"
FAIRSEQ_TINY = SHARED / "fixtures" / "fairseq-tiny"


@pytest.fixture
def sample_dir() -> pathlib.Path:
    return SAMPLE


@pytest.fixture
def fairseq_tiny() -> pathlib.Path:
    if not (FAIRSEQ_TINY / "checkpoint_last.pt").exists():
        pytest.skip(f"fairseq fixture not found at {FAIRSEQ_TINY} (it lives in ../shared, present in CI, absent in a user's clone)")
    return FAIRSEQ_TINY


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
    yield
    torch.set_num_threads(n)
