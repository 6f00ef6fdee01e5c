"""docs/architecture.md against the tree: every product module has its line, every wing of daemon/ is a map
of its modules, and the import graph keeps the house's shape (no loop, nothing back up, shallow wings).

What may import what is the page's table; tests/test_layout.py enforces it, this file the graph's shape."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from . import architecture_page
from .conftest import REPO
from .test_layout import _find_cycle, _import_graph, _imports_by_file, _modules, _package_of

PRODUCT = ("edged", "protocol", "models", "daemon", "quantize", "deploy", "cli")
# Modules the page names that this tree does not have yet, each with why. The test fails once one exists
# (then delete its line).
PENDING: dict[str, str] = {}
# The wings whose `__init__.py` is only their map (the others' `__init__` holds code and its own docstring:
# config/, decoders/ with its DECODERS table by type, delivery/spool/, lifecycle/ota/, backends/tensorrt/).
MAPS = ("backends", "capture", "capture/gstreamer", "scene", "delivery", "lifecycle", "host", "record", "cascade")
# Maps that lag their wing, each with what fixes it. The test fails when a new one lags, and when one listed
# here is fixed (then delete its line).
STALE_MAPS: dict[str, str] = {}
# The top-level modules of daemon/ a wing may read: inference.py holds `Result` and `ActiveModel`, which the
# scene, delivery and lifecycle wings pass on. Every other top-level module reads the wings, never the reverse.
WING_MAY_READ_UP = {"edged.daemon.inference"}
# Arrows between wings that close a loop of wings, each with what removes it. No other loop may appear, and
# the test fails when one listed here is gone (then delete its line).
WING_LOOPS: dict[tuple[str, str], str] = {
    ("config", "capture"): "config/cameras.py checks URIs by the source registry (capture/registry.py: schemes, "
    "forms, hosts) and reads capture/framebound.py's MAX_FRAME_PIXELS, while capture/ reads the camera config; "
    "no module loop (the registry names CameraConfig for types only); gone if the URI rules move into config/",
    ("config", "scene"): "config/cameras.py reads scene/zones.py's MAX_CAMERA_POINTS and polygon_problem (and "
    "scene/lines.py's line checks) while scene/ reads the zone and line config; gone when the checks live in config/",
}
# import floors inside one wing (its modules' longest chain of imports among themselves): capture/ has 6,
# the camera thread above its sources, the registry, the URI grammar and redaction
MAX_WING_FLOORS = 6
MAX_FOLDERS_BELOW_DAEMON = 2  # daemon/capture/gstreamer/
MAX_TOP_LEVEL = 11  # modules at daemon/'s top (app, inference, parts, the surfaces and their helpers)


def _tree() -> set[str]:
    return {
        str(py.relative_to(REPO))
        for part in PRODUCT
        for py in (REPO / part).rglob("*.py")
        if "__pycache__" not in py.parts
    }


def test_every_product_module_is_in_the_page() -> None:
    missing = sorted(_tree() - architecture_page.modules().keys())
    assert not missing, f"add a line for each to a module table of docs/architecture.md: {missing}"


def test_every_module_in_the_page_exists() -> None:
    page, tree = architecture_page.modules().keys(), _tree()
    gone = sorted(page - tree - PENDING.keys())
    assert not gone, f"docs/architecture.md names modules that do not exist (moved? removed?): {gone}"
    arrived = sorted(PENDING.keys() & tree)
    assert not arrived, f"these exist now, so delete them from PENDING: {arrived}"


def test_every_line_says_what_its_module_does() -> None:
    empty = [m for m, what in architecture_page.modules().items() if len(what) < 10 or "TODO" in what]
    assert not empty, empty


def test_the_page_reader_refuses_what_it_cannot_read() -> None:
    """The reader itself: an unreadable row is an error, not a rule dropped; escaped pipes stay in a cell."""
    table = "## What may import what\n\n| part | may import |\n|---|---|\n| every part | `edged.errors` |\n"
    assert architecture_page.import_rules(table + "| `edged.x` | nothing of ours |\n") == (
        ("edged.errors",),
        {"edged.x": ()},
    )
    for bad in ("| `edged.x` | whatever it likes |\n", "| deploy | `edged.models` |\n"):
        try:
            architecture_page.import_rules(table + bad)
        except ValueError as exc:
            assert "What may import what" in str(exc)
        else:
            raise AssertionError(f"read {bad!r}")
    assert architecture_page.modules("| `a/b.py` | `x y\\|z` does it |\n| `c.py` |  |\n") == {
        "a/b.py": "`x y|z` does it",
        "c.py": "",
    }


def _map(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""


def test_each_wing_map_names_its_modules() -> None:
    """A wing's `__init__.py` is its map: it names every module (`name.py`) and sub-wing (`name/`) in it."""
    lagging: dict[str, list[str]] = {}
    for wing in MAPS:
        folder = REPO / "daemon" / wing
        text = _map(folder)
        members = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        members += [f"{p.parent.name}/" for p in folder.glob("*/__init__.py")]
        if unnamed := sorted(m for m in members if m not in text):
            lagging[wing] = unnamed
        assert "TODO" not in text, f"daemon/{wing}/__init__.py: {text[:80]}"
    new = sorted(lagging.keys() - STALE_MAPS.keys())
    assert not new, {w: lagging[w] for w in new}
    fixed = sorted(STALE_MAPS.keys() - lagging.keys())
    assert not fixed, f"these maps are right now, so delete them from STALE_MAPS: {fixed}"


