"""docs/import-graph.svg is the drawing the code gives (docs/import_graph.py), and it has no arrow up."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS))
import import_graph  # noqa: E402


def test_no_package_imports_a_package_above_it() -> None:
    up = [
        (a, b) for (a, b) in import_graph.package_edges() if import_graph._layer(a) < import_graph._layer(b)
    ]
    assert not up


def test_the_committed_drawing_is_current() -> None:
    assert import_graph.OUT.read_text() == import_graph.render(), (
        "docs/import-graph.svg is stale: run `make import-graph`"
    )
