# A test backend for the proxy tests: answers JSON with its machine id, the headers it got
# and the concurrency it has seen; answers 500 if its concurrency ever exceeds $LIMIT.
# /healthz fails while the file `sick` exists in its working directory. ?sleep=MS delays.
# A WebSocket upgrade (/ws) is accepted (RFC 6455 handshake) and then every byte received is
# echoed back, prefixed once by the machine id and a newline.
# /shape/<kind> answers in one of HTTP/1.1's framings (chunked, big, close, 204, hop, drop);
# POST answers the length and a checksum of the body it got; HEAD answers a head only.
import base64, hashlib, http.server, json, os, socketserver, threading, time, urllib.parse

LOCK = threading.Lock()
STATE = {"cur": 0, "max": 0, "count": 0}
MID = os.environ.get("FLY_MACHINE_ID", "?")
LIMIT = int(os.environ.get("LIMIT", "0"))
SICK = "sick"


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        if u.path == "/healthz":
            sick = os.path.exists(SICK)
            return self.reply(500 if sick else 200, b"sick" if sick else b"ok")
        if u.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.echo_websocket()
        if u.path.startswith("/shape/"):
            return self.shape(u.path[len("/shape/"):], urllib.parse.parse_qs(u.query))
        with LOCK:
            STATE["cur"] += 1
            STATE["count"] += 1
            STATE["max"] = max(STATE["max"], STATE["cur"])
            cur = STATE["cur"]
        try:
            q = urllib.parse.parse_qs(u.query)
            ms = int(q.get("sleep", ["0"])[0])
            if ms:
                time.sleep(ms / 1000.0)
            body = json.dumps({
                "machine": MID,
                "cur": cur,
                "max": STATE["max"],
                "count": STATE["count"],
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }).encode()
        finally:
            # The request stops counting before its answer leaves: once the proxy has the
            # answer (and may send the next request), this handler no longer counts, so
            # the count never includes a request the proxy already considers done.
            with LOCK:
                STATE["cur"] -= 1
        over = LIMIT and cur > LIMIT
        self.reply(500 if over else 200, body)

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "1234")
        self.end_headers()

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            n = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(n) if n else b""
        self.reply(200, json.dumps({
            "machine": MID,
            "length": len(body),
            "checksum": sum((k + 1) * b for k, b in enumerate(body)) % 1000000007,
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }).encode())

    def shape(self, kind, q):
        if kind == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            for piece in [b"hello", b", ", b"chunked", b" world"]:
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                time.sleep(0.01)
            self.wfile.write(b"0\r\nX-Checksum: 1\r\n\r\n")
        elif kind == "big":
            n = int(q.get("n", ["1000000"])[0])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            pattern = b"0123456789" * 6554
            sent = 0
            while sent < n:
                piece = pattern[: min(len(pattern), n - sent)]
                self.wfile.write(piece)
                sent += len(piece)
        elif kind == "close":
            # No length and no chunks: the body ends when the connection does.
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"until the connection closes")
            self.close_connection = True
        elif kind == "204":
            self.send_response(204)
            self.end_headers()
        elif kind == "hop":
            self.send_response(200)
            self.send_header("Connection", "keep-alive, X-Private")
            self.send_header("X-Private", "for this connection only")
            self.send_header("Keep-Alive", "timeout=5")
            self.send_header("X-Kept", "1")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        elif kind == "drop":
            # Answers as if the connection stayed open, then closes it.
            self.reply(200, b"dropped after this")
            self.close_connection = True
        else:
            self.reply(404, b"no such shape")

    def echo_websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1((key + guid).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.wfile.write((MID + "\n").encode())
        self.wfile.flush()
        while True:
            data = self.connection.recv(65536)
            if not data:
                break
            self.connection.sendall(data)
        self.close_connection = True

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


S(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