_all_modules = functools.cache(_modules)


def _wing(module: str) -> str | None:
    """The wing of daemon/ a module belongs to (`capture` for edged.daemon.capture.gstreamer.why), None for
    daemon/'s top-level modules and for modules outside daemon/."""
    parts = module.split(".")
    if parts[:2] != ["edged", "daemon"] or len(parts) < 3:
        return None
    return parts[2] if len(parts) > 3 or _all_modules()[module].name == "__init__.py" else None


def _every_import() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere (inside functions and TYPE_CHECKING too)."""
    modules = _all_modules()
    return {name: {m for m in _imports_by_file(py, _package_of(py)) if m in modules} for name, py in modules.items()}


def test_nothing_runs_back_up() -> None:
    """A wing never imports app.py, parts.py, the surfaces or their helpers: only inference.py's types."""
    top = {m for m in _all_modules() if m.startswith("edged.daemon.") and m.count(".") == 2 and _wing(m) is None}
    assert {"edged.daemon.app", "edged.daemon.inference", "edged.daemon.control"} <= top, sorted(top)
    up = sorted(
        (m, t) for m, targets in _every_import().items() if _wing(m) for t in targets if t in top - WING_MAY_READ_UP
    )
    assert not up, f"wings importing daemon/'s top level (module, target): {up}"
    _, rules = architecture_page.import_rules()
    allowed_up = {
        (part, m) for part, allowed in rules.items() if _wing(part) for m in allowed if m in top - WING_MAY_READ_UP
    }
    assert not allowed_up, f"docs/architecture.md lets a wing import daemon/'s top level: {sorted(allowed_up)}"


def _wing_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in _every_import().items():
        if (wing := _wing(module)) is not None:
            graph.setdefault(wing, set()).update(w for t in targets if (w := _wing(t)) not in (None, wing))
    return graph


def test_no_loop_between_wings() -> None:
    graph = _wing_graph()
    present = {(a, b) for a, targets in graph.items() for b in targets}
    for a, b in WING_LOOPS:
        graph[a].discard(b)
    cycle = _find_cycle({w: graph.get(w, set()) for w in graph})
    assert cycle is None, "a loop between wings: " + " -> ".join(cycle or [])
    gone = sorted(WING_LOOPS.keys() - present)
    assert not gone, f"these arrows are gone, so delete them from WING_LOOPS: {gone}"


def _with_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first: an arrow to each of them too
    (but not from a module to the packages it sits in, which Python has started importing already)."""
    out = {m: set(targets) for m, targets in graph.items()}
    for m, targets in graph.items():
        for t in targets:
            parts = t.split(".")
            out[m].update(
                p
                for i in range(1, len(parts))
                if (p := ".".join(parts[:i])) in graph and p != m and not m.startswith(p + ".")
            )
    return out


def test_a_loop_through_a_package_init_is_found() -> None:
    """The checker: x.a imports y.b; y/__init__ imports x.a: a loop, though no module names y itself."""
    graph = {"x": set(), "x.a": {"y.b"}, "y": {"x.a"}, "y.b": set()}
    assert _find_cycle(graph) is None
    assert _find_cycle(_with_parents(graph)) == ["x.a", "y", "x.a"]


def test_no_import_loop_through_a_package_init() -> None:
    """An import-time loop that runs through a package's `__init__` breaks whichever module of it is imported
    first (`from .uri import Plan` on a half-run module), though no two modules name each other."""
    cycle = _find_cycle(_with_parents(_import_graph()))
    assert cycle is None, "import loop through a package: " + " -> ".join(cycle or [])


def _floors(graph: dict[str, set[str]]) -> int:
    @functools.cache
    def floor(m: str) -> int:
        return 1 + max((floor(t) for t in graph[m]), default=0)

    return max((floor(m) for m in graph), default=0)


def test_the_floor_count() -> None:
    assert _floors({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == 3
    assert _floors({"a": set(), "b": set()}) == 1


def test_wings_are_shallow_and_the_top_is_small() -> None:
    graph = _import_graph()
    floors = {}
    for wing in {w for m in graph if (w := _wing(m))}:
        inner = {m for m in graph if _wing(m) == wing}
        floors[wing] = _floors({m: graph[m] & inner for m in inner})
    assert max(floors.values()) <= MAX_WING_FLOORS, floors
    below = {str(p.parent.relative_to(REPO)): len(p.relative_to(REPO / "daemon").parts) - 1
             for p in (REPO / "daemon").rglob("__init__.py")}  # fmt: skip
    deep = sorted(folder for folder, n in below.items() if n > MAX_FOLDERS_BELOW_DAEMON)
    assert not deep, f"wings nested deeper than {MAX_FOLDERS_BELOW_DAEMON} folders below daemon/: {deep}"
    top = sorted(p.name for p in (REPO / "daemon").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules at daemon/'s top: {top}; the rest goes into wings"
