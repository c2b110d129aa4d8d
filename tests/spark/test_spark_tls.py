"""The Spark data source over TLS with tokens: a write with a `produce` token and a read with a
`consume` token round-trip through a TLS node with an auth file; a read-only token cannot write
(FORBIDDEN, at once), and the token never shows in the error. Also the staging client alone
(sparkio.staging.Session): a wrong token and a wrong CA are refused without retries."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
from raft.cli.localcluster import free_ports, wait_for  # noqa: E402
from secfixtures import REPO, make_pki  # noqa: E402
from sparkio.security import ConnSecurity  # noqa: E402
from sparkio.staging import RaftlogError, Session  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spark-tls")
    pki = make_pki(root / "pki", nodes=(1,))
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    with open(root / "node.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raft.cli", "serve", "--shards", "1", "--node-id", "1",
             "--data-dir",
             str(root / "data"), "--peers", f"1={addr}", *pki.node_flags(1),
             "--auth-file", str(pki.auth_file)],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={"PYTHONPATH": str(REPO)})

    def serving() -> bool:
        s = Session(addr, timeout_s=2, security=ConnSecurity(str(pki.ca),
                                                             token=pki.tokens["nobody"]))
        try:
            return s.status()["role"] == "leader"
        except RaftlogError:
            return False
        finally:
            s.close()

    try:
        wait_for(serving, "the TLS node to lead", 60)
        yield addr, pki
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_spark_write_and_read_over_tls_with_tokens(spark, tls_node) -> None:
    addr, pki = tls_node
    tag = f"t{uuid.uuid4().hex[:6]}"
    df = spark.range(500, numPartitions=2).selectExpr(f"concat('{tag}-', id) AS value")
    (df.write.format("raftlog").option("servers", addr).option("tlsCa", str(pki.ca))
     .option("token", pki.tokens["writer"]).option("loadId", f"load-{tag}")
     .mode("append").save())
    got = (spark.read.format("raftlog").option("servers", addr).option("tlsCa", str(pki.ca))
           .option("token", pki.tokens["reader"]).load()
           .selectExpr("CAST(value AS STRING) AS v").collect())
    assert sorted(r.v for r in got if r.v.startswith(tag)) == sorted(
        f"{tag}-{i}" for i in range(500))
    with pytest.raises(Exception) as e:
        (df.write.format("raftlog").option("servers", addr).option("tlsCa", str(pki.ca))
         .option("token", pki.tokens["reader"]).option("loadId", f"nope-{tag}")
         .mode("append").save())
    assert "FORBIDDEN" in str(e.value) and pki.tokens["reader"] not in str(e.value)


def test_the_staging_client_refuses_bad_credentials_at_once(tls_node, tmp_path) -> None:
    addr, pki = tls_node
    for security, code in ((ConnSecurity(str(pki.ca), token="rl_wrong"), "UNAUTHENTICATED"),
                           (ConnSecurity(str(pki.other / "ca.pem")), "TLS_ERROR"),
                           (ConnSecurity(), "UNAUTHENTICATED")):  # plaintext
        s = Session(addr, timeout_s=30, security=security)
        try:
            with pytest.raises(RaftlogError) as e:
                s.status()
        finally:
            s.close()
        assert e.value.code == code and "gave up" not in e.value.message
