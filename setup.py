"""Packaging for hkt_nb: reads its metadata from settings.ini (nbdev 2 layout).

The wheel holds only the library `hkt_nb/`; notebooks, data and results stay in the repo.
Extras: `plot` (matplotlib, seaborn, pandas) and `dev` (nbdev, jupyter-book, papermill, ...).
"""
from configparser import ConfigParser

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
statuses = ["Planning", "Pre-Alpha", "Alpha", "Beta", "Production/Stable", "Mature", "Inactive"]
lic = licenses[cfg["license"]]
min_python = cfg["min_python"]
py_versions = ["3.10", "3.11", "3.12", "3.13"]

requirements = cfg.get("requirements", "").split()
plot_requirements = cfg.get("plot_requirements", "").split()
dev_requirements = cfg.get("dev_requirements", "").split()
console_scripts = [s for s in cfg.get("console_scripts", "").split() if s]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    url=cfg["git_url"],
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=lic[0],
    keywords=cfg["keywords"],
    classifiers=[
        "Development Status :: " + f"{int(cfg['status']) + 1} - {statuses[int(cfg['status'])]}",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: " + lic[1],
        "Natural Language :: English",
    ]
    + [f"Programming Language :: Python :: {v}" for v in py_versions[py_versions.index(min_python):]],
    packages=setuptools.find_packages(include=["hkt_nb", "hkt_nb.*"]),
    include_package_data=False,
    install_requires=requirements,
    extras_require={"plot": plot_requirements, "dev": dev_requirements + plot_requirements},
    python_requires=">=" + min_python,
    zip_safe=False,
    entry_points={"console_scripts": console_scripts, "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
)
