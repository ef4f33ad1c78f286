"""TLS checked both ways, on loopback with certificates made here (openssl).

The scheduler: a `diskflow scheduler` with the cluster's certificates admits the cluster's own client and
worker, and refuses a plain tcp:// client, a client that shows no certificate, one whose certificate a
foreign CA signed (trusting the cluster's CA or not), an expired one, and a worker without certificates;
each refusal is one `SchedulerRefused` line naming the scheduler and the TLS library's reason.

The user: every command that takes a scheduler address checks it against the TLS options before Dask
starts: a tls:// address without the files, a missing or non-PEM file, a key that is not the
certificate's, TLS options beside a tcp:// address, each one line naming the option (and the file) with
exit status 2, no traceback. Connect timeouts are short (`distributed.comm.timeouts.connect`): the module
takes seconds.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")    # before any import that needs it, so the module skips

import dask
from diskflow.cli import main
from diskflow.flow.cluster import dask_client
from diskflow.flow.security import SchedulerRefused, check_tls
from processes import start, stop_cluster

from diskflow.errors import ConfigError

CONNECT = "3s"      # every connection in this module gives up after this


def _openssl(root: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)


def _certificates(root: Path) -> dict[str, Path]:
    """The cluster's CA and a certificate for 127.0.0.1 it signed; a foreign CA and a certificate it signed
    (same key); an expired certificate of the cluster's CA; a file that is not PEM."""
    _openssl(root, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
             "2", "-subj", "/CN=diskflow-test-ca")
    _openssl(root, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "foreign-ca.key", "-out",
             "foreign-ca.pem", "-days", "2", "-subj", "/CN=someone-else")
    _openssl(root, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj",
             "/CN=127.0.0.1")
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for ca, out in (("ca", "node.pem"), ("foreign-ca", "foreign.pem")):
        _openssl(root, "x509", "-req", "-in", "node.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", out, "-days", "2", "-extfile", "san.ext")
    # `openssl ca` sets the validity dates `openssl x509` cannot: a day in 2020
    (root / "ca.cnf").write_text("[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\n"
                                 "serial = serial.txt\ndefault_md = sha256\npolicy = any\n[any]\ncommonName = supplied\n")
    (root / "index.txt").write_text("")
    (root / "serial.txt").write_text("01\n")
    _openssl(root, "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", "node.csr",
             "-out", "expired.pem", "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext",
             "-extfile", "san.ext")
    (root / "junk.pem").write_text("not a certificate\n")
    return {name: root / f"{name}.pem" for name in ("ca", "node", "foreign-ca", "foreign", "expired", "junk")} | \
        {"key": root / "node.key", "foreign-key": root / "foreign-ca.key"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the test's certificates")
    return _certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(autouse=True)
def short_connect() -> Iterator[None]:
    with dask.config.set({"distributed.comm.timeouts.connect": CONNECT}):
        yield


def _flags(certs: dict[str, Path], cert: str = "node", ca: str = "ca", key: str = "key") -> list[str]:
    return ["--tls-ca-file", str(certs[ca]), "--tls-cert", str(certs[cert]), "--tls-key", str(certs[key])]


def _security(certs: dict[str, Path], cert: str = "node", ca: str = "ca") -> Any:
    return distributed.Security(tls_ca_file=str(certs[ca]), tls_client_cert=str(certs[cert]),
                                tls_client_key=str(certs["key"]), require_encryption=True)


@pytest.fixture(scope="module")
def cluster(certs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A `diskflow scheduler` on tls://127.0.0.1 and one `diskflow worker` of its own, separate processes."""
    root = tmp_path_factory.mktemp("tls-cluster")
    sf = root / "scheduler.json"
    procs: dict[str, subprocess.Popen] = {}
    os.environ["DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"] = CONNECT     # the processes started below
    try:
        procs["scheduler"] = start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                     "--scheduler-file", str(sf), *_flags(certs)], root / "scheduler.log")
        deadline = time.monotonic() + 60
        while not sf.exists():
            assert procs["scheduler"].poll() is None and time.monotonic() < deadline, \
                (root / "scheduler.log").read_text()[-2000:]
            time.sleep(0.1)
        address = json.loads(sf.read_text())["address"]
        procs["worker"] = start(["worker", address, "--host", "127.0.0.1", "--no-nanny", "--name", "own",
                                 "--local-directory", str(root / "worker"), *_flags(certs)], root / "worker.log")
        yield {"address": address, "port": int(address.rsplit(":", 1)[1]), "root": root}
    finally:
        os.environ.pop("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", None)
        stop_cluster(procs)


def _refused(scheduler: str, security: Any = None) -> str:
    """The one line a client gets from `scheduler`'s refusal."""
    with pytest.raises(SchedulerRefused) as e, dask_client(scheduler, quiet=True, security=security):
        pass
    message = str(e.value)
    assert message.startswith(f"{scheduler} refused this connection: ") and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------ the scheduler

