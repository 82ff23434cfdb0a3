"""Load a YAML config: ${ENV_VAR} interpolation, pydantic validation, errors naming the YAML path and line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from basemodel_pipeline.config.base import MAX_NAME_CHARS
from basemodel_pipeline.config.models import PipelineConfig
from basemodel_pipeline.errors import ConfigError

ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _shown(value: object, limit: int = 60) -> str:
    """A value for a one-line message: its text, cut to `limit` characters (a 1 MB value is not echoed)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text):,} characters)"


def yaml_path(loc: tuple[Any, ...]) -> str:
    """('data_sources', 0, 'date_column') -> 'data_sources[0].date_column'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{_shown(part)}" if out else _shown(part))
    return out or "<root>"


def _interpolate(node: Any, loc: tuple[Any, ...], file: Path) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, (*loc, k), file) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, (*loc, i), file) for i, v in enumerate(node)]
    if isinstance(node, str):

        def repl(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                raise ConfigError(
                    f"{file}: {yaml_path(loc)}: environment variable {m.group(1)} is not set "
                    f"(export it, or write ${{{m.group(1)}:-default}})"
                )
            return value

        return ENV_PATTERN.sub(repl, node)
    return node


def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node along `loc` (pydantic locations include union tags: skipped)."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if k.value == part), None)
            if nxt is None:
                key = next((k for k, _ in node.value if k.value == part), None)
                return key.start_mark.line + 1 if key is not None else line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
    return node.start_mark.line + 1 if node is not None else line


DISCRIMINATORS = ("kind", "database_type")  # the fields that pick a member of a tagged union


def _clean_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """The YAML path of a pydantic location: walked along the config as written, so the parts pydantic adds
    are dropped (a union member's tag such as 'regression', where it equals the node's `kind` or
    `database_type`; validator and type names such as 'function-after[...]' or 'int' under a scalar), and
    real keys (a typo, a missing field) are kept."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            if part in node:
                out.append(part)
                node = node[part]
            elif isinstance(part, str) and ("[" in part or any(node.get(d) == part for d in DISCRIMINATORS)):
                continue  # a union tag or a validator name
            else:
                out.append(part)  # a key that is not there (a missing field)
                node = None
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(part, str) and (node is not None or "[" in part):
            continue  # a type or validator name under a scalar
        else:
            out.append(part)
    return tuple(out)


LEADING_PATH = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*): (.*)$", re.S)


def _split_leading_path(msg: str) -> tuple[tuple[Any, ...], str] | None:
    """Whole-config validators report 'scenarios[0].target.source: ...'; turn that prefix into a location."""
    m = LEADING_PATH.match(msg)
    if m is None:
        return None
    loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[A-Za-z_]\w*|\d+", m.group(1)))
    return loc, m.group(2)


def format_validation_error(err: ValidationError, file: Path, root: yaml.Node | None, data: Any) -> str:
    lines = []
    for e in err.errors():
        loc = _clean_loc(e["loc"], data)
        msg = e["msg"].removeprefix("Value error, ")
        if not loc and (split := _split_leading_path(msg)):
            loc, msg = split
        if e["type"] == "extra_forbidden":
            msg = f"unknown key '{_shown(loc[-1])}' (check spelling; see the README's config reference)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "string_too_long":
            limit = e["ctx"]["max_length"]
            what = "a name" if limit == MAX_NAME_CHARS else "a value"
            msg = f"{len(e['input']):,} characters; {what} may have at most {limit:,} here: shorten it"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(e["input"], dict | list):
            msg = f"{msg} (got {_shown(repr(e['input']))})"
        line = _line_of(root, loc)
        where = f"{file}:{line}" if line else str(file)
        lines.append(f"{where}: {yaml_path(loc)}: {msg}")
    return "; ".join(lines)


MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; a larger file is refused before it is read
MAX_DEPTH = 32  # levels of nested mappings and lists (a config needs about 6)
MAX_VALUES = 20_000  # values written in the file (a config with 100 sources and scenarios has a few thousand)
ALIAS_BUDGET = 10_000  # values that YAML aliases may add to a config (beyond those written out)
MERGE_TAG = "tag:yaml.org,2002:merge"


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds checked while composing, before anything is built from the nodes:
    nesting depth (PyYAML composes recursively: 3,000 nested lists were a RecursionError), the number of
    values (half a megabyte of `[1,1,...]` takes seconds) and duplicate keys in a mapping (YAML keeps the last
    one without a word)."""

    def __init__(self, text: str, file: Path) -> None:
        super().__init__(text)
        self.file, self.depth, self.values = file, 0, 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):  # an alias adds no value as written (check_alias_expansion)
            return super().compose_node(parent, index)
        line = self.peek_event().start_mark.line + 1
        self.values += 1
        if self.values > MAX_VALUES:
            raise ConfigError(
                f"{self.file}:{line}: the config holds more than {MAX_VALUES:,} values; a pipeline config "
                "needs a few thousand at most: check that this is the right file"
            )
        if self.depth >= MAX_DEPTH and self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            raise ConfigError(
                f"{self.file}:{line}: mappings and lists are nested more than {MAX_DEPTH} levels deep here; "
                "a pipeline config needs fewer than 10: remove the extra nesting"
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
                continue
            line = key.start_mark.line + 1
            if (key.tag, key.value) in first:
                raise ConfigError(
                    f"{self.file}:{line}: key '{_shown(key.value)}' is given twice in one mapping (first on "
                    f"line {first[key.tag, key.value]}); YAML would silently keep only the last value: "
                    "remove one of them"
                )
            first[key.tag, key.value] = line
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _distinct_nodes(root: yaml.Node) -> int:
    """Number of nodes as written (an aliased node counts once)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def check_alias_expansion(root: yaml.Node, file: Path) -> None:
    """ConfigError when aliases make the config refer to itself or expand it by more than ALIAS_BUDGET
    values (a "billion laughs" bomb), before anything expands it."""
    limit = _distinct_nodes(root) + ALIAS_BUDGET
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in active:
            raise ConfigError(
                f"{file}:{node.start_mark.line + 1}: a YAML alias refers to the value containing it "
                "(a recursive anchor); write the value out instead"
            )
        active.add(id(node))
        total = 1
        for child in _children(node):
            total += size(child)
            if total > limit:
                raise ConfigError(
                    f"{file}: YAML aliases expand the config by more than {ALIAS_BUDGET:,} values "
                    "(an alias bomb?); write the repeated parts out or nest fewer aliases"
                )
        active.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root)


