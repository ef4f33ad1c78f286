"""Who may talk to a diskflow cluster: the TLS options checked against the scheduler's address before
Dask starts, and a scheduler's refusal turned into one line.

Without TLS a Dask cluster authenticates nobody: whoever reaches the scheduler's port can submit
tasks, that is run any code, as the user the workers run as. With ``--tls-ca-file``, ``--tls-cert``
and ``--tls-key`` every connection is encrypted and both ends show a certificate signed by the
cluster's CA (Dask's mutual TLS), so the scheduler admits only its own cluster.

`check_tls` is the one check every command that starts or reaches a scheduler calls first: a
``tls://`` address without the files, files that are missing or not PEM, a key that is not the
certificate's, TLS options beside a ``tcp://`` address, each one `ConfigError` naming the option
and the file. Dask's own ``distributed.comm.tls`` config stands in for the options, as in any Dask
process. `refusal` and `probe` turn a scheduler that closes the handshake (a certificate it does not
trust, an expired one, a plain connection to a TLS port) into `SchedulerRefused`, naming the
scheduler and the TLS library's reason, where Dask would raise a traceback or retry forever.
"""
from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask

from ..errors import ConfigError, DiskflowError

__all__ = ["FLAGS", "NEEDS", "OPTIONS", "ROLES", "SchedulerRefused", "TLSFiles", "check_tls", "probe",
           "refusal", "scheme"]

ROLES = ("client", "worker", "scheduler")
OPTIONS = (("ca_file", "tls_ca_file"), ("cert", "tls_cert"), ("key", "tls_key"))     # the fields errors name
# the same options as flags: the texts of the errors below still name them so (the CLI's output is pinned)
FLAGS = {"ca_file": "--tls-ca-file", "cert": "--tls-cert", "key": "--tls-key"}
NEEDS = ("TLS needs the CA certificate of the cluster (--tls-ca-file), this process's certificate (--tls-cert) "
         "and its private key (--tls-key, or in the certificate's file)")


class SchedulerRefused(DiskflowError):
    """The scheduler at `address` closed the connection during the TLS handshake (or a TLS port was
    reached without TLS): `reason` is the TLS library's, with what to check."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"{address} refused this connection: {reason}")

    def __reduce__(self):  # both fields survive pickling, as the other errors' do
        return (type(self), (self.address, self.reason))


@dataclass(frozen=True)
class TLSFiles:
    """A process's checked TLS files (absolute paths), or none: plain TCP, or Dask's ``distributed.comm.tls``
    config (`from_config`), which Dask reads itself."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    from_config: bool = False

    @property
    def enabled(self) -> bool:
        """Whether this process speaks TLS (from the options or from Dask's config)."""
        return self.ca_file is not None or self.from_config

    def argv(self) -> list[str]:
        """`dask scheduler`/`dask worker`'s options for these files (none: Dask's config applies)."""
        return [a for flag, path in (("--tls-ca-file", self.ca_file), ("--tls-cert", self.cert),
                                     ("--tls-key", self.key)) if path is not None for a in (flag, path)]

    def security(self, role: str = "client") -> Any:
        """A `distributed.Security` for `role` requiring encryption, or None (plain TCP). A client's holds the
        files for every role: the embedded cluster a command may start with them runs its scheduler and
        workers on the same certificate."""
        if not self.enabled:
            return None
        from distributed import Security

        if self.ca_file is None:    # Dask's config: Security() reads it
            return Security(require_encryption=True)
        roles = ROLES if role == "client" else (role,)
        files = {f"tls_{r}_{kind}": path for r in roles for kind, path in (("cert", self.cert), ("key", self.key))}
        return Security(tls_ca_file=self.ca_file, require_encryption=True, **files)


def scheme(address: str) -> str:
    """The protocol of a Dask address (``tls://h:1`` -> ``tls``); without one, Dask's default (tcp)."""
    if "://" in address:
        return address.split("://", 1)[0].lower()
    return str(dask.config.get("distributed.comm.default-scheme", default="tcp") or "tcp").lower()


