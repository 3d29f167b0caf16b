"""The README's Python examples, run in order in one namespace from the repository root (where its
`results/pretrained/` folder is): each does what its comments say (issue 33: a new user copies them)."""
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_every_readme_example_runs_and_states_its_shapes(monkeypatch, one_thread):
    monkeypatch.chdir(ROOT)
    blocks = readme_blocks()
    assert len(blocks) >= 4  # the layer, cached decoding, loading a model, its inputs
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["y"].shape == (4, 1000, 256) and torch.isfinite(namespace["y"]).all()
    layer, x = namespace["layer"], namespace["x"]
    torch.testing.assert_close(namespace["y_next"], layer(x)[:, 32:], atol=1e-5, rtol=1e-5)
    assert namespace["logits"].shape == (1, 10) and not namespace["model"].training
