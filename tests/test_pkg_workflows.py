"""The release and Pages workflows (issue 13) are valid YAML, have the triggers and permissions their job
needs, and call only what exists in the repository (Makefile targets, test files, the book's output folder)."""
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    return workflow


def run_lines(workflow: dict) -> list[str]:
    return [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("name", ["release.yml", "pages.yml"])
def test_workflow_calls_only_what_exists(name):
    workflow = load(name)
    for script in run_lines(workflow):
        for target in re.findall(r"\bmake\s+([\w-]+)", script):
            assert target in makefile_targets(), f"{name}: make {target}"
        for path in re.findall(r"(?:--ignore=)?(tests/[\w./]+\.py)", script):
            assert (ROOT / path).exists(), f"{name}: {path}"
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            assert "uses" in step or "run" in step, step


def test_release_workflow():
    workflow = load("release.yml")
    assert workflow["on"]["push"]["tags"] == ["v*"]
    jobs = workflow["jobs"]
    assert jobs["test"]["needs"] == "build" and jobs["publish"]["needs"] == "test"
    assert jobs["publish"]["permissions"] == {"id-token": "write"}  # trusted publishing, no token
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish") for s in jobs["publish"]["steps"])
    assert "settings.ini" in "\n".join(run_lines(workflow))  # the version comes from one place


def test_pages_workflow():
    workflow = load("pages.yml")
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    uses = [s.get("uses", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    upload = next(s for job in workflow["jobs"].values() for s in job["steps"]
                  if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/_build/html"  # where scripts/build_book.py writes the book
    assert any("make book" in line for line in run_lines(workflow))
