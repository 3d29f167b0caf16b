"""The wheel holds only the library: no notebooks, data, tests or results."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_only_the_library(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("hkt_nb-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top <= {"hkt_nb", next(t for t in top if t.endswith(".dist-info"))}, top
    assert "hkt_nb/attention.py" in names and "hkt_nb/model.py" in names
    assert not any(n.endswith((".ipynb", ".parquet", ".json")) for n in names)
