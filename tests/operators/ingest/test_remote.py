"""Ingest from s3:// against a local S3-compatible server (moto's): the same store as from a local path."""
from __future__ import annotations

import filecmp
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from diskflow.cli import main
from diskflow.flow.ingest import run_ingest
from diskflow.operators.ingest.raw import find_raw_files, write_raw_dataset

import diskflow
from diskflow.errors import InputError

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")
werkzeug_app = pytest.importorskip("moto.moto_server.werkzeug_app")

# S3's answer to an unsigned request for a private bucket (moto, not checking signatures, would serve it)
_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
           b"<RequestId>0</RequestId><HostId>0</HostId></Error>")


def _deny_unsigned(app: Any) -> Any:
    """`app` (moto's), but a request without a signature gets S3's 403 AccessDenied, as a private bucket's would."""
    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        if "HTTP_AUTHORIZATION" not in environ and "X-Amz-Signature" not in environ.get("QUERY_STRING", ""):
            start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(_DENIED)))])
            return [b"" if environ["REQUEST_METHOD"] == "HEAD" else _DENIED]
        return app(environ, start_response)
    return wrapped


class _Server(moto_server.ThreadedMotoServer):
    """moto's threaded server, refusing unsigned requests (`_deny_unsigned`)."""

    def _server_entry(self) -> None:
        from werkzeug.serving import make_server

        app = _deny_unsigned(werkzeug_app.DomainDispatcherApplication(werkzeug_app.create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True,
                                   request_handler=werkzeug_app.MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A moto server on a free local port (refusing unsigned requests, as S3 does for a private bucket), a bucket
    ``data`` holding a raw dataset under ``raw/``; the environment holds the credentials."""
    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        mp.setenv(k, v)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = _Server(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="data")
    tmp = tmp_path_factory.mktemp("s3")
    rng = np.random.default_rng(3)
    n, e, dim = 2003, 12007, 9
    raw = write_raw_dataset(tmp / "raw", src=rng.integers(0, n, e), dst=rng.integers(0, n, e),
                            features=rng.standard_normal((n, dim)).astype(np.float32), labels=rng.integers(0, 4, n),
                            splits=rng.choice(["train", "val", "test"], n), edge_parts=3, feature_parts=4,
                            node_parts=2, row_group_rows=300)
    for p in sorted(raw.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), "data", "raw/" + p.relative_to(raw).as_posix())
    try:
        yield {"raw": raw, "tmp": tmp, "options": {"endpoint_url": endpoint, "region": "us-east-1"},
               "endpoint": endpoint}
    finally:
        server.stop()
        mp.undo()


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_s3_ingest_makes_the_store_a_local_ingest_makes(s3: dict, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set(scheduler="sync"):
        run_ingest(s3["raw"], tmp_path / "local", memory_budget="128KiB")
    argv = ["ingest", "s3://data/raw", str(tmp_path / "remote"), "--memory-budget", "128KiB",
            "--storage-options", json.dumps(s3["options"]), "--workers", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert _files(local) == _files(remote)
    for rel in _files(local):
        if rel != "manifest.json":
            assert filecmp.cmp(local / rel, remote / rel, shallow=False), rel
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (local, remote))
    assert set(a["inputs"]) == set(b["inputs"])          # the same files; fingerprints of where they came from
    assert {k: v for k, v in a.items() if k != "inputs"} == {k: v for k, v in b.items() if k != "inputs"}
    assert main(["verify", str(remote)]) == 0


def test_remote_faults_are_one_line_naming_the_url(s3: dict) -> None:
    opts = s3["options"]
    with pytest.raises(InputError, match=r"^s3://nobucket/raw: no such bucket 'nobucket'$"):
        find_raw_files("s3://nobucket/raw", opts)
    with pytest.raises(InputError, match=r"^s3://data/absent: no such directory"):
        find_raw_files("s3://data/absent", opts)
    with pytest.raises(InputError, match=r"^s3://data/raw: cannot list it \(.*(connect|Connect)"):
        find_raw_files("s3://data/raw", {"endpoint_url": "http://127.0.0.1:1", "connect_timeout": 1,
                                         "request_timeout": 2})
    files = find_raw_files("s3://data/raw", opts)
    missing = files.root / "features" / "part-99999.parquet"       # an object gone after the listing
    with pytest.raises(InputError, match=r"^s3://data/raw/features/part-99999.parquet: cannot read"):
        missing.open()
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    client.put_object(Bucket="data", Key="bad/edges/part-0.parquet", Body=b"not parquet")
    client.put_object(Bucket="data", Key="bad/features/part-0.parquet", Body=b"x")
    client.put_object(Bucket="data", Key="bad/nodes/part-0.parquet", Body=b"x")
    with pytest.raises(InputError, match=r"^s3://data/bad/edges/part-0.parquet: unreadable Parquet file"), \
            dask.config.set(scheduler="sync"):
        run_ingest("s3://data/bad", s3["tmp"] / "bad-store", storage_options=opts)


def test_missing_credentials_are_one_line_naming_the_url_and_the_option(s3: dict, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent" / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent" / "config"))
    out = tmp_path / "store"
    argv = ["ingest", "s3://data/raw", str(out), "--storage-options", json.dumps(s3["options"]), "--workers", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("diskflow ingest: error: s3://data/raw: access denied and no credentials found: "), err
    assert "AWS_ACCESS_KEY_ID" in err[0] and "--storage-options" in err[0] and "ACCESS_DENIED" in err[0], err
    assert list(tmp_path.iterdir()) == []            # nothing written, not even a staging directory
    with pytest.raises(InputError, match=r"^s3://data/raw: access denied and no credentials found: .*storage_options"):
        diskflow.ingest("s3://data/raw", out, storage_options=s3["options"])
    assert list(tmp_path.iterdir()) == []
    # credentials given, and refused: the same line says to check them
    refused = {**s3["options"], "anon": True}
    with pytest.raises(InputError, match=r"^s3://data/raw: access denied: check the credentials \(AWS_ACCESS_KEY_ID"):
        diskflow.ingest("s3://data/raw", out, storage_options=refused)
    assert list(tmp_path.iterdir()) == []