def check_tls(address: str | None, ca_file: str | os.PathLike[str] | None = None,
              cert: str | os.PathLike[str] | None = None, key: str | os.PathLike[str] | None = None, *,
              role: str = "client", address_option: str = "--scheduler") -> TLSFiles:
    """Check a process's TLS options against the scheduler `address` it reaches (or, for ``role="scheduler"``,
    listens on), before Dask starts; the checked files.

    `address` None: an embedded cluster, a scheduler file not yet written, or a scheduler listening on the
    default interfaces: only the files are checked. Raises `ConfigError` naming the option (and the file):
    TLS options beside an address of another protocol; a ``tls://`` address with neither the options nor
    Dask's ``distributed.comm.tls`` config; an option missing from the three; a file that does not
    exist, is not PEM, or a key that is not the certificate's.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    given = {name: os.fspath(p) for name, p in (("ca_file", ca_file), ("cert", cert), ("key", key)) if p is not None}
    flags = dict(OPTIONS)
    proto = scheme(address) if address else None
    listens_plain = role == "scheduler" and address is not None and "://" not in address
    if given and proto is not None and proto != "tls" and not listens_plain:
        raise ConfigError(address_option, f"{address} is a {proto}:// address, which does not use "
                                          f"{', '.join(FLAGS[n] for n in given)}; give the scheduler's "
                                          f"tls://HOST:PORT, or leave the TLS options out")
    for name, path in given.items():
        if not Path(path).exists():
            raise ConfigError(flags[name], f"{path}: no such file")
        if not Path(path).is_file():
            raise ConfigError(flags[name], f"{path}: not a file")
    if not given:
        if proto != "tls":
            return TLSFiles()
        configured = _from_config(role)
        if configured is None:
            raise ConfigError("tls_ca_file", f"missing: {address_option} {address} is a TLS scheduler; {NEEDS}, "
                                             "or Dask's distributed.comm.tls config")
        files = configured
        flags = {name: f"Dask's distributed.comm.tls.{_config_key(role, name)}" for name, _ in OPTIONS}
    else:
        for name in ("ca_file", "cert"):
            if name not in given:
                raise ConfigError(flags[name], f"missing: {NEEDS}")
        files = given
    _check_pem(files, flags)
    resolved = {name: str(Path(p).resolve()) for name, p in files.items()}
    if not given:
        return TLSFiles(from_config=True)
    return TLSFiles(resolved["ca_file"], resolved["cert"], resolved.get("key"))


def _config_key(role: str, name: str) -> str:
    return "ca-file" if name == "ca_file" else f"{role}.{name}"


def _from_config(role: str) -> dict[str, str] | None:
    """The CA, certificate and key Dask's ``distributed.comm.tls`` config gives `role`, or None when it lacks
    the CA or the certificate (Dask's `Security` then has no TLS context)."""
    files = {name: dask.config.get(f"distributed.comm.tls.{_config_key(role, name)}", default=None)
             for name, _ in OPTIONS}
    files = {name: str(p) for name, p in files.items() if p}
    if "ca_file" not in files or "cert" not in files:
        return None
    if any("\n" in p for p in files.values()):      # PEM text in the config itself: Dask loads it as such
        return {}
    return files


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_bytes().decode("latin-1")
    except OSError as e:
        raise ConfigError(flag, f"{path}: cannot read ({e.strerror or e})") from None


def _check_pem(files: dict[str, str], flags: dict[str, str]) -> None:
    """Each file holds what its option names, in PEM, and the key is the certificate's (Dask reads them only
    when it connects, and then fails with a traceback)."""
    if not files:
        return
    texts = {name: _read(path, flags[name]) for name, path in files.items()}
    for name in ("ca_file", "cert"):
        if "-----BEGIN CERTIFICATE-----" not in texts[name] and "-----BEGIN TRUSTED CERTIFICATE-----" not in texts[name]:
            raise ConfigError(flags[name], f"{files[name]}: not a PEM certificate (no -----BEGIN CERTIFICATE----- line)")
    key_name = "key" if "key" in files else "cert"
    key_text = texts[key_name]
    if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_text):
        if key_name == "cert":
            raise ConfigError(flags["key"], f"missing: {files['cert']} holds no private key; give the key's file")
        raise ConfigError(flags["key"], f"{files['key']}: not a PEM private key (no -----BEGIN PRIVATE KEY----- line)")
    if "ENCRYPTED PRIVATE KEY" in key_text or "Proc-Type: 4,ENCRYPTED" in key_text:
        raise ConfigError(flags[key_name], f"{files[key_name]}: an encrypted private key; Dask reads keys without "
                                           "a passphrase (openssl pkey -in KEY -out PLAIN writes one)")
    try:
        ssl.create_default_context(cafile=files["ca_file"])
    except ssl.SSLError as e:
        raise ConfigError(flags["ca_file"], f"{files['ca_file']}: not a CA certificate ({_ssl_reason(e)})") from None
    try:
        ssl.create_default_context().load_cert_chain(files["cert"], files.get("key"), password=_no_passphrase)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(flags[key_name], f"{files[key_name]}: not the private key of the certificate in "
                                               f"{files['cert']}") from None
        raise ConfigError(flags["cert"], f"{files['cert']}: not a usable certificate and key ({_ssl_reason(e)})") \
            from None


