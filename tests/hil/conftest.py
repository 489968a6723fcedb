"""Fixtures that behave like HIL's own test setup and HIL's server.

* ``obmd``: started exactly as HIL's ``obmd_cfg`` fixture does: a JSON config
  written with ``tempfile.mkstemp`` (mode 0600) and ``obmd -config <file>``,
  readiness by TCP connect to 127.0.0.1:<port> retried 60 x 0.1 s, teardown
  with SIGTERM and wait.
* ``hil``: a small stand-in for HIL's server. Per node it keeps the obmd uri,
  the obmd admin token and the current node token; it enables and disables
  obm by POST/DELETE <uri>/token with Basic admin auth, and answers user
  operations with 307 to ``<uri>/<op>?token=<t>`` (409 when obm is disabled),
  as HIL's ``_obmd_redirect`` does.
"""
import base64
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OBMD_BIN = os.environ.get("OBMD_BIN", os.path.join(REPO, "bin", "obmd"))
HIL_USER, HIL_PASS = "hil-user", "hil-password"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def gen_token():
    return subprocess.check_output([OBMD_BIN, "-gen-token"], text=True).strip()


class OBMD:
    def __init__(self):
        self.port = free_port()
        self.admin_token = gen_token()
        fd, self.config = tempfile.mkstemp()
        with os.fdopen(fd, "w") as f:
            json.dump({"ListenAddr": ":%d" % self.port, "AdminToken": self.admin_token,
                       "DBType": "sqlite3", "DBPath": ":memory:"}, f)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([OBMD_BIN, "-config", self.config], stdout=self.log, stderr=self.log)
        for _ in range(60):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError("obmd did not start listening within 6 seconds")
        self.base = "http://localhost:%d" % self.port

    def uri(self, node):
        return "%s/node/%s" % (self.base, node)

    def register(self, node, num_writes=0):
        resp = requests.put(self.uri(node), auth=("admin", self.admin_token),
                            data=json.dumps({"type": "mock", "info": {"addr": "10.0.0.4", "NumWrites": num_writes}}))
        assert resp.ok, resp.status_code

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=15)
        os.remove(self.config)


class HILState:
    """What HIL's database keeps per node: obmd_uri, obmd_admin_token, obmd_node_token."""

    def __init__(self):
        self.nodes = {}
        self.lock = threading.Lock()


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body=b"", headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, status, typ, msg):
            self.reply(status, json.dumps({"type": typ, "msg": msg}).encode(), [("Content-Type", "application/json")])

        def body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def authed(self):
            want = "Basic " + base64.b64encode(("%s:%s" % (HIL_USER, HIL_PASS)).encode()).decode()
            return self.headers.get("Authorization") == want

        def route(self, method):
            parts = self.path.split("?")[0].strip("/").split("/")
            body = self.body()
            if not self.authed():
                return self.error(401, "AuthorizationError", "bad credentials")
            if len(parts) < 3 or parts[:2] != ["v0", "node"]:
                return self.error(404, "NotFoundError", "no such route")
            node, op = parts[2], "/".join(parts[3:])
            with state.lock:
                n = state.nodes.get(node)
            if op == "" and method == "PUT":  # node_register
                req = json.loads(body)
                with state.lock:
                    if node in state.nodes:
                        return self.error(409, "DuplicateError", node)
                    state.nodes[node] = {"uri": req["obmd"]["uri"], "admin_token": req["obmd"]["admin_token"], "token": None}
                return self.reply(200)
            if n is None:
                return self.error(404, "NotFoundError", node)
            if op == "obm" and method == "PUT":  # node_enable_disable_obm
                enabled = json.loads(body)["enabled"]
                auth = ("admin", n["admin_token"])
                if enabled:
                    resp = requests.post(n["uri"] + "/token", auth=auth)
                    if not resp.ok:
                        return self.error(500, "OBMError", "Failed to get a token for node")
                    n["token"] = resp.json()["token"]
                else:
                    resp = requests.delete(n["uri"] + "/token", auth=auth)
                    if not resp.ok:
                        return self.error(500, "OBMError", "Failed invalidate token for node")
                    n["token"] = None
                return self.reply(200)
            allowed = {"power_cycle": "POST", "power_on": "POST", "power_off": "POST",
                       "boot_device": "PUT", "power_status": "GET", "console": "GET"}
            if allowed.get(op) != method:
                return self.error(405, "MethodNotAllowed", op)
            if n["token"] is None:
                return self.error(409, "BlockedError", "OBM is not enabled")
            location = n["uri"] + "/" + op + "?token=" + n["token"]
            return self.reply(307, b"Redirecting...", [("Location", location)])

        def do_GET(self):
            self.route("GET")

        def do_PUT(self):
            self.route("PUT")

        def do_POST(self):
            self.route("POST")

        def do_DELETE(self):
            self.route("DELETE")

    return Handler


class HIL:
    def __init__(self):
        self.state = HILState()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def obmd():
    o = OBMD()
    yield o
    o.stop()


@pytest.fixture
def hil():
    h = HIL()
    yield h
    h.stop()
