"""Runs on object stores: a run path may be a URL of any filesystem fsspec handles (`s3://`,
`gs://`, `memory://`, ...); `file://` URLs and plain paths are local directories.

On an object store every part file and every run.json version is uploaded in one PUT of the
complete object, so an object appears whole or not at all (no rename needed). Credentials and
endpoint come from the filesystem's standard configuration (for S3: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, ...). Object stores have no OS file locks: one
writer per rank is then the caller's responsibility.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# what to install for a protocol fsspec knows but cannot load
INSTALL = {"s3": "pip install 'trustlens[s3]'", "s3a": "pip install 'trustlens[s3]'", "gs": "pip install gcsfs"}


# the client libraries of the object stores fsspec reaches, whose errors are not OSErrors
_CLIENTS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google.auth", "google.api_core", "adlfs", "azure.core")
_HINTS = {
    "NoCredentialsError": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for a "
    "server other than AWS",
}


def storage_error(err: BaseException) -> str | None:
    """One line for an error raised by an object store's client library (e.g. botocore's
    NoCredentialsError, which is not an OSError), with what to set when known; None for any
    other error."""
    module = type(err).__module__
    if not any(module == client or module.startswith(client + ".") for client in _CLIENTS):
        return None
    hint = _HINTS.get(type(err).__name__)
    return f"object store: {type(err).__name__}: {err}" + (f" ({hint})" if hint else "")


def is_url(path: str | os.PathLike) -> bool:
    """Whether `path` names an object-store location (a URL other than file://)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path: str | os.PathLike) -> Path:
    """A local path from a path or a file:// URL."""
    text = os.fspath(path)
    return Path(text.removeprefix("file://")).expanduser()


def write_local_atomic(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Make the local file `path` with `write(file)` so that readers only ever see a complete
    file: written under a hidden temporary name, fsynced, then renamed over `path`; on any error
    the temporary file is removed and the error raised."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Remote:
    """A location on an fsspec filesystem: `fs` and the path inside it (no protocol)."""

    fs: Any  # fsspec.AbstractFileSystem
    path: str  # e.g. "bucket/prefix/run"
    protocol: str  # e.g. "s3"

    @classmethod
    def of(cls, url: str) -> Remote:
        protocol = url.split("://", 1)[0]
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(url)
        except ImportError as err:
            hint = INSTALL.get(protocol, f"install the fsspec filesystem for {protocol!r}")
            raise ImportError(f"reading or writing {url!r} needs the {protocol!r} filesystem: {hint} ({err})") from err
        except ValueError as err:
            raise ValueError(f"no filesystem for {protocol!r} (in {url!r}): {err}") from err
        return cls(fs, path.rstrip("/"), protocol)

    def __truediv__(self, name: str) -> Remote:
        return Remote(self.fs, posixpath.join(self.path, name), self.protocol)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.path}"

    def __str__(self) -> str:
        return self.url

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path))

    def listdir(self) -> list[tuple[str, bool]]:
        """(name, is a folder) of every entry; [] when there is no such folder."""
        try:
            entries = self.fs.ls(self.path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return [(posixpath.basename(e["name"].rstrip("/")), e["type"] == "directory") for e in entries]

    def read_bytes(self) -> bytes:
        return bytes(self.fs.cat_file(self.path))

    def write_bytes(self, data: bytes) -> None:
        """Upload `data` as the whole object (one PUT)."""
        self.fs.pipe_file(self.path, data)

    def open(self, mode: str = "rb") -> Any:
        return self.fs.open(self.path, mode)

    def remove_tree(self) -> None:
        if self.fs.exists(self.path):
            self.fs.rm(self.path, recursive=True)
