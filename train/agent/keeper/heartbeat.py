"""The keepers' heartbeat (train.agent.keeper.loop): HTTPS on the cluster network at the run's port, both
sides showing a certificate of the run's CA (train.agent.keeper.tls; plain HTTP for a run started
before), each request carrying the run's token. GET /state answers a keeper's view of the run
(train.agent.keeper.generation.View, JSON); GET /checkpoint sends this host's snapshot to a peer that copies
it (409 when its bytes no longer match its manifest)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from train.agent.keeper import replica, tls
from train.agent.keeper.generation import View

BIND_WAIT_S = 20.0  # an ending keeper answers its peers a few polls longer (loop.linger_s: 7 s by default)


def serve(spec: dict, run_dir: str, state: Callable[[], dict], serves: Callable[[], bool]) -> ThreadingHTTPServer:
    """The heartbeat of host spec["me"], in a thread: `state()` what a peer hears (a View's dict), `serves()` whether
    the snapshot may be sent."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a peer that connects and says nothing holds one thread this long, never the server

        def setup(self):
            super().setup()
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()  # here, in this request's thread: never in accept()

        def log_message(self, *args):  # one line a poll would drown the keeper's own log
            pass

        def do_GET(self):
            if self.headers.get("X-Tandem-Token") != spec["token"]:
                self.send_error(403)
                return
            if self.path == "/state":
                body = json.dumps(state()).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/checkpoint":
                snap = replica.paths(run_dir)[1]
                if not serves():
                    self.send_error(409, "this host's checkpoint does not match its manifest")
                    return
                try:
                    f = snap.open("rb")
                except OSError:
                    self.send_error(404)
                    return
                with f:
                    self.send_response(200)
                    self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
                    self.end_headers()
                    self.wfile.flush()
                    with contextlib.suppress(OSError):
                        self.connection.sendfile(f)
            else:
                self.send_error(404)

    context = tls.server_context(spec)

    class Server(ThreadingHTTPServer):
        def get_request(self):
            sock, address = super().get_request()
            if context is None:
                return sock, address
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        def handle_error(self, request, client_address):  # a stranger without the run's certificate: refused
            pass

    address = (spec["addresses"][spec["me"]], int(spec["port"]))
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        try:
            server = Server(address, Handler)
            break
        except OSError as err:  # the run's last keeper still lingers on the port for its peers: a few seconds
            if err.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="heartbeat").start()
    return server


def ask(spec: dict, peer: str) -> View | None:
    """What `peer`'s keeper says, or None when it does not answer."""
    url = f"{tls.scheme(spec)}://{spec['addresses'][peer]}:{spec['port']}/state"
    request = urllib.request.Request(url, headers={"X-Tandem-Token": spec["token"]})
    try:
        with urllib.request.urlopen(request, timeout=2, context=tls.client_context(spec)) as answer:
            return View.of(json.loads(answer.read()))
    except (OSError, ValueError, KeyError):
        return None
