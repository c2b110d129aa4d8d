"""Client profiles: named sets of client settings in one TOML file, so a user who talks to more
than one cluster (a local `raftlog up`, staging with TLS and a token) names it once and then
says `--profile staging` (or selects it with `raftlog profile use staging`).

    current = "staging"

    [profiles.staging]
    servers = "10.0.0.1:7101,10.0.0.2:7101"
    tls_ca = "/home/me/staging/ca.pem"
    token_file = "/home/me/staging/token"   # the file's path, never the token itself
    timeout = 20.0
    acks = "quorum"

The file is $RAFTLOG_CONFIG_DIR/profiles.toml, else $XDG_CONFIG_HOME/raftlog/profiles.toml, else
~/.config/raftlog/profiles.toml. It is written whole to a temporary file in the same directory,
fsynced and renamed over the old one (a crash leaves the old file or the new one, never half),
with mode 0600: it names certificate keys and token files, which is already more than other
users need to know. This module only stores; raft/cli/client_settings.py applies a profile.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raft.node.config import ConfigError

CONFIG_DIR_ENV = "RAFTLOG_CONFIG_DIR"
PROFILE_ENV = "RAFTLOG_PROFILE"
FILE_NAME = "profiles.toml"

# Every key a profile may hold, with its type; paths are stored absolute.
KEYS: dict[str, type] = {"servers": str, "tls_ca": str, "tls_cert": str, "tls_key": str,
                         "token_file": str, "timeout": float, "acks": str}
PATH_KEYS = ("tls_ca", "tls_cert", "tls_key", "token_file")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def profiles_path() -> Path:
    """Where the profiles live (see the module docstring for the order)."""
    explicit = os.environ.get(CONFIG_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser() / FILE_NAME
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "raftlog" / FILE_NAME


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"profile name {name!r} is not allowed: use letters, digits, '.', "
                          f"'_' or '-' (at most 64, starting with a letter or digit)")
    return name


@dataclass(slots=True)
class Profile:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.settings.get(key)


@dataclass(slots=True)
class ProfileFile:
    """The whole file: the profiles by name and the selected one (`current`)."""

    path: Path
    profiles: dict[str, Profile] = field(default_factory=dict)
    current: str | None = None

    @classmethod
    def load(cls, path: Path | None = None) -> "ProfileFile":
        """The profiles at `path` (default: profiles_path()); an empty set when the file does
        not exist. A malformed file is a ConfigError naming the line and the fix."""
        path = path or profiles_path()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"profiles file {path} cannot be read ({e}); fix its "
                              f"permissions or set {CONFIG_DIR_ENV} to another directory") \
                from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"profiles file {path} is not valid TOML: {e}; correct that line "
                              f"(or move the file away and recreate the profiles with "
                              f"`raftlog profile create`)") from None
        return cls._from_dict(path, text, data)

    @classmethod
    def _from_dict(cls, path: Path, text: str, data: dict[str, Any]) -> "ProfileFile":
        def bad(what: str, needle: str) -> ConfigError:
            line = _line_of(text, needle)
            at = f" (line {line})" if line else ""
            return ConfigError(f"profiles file {path}{at}: {what}; correct it with an editor "
                               f"or recreate the profile with `raftlog profile create`")

        unknown = set(data) - {"current", "profiles"}
        if unknown:
            key = sorted(unknown)[0]
            raise bad(f"unknown top-level key {key!r} (expected `current` and "
                      f"[profiles.NAME] tables)", key)
        current = data.get("current")
        if current is not None and not isinstance(current, str):
            raise bad("`current` must be a profile name in quotes", "current")
        raw = data.get("profiles", {})
        if not isinstance(raw, dict):
            raise bad("`profiles` must be tables like [profiles.NAME]", "profiles")
        out = cls(path, current=current)
        for name, table in raw.items():
            if not isinstance(table, dict):
                raise bad(f"profile {name!r} must be a table [profiles.{name}]", name)
            settings: dict[str, Any] = {}
            for key, value in table.items():
                want = KEYS.get(key)
                if want is None and key == "token":
                    raise bad(f"profile {name!r} holds a token; profiles name a token file "
                              f"instead: put the token in a file (mode 0600) and set "
                              f"token_file = \"PATH\"", key)
                if want is None:
                    raise bad(f"profile {name!r} has unknown key {key!r} (known: "
                              f"{', '.join(KEYS)})", key)
                if want is float and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                if not isinstance(value, want) or isinstance(value, bool):
                    raise bad(f"profile {name!r}: {key} must be a "
                              f"{'number' if want is float else 'string in quotes'}", key)
                settings[key] = value
            out.profiles[name] = Profile(name, settings)
        return out

    def get(self, name: str) -> Profile:
        """The named profile; unknown names get the list of the ones that exist."""
        try:
            return self.profiles[name]
        except KeyError:
            pass
        if self.profiles:
            known = ", ".join(sorted(self.profiles))
            hint = f"the profiles in {self.path} are: {known}"
        else:
            hint = f"{self.path} has no profiles yet"
        raise ConfigError(f"no profile named {name!r}: {hint}; create it with `raftlog "
                          f"profile create {name} --servers HOST:PORT,...`")

    def to_toml(self) -> str:
        lines = ["# raftlog client profiles (`raftlog profile --help`). Paths only: never put "
                 "a token here.", ""]
        if self.current is not None:
            lines += [f"current = {_quote(self.current)}", ""]
        for name in sorted(self.profiles):
            bare = re.fullmatch(r"[A-Za-z0-9_-]+", name)
            lines.append(f"[profiles.{name if bare else _quote(name)}]")
            for key in KEYS:
                value = self.profiles[name].settings.get(key)
                if value is None:
                    continue
                lines.append(f"{key} = {value!r}" if isinstance(value, float)
                             else f"{key} = {_quote(value)}")
            lines.append("")
        return "\n".join(lines)

    def save(self) -> None:
        """Write atomically with mode 0600 (see the module docstring)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".profiles-", suffix=".tmp", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.to_toml())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)


def _quote(text: str) -> str:
    """A TOML basic string: JSON's escapes are a subset TOML accepts."""
    return json.dumps(text, ensure_ascii=False)


def _line_of(text: str, needle: str) -> int | None:
    """The first line that defines `needle` (a key or a table name), for error messages."""
    pattern = re.compile(rf"^\s*(\[.*\b{re.escape(needle)}\b.*\]|\"?{re.escape(needle)}\"?\s*=)")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.search(line):
            return number
    return None


__all__ = ["CONFIG_DIR_ENV", "KEYS", "PATH_KEYS", "PROFILE_ENV", "Profile", "ProfileFile",
           "check_name", "profiles_path"]
