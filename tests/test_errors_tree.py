"""One exception file in fact: every public exception class of edged is defined in edged/errors.py, and the
tree drawn in its docstring names each one under its real base (STYLE "Errors", issue 28)."""

from __future__ import annotations

import ast
import builtins
import pickle
import re
from pathlib import Path

import pytest

import edged.errors as errors
from edged.errors import Code, EdgedError

from .conftest import REPO

PRODUCT = ("daemon", "models", "quantize", "deploy", "protocol", "cli", "edged")
# a base that makes a class an exception without being one of ours: a builtin (RuntimeError) or a third
# party's, spelled dotted (yaml.YAMLError, sqlite3.Error)
_BUILTIN = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
_FOREIGN = re.compile(r"\.\w*(Error|Exception|Warning)$")
# a line of the drawn tree: its indent (4 spaces and 4 per level), the box drawing, the class name
_TREE_LINE = re.compile(r"^    ((?:[│ ]   )*)(?:[├└]── )?(\w+)\b")
# Classes errors.py defines whose old module still defines its own copy, each with what removes it. The test
# fails when a new one appears and when one listed here is gone (then delete its line).
PENDING: dict[str, str] = {}


def _classes(py: Path) -> list[tuple[str, list[str]]]:
    """(name, its bases as written) of every class defined in a file, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(py.read_text(encoding="utf-8"), str(py))):
        if isinstance(node, ast.ClassDef):
            found.append((node.name, [ast.unparse(b) for b in node.bases]))
    return found


def exception_classes(root: Path = REPO) -> dict[str, list[Path]]:
    """Every exception class defined in the product's folders -> the files that define one of that name.
    A class is one when a base is a builtin exception, a third party's (dotted, ``…Error``), or a class
    already found to be one (to a fixpoint, so a subclass of a subclass defined elsewhere counts too)."""
    defined = [
        (py, name, bases)
        for part in PRODUCT
        for py in sorted((root / part).rglob("*.py"))
        for name, bases in _classes(py)
    ]
    known = set(_BUILTIN)
    grew = True
    while grew:
        grew = False
        for _, name, bases in defined:
            if name not in known and any(b.split(".")[-1] in known or _FOREIGN.search(b) for b in bases):
                known.add(name)
                grew = True
    found: dict[str, list[Path]] = {}
    for py, name, _ in defined:
        if name in known and name not in _BUILTIN:
            found.setdefault(name, []).append(py.relative_to(root))
    return found


def drawn_tree(doc: str) -> dict[str, str]:
    """The tree drawn in errors.py's docstring: class -> the class (or builtin) it is drawn under."""
    parents: dict[str, str] = {}
    stack: list[str] = []
    for line in doc.splitlines():
        m = _TREE_LINE.match(line)
        if not m or not (line[4:5].isalpha() or "── " in line):
            continue
        depth = len(m.group(1)) // 4 + ("── " in line)
        name = m.group(2)
        del stack[depth:]
        if stack:
            parents[name] = stack[-1]
        stack.append(name)
    return parents


def test_every_public_exception_class_lives_in_errors_py() -> None:
    elsewhere = {
        name: [str(p) for p in files if p != Path("edged/errors.py")]
        for name, files in exception_classes().items()
        if not name.startswith("_")
    }
    elsewhere = {name: files for name, files in elsewhere.items() if files}
    for name, why in PENDING.items():
        assert elsewhere.pop(name, None) == [why.split(":")[0]], f"PENDING[{name!r}] is done: delete its line"
    assert not elsewhere, f"define these in edged/errors.py (and import them where they were): {elsewhere}"


