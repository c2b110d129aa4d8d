"""TLS and token options of the Spark data source (both directions):

    .option("tlsCa", "/etc/raftlog/ca.pem")        # TLS, nodes checked against this CA
    .option("tlsCert", ...).option("tlsKey", ...)  # mutual TLS (principal from the cert)
    .option("token", os.environ["RAFTLOG_TOKEN"])  # bearer token in the hello

The paths must exist on the driver and on every executor. Spark redacts option values whose
key matches spark.redaction.regex (by default it contains "token"), so the token does not show
in the UI or the plan; it never appears in our logs or errors either. Without `token` the
RAFTLOG_TOKEN environment variable of the process is used, which keeps it out of the job's
options altogether.

Only strings are kept (the options are pickled to executors); each process builds its TLS
context once.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
from dataclasses import dataclass, field

from raft.protocol.hello import Hello


class SecurityOptionError(ValueError):
    """A TLS or token option is unusable; the message names the option."""


@dataclass(frozen=True, slots=True)
class ConnSecurity:
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "ConnSecurity":
        """From Spark options (keys lower-cased by the caller)."""
        sec = cls(options.get("tlsca") or None, options.get("tlscert") or None,
                  options.get("tlskey") or None,
                  options.get("token") or os.environ.get("RAFTLOG_TOKEN") or None)
        if (sec.tls_cert is None) != (sec.tls_key is None):
            raise SecurityOptionError("options tlsCert and tlsKey go together")
        if sec.tls_cert and not sec.tls_ca:
            raise SecurityOptionError("option tlsCert needs tlsCa (the cluster CA)")
        if sec.tls_ca:
            _context(sec.tls_ca, sec.tls_cert, sec.tls_key)  # fail on the driver, early
        return sec

    def hello(self) -> Hello:
        """The client hello, carrying the token when there is one."""
        return Hello.client(self.token)

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        if not self.tls_ca:
            return sock
        return _context(self.tls_ca, self.tls_cert, self.tls_key).wrap_socket(
            sock, server_hostname=host)


@functools.lru_cache(maxsize=8)
def _context(ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except FileNotFoundError as e:
        raise SecurityOptionError(f"TLS file {e.filename} does not exist on this host (the "
                                  f"tlsCa/tlsCert/tlsKey paths must exist on the driver and "
                                  f"every executor)") from None
    except ssl.SSLError as e:
        raise SecurityOptionError(f"TLS files cannot be used ({e.reason or e}); check options "
                                  f"tlsCa, tlsCert and tlsKey") from None
    return ctx
