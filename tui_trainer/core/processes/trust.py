"""What the tool checks before it trusts a socket, a folder or a pid it did not make itself.

The warm launcher's socket lives in a folder of the user's runtime directory (platformdirs:
$XDG_RUNTIME_DIR/tui-trainer, else a private folder in the temporary directory), made by
us, owned by us and closed to everyone else (0700). A client checks the folder and the
socket before it connects, and the peer's uid (SO_PEERCRED) before it sends anything: the
request carries the environment and the run's log descriptors. A pid that comes back is
believed only when the process is the launcher's child and ours, and is watched together
with its start time, so that a reused pid is never mistaken for it (or signalled).

Core layer: imports neither torch nor textual.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import struct
import tempfile
import time
import warnings
from pathlib import Path

import platformdirs

from ..session.paths import APP
from ..text import shown

WARM_PREFIX = "warm-"
LEGACY_PREFIX = "tui-trainer-warm-"     # folders of launchers before they moved here
STALE_S = 120.0     # a launcher folder with no live owner is swept after this long
SOCKET_PATH_MAX = 107     # sun_path's 108 bytes, less the NUL that ends the path


class Untrusted(Exception):
    """A socket, folder or answer that is not ours or not what it should be."""


def runtime_base() -> Path:
    """The private folder for this user's sockets, made (0700) if missing; Untrusted when
    it exists but is another user's or open to others."""
    with warnings.catch_warnings():         # no XDG_RUNTIME_DIR: it warns, then guesses
        warnings.simplefilter("ignore")
        run = Path(platformdirs.user_runtime_dir(APP, appauthor=False))
    if not os.environ.get("XDG_RUNTIME_DIR") or not run.parent.is_dir() \
            or not os.access(run.parent, os.W_OK | os.X_OK):
        run = Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"
    try:
        run.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise Untrusted(f"{run}: cannot make the launcher folder ({e.strerror})") from e
    check_private_dir(run)
    return run


def leave_base(launcher_dir: Path) -> None:
    """Removes the runtime folder that holds `launcher_dir` (a launcher's own folder, gone by
    now) when nothing else is in it, so that nothing stays in the temporary directory; a
    launcher that starts meanwhile makes it again. Only a folder named as runtime_base names
    it is removed."""
    base = launcher_dir.parent
    if launcher_dir.name.startswith(WARM_PREFIX) and \
            base.name in (APP, f"{APP}-{os.getuid()}"):
        try:
            base.rmdir()
        except OSError:
            pass


def check_private_dir(folder: Path) -> None:
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{folder} is not a folder")
    if st.st_uid != os.getuid():
        raise Untrusted(f"{folder} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise Untrusted(f"{folder} is open to other users (mode {st.st_mode & 0o777:o})")


def check_socket(path: Path) -> None:
    """The launcher socket and its folder are ours and private (before connecting)."""
    check_private_dir(path.parent)
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise Untrusted(f"{path} is not a socket of this user")


def peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def check_peer(conn: socket.socket, uid: int | None = None) -> int:
    """The peer's pid, when it runs as this user (or `uid`); Untrusted otherwise."""
    pid, peer_uid = peer(conn)
    want = os.getuid() if uid is None else uid
    if peer_uid != want:
        raise Untrusted(f"the process at the other end (pid {pid}) runs as uid {peer_uid}, "
                        f"not {want}")
    return pid


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, its identity."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def owned(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def check_child(answer: object, launcher_pid: int) -> tuple[int, int | None]:
    """A launcher's answer to a request: the pid of the child it forked, believed only if
    that process is the launcher's child and ours. Returns (pid, start time)."""
    if not isinstance(answer, dict):
        raise Untrusted(f"the launcher answered {str(answer)[:80]!r}, not a pid")
    if "pid" not in answer and isinstance(answer.get("error"), str):
        raise Untrusted(f"the launcher refused: {shown(answer['error'], 200)}")
    pid = answer.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise Untrusted(f"the launcher answered pid {str(pid)[:40]!r}")
    parent = parent_of(pid)
    if parent is None:
        # Gone already: a child that failed at once, reaped by the launcher (whose peer
        # check passed) before this read /proc. Its exit status follows on the socket;
        # starting the run again cold would run it twice.
        return pid, None
    if parent != launcher_pid or not owned(pid):
        raise Untrusted(f"pid {pid} is not a process the launcher (pid {launcher_pid}) "
                        "started for this user")
    return pid, start_time(pid)


def same_process(pid: int, started: int | None) -> bool:
    """The process `pid` still exists, is not a zombie, and is the one that started at
    `started` (None: not known, any)."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return False
    if fields[0] == "Z":
        return False
    return started is None or fields[19] == str(started)


def sweep_stale(base: Path, now: float | None = None) -> list[Path]:
    """Removes launcher folders under `base` (and legacy ones in the temporary directory)
    whose launcher is gone: ours, with an `owner.pid` naming no live process, or with none
    and older than STALE_S. Returns what it removed."""
    now = time.time() if now is None else now
    gone: list[Path] = []
    candidates = list(base.glob(WARM_PREFIX + "*"))
    candidates += list(Path(tempfile.gettempdir()).glob(LEGACY_PREFIX + "*"))
    for folder in candidates:
        try:
            st = os.lstat(folder)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            pid_file = folder / "owner.pid"
            try:
                pid, started = (int(x) for x in pid_file.read_text().split())
                alive = same_process(pid, started)
            except (OSError, ValueError):
                alive = now - st.st_mtime < STALE_S or _answers(folder / "launcher.sock")
            if not alive:
                shutil.rmtree(folder, ignore_errors=True)
                gone.append(folder)
        except OSError:
            continue
    return gone


def _answers(path: Path) -> bool:
    """Something accepts connections on this socket (a launcher of an older version)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(1)
        conn.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        conn.close()
