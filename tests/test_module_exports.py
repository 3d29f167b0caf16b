"""`__all__` of every module of hkt_nb (issue 22, item 7): only public names that the module itself defines, and never a
method grown onto a class across cells (`add_to_class`), so `from hkt_nb.<module> import *` binds no `forward`."""
import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import hkt_nb

MODULES = ["hkt_nb"] + sorted(m.name for m in pkgutil.walk_packages(hkt_nb.__path__, "hkt_nb.")
                              if m.name != "hkt_nb._modidx")


def top_level_definitions(path: Path) -> set[str]:
    "Names a module's source binds at top level by def, class or assignment (not by import)."
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def attached_methods(module) -> set[int]:
    "ids of the functions, properties and classmethods that the module's classes hold."
    held = set()
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue
        for value in vars(cls).values():
            if not (inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod))):
                continue  # a plain value (a dataclass default such as 2) shares its id with equal constants
            held |= {id(value), id(getattr(value, "fget", None)), id(getattr(value, "__func__", None))}
    held.discard(id(None))
    return held


@pytest.mark.parametrize("name", MODULES)
def test_all_holds_only_public_names_the_module_defines(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", [])
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    is_package = Path(module.__file__).name == "__init__.py"
    defined = top_level_definitions(Path(module.__file__))
    methods = attached_methods(module)
    for public in exported:
        assert not public.startswith("_"), f"{name}.__all__ exports the private name {public!r}"
        assert hasattr(module, public), f"{name}.__all__ names {public!r}, which the module lacks"
        obj = getattr(module, public)
        assert id(obj) not in methods, f"{name}.__all__ exports {public!r}, a method attached to a class"
        assert "." not in getattr(obj, "__qualname__", public) or inspect.isclass(obj), \
            f"{name}.__all__ exports {public!r}, whose qualified name is {obj.__qualname__!r}"
        if is_package:  # a package re-exports what its own submodules define
            home = getattr(obj, "__module__", name) or name
            assert home == name or home.startswith(name + "."), f"{name}.__all__ re-exports {public!r} from {home}"
        else:
            assert public in defined, f"{name}.__all__ exports {public!r}, which the module imports instead of defining"


def test_star_imports_bind_no_method_names():
    namespace = {}
    exec("from hkt_nb.attention import *\nfrom hkt_nb.model import *", namespace)
    for method in ("forward", "scores", "lambdas", "gates", "from_mha", "attention_layers", "from_checkpoint",
                   "levels", "level_queries_keys", "causal_value_conv"):
        assert method not in namespace, method
    assert namespace["HierarchicalAttention"].forward.__qualname__ == "HierarchicalAttention.forward"


def test_every_module_compiles_without_invalid_escapes(repo_root):
    "Docstrings with TeX are raw strings: no `\\t` of `\\top` silently becomes a tab (SyntaxWarning in newer Pythons)."
    import warnings
    for path in sorted((repo_root / "hkt_nb").rglob("*.py")):
        with warnings.catch_warnings():
            warnings.simplefilter("error", SyntaxWarning)
            warnings.simplefilter("error", DeprecationWarning)
            compile(path.read_text(), str(path), "exec")


CONTROL = "\t\x08\x0c\x07\x0b\r"  # what "\top", "\beta", "\frac", "\alpha", "\vert", "\rho" become in a string that is not raw


@pytest.mark.parametrize("name", MODULES)
def test_no_docstring_holds_a_tex_command_eaten_by_an_escape(name):
    "A docstring with TeX (`$U_l S U_l^\\top$`) in a string that is not raw shows a tab where `\\t` was (issue 33)."
    path = Path(importlib.import_module(name).__file__)
    eaten = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False) or ""
            eaten += [f"{getattr(node, 'name', name)}: {doc[:60]!r}" for ch in CONTROL if ch in doc][:1]
    assert eaten == [], f"docstrings of {name} with an escape where TeX was meant (use a raw string): {eaten}"