def test_the_drawn_tree_names_every_class_under_its_real_base() -> None:
    ours = {n: c for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, BaseException)}
    ours = {n: c for n, c in ours.items() if c.__module__ == errors.__name__}
    drawn = drawn_tree(errors.__doc__ or "")
    assert set(drawn) - {"EdgedError"} <= set(ours), f"drawn but not defined: {set(drawn) - set(ours)}"
    missing = set(ours) - set(drawn) - {"EdgedError"}
    assert not missing, f"missing from the tree in errors.py's docstring: {sorted(missing)}"
    for name, cls in ours.items():
        if name == "EdgedError":
            assert name not in drawn, "EdgedError is the root of the tree"
            continue
        assert drawn[name] == cls.__bases__[0].__name__, f"{name} is drawn under {drawn[name]}"


def test_the_checks_see_a_class_added_elsewhere_and_one_left_out_of_the_tree(tmp_path: Path) -> None:
    """The two tests above are not vacuous: a stray subclass two steps down and an undrawn class are found."""
    for part in PRODUCT:
        (tmp_path / part).mkdir()
    (tmp_path / "daemon" / "a.py").write_text("class LocalError(ValueError): ...\nclass _Private(LocalError): ...\n")
    (tmp_path / "models" / "b.py").write_text("from edged.errors import SwapError\nclass Stray(SwapError): ...\n")
    (tmp_path / "deploy" / "c.py").write_text("import yaml\nclass Dup(yaml.YAMLError): ...\nclass Plain: ...\n")
    (tmp_path / "edged" / "errors.py").write_text("class SwapError(Exception): ...\n")
    (tmp_path / "cli" / "d.py").write_text("from models.b import Stray\nclass Deeper(Stray): ...\n")
    found = exception_classes(tmp_path)
    assert sorted(found) == ["Deeper", "Dup", "LocalError", "Stray", "SwapError", "_Private"]
    doc = (errors.__doc__ or "").replace("    └── RolloutError", "    └── Rollout")
    assert "RolloutError" not in drawn_tree(doc)
    assert drawn_tree(errors.__doc__ or "")["SpoolCorrupt"] == "SpoolError"


@pytest.mark.parametrize(
    "name, code",
    [
        ("SpoolError", Code.SPOOL_FAILED),
        ("SpoolCorrupt", Code.SPOOL_CORRUPT),
        ("IncompatibleEngine", Code.INCOMPATIBLE),
        ("CertError", Code.CERTS_FAILED),
        ("BundleError", Code.BUNDLE_FAILED),
        ("RolloutError", Code.ERROR),
    ],
)
def test_a_moved_error_keeps_its_code_str_and_pickle(name: str, code: Code) -> None:
    cls = getattr(errors, name)
    err = cls("it broke")
    assert isinstance(err, EdgedError) and err.code is code and str(err) == "it broke"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == "it broke" and back.code is code
    other = pickle.loads(pickle.dumps(cls("x", code=Code.NO_SPACE)))
    assert other.code is Code.NO_SPACE


def test_the_moved_errors_stay_importable_where_they_were() -> None:
    from edged.daemon.backends.tensorrt import cuda as cuda_api
    from edged.daemon.delivery import spool
    from edged.daemon.delivery.spool import file as spool_file
    from edged.deploy import bundle, certs, rollout
    from edged.deploy.rollout import state as rollout_state
    from edged.models import compat

    assert spool.SpoolError is spool_file.SpoolError is errors.SpoolError
    assert spool.SpoolCorrupt is spool_file.SpoolCorrupt is errors.SpoolCorrupt
    assert compat.IncompatibleEngine is errors.IncompatibleEngine
    assert certs.CertError is errors.CertError and bundle.BundleError is errors.BundleError
    assert rollout_state.RolloutError is rollout.RolloutError is errors.RolloutError
    assert cuda_api.CudaError is errors.CudaError


def test_cuda_error_stays_outside_edged_error() -> None:
    """The TensorRT backend passes an EdgedError on as it is and translates anything else (a CudaError among
    them) into an EngineLoadError with its reason: a CudaError that were an EdgedError would skip that."""
    err = errors.CudaError("cuMemAlloc failed: out of memory")
    assert isinstance(err, RuntimeError) and not isinstance(err, EdgedError)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)
