"""Raw shards from a URL: object storage (``s3://``, ``gs://``), ``hdfs://``, or anything fsspec resolves.

`raw_source` turns the raw directory given to ingest into a `RawSource` (a local path stays a `Path`);
its files are `RemotePath` values, which the readers in `raw` open through the filesystem (Arrow's own
for s3, gs and hdfs; fsspec's, wrapped for Arrow, for every other scheme). A `RemotePath` is small and
picklable: the Dask tasks that read a shard open it themselves, on the worker, so the client never
holds the bytes. The filesystem is made once per process (`RawSource.filesystem`).

Credentials come from where the filesystem looks (the environment, ``~/.aws``, the instance's role,
``GOOGLE_APPLICATION_CREDENTIALS``, ...) and from `storage_options`, fsspec's (as Dask's
``read_parquet`` takes them): for s3 ``key``, ``secret``, ``token``, ``endpoint_url`` (also under
``client_kwargs``), ``region``, ``anon``; the rest go to the filesystem as they are. Every fault of
reaching the data (no such bucket or object, no credentials, an endpoint that does not answer) is one
`InputError` naming the URL; a request the filesystem refuses also says where the credentials come from and
that ``storage_options`` (``--storage-options``) gives them, and whether none were found.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, cast
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import ConfigError, InputError

__all__ = ["ARROW_SCHEMES", "RawSource", "RemotePath", "is_url", "list_files", "raw_path", "raw_size",
           "raw_source", "remote_fingerprint"]

ARROW_SCHEMES = ("s3", "gs", "gcs", "hdfs")     # Arrow's own filesystems; any other scheme goes through fsspec
_S3_OPTIONS = {"key": "access_key", "secret": "secret_key", "token": "session_token", "region": "region",
               "endpoint_url": "endpoint_override", "anon": "anonymous", "connect_timeout": "connect_timeout",
               "request_timeout": "request_timeout"}
_S3_DEFAULTS = {"connect_timeout": 10.0, "request_timeout": 60.0}


def is_url(raw: Any) -> bool:
    """Whether `raw` names a URL with a scheme other than ``file`` (a local path otherwise)."""
    if not isinstance(raw, str) or "://" not in raw:
        return False
    return urlsplit(raw).scheme.lower() not in ("", "file")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


# what the filesystems say when a request is refused for want of (good) credentials
_DENIED = re.compile(r"access.?denied|forbidden|unauthori[sz]ed|permission.?denied|not authori[sz]ed|"
                     r"invalid.?access.?key|signature.?does.?not.?match|expired.?token|invalid.?token|"
                     r"credential|\b40[13]\b", re.IGNORECASE)
_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_CREDENTIAL_OPTIONS = ("key", "secret", "token", "access_key", "secret_key", "session_token", "profile",
                       "role_arn", "credentials", "anon", "anonymous")


def _credentials_found(scheme: str, options: dict[str, Any]) -> bool | None:
    """Whether credentials for `scheme` are given (in `options`) or found where its filesystem looks for them
    (the environment, the usual files); None where this cannot tell (a scheme without a known place)."""
    if any(k in options for k in _CREDENTIAL_OPTIONS):
        return True
    home = Path.home()
    if scheme == "s3":
        files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials",
                 os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
        return any(os.environ.get(k) for k in _AWS_ENV) or any(Path(f).is_file() for f in files)
    if scheme in ("gs", "gcs"):
        default = home / ".config" / "gcloud" / "application_default_credentials.json"
        return bool(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")) or default.is_file()
    return None


def _refused(scheme: str, options: dict[str, Any]) -> str:
    """What to check when the filesystem refused a request: where the credentials come from, and the option."""
    found = _credentials_found(scheme, options)
    given = "storage_options (--storage-options)"
    if scheme == "s3":
        where = ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials), "
                 f"or key and secret in {given}")
    elif scheme in ("gs", "gcs"):
        where = f"GOOGLE_APPLICATION_CREDENTIALS (or gcloud's application default credentials), or token in {given}"
    else:
        where = f"the credentials in {given}"
    if found is False:
        return f"access denied and no credentials found: set {where}"
    return f"access denied: check the credentials ({where}) and the permissions"


def _fault(source: RawSource, what: str, e: BaseException) -> str:
    """One line for a failed request: `what` failed, and why (`e`); where the filesystem refused it, what to
    check first (the credentials and the option that gives them)."""
    if isinstance(e, PermissionError) or _DENIED.search(str(e)):
        return f"{_refused(source.scheme, source.storage_options)} ({what}: {_one_line(e)})"
    return f"{what} ({_one_line(e)})"


def _s3_options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(_S3_DEFAULTS)
    opts = dict(options)
    client = opts.pop("client_kwargs", None) or {}
    if not isinstance(client, dict):
        raise ConfigError("storage_options", f"client_kwargs must be a mapping, got {client!r}")
    for k, v in client.items():
        if k == "endpoint_url":
            opts.setdefault("endpoint_url", v)
        elif k == "region_name":
            opts.setdefault("region", v)
        else:
            raise ConfigError("storage_options", f"client_kwargs.{k} is not an option Arrow's S3 filesystem takes "
                                                 f"(for {url})")
    for k, v in opts.items():
        name = _S3_OPTIONS.get(k, k)
        if k == "endpoint_url" and isinstance(v, str) and "://" in v:
            scheme, rest = v.split("://", 1)
            out["scheme"] = scheme
            v = rest.rstrip("/")
        out[name] = v
    return out


@dataclass(frozen=True)
class RawSource:
    """A raw dataset at a URL, and how to reach it (picklable: the workers make their own filesystem)."""

    url: str
    options_json: str = "{}"                 # storage_options, as JSON (hashable, picklable)
    _fs: list[Any] = field(default_factory=list, compare=False, repr=False)

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(json.loads(self.options_json))

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options_json": self.options_json}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "url", state["url"])
        object.__setattr__(self, "options_json", state["options_json"])
        object.__setattr__(self, "_fs", [])

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """(the filesystem, the dataset's root path in it), made once per process.

        Raises:
            ConfigError: an option the filesystem does not take.
            InputError: the scheme has no filesystem here (naming the URL and what to install).
        """
        if self._fs:
            return self._fs[0]
        with _FS_LOCK:
            if not self._fs:
                self._fs.append(self._make())
        return self._fs[0]

    def _make(self) -> tuple[pafs.FileSystem, str]:
        opts = self.storage_options
        split = urlsplit(self.url)
        root = (split.netloc + split.path).rstrip("/")
        try:
            if self.scheme == "s3":
                return pafs.S3FileSystem(**_s3_options(self.url, opts)), root
            if self.scheme in ARROW_SCHEMES and not opts:
                fs, path = pafs.FileSystem.from_uri(self.url)
                return fs, path.rstrip("/")
            import fsspec

            fs_, path = fsspec.core.url_to_fs(self.url, **opts)
            return pafs.PyFileSystem(pafs.FSSpecHandler(fs_)), str(path).rstrip("/")
        except TypeError as e:
            raise ConfigError("storage_options", f"not taken by the {self.scheme}:// filesystem ({_one_line(e)})") from e
        except (ImportError, ValueError) as e:
            raise InputError(self.url, f"no filesystem for {self.scheme}:// here ({_one_line(e)}; install the fsspec "
                                       "package that implements it)") from e
        except (OSError, pa.ArrowException) as e:
            raise InputError(self.url, _fault(self, "cannot reach it", e)) from e


_FS_LOCK = threading.Lock()


@dataclass(frozen=True)
class RemotePath:
    """A file or folder of a `RawSource`, `rel` below its root: what ingest's readers take for a `Path`
    (its `str` is the URL, which errors name)."""

    source: RawSource
    rel: str = ""

    def __str__(self) -> str:
        return self.source.url.rstrip("/") + ("/" + self.rel if self.rel else "")

    def __fspath__(self) -> str:     # for messages that fspath a path; never opened as a local file
        return str(self)

    @property
    def path(self) -> str:
        """The path in the filesystem (bucket/key)."""
        _, root = self.source.filesystem()
        return root + ("/" + self.rel if self.rel else "")

    @property
    def name(self) -> str:
        return PurePosixPath(self.rel).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.rel).suffix

    @property
    def parent(self) -> RemotePath:
        parent = PurePosixPath(self.rel).parent.as_posix()
        return RemotePath(self.source, "" if parent == "." else parent)

    def __truediv__(self, other: str) -> RemotePath:
        return RemotePath(self.source, (PurePosixPath(self.rel) / other).as_posix() if self.rel else str(other))

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.rel).relative_to(other.rel) if other.rel else PurePosixPath(self.rel)

    def open(self) -> pa.NativeFile:
        """The file, for random-access reads (Parquet footers and row groups, IPC batches).

        Raises:
            InputError: naming the URL: no such object or bucket, no access, or no answer.
        """
        fs, _ = self.source.filesystem()
        try:
            return fs.open_input_file(self.path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(self, _fault(self.source, "cannot read", e)) from e

    def info(self) -> pafs.FileInfo:
        fs, _ = self.source.filesystem()
        try:
            info = fs.get_file_info(self.path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(self, _fault(self.source, "cannot reach it", e)) from e
        if info.type == pafs.FileType.NotFound:
            raise InputError(self, "no such object")
        return info


def raw_source(raw: str, storage_options: dict[str, Any] | None = None) -> RemotePath:
    """The root of a raw dataset at URL `raw`, reached with `storage_options` (see the module).

    Raises:
        ConfigError: `storage_options` is not a JSON-able mapping.
    """
    opts = dict(storage_options or {})
    try:
        text = json.dumps(opts, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ConfigError("storage_options", f"must be a mapping of plain values ({e})") from e
    return RemotePath(RawSource(raw.rstrip("/"), text))


def list_files(root: RemotePath) -> list[RemotePath]:
    """Every file below `root`, sorted (one listing call).

    Raises:
        InputError: naming the URL, for a missing bucket or prefix, missing credentials or an endpoint
        that does not answer.
    """
    fs, base = root.source.filesystem()
    try:
        top = fs.get_file_info(base)
        if top.type == pafs.FileType.NotFound:
            bucket = base.split("/")[0]
            if root.source.scheme in ("s3", "gs", "gcs") and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise InputError(root, f"no such bucket {bucket!r}")
            raise InputError(root, "no such directory (expected a raw dataset with edges/, features/, nodes/)")
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except (OSError, pa.ArrowException) as e:
        raise InputError(root, _fault(root.source, "cannot list it", e)) from e
    out = []
    for info in infos:
        if info.type == pafs.FileType.File:
            rel = info.path[len(base):].lstrip("/") if info.path.startswith(base) else info.path
            out.append(root / rel)
    return sorted(out, key=lambda p: p.rel)


def raw_path(path: Any) -> Path:
    """A raw file as the readers take it: a `RemotePath` as it is (it stands in for a `Path` wherever the
    readers in `raw` use one), anything else as a local `Path`."""
    return cast(Path, path) if isinstance(path, RemotePath) else Path(path)


def raw_size(path: Path | RemotePath) -> int:
    """A raw file's size in bytes."""
    if isinstance(path, RemotePath):
        return int(path.info().size or 0)
    return path.stat().st_size


def remote_fingerprint(path: RemotePath) -> str:
    """A fingerprint of an object from its listing alone (the client reads none of its bytes): its URL, size
    and modification time (an object is replaced whole, never edited in place, so a rewrite changes it)."""
    info = path.info()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{path}:{int(info.size or 0)}:{info.mtime_ns or 0}".encode())
    return h.hexdigest()
