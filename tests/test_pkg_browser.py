"""The built book, opened in a real browser (issue 13): headless Chromium (the system package) driven by
Selenium opens every chapter page of `_build/_build/html` (or `HKT_BOOK_HTML`) from disk, with no network,
and checks that
- the maths is typeset: every `.math` element holds MathJax output (`mjx-container`), no MathJax error,
  and no raw `\\begin{` or `$$` is left in the text outside code, nor any `$...\\cmd...$`, `$..^{..}$` or `$.._{..}$`
  (maths in a Markdown output, a show_doc docstring or a table that was not typeset; issue 33);
- no show_doc attribute text (`{target="_blank" ...}`) is printed beside an API entry;
- no display equation is clipped: a display whose content is wider than its box scrolls inside it (and no part
  of it lies left of its box, where no scrollbar reaches);
- no progress bar (tqdm's, `datasets`') and no profiler log line (`USDT: ...`) is printed into an output;
- every image has loaded (`complete` and a non-zero natural width);
- the Colab launch link opens this chapter's notebook in the repository of settings.ini;
- the page raised no JavaScript error (browser log level SEVERE).
Skipped, with the package to install, when Chromium, chromedriver or selenium is missing; skipped when no
book is built unless `HKT_REQUIRE_BOOK=1` (`make browser-test`, run by `make test` after `make book`).
"""
import os
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = Path(os.environ.get("HKT_BOOK_HTML", ROOT / "_build" / "_build" / "html")).resolve()
os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium sends no usage statistics (and needs no network)
INSTALL = "install the system package: `apt-get install chromium chromium-driver` (Debian/Ubuntu; .ci/run does it)"


