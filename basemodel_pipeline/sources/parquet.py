"""Parquet sources: local files, directories and globs, and s3:// objects.

Local Parquet is read by DuckDB. s3:// is read by DuckDB's httpfs extension, installed with no internet
from the duckdb-extension-httpfs wheel into a project-owned extension directory
(<workspace>/.duckdb/extensions), or, without the extension, through pyarrow's S3 filesystem (a
pyarrow dataset that DuckDB scans). Credentials and endpoint come from data_location.s3 or the AWS_*
environment variables. With cache_path, s3:// files are copied into a local directory once and only new or
changed files are copied again.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import ParquetLocation, S3Options
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.retry import connection_failure, host_port, mentions, secret_values
from basemodel_pipeline.settings import setting
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import quote_ident, quote_literal

__all__ = ["ParquetBackend", "parquet_glob", "quote_ident", "quote_literal", "read_parquet_sql"]

DATASET_VIEW = "__basemodel_source"
BATCH_ROWS = 1 << 17


def is_local(src: DataSource) -> bool:
    """A Parquet source on a local (or mounted) path, read by DuckDB in place: not s3:// nor a warehouse."""
    loc = src.data_location
    return loc.database_type == "parquet" and "://" not in loc.path


def parquet_glob(path: str) -> str:
    """A directory becomes ``<dir>/**/*.parquet``; files, globs and URLs ending in .parquet stay as they are."""
    if "://" not in path and os.path.isdir(path):
        return path.rstrip("/") + "/**/*.parquet"
    if path.startswith("s3://") and path.endswith("/"):
        return path + "**/*.parquet"
    return path


def read_parquet_sql(path: str, **options: bool) -> str:
    """Safely quoted ``read_parquet('<path>', union_by_name=true)`` (plus extra boolean options)."""
    opts = "".join(f", {k}={'true' if v else 'false'}" for k, v in {"union_by_name": True, **options}.items())
    return f"read_parquet({quote_literal(parquet_glob(path))}{opts})"


def check_path(src: DataSource, index: int | None = None) -> None:
    path = src.data_location.path
    if "://" not in path and not glob.glob(parquet_glob(path), recursive=True):
        where = f"data_sources[{index}].data_location.path" if index is not None else f"source '{src.name}'"
        raise DataError(
            f"{where}: no Parquet file matches '{path}' (check the path; relative paths are "
            "relative to the config file)"
        )


def s3_settings(opts: S3Options) -> dict[str, Any]:
    """S3 options with the AWS_* environment as defaults. Holds secrets: never log it."""
    env = os.environ.get
    endpoint = opts.endpoint or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL")
    use_ssl = opts.use_ssl
    if endpoint and "://" in endpoint:
        use_ssl = endpoint.startswith("https://")
        endpoint = endpoint.split("://", 1)[1]
    return {
        "endpoint": endpoint,
        "region": opts.region or env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1",
        "key_id": opts.access_key_id or env("AWS_ACCESS_KEY_ID"),
        "secret": opts.secret_access_key or env("AWS_SECRET_ACCESS_KEY"),
        "session_token": opts.session_token or env("AWS_SESSION_TOKEN"),
        "use_ssl": use_ssl,
        "url_style": opts.url_style if not endpoint or opts.url_style != "vhost" else "path",
    }


def extension_dir(workspace: Path) -> Path:
    return Path(setting("BASEMODEL_DUCKDB_EXTENSIONS") or workspace / ".duckdb" / "extensions")