def test_the_cluster_admits_its_own_client_and_worker(cluster: dict[str, Any], certs: dict[str, Path]) -> None:
    assert cluster["address"].startswith("tls://127.0.0.1:")
    with dask_client(cluster["address"], quiet=True, security=_security(certs)) as client:
        client.wait_for_workers(1, timeout=60)
        assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert [w["name"] for w in workers.values()] == ["own"]
        assert all(a.startswith("tls://") for a in workers)


def test_a_plain_tcp_client_is_refused(cluster: dict[str, Any]) -> None:
    plain = cluster["address"].replace("tls://", "tcp://")
    assert "a TLS scheduler refuses plain tcp:// connections" in _refused(plain)


def test_a_client_without_a_certificate_is_refused(cluster: dict[str, Any], certs: dict[str, Path]) -> None:
    """Dask itself cannot connect without a certificate, so a bare TLS socket tries: it trusts the cluster's CA,
    completes its side of the handshake, and the scheduler hangs up on it."""
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", cluster["port"]), timeout=5) as raw, \
            pytest.raises((ssl.SSLError, ConnectionError)) as e, context.wrap_socket(raw) as conn:
        conn.sendall(b"\0" * 8)
        if conn.recv(1) == b"":             # closed without a word: refused as well
            raise ConnectionError("closed")
    assert "timed out" not in str(e.value)


def test_a_client_whose_certificate_a_foreign_ca_signed_is_refused(cluster: dict[str, Any],
                                                                   certs: dict[str, Path]) -> None:
    message = _refused(cluster["address"], _security(certs, cert="foreign"))
    assert f"{certs['foreign']} does not verify against --tls-ca-file {certs['ca']}" in message, message
    # trusting only its own CA, it does not trust the scheduler either
    message = _refused(cluster["address"], _security(certs, cert="foreign", ca="foreign-ca"))
    assert "certificate verify failed" in message and "does not trust the scheduler's certificate" in message


def test_an_expired_certificate_is_refused(cluster: dict[str, Any], certs: dict[str, Path]) -> None:
    message = _refused(cluster["address"], _security(certs, cert="expired"))
    assert "certificate has expired" in message, message