def toc_pages() -> list[str]:
    "Every page of _toc.yml, root first, sections (e.g. nbs/02a_flex) included."
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries:
            pages.append(entry["file"])
            walk(entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    return pages


def colab_url(page: str, cfg) -> str:
    repo = cfg["git_url"].removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{repo}/blob/{cfg['branch']}/{page}.ipynb"


def built_pages() -> list[str]:
    return [page for page in toc_pages() if (BOOK / f"{page}.html").exists()]


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(f"headless Chromium test: chromium or chromedriver not found; {INSTALL}")
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (in the `dev` extra)")
    if not built_pages():
        message = f"no built book at {BOOK}: run `make book` first"
        if os.environ.get("HKT_REQUIRE_BOOK") == "1":
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--allow-file-access-from-files", "--window-size=1280,1024"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
const start = Date.now();
(function wait() {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { mj.startup.promise.then(() => done("typeset"), e => done("error " + e)); }
  else if (Date.now() - start > 20000) { done(document.querySelector(".math") ? "no MathJax" : "no maths"); }
  else { setTimeout(wait, 100); }
})();
"""

INSPECT = """
const maths = [...document.querySelectorAll(".math")];
const body = document.body.cloneNode(true);
body.querySelectorAll("pre, code, script, style, textarea, .math, mjx-container").forEach(e => e.remove());
const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
const texts = [];
while (walker.nextNode()) texts.push(walker.currentNode.nodeValue);
const text = texts.join(" ");  // text nodes apart, as tools/rawtex.py reads them
// a display is clipped when its content is wider than the box that shows it and that box does not scroll, or
// when part of it lies left of that box (centred content that overflows: no scrollbar reaches it)
const clipped = [];
for (const display of document.querySelectorAll('mjx-container[display="true"]')) {
  const math = display.querySelector("mjx-math") || display;
  const content = math.getBoundingClientRect();
  for (const box of [display, display.parentElement]) {
    if (!box) continue;
    const rect = box.getBoundingClientRect(), style = getComputedStyle(box);
    const reason = content.left < rect.left - 1 ? "starts left of its box"
      : content.width <= box.clientWidth + 1 ? null
      : ["auto", "scroll"].includes(style.overflowX) && box.scrollWidth >= content.width - 1 ? "scrolls"
      : "wider than its box";
    if (reason === "scrolls") break;  // reachable: this box scrolls over the whole display
    if (reason) {
      clipped.push(`${display.textContent.slice(0, 60)}: ${reason} (content ${content.width.toFixed(0)} px, ` +
                   `box ${box.clientWidth} px, overflow-x ${style.overflowX})`);
      break;
    }
  }
}
return {
  rawtex: text.match(/\\$[^$\\n]{0,80}?(?:\\\\[a-zA-Z]+|\\^\\{|_\\{)[^$\\n]{0,80}?\\$/g) || [],
  // an opening $ whose maths was cut off (e.g. by a Markdown list item that starts inside it): "$M_l = \\\\tfrac12(..."
  unclosed: text.match(/\\$[^$\\s][^$\\n]{0,60}?\\\\[a-zA-Z]{2,}/g) || [],
  attributes: text.match(/\\{target=/g) || [],
  clipped: clipped,
  maths: maths.length,
  untypeset: maths.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.slice(0, 80)),
  errors: [...document.querySelectorAll("mjx-merror")].map(e => e.textContent.slice(0, 80)),
  raw: body.textContent.match(/\\\\begin\\{|\\$\\$/g) || [],
  images: [...document.images].map(i => ({src: i.getAttribute("src"), ok: i.complete && i.naturalWidth > 0})),
  colab: [...document.querySelectorAll("a[href*='colab.research.google.com']")].map(a => a.href),
  // a progress bar printed into an output ("Saving the dataset: 100%|####| 10/10 [00:00<00:00, ...]"), code included
  logs: document.body.textContent.match(/USDT:\\d{4}-\\d\\d-\\d\\d[^\\n]{0,80}/g) || [],  // the profiler's own log lines
  progress: document.body.textContent.match(/\\d+%\\|[^|\\n]{0,100}\\|\\s*[\\d.]+[kMG]?\\/[\\d.]+[kMG]?\\s*\\[/g) || [],
  tableTop: (t => t ? t.getBoundingClientRect().top + window.scrollY : null)(document.querySelector("main table, article table")),
  screen: window.innerHeight,
};
"""


RESULTS_FIRST = ("nbs/00_index", "nbs/09_results")  # pages whose results table must start in the first screen


def severe_logs(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]




@pytest.mark.parametrize("page", toc_pages())
def test_book_page_in_chromium(browser, page, settings):
    path = BOOK / f"{page}.html"
    if not path.exists():
        pytest.fail(f"{page} is in _toc.yml but {path} was not built")
    severe_logs(browser)  # drop what earlier pages left
    browser.get(path.as_uri())
    state = browser.execute_async_script(WAIT_FOR_MATHJAX)
    found = browser.execute_script(INSPECT)
    if found["maths"]:
        assert state == "typeset", f"MathJax did not typeset {page}: {state}"
    assert found["untypeset"] == [], f"maths left as text on {page}"
    assert found["errors"] == [], f"MathJax errors on {page}"
    assert found["raw"] == [], f"raw TeX left in the text of {page}: {found['raw']}"
    assert found["rawtex"] == [], f"maths left as raw $...$ TeX on {page}: {found['rawtex'][:5]}"
    assert found["unclosed"] == [], f"maths cut off, left as raw TeX after a $ on {page}: {found['unclosed'][:5]}"
    assert found["attributes"] == [], f"raw show_doc attribute text {{target=...}} on {page}"
    assert found["clipped"] == [], f"display maths wider than its box, with no scrollbar, on {page}: {found['clipped']}"
    broken = [image["src"] for image in found["images"] if not image["ok"]]
    assert broken == [], f"images that did not load on {page}"
    colab = colab_url(page, settings)
    assert colab in found["colab"], f"no Colab link to {colab} on {page}: {found['colab']}"
    assert severe_logs(browser) == [], f"JavaScript errors on {page}"
    assert found["logs"] == [], f"PyTorch profiler log lines printed into the outputs of {page}: {found['logs'][:2]}"
    assert found["progress"] == [], f"progress bars printed into the outputs of {page}: {found['progress'][:3]}"
    if page in RESULTS_FIRST:  # issue 33: a reader states the results from the first screen
        assert found["tableTop"] is not None and found["tableTop"] < found["screen"], (
            f"the results table of {page} starts at {found['tableTop']} px, below the first screen ({found['screen']} px)")
