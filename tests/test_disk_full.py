"""A full disk (issue 35, item 7): every write of a run (checkpoint, record, predictions, pretrained folder, the
baselines' files) turns ENOSPC / EFBIG, also when torch's serializer or safetensors wraps it, into one
`DiskFullError` line that names the file; the old file is left byte for byte, no temporary file and no folder the
write created stays behind, and `hkt-train` prints that line (no traceback) and exits with status 1.

Each writer runs in a child process whose file size limit (`RLIMIT_FSIZE`) is a few KiB, with SIGXFSZ ignored, so
that a write past the limit fails with EFBIG exactly where a full disk fails with ENOSPC. The limit is set just
before the writes, after the imports; the parent prepares the old files and compares the whole folder afterwards."""
import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hkt_nb.train.checkpoints import (
    DiskFullError,
    atomic_save,
    disk_full_error,
    disk_full_reason,
    folders_removed_on_error,
)

resource = pytest.importorskip("resource", reason="RLIMIT_FSIZE is POSIX")
if not hasattr(__import__("signal"), "SIGXFSZ"):
    pytest.skip("no SIGXFSZ on this platform", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
LIMIT = 4096  # bytes: every file the tests write under it is larger, except the explicit small one
TOO_LARGE = os.strerror(errno.EFBIG)  # "File too large": the reason a DiskFullError gives under the limit
ADVICE = "; free some space or write to another folder (hkt-train --results-dir), then run again"

CHILD = '''
import json, resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
ROOT, LIMIT = Path(sys.argv[1]), int(sys.argv[2])


def limited():
    "From here on no file of this process may grow past LIMIT bytes."
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def outcome(write):
    "What `write()` raised, as JSON: a DiskFullError's message, path and the chain of its causes; None: no error."
    from hkt_nb.train.checkpoints import DiskFullError
    try:
        write()
    except DiskFullError as error:
        chain, cause = [], error.__cause__
        while cause is not None:
            chain.append([type(cause).__name__, getattr(cause, "errno", None), str(cause)])
            cause = cause.__cause__ or cause.__context__
        return {"error": type(error).__name__, "message": str(error), "path": str(error.path), "chain": chain}
    return {"error": None}
'''


def child(body: str, root: Path, *args, limit: int = LIMIT) -> subprocess.CompletedProcess:
    "Run CHILD + `body` in a fresh interpreter (argv: root, limit, *args) that imports hkt_nb from this worktree."
    return subprocess.run([sys.executable, "-c", CHILD + textwrap.dedent(body), str(root), str(limit), *args],
                          capture_output=True, text=True, cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def outcomes(body: str, root: Path) -> list[dict]:
    "The list of `outcome`s the child's body prints as its last line of JSON."
    out = child(body, root)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def tree(root: Path) -> dict:
    "Every folder and file under `root`: relative path -> the file's bytes, or 'folder'."
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else "folder" for p in sorted(root.rglob("*"))}


def assert_disk_full(result: dict, path: Path) -> None:
    "A one-line DiskFullError naming `path` (the file, not its temporary), for the file size limit."
    assert result["error"] == "DiskFullError", result
    assert result["path"] == str(path), result
    assert result["message"] == f"cannot write {path}: the disk is full ({TOO_LARGE}){ADVICE}", result["message"]
    assert any(kind == "OSError" and code == errno.EFBIG for kind, code, _ in result["chain"]) or \
        any(f"(os error {errno.EFBIG})" in text for _, _, text in result["chain"]), result["chain"]


# ---------------------------------------------------------------- the pieces, in this process (no limit needed)
def test_disk_full_reason_reads_every_form():
    "ENOSPC / EFBIG found on the error, in its cause or context chain, or in a wrapped message; nothing else."
    assert disk_full_reason(OSError(errno.ENOSPC, "No space left on device")) == os.strerror(errno.ENOSPC)
    try:  # torch's serializer: the OSError is the context of its own RuntimeError (the message of the issue)
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 32640 vs 32592")
    except RuntimeError as error:
        wrapped = error
    assert disk_full_reason(wrapped) == TOO_LARGE
    chained = RuntimeError("write failed")
    chained.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full_reason(chained) == os.strerror(errno.ENOSPC)
    safetensors = Exception(f"Error while serializing: I/O error: {TOO_LARGE} (os error {errno.EFBIG})")
    assert disk_full_reason(safetensors) == TOO_LARGE
    assert disk_full_reason(PermissionError(errno.EACCES, "Permission denied")) is None
    assert disk_full_reason(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")) is None
    assert disk_full_reason(ValueError("bad value")) is None


def test_disk_full_error_is_one_line_naming_the_file(tmp_path):
    error = disk_full_error(tmp_path / "a.pt", TOO_LARGE)
    assert isinstance(error, DiskFullError) and isinstance(error, OSError) and error.path == tmp_path / "a.pt"
    assert str(error) == f"cannot write {tmp_path / 'a.pt'}: the disk is full ({TOO_LARGE}){ADVICE}"


def test_folders_removed_on_error_removes_only_the_new_empty_folders(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), folders_removed_on_error(tmp_path / "kept" / "a" / "b"):
        (tmp_path / "kept" / "a" / "b").mkdir(parents=True)
        raise KeyboardInterrupt
    assert tree(tmp_path) == {"kept": "folder"}
    with pytest.raises(ValueError), folders_removed_on_error(tmp_path / "x" / "y"):  # a file keeps its folder
        (tmp_path / "x" / "y").mkdir(parents=True)
        (tmp_path / "x" / "note").write_text("mine")
        raise ValueError
    assert tree(tmp_path) == {"kept": "folder", "x": "folder", "x/note": b"mine"}
    with folders_removed_on_error(tmp_path / "ok"):  # no error: nothing removed
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()


# ---------------------------------------------------------------- each writer under RLIMIT_FSIZE, in a child
def test_atomic_write_with_torch_save(tmp_path):
    """atomic_write with torch.save inside (torch wraps the EFBIG in its RuntimeError `unexpected pos`) and with a
    plain write: DiskFullError naming the file; the old file intact; the new folders removed; a small file under the
    same limit is written as usual (the limit, not the writer, is what fails)."""
    (tmp_path / "old").mkdir()
    torch.save({"weights": torch.ones(3)}, tmp_path / "old" / "last.pt")
    before = tree(tmp_path)
    results = outcomes('''
        import torch
        from hkt_nb.train.checkpoints import atomic_write
        big = {"weights": torch.arange(10_000, dtype=torch.float32)}
        limited()
        print(json.dumps([outcome(lambda: atomic_write(ROOT / "old" / "last.pt", lambda f: torch.save(big, f))),
                          outcome(lambda: atomic_write(ROOT / "new" / "run" / "last.pt", lambda f: torch.save(big, f))),
                          outcome(lambda: atomic_write(ROOT / "plain" / "a.bin", lambda f: f.write(bytes(LIMIT + 1)))),
                          outcome(lambda: atomic_write(ROOT / "small" / "ok.pt", lambda f: torch.save(torch.zeros(2), f)))]))
    ''', tmp_path)
    old, new, plain, small = results
    assert_disk_full(old, tmp_path / "old" / "last.pt")
    assert old["chain"][0][0] == "RuntimeError" and "inline_container" in old["chain"][0][2], old["chain"]  # wrapped
    assert_disk_full(new, tmp_path / "new" / "run" / "last.pt")
    assert_disk_full(plain, tmp_path / "plain" / "a.bin")
    assert plain["chain"][0][:2] == ["OSError", errno.EFBIG]
    assert small == {"error": None}
    after = tree(tmp_path)
    assert after.pop("small/ok.pt") and after.pop("small") == "folder"
    assert after == before  # old bytes kept; no .tmp file, no new/, new/run/ or plain/ folder
    assert torch.equal(torch.load(tmp_path / "small" / "ok.pt"), torch.zeros(2))


def test_checkpoint_save(tmp_path):
    """A run's checkpoint (`atomic_save` of model, optimiser and random states, as `save_checkpoint` writes it):
    over an old checkpoint, which stays readable with its epoch; and as the first one, which leaves no
    `checkpoints/<run>/` folder."""
    from hkt_nb.train.checkpoints import read_checkpoint, rng_state
    (tmp_path / "checkpoints" / "old-run").mkdir(parents=True)
    atomic_save({"epoch": 3, "rng": rng_state()}, tmp_path / "checkpoints" / "old-run" / "last.pt")
    before = tree(tmp_path)
    results = outcomes('''
        import torch
        from hkt_nb.train.checkpoints import atomic_save, rng_state
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 64)).sum().backward(); optimizer.step()
        state = {"epoch": 4, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": [rng_state()]}
        limited()
        print(json.dumps([outcome(lambda: atomic_save(state, ROOT / "checkpoints" / "old-run" / "last.pt")),
                          outcome(lambda: atomic_save(state, ROOT / "checkpoints" / "new-run" / "last.pt"))]))
    ''', tmp_path)
    assert_disk_full(results[0], tmp_path / "checkpoints" / "old-run" / "last.pt")
    assert_disk_full(results[1], tmp_path / "checkpoints" / "new-run" / "last.pt")
    assert tree(tmp_path) == before
    assert read_checkpoint(tmp_path / "checkpoints" / "old-run" / "last.pt", "cpu")["epoch"] == 3


def test_record_json(tmp_path):
    "A run's record: the LRA loop's `atomic_save(results, <run>.json)` and the LM's `save_record`; old records intact."
    old = {"run": "old", "test_acc": 0.5}
    for name in ("lra-run.json", "lm-run.json"):
        atomic_save(old, tmp_path / name)
    before = tree(tmp_path)
    results = outcomes('''
        from hkt_nb.lm.training import save_record
        from hkt_nb.train.checkpoints import atomic_save
        record = {"run": "new", "history": [{"epoch": k, "val_loss": 1.0 / (k + 1)} for k in range(500)]}
        limited()
        print(json.dumps([outcome(lambda: atomic_save(record, ROOT / "lra-run.json")),
                          outcome(lambda: save_record(record, ROOT / "lm-run.json")),
                          outcome(lambda: save_record(record, ROOT / "new" / "lm-run.json"))]))
    ''', tmp_path)
    for result, path in zip(results, ("lra-run.json", "lm-run.json", "new/lm-run.json")):
        assert_disk_full(result, tmp_path / path)
    assert tree(tmp_path) == before
    assert json.loads((tmp_path / "lra-run.json").read_text()) == old


def test_predictions_npz(tmp_path):
    "`save_predictions` over old predictions (left as they were) and into a results folder without predictions/."
    from hkt_nb.train.records import read_predictions, save_predictions
    save_predictions(tmp_path / "predictions" / "old.npz", np.array([1, 2, 3]), np.array([1, 2, 0]))
    (tmp_path / "fresh").mkdir()
    before = tree(tmp_path)
    results = outcomes('''
        import numpy as np
        from hkt_nb.train.records import save_predictions
        rng = np.random.default_rng(0)
        predictions, labels = rng.integers(0, 10, 20_000), rng.integers(0, 10, 20_000)  # ~20 KB compressed
        limited()
        print(json.dumps([outcome(lambda: save_predictions(ROOT / "predictions" / "old.npz", predictions, labels)),
                          outcome(lambda: save_predictions(ROOT / "fresh" / "predictions" / "run.npz", predictions,
                                                           labels))]))
    ''', tmp_path)
    assert_disk_full(results[0], tmp_path / "predictions" / "old.npz")
    assert_disk_full(results[1], tmp_path / "fresh" / "predictions" / "run.npz")
    assert tree(tmp_path) == before
    predictions, labels = read_predictions(tmp_path / "predictions" / "old.npz", None)
    assert predictions.tolist() == [1, 2, 3] and labels.tolist() == [1, 2, 0]


def test_baselines_files(tmp_path):
    "`save_baselines`: its predictions .npz fail first; the old baselines stay, a fresh folder gets no baselines/."
    from hkt_nb.lra import baselines as B
    labels = np.array([0, 1, 1, 0])
    old = {"task": "imdb", "preset": "cpu", "strongest": "rule", "test_labels": labels,
           "baselines": {"rule": {"val_acc": 0.75, "test_acc": 0.75}}, "predictions": {"rule": np.array([0, 0, 1, 0])}}
    B.save_baselines(old, tmp_path / "old")
    (tmp_path / "fresh").mkdir()
    before = tree(tmp_path)
    results = outcomes('''
        import numpy as np
        from hkt_nb.lra.baselines import save_baselines
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 2, 20_000)
        result = {"task": "imdb", "preset": "cpu", "strongest": "rule", "test_labels": labels,
                  "baselines": {"rule": {"val_acc": 0.5, "test_acc": 0.5}}, "predictions": {"rule": 1 - labels}}
        limited()
        print(json.dumps([outcome(lambda: save_baselines(result, ROOT / "old")),
                          outcome(lambda: save_baselines(result, ROOT / "fresh"))]))
    ''', tmp_path)
    assert_disk_full(results[0], B.baseline_predictions_path(tmp_path / "old", "imdb", "cpu", "rule"))
    assert_disk_full(results[1], B.baseline_predictions_path(tmp_path / "fresh", "imdb", "cpu", "rule"))
    assert tree(tmp_path) == before
    assert B.load_baseline_predictions(tmp_path / "old", "imdb", "cpu", "rule")[0].tolist() == [0, 0, 1, 0]


MODELS = {  # a model of each kind with PretrainedMixin, built by the same code here and in the child
    "classifier": ("from hkt_nb.model import ClassifierConfig as Config, HKTClassifier as Model",
                   dict(vocab_size=11, n_classes=3, max_len=32, d_model=16, n_heads=2, n_layers=1)),
    "byte LM": ("from hkt_nb.lm.model import LMConfig as Config, ByteLM as Model",
                dict(d_model=16, n_heads=2, n_layers=2, max_len=64)),
}


def build(kind: str, seed: int):
    "The model of `kind` with the weights of `seed` (also the code the child runs)."
    namespace = {}
    exec(MODELS[kind][0], namespace)
    torch.manual_seed(seed)
    return namespace["Model"](namespace["Config"](**MODELS[kind][1])).eval()


@pytest.mark.parametrize("kind", MODELS)
def test_save_pretrained(tmp_path, kind):
    """`save_pretrained` of a classifier and of the byte LM (and `save_weights`): over an old folder, which keeps
    its bytes and loads the old model; into a fresh `pretrained/<run>/`, which is not left behind (nor pretrained/).
    The error names the weights file, not its temporary name; safetensors' own error is its cause."""
    from hkt_nb.pretrained import save_weights
    old_model = build(kind, seed=0)
    old_model.save_pretrained(tmp_path / "pretrained" / "old")
    save_weights(old_model, tmp_path / "weights.safetensors")
    (tmp_path / "fresh").mkdir()
    before = tree(tmp_path)
    results = outcomes(f'''
        import torch
        from hkt_nb.pretrained import save_weights
        {MODELS[kind][0]}
        torch.manual_seed(1)
        model = Model(Config(**{MODELS[kind][1]!r}))
        limited()
        print(json.dumps([outcome(lambda: model.save_pretrained(ROOT / "pretrained" / "old")),
                          outcome(lambda: model.save_pretrained(ROOT / "fresh" / "pretrained" / "run")),
                          outcome(lambda: save_weights(model, ROOT / "weights.safetensors"))]))
    ''', tmp_path)
    assert_disk_full(results[0], tmp_path / "pretrained" / "old" / "model.safetensors")
    assert any(kind_ == "SafetensorError" for kind_, _, _ in results[0]["chain"]), results[0]["chain"]
    assert_disk_full(results[1], tmp_path / "fresh" / "pretrained" / "run" / "model.safetensors")
    assert_disk_full(results[2], tmp_path / "weights.safetensors")
    assert tree(tmp_path) == before  # no .tmp file, no fresh/pretrained/
    loaded = type(old_model).from_pretrained(tmp_path / "pretrained" / "old")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in old_model.state_dict().items())


# ---------------------------------------------------------------- hkt-train under the limit
CLI = ["--task", "synthetic", "--device", "cpu", "--threads", "1", "--no-progress"]
RUN = "synthetic-hkt-smoke-seed0"
CLI_LIMIT = 64 * 1024  # above the tokenised data the run caches (~30 KB), below its first checkpoint


@pytest.mark.parametrize("retrain", [False, True], ids=["fresh folder", "--retrain over a finished run"])
def test_hkt_train_on_a_full_disk_prints_one_line(tmp_path, retrain):
    """The issue's case: `hkt-train` (a `--retrain` over old files, or into a fresh results folder) under a file size
    limit that its first checkpoint exceeds. It prints one line, the DiskFullError naming the checkpoint, on stderr,
    no traceback, exits 1; the old record and predictions keep their bytes, and neither the `checkpoints/<run>/`
    folder, its lock, nor a results folder this call created is left behind."""
    results = tmp_path / "results"
    if retrain:  # --retrain reads neither: bytes stand for a finished run's files
        (results / "predictions").mkdir(parents=True)
        (results / f"{RUN}.json").write_bytes(b'{"run": "the old record"}\n')
        (results / "predictions" / f"{RUN}.npz").write_bytes(b"the old predictions")
    before = tree(tmp_path)
    argv = [*CLI, "--results-dir", str(results), *(["--retrain"] if retrain else [])]
    out = child('''
        limited()
        from hkt_nb.lra.runs import main
        sys.argv = ["hkt-train", *sys.argv[3:]]
        sys.exit(main())
    ''', tmp_path, *argv, limit=CLI_LIMIT)
    checkpoint = results.resolve() / "checkpoints" / RUN / "last.pt"
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    message = f"hkt-train: cannot write {checkpoint}: the disk is full ({TOO_LARGE}){ADVICE}"
    assert out.returncode == 1 and "Traceback" not in out.stderr and lines[-1] == message, out.stderr
    assert [line for line in lines if line.startswith("hkt-train")] == [message]  # besides datasets' bars (a cold cache)
    assert f"hkt-train: results in {results.resolve()}" in out.stdout
    assert tree(tmp_path) == before


def test_train_on_a_full_disk_leaves_no_folder(tmp_path, monkeypatch, one_thread):
    """The library's `train` (no command line): a first checkpoint that finds the disk full (ENOSPC, raised inside
    the real `atomic_write` after a partial write) raises the DiskFullError naming it, and leaves neither the
    `checkpoints/<run>/` folder, the lock, `checkpoints/` nor the results folder that the run created."""
    from hkt_nb.lra.loop import train
    from hkt_nb.train import checkpoints

    real_save = checkpoints.atomic_save

    def full_disk_save(obj, path):
        if Path(path).suffix != ".pt":
            return real_save(obj, path)

        def write(file):
            file.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return checkpoints.atomic_write(path, write)

    monkeypatch.setattr(checkpoints, "atomic_save", full_disk_save)
    results = tmp_path / "results"
    with pytest.raises(DiskFullError) as error:
        train("synthetic", "hkt", "smoke", 0, results_dir=results, device="cpu", progress=False, verbose=False)
    checkpoint = results.resolve() / "checkpoints" / RUN / "last.pt"
    assert str(error.value) == f"cannot write {checkpoint}: the disk is full ({os.strerror(errno.ENOSPC)}){ADVICE}"
    assert tree(tmp_path) == {}
