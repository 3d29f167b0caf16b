"""Packaging for hkt_nb: every piece of metadata is read from settings.ini (nbdev 2 layout), the one place
where the version, the requirements, the extras and the repository address are written.

- `requirements` -> install_requires (the core layer: torch, numpy and safetensors; never a Hub client);
- every other `<name>_requirements` key -> the extra `<name>` (lra, theory, hub, book, dev), plus `all`;
- `git_url`, `doc_host` + `doc_baseurl`, `paper_url` -> the project URLs.
The licence (SPDX expression and LICENSE file) and `requires-python` are static in pyproject.toml.
The wheel holds only the library `hkt_nb/` (and its `py.typed` marker); MANIFEST.in says what the sdist holds.
"""
from configparser import ConfigParser

import setuptools

parser = ConfigParser(delimiters=["="])
parser.read("settings.ini", encoding="utf-8")
cfg = parser["DEFAULT"]

STATUSES = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable", "6 - Mature"]
PY_VERSIONS = ["3.10", "3.11", "3.12", "3.13"]  # the release workflow tests the wheel on the first and the last


def requirement_list(key: str) -> list[str]:
    return cfg.get(key, "").split()


extras = {key[: -len("_requirements")]: requirement_list(key) for key in cfg if key.endswith("_requirements")}
extras["all"] = sorted({req for reqs in extras.values() for req in reqs})
docs_url = cfg["doc_host"].rstrip("/") + cfg["doc_baseurl"].rstrip("/") + "/"

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    url=docs_url,
    project_urls={
        "Documentation": docs_url,
        "Source": cfg["git_url"],
        "Issues": cfg["git_url"] + "/issues",
        "Paper": cfg["paper_url"],
    },
    author=cfg["author"],
    author_email=cfg["author_email"],
    keywords=cfg["keywords"],
    classifiers=[
        f"Development Status :: {STATUSES[int(cfg['status'])]}",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Natural Language :: English",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3 :: Only",
        "Typing :: Typed",
    ]
    + [f"Programming Language :: Python :: {v}" for v in PY_VERSIONS[PY_VERSIONS.index(cfg["min_python"]):]],
    packages=setuptools.find_packages(include=["hkt_nb", "hkt_nb.*"]),
    package_data={"hkt_nb": ["py.typed"]},
    include_package_data=False,
    install_requires=requirement_list("requirements"),
    extras_require=extras,
    zip_safe=False,
    entry_points={
        "console_scripts": cfg.get("console_scripts", "").split(),
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
)
