"""TLS for a local cluster (`raftlog up --tls`, tests): a throw-away CA and one certificate per
node under `<data-dir>/tls/`, made once and reused when the cluster restarts on the same data
directory (the CA as `ca.pem`: clients pass it as --tls-ca)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raft.cli import pki


@dataclass(frozen=True, slots=True)
class LocalTLS:
    directory: Path
    ca: Path

    def node_args(self, node_id: int) -> list[str]:
        """The `serve` flags of node `node_id` (its certificate is issued if missing)."""
        paths = pki.node_paths(self.directory, node_id)
        if not (paths.key.exists() and pki.valid_for(paths.cert, 7)):
            pki.issue_node(self.directory, node_id)
        return ["--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
                "--tls-ca", str(self.ca)]

    @property
    def client_options(self) -> dict[str, Any]:
        return {"tls_ca": str(self.ca)}

    def client_flags(self) -> str:
        return f"--tls-ca {self.ca}"


def prepare(data_dir: Path, node_ids: list[int]) -> LocalTLS:
    directory = Path(data_dir).resolve() / "tls"
    ca, _nodes = pki.local_cluster(directory, node_ids)
    return LocalTLS(directory, ca.cert)

