#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/seeds/TARGET/*) from the inputs the tests use: request
and answer heads of the proxy's tests, create bodies of the API tests, catalog messages
(postcard, hand-encoded), and layers like those of crates/image/tests/hostile.rs. Run it
again after changing it; the files it writes (seed-*) are committed, beside the inputs
that fuzzing found (found-*, kept as regression seeds)."""
import gzip, io, os, tarfile

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, items):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        if old.startswith("seed-"):
            os.remove(os.path.join(d, old))
    for i, data in enumerate(items):
        with open(os.path.join(d, f"seed-{i:02}"), "wb") as f:
            f.write(data)


heads = [
    b"GET / HTTP/1.1\r\nHost: a.localhost\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
    b"HEAD /a?b=c HTTP/1.1\r\nHost: web.localhost\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
    b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"GET / HTTP/1.1\nHost: a\n\n",
    b"GET http://other.example/x HTTP/1.1\r\nfly-force-instance-id: m1\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-A: caf\xc3\xa9\r\n\r\n",
]
write("h1_request_head", heads)

answers = [
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
    b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\nConnection: Keep-Alive\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n"
    b"Keep-Alive: timeout=5\r\nX-Kept: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n",
    b"5\r\nhello world\r\n0\r\n\r\n",
]
write("h1_answer", [b"H" + a for a in answers])

configs = [
    b'{"config": {"driver": "process", "image": "process", "init": {"exec": ["sleep", "100"]}}, "skip_launch": true}',
    b'{"name": "web-1", "region": "local", "lease_ttl": 30, "config": {"image": "docker.io/library/busybox:latest",'
    b' "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}, "env": {"A": "1"}, "metadata": {"fly_process_group": "app"},'
    b' "services": [{"protocol": "tcp", "internal_port": 8080, "ports": [{"port": 80, "handlers": ["http"]}],'
    b' "concurrency": {"type": "requests", "soft_limit": 20, "hard_limit": 25}, "autostart": true, "autostop": "stop",'
    b' "min_machines_running": 1}], "checks": {"alive": {"type": "http", "port": 8080, "interval": "1s", "timeout": "500ms",'
    b' "grace_period": "2s", "method": "GET", "path": "/"}}, "restart": {"policy": "on-failure", "max_retries": 3},'
    b' "stop_config": {"signal": "SIGTERM", "timeout": "5s"}, "files": [{"guest_path": "/etc/x", "raw_value": "aGk=", "mode": 420}],'
    b' "auto_destroy": true, "schedule": "hourly", "standbys": ["m1"], "dns": {"skip_registration": false},'
    b' "containers": [], "rootfs": {"size_gb": 2, "persist": null}, "metrics": {"port": 9091, "path": "/m"}}}',
    b'{"config": {"image": "process", "init": {"exec": ["true"], "tty": true},'
    b' "services": [{"internal_port": 80, "ports": [{"port": 80, "tls_options": {"alpn": ["h2"]}, "x_extra": [1.5, null]}]}]}}',
    b'{"config": {"size": "shared-cpu-2x", "image": "process", "init": {"cmd": "sh -c true", "entrypoint": ["/bin/sh"]},'
    b' "mounts": [{"volume": "vol_1", "path": "/data"}]}}',
    b'{"config": {"driver": "process", "guest": {"cpus": 1}, "size": "shared-cpu-1x"}}',
    b'  ',
]
write("machine_config", configs)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(s):
    b = s.encode()
    return varint(len(b)) + b


def row(owner, kind, key, body):
    return (string(owner) + varint(kind) + string(key) + varint(3) + b"\x00" + varint(1_700_000_000_000)
            + varint(len(body)) + body + bytes(32) + varint(64) + bytes(64))


machine = b'{"id":"m1","app":"web","host_id":"h1","state":"started","config":{}}'
messages = [
    # SyncMsg::Request { from, from_addr: 127.0.0.1:7000, digest: [] }
    varint(0) + string("h1") + varint(0) + bytes([127, 0, 0, 1]) + varint(7000) + varint(0),
    # SyncMsg::Response { from, rows: [row], want: [], complete: None }
    varint(1) + string("h2") + varint(1) + row("h1", 1, "m1", machine) + varint(0) + b"\x00",
    # SyncMsg::Push { rows: [], complete: None }
    varint(2) + varint(0) + b"\x00",
    # BroadcastItem::Hint { owner, kind, key, version }
    varint(1) + string("h1") + varint(1) + string("m1") + varint(9),
    # Goodbye { node_id, bump }
    string("h1") + varint(2),
]
write("catalog_frame", [b"M" + m for m in messages])


def tar_of(entries, compress=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, extra in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1
            data = None
            if kind == "file":
                data = extra
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, extra
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, extra
            elif kind == "char":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "xattr":
                info.size = 1
                data = b"x"
                info.pax_headers = {"SCHILY.xattr.user.k": "v", "SCHILY.xattr.trusted.overlay.opaque": "y"}
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


layers = [
    tar_of([("etc/", "dir", None), ("etc/hosts", "file", b"127.0.0.1 localhost\n"), ("bin/sh", "symlink", "busybox"),
            ("bin/ls", "hardlink", "etc/hosts")], compress=True),
    tar_of([("../../../../tmp/pwned", "file", b"x")]),
    tar_of([("a/", "dir", None), ("a/../../pwned", "file", b"x")]),
    tar_of([("escape", "symlink", "/"), ("escape/tmp/pwned", "file", b"x")]),
    tar_of([("d", "symlink", "/tmp"), ("d/sub/", "dir", None)]),
    tar_of([("passwd", "hardlink", "/etc/passwd")]),
    tar_of([("null", "char", None), ("pipe", "fifo", None)]),
    tar_of([("a/", "dir", None), ("a/b", "file", b"x"), ("a/.wh.b", "file", b""), ("a/.wh..wh..opq", "file", b""),
            ("c", "xattr", None)]),
]
write("image_layer", [b"T" + l for l in layers])
