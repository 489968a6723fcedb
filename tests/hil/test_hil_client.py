"""HIL's obm flows against obmesh's obmd drop-in, as HIL's client does them.

The client talks to the stand-in HIL server with Basic credentials and
follows its 307 redirects to obmd with the same method and body, with the
HIL Authorization header still present (as HIL's HybridHTTPClient and a
same-host deployment do).
"""
import json
import threading
import time

import pytest
import requests

from conftest import HIL_PASS, HIL_USER


class HILClient:
    """The parts of hil.client.node.Node that touch obm."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.session = requests.Session()
        self.session.auth = (HIL_USER, HIL_PASS)

    def request(self, method, path, data=None, stream=False):
        url = self.endpoint + "/v0/node/" + path
        resp = self.session.request(method, url, data=data, allow_redirects=False, stream=stream)
        if resp.status_code == 307:
            # Re-send the same method and body; keep the (unrelated) HIL
            # Authorization header, which obmd must ignore.
            resp = self.session.request(method, resp.headers["Location"], data=data, allow_redirects=False,
                                        stream=stream, timeout=None if stream else 30)
        return resp

    def check(self, resp):
        if 200 <= resp.status_code < 300:
            return resp.json() if resp.content else None
        raise FailedAPICall(resp.status_code, resp.text)

    def register(self, node, obmd_uri, obmd_admin_token):
        body = {"obmd": {"uri": obmd_uri, "admin_token": obmd_admin_token}}
        return self.check(self.request("PUT", node, json.dumps(body)))

    def enable_obm(self, node):
        return self.check(self.request("PUT", node + "/obm", json.dumps({"enabled": True})))

    def disable_obm(self, node):
        return self.check(self.request("PUT", node + "/obm", json.dumps({"enabled": False})))

    def power_cycle(self, node, force=False):
        return self.check(self.request("POST", node + "/power_cycle", json.dumps({"force": force})))

    def power_off(self, node):
        return self.check(self.request("POST", node + "/power_off"))

    def power_on(self, node):
        return self.check(self.request("POST", node + "/power_on"))

    def set_bootdev(self, node, dev):
        return self.check(self.request("PUT", node + "/boot_device", json.dumps({"bootdev": dev})))

    def power_status(self, node):
        return self.check(self.request("GET", node + "/power_status"))

    def show_console(self, node):
        resp = self.request("GET", node + "/console", stream=True)
        if 200 <= resp.status_code < 300:
            return resp
        raise FailedAPICall(resp.status_code, resp.text)


class FailedAPICall(Exception):
    def __init__(self, status, text):
        super().__init__("%s %r" % (status, text))
        self.status = status
        self.text = text


@pytest.fixture
def client(obmd, hil):
    c = HILClient(hil.endpoint)
    for node in ("node-99", "node-98"):
        obmd.register(node)
        c.register(node, obmd.uri(node), obmd.admin_token)
    return c


def node_token(hil, node):
    return hil.state.nodes[node]["token"]


def test_blocked_until_enabled(client):
    for call in (lambda: client.power_off("node-99"), lambda: client.power_on("node-99"),
                 lambda: client.set_bootdev("node-99", "A"), lambda: client.power_cycle("node-99", True),
                 lambda: client.power_cycle("node-99", False), lambda: client.power_status("node-99"),
                 lambda: client.show_console("node-99")):
        with pytest.raises(FailedAPICall) as e:
            call()
        assert e.value.status == 409
        assert json.loads(e.value.text)["type"] == "BlockedError"


def test_no_token_before_enable(client, obmd):
    """Before HIL enables obm, obmd itself holds no token for the node: a
    well-formed token it never issued is 401 (HIL's 409 never reaches it)."""
    assert obmd_status(obmd, "node-99", "0123456789abcdef0123456789abcdef") == (401, "")


def obmd_status(obmd, node, token):
    """power_status straight at obmd with a token (not through HIL, whose
    own 409 for a disabled node says nothing of obmd)."""
    r = requests.get(obmd.uri(node) + "/power_status?token=" + token, timeout=30)
    return r.status_code, r.text


def test_enable_disable_mixed_order(client, hil, obmd):
    issued = []
    for op in ("enable", "enable", "disable", "disable", "enable", "disable", "enable", "enable", "disable"):
        getattr(client, op + "_obm")("node-99")
        if op == "enable":
            assert client.power_status("node-99") == {"power_status": "Mock Status"}
            token = node_token(hil, "node-99")
            assert token not in issued, "obmd issued the same token twice"
            issued.append(token)
            # Only the newest token works at obmd: every earlier one was
            # replaced (re-enable) or revoked (disable).
            assert obmd_status(obmd, "node-99", token) == (200, '{"power_status":"Mock Status"}\n')
            for old in issued[:-1]:
                assert obmd_status(obmd, "node-99", old) == (401, ""), old
        else:
            assert node_token(hil, "node-99") is None
    # Disabled now: HIL blocks with its own 409, and obmd itself refuses
    # every token it ever issued.
    with pytest.raises(FailedAPICall) as e:
        client.power_status("node-99")
    assert e.value.status == 409
    assert len(issued) == 5
    for old in issued:
        assert obmd_status(obmd, "node-99", old) == (401, ""), old


def test_power_operations(client):
    client.enable_obm("node-99")
    assert client.power_off("node-99") is None
    assert client.power_status("node-99") == {"power_status": "Mock Status"}
    assert client.power_on("node-99") is None
    assert client.set_bootdev("node-99", "A") is None
    assert client.power_cycle("node-99", True) is None
    assert client.power_cycle("node-99", False) is None
    assert client.power_cycle("node-99") is None
    with pytest.raises(FailedAPICall) as e:
        client.power_cycle("node-99", "wrong")
    assert e.value.status == 400 and e.value.text == ""
    with pytest.raises(FailedAPICall) as e:
        client.set_bootdev("node-99", "invalid")
    assert e.value.status == 400 and e.value.text == ""


def test_nodes_are_independent(client, hil, obmd):
    client.enable_obm("node-99")
    client.enable_obm("node-98")
    t99, t98 = node_token(hil, "node-99"), node_token(hil, "node-98")
    assert t99 != t98
    # A node's token opens that node only.
    assert obmd_status(obmd, "node-98", t99) == (401, "")
    assert obmd_status(obmd, "node-99", t98) == (401, "")
    client.disable_obm("node-98")
    assert client.power_status("node-99") == {"power_status": "Mock Status"}
    # At obmd: node-98's revoked token is refused, node-99's still works.
    assert obmd_status(obmd, "node-98", t98) == (401, "")
    assert obmd_status(obmd, "node-99", t99) == (200, '{"power_status":"Mock Status"}\n')


def test_console_lines(client):
    client.enable_obm("node-99")
    resp = client.show_console("node-99")
    assert resp.headers["Content-Type"] == "application/octet-stream"
    lines = resp.iter_lines()
    for i in range(11):
        assert next(lines) == str(i).encode()
    resp.close()


def test_disable_ends_console_and_old_token_is_401(client, hil, obmd):
    client.enable_obm("node-99")
    token = node_token(hil, "node-99")
    resp = client.show_console("node-99")
    lines = resp.iter_lines()
    got = [next(lines) for _ in range(5)]
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    ended = threading.Event()
    last = []

    def drain():
        for line in lines:
            last.append(int(line))
        ended.set()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    time.sleep(0.2)  # let the stream run a little
    client.disable_obm("node-99")
    assert ended.wait(15), "the console did not end after disable"
    t.join(5)
    # Every call with the revoked token is now 401 at obmd.
    for method, op, body in (("GET", "power_status", None), ("POST", "power_on", None), ("POST", "power_off", None),
                             ("POST", "power_cycle", '{"force": true}'), ("PUT", "boot_device", '{"bootdev": "A"}'),
                             ("GET", "console", None)):
        r = requests.request(method, obmd.uri("node-99") + "/" + op + "?token=" + token, data=body)
        assert r.status_code == 401 and r.text == "", (op, r.status_code)
    # A new token gives a console that continues past what was read (obmd
    # loses the line being written when a stream is cut).
    client.enable_obm("node-99")
    resp2 = client.show_console("node-99")
    first = int(next(resp2.iter_lines()))
    prev = last[-1] if last else 4
    assert prev + 2 <= first <= prev + 3
    resp2.close()


def test_requests_follows_307_itself(client, hil, obmd):
    """HIL's RequestsHTTPClient lets requests follow the 307 (same method, body)."""
    client.enable_obm("node-99")
    s = requests.Session()
    s.auth = (HIL_USER, HIL_PASS)
    r = s.post(hil.endpoint + "/v0/node/node-99/power_cycle", data=json.dumps({"force": False}))
    assert r.status_code == 200 and r.text == ""
    r = s.get(hil.endpoint + "/v0/node/node-99/power_status")
    assert r.json() == {"power_status": "Mock Status"}
    r = s.put(hil.endpoint + "/v0/node/node-99/boot_device", data=json.dumps({"bootdev": "B"}))
    assert r.status_code == 200
