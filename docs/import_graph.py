"""The drawing of the library's layers and the imports between its packages: docs/import-graph.svg.

    python docs/import_graph.py          (make import-graph)

Reads the same import graph as basemodel_pipeline_tests/test_architecture.py (every import, lazy ones too,
read with `ast`) and draws one box per package at the height of its layer (LAYERS, bottom to top; the ground
floor's small modules as one box) and one arrow per pair of packages with imports between them, the thicker
the more module imports it stands for.
Every arrow points down or sideways within a layer; an upward one (a broken layer rule) would be drawn red.
The SVG is deterministic (no date, fixed ids), so test_architecture checks that the committed drawing is the
one the code gives.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from basemodel_pipeline_tests import test_architecture as arch  # noqa: E402

OUT = HERE / "import-graph.svg"


def package_edges() -> Counter[tuple[str, str]]:
    """(importer package, imported package) -> module imports between them ("" is the package root)."""
    edges: Counter[tuple[str, str]] = Counter()
    for module, targets in arch.graph().items():
        for target in targets:
            a, b = _package(module), _package(target)
            if a != b:
                edges[a, b] += 1
    return edges


GROUND = "ground floor"  # config, errors, workspace, ...: one box (every layer may use it)


def _package(module: str) -> str:
    top = module.split(".")[0]
    return GROUND if arch.layer_of(top) == 0 else top


def _layer(package: str) -> int:
    return 0 if package == GROUND else arch.layer_of(package)


def render() -> str:
    """The SVG text of the drawing."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "basemodel_pipeline"
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    edges = package_edges()
    packages = sorted({p for e in edges for p in e} | {_package(m) for m in arch.graph()})
    rows: dict[int, list[str]] = {}
    for p in packages:
        rows.setdefault(_layer(p), []).append(p)
    width = 4
    pos = {}
    for layer, members in rows.items():
        shift = 0.0 if len(members) > 1 or layer == 0 else (0.6 if layer % 2 else -0.6)  # a zig-zag
        for i, p in enumerate(sorted(members)):
            pos[p] = ((i + 0.5) * width / len(members) + shift, layer * 1.6)
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.6 * len(rows) * 1.6))
    for (a, b), n in sorted(edges.items()):
        (xa, ya), (xb, yb) = pos[a], pos[b]
        up = _layer(a) < _layer(b)
        ax.annotate(
            "",
            xy=(xb, yb + 0.25),
            xytext=(xa, ya - 0.25),
            arrowprops={
                "arrowstyle": "-|>",
                "color": "#d62728" if up else "#9aa5b1",
                "lw": 0.4 + 0.25 * min(n, 12) ** 0.5,
                "connectionstyle": "arc3,rad=0.12",
                "shrinkA": 2,
                "shrinkB": 2,
            },
        )
    ground = sorted(m or "(root)" for m in arch.LAYERS[0][1])
    for p, (x, y) in pos.items():
        label = p if p != GROUND else "ground floor: " + ", ".join(ground[:9]) + ",\n" + ", ".join(ground[9:])
        ax.text(x, y, label, ha="center", va="center", fontsize=9 if p != GROUND else 7,
                bbox={"boxstyle": "round,pad=0.35", "fc": "#eef3f8", "ec": "#4a6fa5", "lw": 0.8})  # fmt: skip
    for layer in rows:
        ax.text(-0.35, layer * 1.6, arch.LAYERS[layer][0], ha="right", va="center", fontsize=8, color="#555")
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(-0.8, (len(arch.LAYERS) - 1) * 1.6 + 0.8)
    ax.axis("off")
    ax.set_title("basemodel_pipeline: layers (bottom to top) and imports between packages", fontsize=10)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def main() -> None:
    OUT.write_text(render())
    up = [f"{a} -> {b}" for (a, b) in package_edges() if _layer(a) < _layer(b)]
    print(f"wrote {OUT}" + (f"; upward imports: {', '.join(up)}" if up else "; no import points up"))


if __name__ == "__main__":
    main()
