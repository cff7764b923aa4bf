"""A holder that failed tells the ranks waiting on its socket why, and no one else (singpy.launch.holder).

Its socket's name can be read by anyone in /proc/net/unix: another user's process connecting in that second
must not read the error, which names the user's paths.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from singpy.launch import holder
from singpy.launch.rendezvous import bind
from tests.support.users import ensure_other_user

SECRET = "can't build the container: /home/alice/private/project.sif is corrupt"


def _read_as(uid: int, gid: int, name: str) -> int:
    """A child of `uid` connected to @name; the descriptor where it writes what it read (nothing when the holder
    says nothing)."""
    got, put = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(got)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client:  # as rendezvous makes it
                client.settimeout(5)
                client.connect("\0" + name)
                data = b""
                while chunk := client.recv(4096):
                    data += chunk
            os.write(put, data)
        finally:
            os._exit(0)
    os.close(put)
    return got


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user's process is made as root")
@pytest.mark.parametrize("who", ["same-user", "other-user"])
def test_a_failed_holders_error_reaches_its_own_user_only(who: str) -> None:
    name = f"singpy-test-refusal/{uuid.uuid4().hex}"
    listener = bind(name)
    assert listener is not None
    other = ensure_other_user()
    if who == "other-user" and other is None:
        pytest.skip("no second user")
    uid, gid = (0, 0) if who == "same-user" or other is None else (other.pw_uid, other.pw_gid)
    reader = _read_as(uid, gid, name)
    holder._refuse_waiting(socket.socket(fileno=listener.detach()), SECRET)  # as the holder wraps it
    with os.fdopen(reader, "rb") as result:
        received = result.read()
    os.wait()
    if who == "same-user":
        assert SECRET.encode() in received
    else:
        assert received == b""
