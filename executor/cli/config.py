"""Optional host configuration in /etc/casebox/casebox.toml; command-line flags override it.

The file is closed like every other input: an unknown key or a wrong type is
refused with exit 64 naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib

from executor.inputs import read_capped
from journal.errors import Refused

DEFAULT_PATH = "/etc/casebox/casebox.toml"
CONFIG_MAX_BYTES = 65_536
# A fixed, documented pair far above every distribution's login, system and
# systemd DynamicUser ranges, and below 2^31 so no tool reads it as negative.
DEFAULT_SANDBOX_ID = 2_000_000_000
MAX_ID = 2**32 - 2
# How many consecutive uid/gid pairs the sandbox pool may hold: one per stage running at once (S6).
MAX_SANDBOX_IDS = 64
GROUP_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}\Z")
# The daemon's bounds (steward/server.py): setting -> (lowest, highest).
_BOUNDED = {
    "idle_seconds": (1, 86_400),
    "max_connections": (1, 4_096),
    "max_connections_per_uid": (1, 4_096),
    "stop_seconds": (1, 3_600),
}
MAX_FILE_HOSTS = 16


def _ahead_for_host() -> int:
    from steward.api import ahead_for_host

    return ahead_for_host()


@dataclasses.dataclass(frozen=True)
class Config:
    state_root: str = "/var/lib/casebox"
    socket: str = "/run/casebox/steward.sock"
    sandbox_uid: int = DEFAULT_SANDBOX_ID
    sandbox_gid: int = DEFAULT_SANDBOX_ID
    # The pool: sandbox_uid .. sandbox_uid + sandbox_ids - 1, each with the gid as far from sandbox_gid.
    sandbox_ids: int = 1
    client_uids: tuple[int, ...] = (0,)
    socket_group: str | int = "casebox"
    idle_seconds: int = 60
    max_connections: int = 32
    max_connections_per_uid: int = 8
    stop_seconds: int = 75
    index_file_hosts: tuple[str, ...] = ("files.pythonhosted.org:443",)
    # How many sandboxes a session starts ahead of their ops (docs/launcher.md, "Started ahead").
    sandboxes_ahead: int = dataclasses.field(default_factory=_ahead_for_host)
    source: str = "built-in defaults"

    def __post_init__(self) -> None:
        top = max(self.sandbox_uid, self.sandbox_gid) + self.sandbox_ids - 1
        if top > MAX_ID:
            raise Refused(f"{self.source}: sandbox_ids", f"puts the last sandbox id at {top}, past {MAX_ID}")

    @property
    def sandbox_pool(self) -> tuple[tuple[int, int], ...]:
        """(uid, gid) of every sandbox id pair: concurrent stages never share one (S6)."""
        return tuple((self.sandbox_uid + n, self.sandbox_gid + n) for n in range(self.sandbox_ids))

    def overridden(self, **flags: object) -> "Config":
        """This configuration with every flag that was given (not None) taking precedence."""
        given = {
            name: _check(name, value, f"--{name.replace('_', '-')}") for name, value in flags.items() if value is not None
        }
        return dataclasses.replace(self, **given) if given else self

    def as_dict(self) -> dict[str, object]:
        values = dataclasses.asdict(self)
        values["client_uids"] = list(self.client_uids)
        values["index_file_hosts"] = list(self.index_file_hosts)
        return values


def _check(name: str, value: object, where: str) -> object:
    if name in ("state_root", "socket"):
        if type(value) is not str or not value.startswith("/") or "\x00" in value:
            raise Refused(where, "must be an absolute path")
        return os.path.normpath(value)
    if name in ("sandbox_uid", "sandbox_gid"):
        if type(value) is not int or not 1 <= value <= MAX_ID:
            raise Refused(where, f"must be an integer from 1 to {MAX_ID}")
        return value
    if name == "sandbox_ids":
        if type(value) is not int or not 1 <= value <= MAX_SANDBOX_IDS:
            raise Refused(where, f"must be an integer from 1 to {MAX_SANDBOX_IDS}")
        return value
    if name == "client_uids":
        if type(value) not in (list, tuple) or not value or any(type(uid) is not int or not 0 <= uid <= MAX_ID for uid in value):
            raise Refused(where, "must be a non-empty list of user ids")
        return tuple(value)
    if name in _BOUNDED:
        low, high = _BOUNDED[name]
        if type(value) is not int or not low <= value <= high:
            raise Refused(where, f"must be an integer from {low} to {high}")
        return value
    if name == "socket_group":
        if (type(value) is int and 0 <= value <= MAX_ID) or (type(value) is str and GROUP_NAME.match(value)):
            return value
        raise Refused(where, "must be a group name (a-z 0-9 _ -, at most 32) or a group id")
    if name == "sandboxes_ahead":
        from steward.api import MAX_AHEAD

        if type(value) is not int or not 0 <= value <= MAX_AHEAD:
            raise Refused(where, f"must be an integer from 0 to {MAX_AHEAD}")
        return value
    if name == "index_file_hosts":
        from steward.forwarder import check_file_host

        if type(value) not in (list, tuple) or len(value) > MAX_FILE_HOSTS:
            raise Refused(where, f"must be a list of at most {MAX_FILE_HOSTS} HOST or HOST:PORT entries")
        return tuple(check_file_host(entry, where) for entry in value)
    raise Refused(where, "is not a known setting")


def load(path: str | None = None) -> Config:
    """The configuration at ``path``, or the default file if it exists, or the defaults."""
    if path is None:
        if not os.path.exists(DEFAULT_PATH):
            return Config()
        path = DEFAULT_PATH
    data = read_capped(path, CONFIG_MAX_BYTES)
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise Refused(path, "is not valid UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise Refused(path, f"is not valid TOML ({error})") from None
    # "source" records where the settings came from; it is not a setting, so _check refuses it.
    settings = {name: _check(name, value, f"{path}: {name}") for name, value in table.items()}
    return Config(source=path, **settings)
