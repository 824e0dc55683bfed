"""Does a node's scheduler daemon accept a TCP connection? The second sign a node check needs
(orchestrator/observe/node_check.py, issue 24 goal 2): a step that is slow to start on a node says
the scheduler is slow, not that the node is dead. A node that is up accepts a connection on its
daemon's port however busy it is (its kernel answers, in the listen queue); a crashed node (powered
off, its link down, its daemon dead) does not: no answer, a refusal, no route.

Every node is asked at once from one thread (non-blocking connects, one ``select`` loop), so a
silence of a thousand nodes costs one round trip and at most ``timeout_s``. A connection is closed
as soon as it is made: nothing is sent."""

from __future__ import annotations

import errno
import selectors
import socket
import time

Address = tuple[str, int]  # (host, port)


def daemons_accept(addresses: dict[str, Address | None], timeout_s: float) -> dict[str, bool | None]:
    """Per node: True where its daemon accepted a connection within ``timeout_s``; False where it
    refused, was out of reach or did not answer in time; None where no address is known or its name
    does not resolve (nothing proved)."""
    answers: dict[str, bool | None] = dict.fromkeys(addresses)
    selector = selectors.DefaultSelector()
    deadline = time.monotonic() + timeout_s  # name lookups included: a slow resolver leaves the rest unasked
    try:
        for node, address in addresses.items():
            if time.monotonic() >= deadline:
                break
            answers[node] = _start(selector, node, address)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]  # registered as sockets
                answers[key.data] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                selector.unregister(sock)
                sock.close()
        for key in list(selector.get_map().values()):  # no answer in time
            answers[key.data] = False
    finally:
        for key in list(selector.get_map().values()):  # closed however the ask ended
            key.fileobj.close()  # type: ignore[union-attr]  # sockets
        selector.close()
    return answers


def _start(selector: selectors.BaseSelector, node: str, address: Address | None) -> bool | None:
    """The connection to ``address`` begun and registered (None: its answer is pending), or its
    answer at once: False (refused, no route), None (no address, a name that does not resolve)."""
    if address is None:
        return None
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        code = sock.connect_ex(where)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            return False
        selector.register(sock, selectors.EVENT_WRITE, node)
    except BaseException:
        sock.close()
        raise
    return None