def httpfs_wheel_file() -> Path | None:
    """httpfs.duckdb_extension shipped by the duckdb-extension-httpfs wheel for this DuckDB version."""
    try:
        import duckdb_extension_httpfs  # type: ignore[import-not-found]
    except ImportError:
        return None
    base = Path(duckdb_extension_httpfs.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    file = base / "httpfs.duckdb_extension"
    return file if file.is_file() else None


def load_httpfs(con: duckdb.DuckDBPyConnection, workspace: Path) -> None:
    """Install httpfs from the wheel into the project's extension directory (offline) and load it."""
    directory = extension_dir(workspace)
    directory.mkdir(parents=True, exist_ok=True)
    con.execute(f"SET extension_directory = {quote_literal(str(directory))}")
    con.execute("SET autoinstall_known_extensions = false")
    try:
        con.execute("LOAD httpfs")
        return
    except duckdb.Error:
        pass
    wheel = httpfs_wheel_file()
    if wheel is None:
        raise DataError(
            "DuckDB's httpfs extension is not installed and the duckdb-extension-httpfs wheel is missing; "
            "pip install duckdb-extension-httpfs==" + duckdb.__version__ + " or set engine: pyarrow"
        )
    con.execute(f"INSTALL {quote_literal(str(wheel))}")
    con.execute("LOAD httpfs")


def create_s3_secret(con: duckdb.DuckDBPyConnection, s3: dict[str, Any]) -> None:
    parts = [
        "TYPE s3",
        f"REGION {quote_literal(s3['region'])}",
        f"URL_STYLE {quote_literal(s3['url_style'])}",
    ]
    parts.append(f"USE_SSL {'true' if s3['use_ssl'] else 'false'}")
    if s3["endpoint"]:
        parts.append(f"ENDPOINT {quote_literal(s3['endpoint'])}")
    if s3["key_id"]:
        parts.append(f"KEY_ID {quote_literal(s3['key_id'])}")
        parts.append(f"SECRET {quote_literal(s3['secret'] or '')}")
    else:
        parts.append("PROVIDER credential_chain")
    if s3["session_token"]:
        parts.append(f"SESSION_TOKEN {quote_literal(s3['session_token'])}")
    con.execute(f"CREATE OR REPLACE SECRET basemodel_s3 ({', '.join(parts)})")


def s3_filesystem(s3: dict[str, Any]) -> Any:
    from pyarrow import fs

    return fs.S3FileSystem(
        access_key=s3["key_id"],
        secret_key=s3["secret"],
        session_token=s3["session_token"],
        region=s3["region"],
        endpoint_override=s3["endpoint"],
        scheme="https" if s3["use_ssl"] else "http",
        force_virtual_addressing=s3["url_style"] == "vhost" and bool(s3["endpoint"]),
        connect_timeout=10,
        request_timeout=60,
    )


def s3_files(filesystem: Any, url: str) -> list[Any]:
    """FileInfo of every Parquet object that an s3:// file, prefix or glob names."""
    from pyarrow import fs

    path = url.removeprefix("s3://")
    pattern = None
    if any(ch in path for ch in "*?["):
        base = path[: min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        pattern = path
    else:
        base = path.rstrip("/")
    info = filesystem.get_file_info(base)
    if info.type == fs.FileType.File:
        return [info]
    selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
    infos = [i for i in filesystem.get_file_info(selector) if i.type == fs.FileType.File]
    if pattern is not None:
        return [i for i in infos if fnmatch.fnmatch(i.path, pattern)]
    return [i for i in infos if i.path.endswith(".parquet")]


class ParquetBackend(Backend):
    dialect = "duckdb"

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: ParquetLocation = src.data_location  # type: ignore[assignment]
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        self.engine = "local"
        self.path = self.location.path
        if self.path.startswith("s3://"):
            self._open_s3()
        elif "://" in self.path:
            raise DataError(f"source '{src.name}': unsupported URL {self.path!r}; use a local path or s3://")
        else:
            check_path(src)

    def _open_s3(self) -> None:
        s3 = s3_settings(self.location.s3)
        if self.location.cache_path:
            self.path = self._sync_cache(s3)
            return
        engine = self.location.engine
        if engine in ("auto", "duckdb"):
            try:
                load_httpfs(self.con, self.workspace)
                create_s3_secret(self.con, s3)
                self.engine = "duckdb-httpfs"
                return
            except (duckdb.Error, DataError):
                if engine == "duckdb":
                    raise
        self._register_dataset(s3)

    def _register_dataset(self, s3: dict[str, Any]) -> None:
        import pyarrow.dataset as ds

        filesystem = s3_filesystem(s3)
        files = s3_files(filesystem, self.path)
        if not files:
            raise DataError(
                f"source '{self.src.name}': no Parquet object matches {self.path!r}; check the path"
            )
        dataset = ds.dataset([f.path for f in files], filesystem=filesystem, format="parquet")
        self.con.register(DATASET_VIEW, dataset)
        self.engine = "pyarrow-s3"

    def _sync_cache(self, s3: dict[str, Any]) -> str:
        """Copy new or changed s3:// objects into cache_path (atomically); return the local directory."""
        assert self.location.cache_path
        filesystem = s3_filesystem(s3)
        root = Path(self.location.cache_path)
        files = s3_files(filesystem, self.path)
        if not files:
            raise DataError(
                f"source '{self.src.name}': no Parquet object matches {self.path!r}; check the path"
            )
        for info in files:
            target = root / info.path
            if target.is_file() and target.stat().st_size == info.size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            with filesystem.open_input_stream(info.path) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(tmp, target)
        self.engine = "local-cache"
        keep = {str(root / f.path) for f in files}
        local = [p for p in glob.glob(str(root / "**" / "*.parquet"), recursive=True) if p in keep]
        self._local_files = sorted(local)
        return str(root)

    def table(self) -> exp.Expression:
        if self.engine == "pyarrow-s3":
            return exp.to_table(DATASET_VIEW, quoted=True)
        files = getattr(self, "_local_files", None)
        target = (
            "[" + ", ".join(quote_literal(f) for f in files) + "]"
            if files
            else quote_literal(parquet_glob(self.path))
        )
        select = sqlglot.parse_one(f"SELECT * FROM read_parquet({target}, union_by_name=true)", read="duckdb")
        return select.find(exp.From).this

    def execute(self, sql: str) -> pa.RecordBatchReader:
        return self.con.execute(sql).fetch_record_batch(BATCH_ROWS)

    @classmethod
    def endpoint(cls, location: ParquetLocation) -> str | None:
        if not location.path.startswith("s3://"):
            return None
        s3 = s3_settings(location.s3)
        if s3["endpoint"]:
            return host_port(s3["endpoint"], 443 if s3["use_ssl"] else 80)
        return f"s3.{s3['region']}.amazonaws.com:443"

    @classmethod
    def secrets(cls, location: ParquetLocation) -> list[str]:
        s3 = s3_settings(location.s3)  # the AWS_* environment included
        return [*secret_values(location), *(v for v in (s3["secret"], s3["session_token"]) if v)]

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        text = str(exc)
        # DuckDB's "Could not connect to server", pyarrow's curl errors: retried, though they say HTTP
        if connection_failure(exc) is not None:
            return True
        if "No files found that match the pattern" in text:  # a missing path or prefix: retrying cannot help
            return False
        if isinstance(exc, duckdb.HTTPException) or "HTTP" in text:
            return mentions(text, ("500", "502", "503", "504", "429", "timeout", "timed out"))
        return super().is_transient(exc)

    def close(self) -> None:
        self.con.close()
