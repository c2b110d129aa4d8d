"""Client profiles (issue 29 item 4) as a user meets them: `raftlog profile create/use/list/
show/delete`, then produce, consume and status through a profile against a real cluster, with
no --servers; the precedence flags > env vars > profile > default; an unknown profile names the
ones that exist; a malformed file names its line; the file is private (0600) and written
whole."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cli_helpers import cli, free_base_port, raftlog
from raft.cli.localcluster import LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = LocalCluster(tmp_path_factory.mktemp("profiles"), nodes=3)
    c.start()
    try:
        c.wait_leader(timeout=60)
        yield c
    finally:
        c.stop()


def dead_servers() -> str:
    """An address nobody listens on: a client sent there fails with UNAVAILABLE."""
    return f"127.0.0.1:{free_base_port(1)}"


class Profiles:
    """`raftlog` with RAFTLOG_CONFIG_DIR pointing at a test's own directory."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "config"
        self.env = {"RAFTLOG_CONFIG_DIR": str(self.dir)}

    @property
    def file(self) -> Path:
        return self.dir / "profiles.toml"

    def cli(self, *args: str, **env: str):
        """In-process: for commands that touch no cluster."""
        return cli(*args, extra_env={**self.env, **env})

    def run(self, *args: str, stdin: str = "", **env: str):
        """A real `raftlog` process."""
        return raftlog(*args, stdin=stdin, extra_env={**self.env, **env})


@pytest.fixture
def profiles(tmp_path: Path) -> Profiles:
    return Profiles(tmp_path)


def test_produce_consume_and_status_through_the_selected_profile(
        cluster: LocalCluster, profiles: Profiles) -> None:
    res = profiles.cli("profile", "create", "local", "--servers", cluster.servers,
                       "--acks", "leader", "--timeout", "20")
    assert res.returncode == 0, res.stderr
    assert profiles.cli("profile", "use", "local").returncode == 0

    res = profiles.run("produce", "--json", stdin="through-a-profile\n")
    assert res.returncode == 0, res.stderr
    offset = json.loads(res.stdout.splitlines()[0])["offset"]
    res = profiles.run("consume", "--from", str(offset), "--json", "--timeout", "20")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[0])["value"] == "through-a-profile"
    res = profiles.run("status", "--json")
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    assert len(nodes) == 3 and all("role" in n for n in nodes), res.stdout


def test_flags_beat_env_vars_which_beat_the_profile(cluster: LocalCluster,
                                                    profiles: Profiles) -> None:
    dead = dead_servers()
    assert profiles.cli("profile", "create", "dead", "--servers", dead, "--use").returncode == 0
    assert profiles.cli("profile", "create", "live", "--servers",
                        cluster.servers).returncode == 0

    # The selected profile points nowhere: produce fails, naming where it tried.
    res = profiles.run("produce", "--timeout", "2", stdin="x\n")
    assert res.returncode == 1 and "UNAVAILABLE" in res.stderr, res.stderr
    # --profile picks another profile for one command.
    res = profiles.run("produce", "--profile", "live", "--json", stdin="picked\n")
    assert res.returncode == 0, res.stderr
    # An env var beats the profile it would otherwise use ...
    res = profiles.run("produce", "--profile", "live", "--timeout", "2", stdin="x\n",
                       RAFTLOG_SERVERS=dead)
    assert res.returncode == 1 and "UNAVAILABLE" in res.stderr, res.stderr
    # ... and a flag beats the env var.
    res = profiles.run("produce", "--servers", cluster.servers, "--json", stdin="flag\n",
                       RAFTLOG_SERVERS=dead)
    assert res.returncode == 0, res.stderr


