"""The repository address is written once, in settings.ini (issue 13): every GitHub, Pages and Colab link in
the README, the chapters (install cells included), CITATION.cff, the book's configuration and the workflows
derives from `git_url`, `branch`, `doc_host` and `doc_baseurl`; nbdev's own settings point at real files and
pages (`readme_nb`, the `_modidx` doc links, which the book build answers with redirect pages)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"https?://[A-Za-z0-9.-]*(?:github\.com|github\.io|colab\.research\.google\.com)[^\s\"'`)<>\\\]]*")


def files_with_links() -> list[Path]:
    names = ["README.md", "CITATION.cff", "_config.yml", "references.bib", ".ci/run"]
    found = [ROOT / n for n in names if (ROOT / n).exists()]
    found += sorted((ROOT / "nbs").glob("*.ipynb")) + sorted((ROOT / ".github").rglob("*.yml"))
    return found


def allowed_prefixes(cfg) -> tuple[str, ...]:
    repo = cfg["git_url"].removeprefix("https://github.com/")
    docs = cfg["doc_host"].rstrip("/") + cfg["doc_baseurl"].rstrip("/")
    return (cfg["git_url"], docs, f"https://colab.research.google.com/github/{repo}/blob/{cfg['branch']}/nbs/",
            "https://colab.research.google.com")  # the launch-button host in _config.yml


def test_every_repository_link_derives_from_settings(settings):
    prefixes = allowed_prefixes(settings)
    foreign = []
    for path in files_with_links():
        for link in LINK.findall(path.read_text(encoding="utf-8")):
            if link.startswith("https://github.com/") and "/actions/" in link:
                continue
            if not any(link == p or link.startswith(p.rstrip("/") + "/") or link.startswith(p + "?") or link.startswith(p + "@") for p in prefixes):
                foreign.append(f"{path.relative_to(ROOT)}: {link}")
    assert foreign == [], "links not derived from settings.ini git_url/doc_host/doc_baseurl"


def test_colab_links_name_existing_chapters(settings):
    cfg = settings
    repo = cfg["git_url"].removeprefix("https://github.com/")
    pattern = re.compile(rf"https://colab\.research\.google\.com/github/{re.escape(repo)}/blob/[^/]+/(nbs/[\w.-]+\.ipynb)")
    for path in files_with_links():
        for notebook in pattern.findall(path.read_text(encoding="utf-8")):
            assert (ROOT / notebook).exists(), f"{path.name} links to {notebook}, which does not exist"


def test_readme_nb_exists(settings):
    cfg = settings
    assert (ROOT / cfg["nbs_path"] / cfg["readme_nb"]).exists(), cfg["readme_nb"]


def test_modidx_doc_links_are_pages_of_the_book(build_book, settings):
    "_modidx links `<name>.html#sym`; the book writes one redirect `<name>.html` per chapter of _toc.yml."
    namespace = {}
    exec((ROOT / "hkt_nb" / "_modidx.py").read_text(), namespace)
    index = namespace["d"]
    cfg = settings
    assert {k: index["settings"][k] for k in ("doc_host", "doc_baseurl", "git_url", "branch")} == \
        {k: cfg[k] for k in ("doc_host", "doc_baseurl", "git_url", "branch")}
    pages = {build_book.doc_page(name) for name in build_book.toc_files(ROOT / "_toc.yml")}
    linked = {link.split("#")[0] for module in index["syms"].values() for link, _ in module.values()}
    assert linked - pages == set(), "doc links to pages the book never writes"


def test_book_config_takes_the_address_from_settings(build_book, settings):
    import yaml

    config = build_book.book_config(yaml.safe_load((ROOT / "_config.yml").read_text()), dict(settings))
    cfg = settings
    assert config["repository"]["url"] == cfg["git_url"] and config["repository"]["branch"] == cfg["branch"]
    assert config["html"]["baseurl"] == cfg["doc_host"] + cfg["doc_baseurl"] + "/"