def test_workers_without_the_clusters_certificates_are_refused(cluster: dict[str, Any], certs: dict[str, Path],
                                                               capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each is refused by `diskflow worker`'s probe, before Dask's worker starts (which would retry forever)."""
    import diskflow.cluster

    started: list[Any] = []     # (`diskflow worker` imports it from diskflow.cluster when it runs)
    monkeypatch.setattr(diskflow.cluster, "run_dask_cli", lambda *a: started.append(a) or 0)
    plain = cluster["address"].replace("tls://", "tcp://")
    for argv, says in ((["worker", plain, "--no-nanny"], "refuses plain tcp:// connections"),
                       (["worker", cluster["address"], "--no-nanny", *_flags(certs, cert="foreign")],
                        "does not verify against --tls-ca-file"),
                       (["worker", cluster["address"], "--no-nanny", *_flags(certs, cert="expired")],
                        "certificate has expired")):
        rc = main(argv)
        assert started == [], f"diskflow {' '.join(argv)} started Dask's worker"
        assert rc == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"diskflow worker: error: {argv[1]} refused this connection: ") and says in err, err
    with dask_client(cluster["address"], quiet=True, security=_security(certs)) as client:
        client.wait_for_workers(1, timeout=60)     # the fixture's own worker may still be joining
        assert [w["name"] for w in client.scheduler_info(n_workers=-1)["workers"].values()] == ["own"]


def test_dasks_own_tls_config_stands_in_for_the_options(cluster: dict[str, Any], certs: dict[str, Path],
                                                         capsys: pytest.CaptureFixture) -> None:
    config = {"distributed.comm.tls.ca-file": str(certs["ca"]), "distributed.comm.tls.client.cert": str(certs["node"]),
              "distributed.comm.tls.client.key": str(certs["key"])}
    with dask.config.set(config):
        assert check_tls(cluster["address"], None, None, None).from_config
        from diskflow.flow.roles import tls_security

        with dask_client(cluster["address"], quiet=True,
                         security=tls_security(None, None, None, cluster["address"])) as client:
            assert client.submit(len, "abc").result(timeout=30) == 3
    junk = {**config, "distributed.comm.tls.client.cert": str(certs["junk"])}
    with dask.config.set(junk), pytest.raises(ConfigError, match=r"tls\.client\.cert: .*junk\.pem: not a PEM"):
        check_tls(cluster["address"], None, None, None)


def test_an_embedded_cluster_with_tls_options_listens_on_tls(certs: dict[str, Path]) -> None:
    security = check_tls(None, certs["ca"], certs["node"], certs["key"]).security()
    with dask_client(n_workers=1, processes=False, quiet=True, security=security) as client:
        assert client.scheduler.address.startswith("tls://")
        assert client.submit(len, "ab").result(timeout=30) == 2
    from diskflow.flow.roles import stream_client

    with stream_client(None, cpu_workers=1, device="cpu", processes=False, quiet=True, security=security) as client:
        assert client.scheduler.address.startswith("tls://")
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2       # a CPU worker and the GPU worker


# ------------------------------------------------------------------------------------------ the user

def _one_line(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err and captured.out == "", (argv, err)
    assert err.startswith(f"diskflow {argv[0]}: error: "), err
    return err.strip()


# command family -> its argv up to the scheduler's address, and the option that takes the address
COMMANDS: dict[str, tuple[list[str], str]] = {
    "worker": (["worker"], "SCHEDULER"),
    "run": (["run", "streaming", "--dataset", "STORE", "--scheduler"], "--scheduler"),
    "prepare": (["prepare", "belady", "--dataset", "STORE", "--out", "PACKED", "--scheduler"], "--scheduler"),
    "ingest": (["ingest", "RAW", "STORE", "--scheduler"], "--scheduler"),
    "synth": (["synth", "OUT", "--scheduler"], "--scheduler"),
    "scheduler": (["scheduler", "--host"], "--host"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_misconfigured_command_says_one_line_and_exits_2(command: str, certs: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)         # nothing a command might write lands in the checkout
    prefix, option = COMMANDS[command]
    tls, tcp = "tls://127.0.0.1:9", "tcp://127.0.0.1:9"
    if command == "scheduler":
        tls, tcp = "tls://127.0.0.1", "tcp://127.0.0.1"
    ca, cert, key = (str(certs[n]) for n in ("ca", "node", "key"))
    missing = str(tmp_path / "missing.pem")

    err = _one_line([*prefix, tls], capsys)
    assert f"--tls-ca-file: missing: {option} {tls} is a TLS scheduler; TLS needs the CA certificate" in err
    err = _one_line([*prefix, tls, "--tls-ca-file", ca, "--tls-key", key], capsys)
    assert "--tls-cert: missing: TLS needs" in err
    err = _one_line([*prefix, tls, "--tls-ca-file", ca, "--tls-cert", cert], capsys)
    assert f"--tls-key: missing: {cert} holds no private key" in err
    err = _one_line([*prefix, tls, "--tls-ca-file", missing, "--tls-cert", cert, "--tls-key", key], capsys)
    assert err.endswith(f"--tls-ca-file: {missing}: no such file")
    err = _one_line([*prefix, tls, "--tls-ca-file", ca, "--tls-cert", str(certs["junk"]), "--tls-key", key], capsys)
    assert err.endswith(f"--tls-cert: {certs['junk']}: not a PEM certificate (no -----BEGIN CERTIFICATE----- line)")
    err = _one_line([*prefix, tls, "--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", str(certs["junk"])], capsys)
    assert err.endswith(f"--tls-key: {certs['junk']}: not a PEM private key (no -----BEGIN PRIVATE KEY----- line)")
    err = _one_line([*prefix, tls, "--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", str(certs["foreign-key"])],
                    capsys)
    assert err.endswith(f"--tls-key: {certs['foreign-key']}: not the private key of the certificate in {cert}")
    err = _one_line([*prefix, tcp, "--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key], capsys)
    assert f"{option}: {tcp} is a tcp:// address, which does not use --tls-ca-file, --tls-cert, --tls-key" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_misconfigured_worker_exits_2_as_a_process(certs: dict[str, Path], tmp_path: Path) -> None:
    """As a user runs it: `diskflow worker tls://...` without the TLS options, a process of its own."""
    r = subprocess.run([sys.executable, "-m", "diskflow", "worker", "tls://127.0.0.1:9"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, check=False)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("diskflow worker: error: --tls-ca-file: missing: SCHEDULER tls://127.0.0.1:9 is a TLS "
                               "scheduler") and r.stderr.count("\n") == 1, r.stderr


def test_the_library_raises_config_errors_naming_the_option(certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        check_tls("tls://127.0.0.1:9")
    assert e.value.option == "tls_ca_file"
    with pytest.raises(ConfigError, match="is a tcp:// address") as e:
        check_tls("127.0.0.1:9", certs["ca"], certs["node"], certs["key"])   # no scheme: Dask's default, tcp
    assert e.value.option == "--scheduler"
    files = check_tls("tls://127.0.0.1:9", certs["ca"], certs["node"], certs["key"])
    assert files.argv() == ["--tls-ca-file", str(certs["ca"]), "--tls-cert", str(certs["node"]),
                            "--tls-key", str(certs["key"])]
    assert check_tls("tcp://127.0.0.1:9").security() is None
    both = tmp_path / "both.pem"        # a certificate file that holds its key needs no --tls-key
    both.write_text(certs["node"].read_text() + certs["key"].read_text())
    assert check_tls("tls://127.0.0.1:9", certs["ca"], both).key is None
    # a scheduler listening on a bare host with the TLS options listens on tls://
    assert check_tls("127.0.0.1", certs["ca"], certs["node"], certs["key"], role="scheduler").enabled
    encrypted = tmp_path / "encrypted.key"
    _openssl(tmp_path, "pkey", "-in", str(certs["key"]), "-out", str(encrypted), "-aes128", "-passout", "pass:x")
    with pytest.raises(ConfigError, match="an encrypted private key") as e:
        check_tls("tls://127.0.0.1:9", certs["ca"], certs["node"], encrypted)
    assert e.value.option == "tls_key"