def _parse_yaml(text: str, file: Path) -> tuple[yaml.Node | None, Any]:
    """(node tree for line numbers, plain data) of a YAML document within the bounds of BoundedLoader whose
    aliases stay within budget."""
    loader = BoundedLoader(text, file)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        check_alias_expansion(root, file)
        return root, loader.construct_document(root)
    finally:
        loader.dispose()


def parse_config(text: str, file: Path, base_dir: Path | None = None) -> PipelineConfig:
    if len(text) > MAX_CONFIG_BYTES:
        _too_large(file, len(text.encode()))
    try:
        root, raw = _parse_yaml(text, file)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark else str(file)
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: the config must be a YAML mapping with data_sources, data_params, ...")
    raw = _interpolate(raw, (), file)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, file, root, raw)) from None
    return resolve_paths(cfg, base_dir or file.parent)


def resolve_paths(cfg: PipelineConfig, base_dir: Path) -> PipelineConfig:
    """Make the workspace and local data paths absolute, relative to the config file's directory."""

    def absolute(p: str) -> str:
        if "://" in p or os.path.isabs(p):
            return p
        return str((base_dir / p).resolve())

    sources = [
        s.model_copy(update={"data_location": s.data_location.resolved(absolute)}) for s in cfg.data_sources
    ]
    if any(sc.target.kind == "python" for sc in cfg.scenarios):
        # Python targets ("module:function") may live next to the config: importable from any directory
        here = str(base_dir.resolve())
        if here not in sys.path:
            sys.path.append(here)
    resolved = cfg.model_copy(update={"workspace": absolute(cfg.workspace), "data_sources": sources})
    resolved._config_dir = str(base_dir.resolve())
    return resolved


def _too_large(file: Path, size: int) -> NoReturn:
    raise ConfigError(
        f"{file}: the config is {size:,} bytes; a config may be at most {MAX_CONFIG_BYTES:,} bytes (a pipeline "
        "config is a few KB): check that this is the right file"
    )


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    file = Path(path)
    if file.is_dir():
        found = sorted(p.name for p in file.glob("*.y*ml"))[:5]
        raise ConfigError(
            f"{file} is a directory: pass the path of the YAML config file in it"
            + (f" ({', '.join(found)})" if found else " (it holds no .yaml file)")
        )
    if not file.is_file():
        raise ConfigError(f"{file}: config file not found (pass the path to your YAML config)")
    with file.open("rb") as fh:  # read no more than the limit allows
        data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            _too_large(file, os.fstat(fh.fileno()).st_size)
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{file}: the config is not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    return parse_config(text, file.resolve())


def portable_path(path: str, roots: dict[str, str]) -> str:
    """A local absolute path as '<root name>/relative/path' when it lies inside one of `roots` (first match
    wins), else unchanged; URLs (s3://...) and relative paths are returned as they are."""
    if "://" in path or not os.path.isabs(path):
        return path
    p = PurePosixPath(os.path.normpath(path))
    for name, root in roots.items():
        if p.is_relative_to(root):
            return f"<{name}>/{p.relative_to(root)}"
    return path


def data_fingerprint(cfg: PipelineConfig) -> str:
    """Hash of the data part of the config: a changed source definition gets a new cache directory.

    Local paths inside the workspace or the config file's directory are hashed relative to it, so a workspace
    copied or re-mounted elsewhere (with its config and data) keeps its cache; other paths, s3:// URLs and
    warehouse tables are hashed as written."""
    roots = {"workspace": os.path.normpath(cfg.workspace)}
    if cfg.config_dir:
        roots["config"] = os.path.normpath(cfg.config_dir)
    sources = []
    for src in cfg.data_sources:
        dumped = src.model_dump(mode="json")
        location = dumped["data_location"]
        for key in ("path", "cache_path"):
            if isinstance(location.get(key), str):
                location[key] = portable_path(location[key], roots)
        sources.append(dumped)
    payload = {
        "data_sources": sources,
        "data_start_date": cfg.data_params.data_start_date.isoformat(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
