"""A small Sphinx extension for the book (loaded through _config.yml `sphinx.local_extensions`).

Jupyter Book 1 registers sphinx-thebe's inline configuration script twice on some builds, so every page
declared `const THEBE_JS_URL` twice ("Identifier 'THEBE_JS_URL' has already been declared", a JavaScript
error that tests/test_pkg_browser.py catches). This extension keeps one copy of every script on a page.
It adds the book's style sheet (book_static/hkt_book.css: tables that fit the page), and gives the theme an explicit colour mode (`auto`): without one, pydata-sphinx-theme logs the error
"Got invalid theme mode" on a reader's first visit.
"""
from pathlib import Path


def script_key(script) -> tuple:
    "What makes two scripts the same: file (None and '' both mean an inline script) and attributes (body)."
    attributes = getattr(script, "attributes", {}) or {}
    filename = getattr(script, "filename", script) or ""
    return str(filename), tuple(sorted((name, str(value)) for name, value in attributes.items()))


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    if not context.get("default_mode"):
        context["default_mode"] = "auto"
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


STATIC = Path(__file__).resolve().parent / "book_static"


def add_static_path(app):
    app.config.html_static_path = [*app.config.html_static_path, str(STATIC)]


def setup(app):
    app.connect("builder-inited", add_static_path)
    app.add_css_file("hkt_book.css")
    # early (priority 100): Sphinx stops calling handlers after the first one that returns a template name
    app.connect("html-page-context", drop_duplicate_scripts, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
