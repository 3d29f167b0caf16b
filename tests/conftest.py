import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (run by `make gpu-check`; HKT_TEST_DEVICE=cpu dry-runs it)")