def test_config_show_names_the_source_of_each_client_setting(profiles: Profiles,
                                                             tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("not-for-your-eyes")
    assert profiles.cli("profile", "create", "p", "--servers", "10.0.0.1:7101",
                        "--timeout", "7", "--token-file", str(token), "--use").returncode == 0

    def sources(*args: str, **env: str) -> dict[str, tuple]:
        res = profiles.cli("config", "show", "--node-id", "1", "--json", *args, **env)
        assert res.returncode == 0, res.stderr
        assert "not-for-your-eyes" not in res.stdout
        return {r["setting"]: (r["value"], r["source"]) for r in json.loads(res.stdout)[
            "settings"] if r["setting"].endswith("(client)")}

    got = sources()
    assert got["profile (client)"] == ("p", f"selected in {profiles.file}")
    assert got["servers (client)"] == ("10.0.0.1:7101", "profile p")
    assert got["timeout (client)"] == (7.0, "profile p")
    assert got["token (client)"] == ("(set, hidden)", "profile p")
    got = sources(RAFTLOG_SERVERS="10.0.0.2:7101", RAFTLOG_TLS_CA="/ca.pem")
    assert got["servers (client)"] == ("10.0.0.2:7101", "env RAFTLOG_SERVERS")
    assert got["tls_ca (client)"] == ("/ca.pem", "env RAFTLOG_TLS_CA")
    got = sources("--servers", "10.0.0.3:7101", "--timeout", "3",
                  RAFTLOG_SERVERS="10.0.0.2:7101")
    assert got["servers (client)"] == ("10.0.0.3:7101", "flag --servers")
    assert got["timeout (client)"] == (3.0, "flag --timeout")
    assert profiles.cli("profile", "delete", "p").returncode == 0
    got = sources()
    assert got["servers (client)"][1] == "default"
    assert got["profile (client)"] == (None, "none selected")


def test_a_profile_sets_produce_acks_and_the_flag_overrides_it(profiles: Profiles,
                                                              monkeypatch) -> None:
    from raft.cli.client_settings import resolve_client
    from raft.cli.main import build_parser

    monkeypatch.setenv("RAFTLOG_CONFIG_DIR", str(profiles.dir))
    monkeypatch.delenv("RAFTLOG_SERVERS", raising=False)
    assert profiles.cli("profile", "create", "fast", "--servers", "10.0.0.1:7101",
                        "--acks", "1").returncode == 0
    for argv, want in ((["produce", "--profile", "fast"], "leader"),
                       (["produce", "--profile", "fast", "--acks", "all"], "quorum"),
                       (["produce"], "quorum")):
        args = build_parser().parse_args(argv)
        resolve_client(args)
        assert args.acks == want, argv


def test_an_unknown_profile_names_the_ones_that_exist(profiles: Profiles) -> None:
    for name in ("staging", "prod"):
        assert profiles.cli("profile", "create", name, "--servers",
                            "10.0.0.1:7101").returncode == 0
    res = profiles.run("status", "--profile", "stagin")
    assert res.returncode == 2, res.stderr
    assert "no profile named 'stagin'" in res.stderr and "prod, staging" in res.stderr
    res = profiles.cli("profile", "use", "nope", "--json")
    assert res.returncode == 2
    assert json.loads(res.stderr)["error"]["code"] == "CONFIG"
    res = profiles.run("consume", "--from", "0", RAFTLOG_PROFILE="qa")
    assert res.returncode == 2 and "no profile named 'qa'" in res.stderr, res.stderr


def test_a_malformed_file_names_the_line_and_the_fix(profiles: Profiles) -> None:
    profiles.dir.mkdir()
    profiles.file.write_text('current = "a"\n\n[profiles.a]\nservers = 10.0.0.1:7101\n')
    res = profiles.run("status")
    assert res.returncode == 2, res.stderr
    assert "not valid TOML" in res.stderr and "line 4" in res.stderr, res.stderr
    assert "raftlog profile create" in res.stderr
    profiles.file.write_text('[profiles.a]\nservers = "10.0.0.1:7101"\ntls-ca = "ca.pem"\n')
    res = profiles.cli("profile", "list")
    assert res.returncode == 2
    assert "line 3" in res.stderr and "unknown key 'tls-ca'" in res.stderr, res.stderr
    profiles.file.write_text('[profiles.a]\nservers = "10.0.0.1:7101"\ntoken = "abc"\n')
    res = profiles.cli("profile", "list")
    assert res.returncode == 2 and "line 3" in res.stderr and "token_file" in res.stderr


def test_the_file_is_private_whole_and_follows_xdg(profiles: Profiles, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    res = profiles.cli("profile", "create", "a", "--servers", "10.0.0.1:7101",
                       "--token-file", str(token))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.stat(profiles.file).st_mode) == 0o600
    assert "s3cret-token" not in profiles.file.read_text()  # the path, never the token
    assert sorted(p.name for p in profiles.dir.iterdir()) == ["profiles.toml"]  # no temp left
    res = profiles.cli("profile", "create", "a", "--servers", "10.0.0.2:7101")
    assert res.returncode == 2 and "--force" in res.stderr
    res = profiles.cli("profile", "create", "b", "--servers", "10.0.0.1:7101",
                       "--tls-ca", str(tmp_path / "missing.pem"))
    assert res.returncode == 2 and "missing.pem: no such file" in res.stderr, res.stderr
    listed = json.loads(profiles.cli("profile", "list", "--json").stdout)
    assert [p["name"] for p in listed["profiles"]] == ["a"]
    assert listed["profiles"][0]["token_file"] == str(token)

    # Without RAFTLOG_CONFIG_DIR the file lives under $XDG_CONFIG_HOME/raftlog.
    xdg = tmp_path / "xdg"
    res = cli("profile", "create", "x", "--servers", "10.0.0.1:7101",
              extra_env={"RAFTLOG_CONFIG_DIR": "", "XDG_CONFIG_HOME": str(xdg)})
    assert res.returncode == 0, res.stderr
    assert (xdg / "raftlog" / "profiles.toml").is_file()


def test_deleting_the_selected_profile_unselects_it(profiles: Profiles) -> None:
    assert profiles.cli("profile", "create", "a", "--servers", "10.0.0.1:7101",
                        "--use").returncode == 0
    shown = json.loads(profiles.cli("profile", "show", "--json").stdout)
    assert shown["name"] == "a" and shown["current"] is True
    res = profiles.cli("profile", "delete", "a")
    assert res.returncode == 0 and "no profile is selected now" in res.stdout
    assert json.loads(profiles.cli("profile", "list", "--json").stdout)["current"] is None
