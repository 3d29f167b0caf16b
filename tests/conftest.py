import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