def _no_passphrase() -> bytes:
    raise ConfigError("tls_key", "an encrypted private key; Dask reads keys without a passphrase")


def _ssl_reason(e: BaseException) -> str:
    """An SSL error's text without its ``[LIB: CODE]`` prefix and ``(_ssl.c:N)`` suffix."""
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return f"certificate verify failed: {e.verify_message}"
    text = str(e.args[1] if len(e.args) > 1 else e)
    text = re.sub(r"^\[[A-Z0-9_]+(: [A-Z0-9_]+)?\]\s*", "", text)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text) or type(e).__name__


def refusal(address: str, exc: BaseException, security: Any = None, role: str = "client") -> SchedulerRefused | None:
    """`SchedulerRefused` for a connection that `address` closed during the handshake (from Dask's
    `Client`, `comm.connect`), or None for any other failure (unreachable, timed out).

    The reason is the TLS library's; where the scheduler hung up on this process's certificate, the
    certificate is also verified here against this process's own CA (`security`'s, a
    `distributed.Security`), which names what the scheduler would not say: expired, another CA's.
    """
    from distributed.comm.core import CommClosedError

    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify is not None:
        return SchedulerRefused(address, f"{_ssl_reason(verify)}: this process does not trust the scheduler's "
                                         "certificate; is --tls-ca-file the CA that signed the cluster's?")
    tls = next((e for e in chain if isinstance(e, ssl.SSLError)), None)
    if tls is None and not (isinstance(exc, CommClosedError) and not str(exc).startswith("Timed out")):
        return None
    if tls is not None:
        reason = _ssl_reason(tls)
    else:
        reset = next((e for e in chain if isinstance(e, ConnectionError)), None)
        reason = reset.strerror if isinstance(reset, OSError) and reset.strerror else "connection closed"
        if scheme(address) != "tls":
            return SchedulerRefused(address, f"{reason} during the handshake: a TLS scheduler refuses plain "
                                             f"{scheme(address)}:// connections; give its tls:// address and the "
                                             "--tls-* options")
    own = _own_certificate_fault(security, role)
    hint = (f"this process's certificate {own}" if own else
            "the scheduler does not accept this process's certificate; is --tls-cert signed by the cluster's CA?")
    return SchedulerRefused(address, f"{reason} during the TLS handshake: {hint}")


def _own_certificate_fault(security: Any, role: str) -> str | None:
    """What is wrong with `security`'s certificate for `role` as its own CA sees it (``node.pem: certificate
    has expired``), or None: it verifies, or there is none to look at. A TLS handshake in memory, no network."""
    ca, cert, key = (getattr(security, a, None) for a in ("tls_ca_file", f"tls_{role}_cert", f"tls_{role}_key"))
    if not ca or not cert or any("\n" in str(p) for p in (ca, cert, key) if p):
        return None
    try:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False           # as Dask's: a dedicated CA, addresses rather than host names
        client.verify_flags &= ~ssl.VERIFY_X509_STRICT
        client.load_verify_locations(ca)
        c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
        ends = (client.wrap_bio(c_in, c_out), server.wrap_bio(s_in, s_out, server_side=True))
        for _ in range(8):
            pending = False
            for end in ends:
                try:
                    end.do_handshake()
                except ssl.SSLWantReadError:
                    pending = True
            s_in.write(c_out.read())
            c_in.write(s_out.read())
            if not pending:
                return None
    except ssl.SSLCertVerificationError as e:
        return f"{cert} does not verify against --tls-ca-file {ca}: {e.verify_message or _ssl_reason(e)}"
    except (ssl.SSLError, OSError):
        return None
    return None


def probe(address: str, files: TLSFiles, *, role: str = "worker", timeout: float | str | None = None,
          address_option: str = "scheduler") -> None:
    """Connect to `address` once as `role` and hang up, so a scheduler that refuses this process's certificate
    (or its plain connection) is one `SchedulerRefused` line before Dask starts a worker that would retry
    forever or fail with a traceback. A scheduler not reachable yet passes: Dask's worker waits for it.
    `timeout`: the most seconds to try (default Dask's connect timeout, at most 5 s)."""
    import asyncio

    from dask.utils import parse_timedelta
    from distributed.comm import connect

    if timeout is None:
        timeout = min(5.0, parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds"))
    security = files.security(role)
    args = security.get_connection_args(role) if security is not None else {}

    async def once() -> None:
        comm = await connect(address, timeout=timeout, **args)
        await comm.close()

    try:
        asyncio.run(once())
    except ValueError as e:         # Dask's parse of a malformed address
        raise ConfigError(address_option, f"{address}: {e}") from None
    except (OSError, TimeoutError) as e:
        refused = refusal(address, e, security, role)
        if refused is not None:
            raise refused from None

