"""The HTTP side of ``airfs catalog serve``: a threaded HTTP/1.1 server (the standard
library's), bearer-token authentication, routing, TLS, body limits, and Unity Catalog's error
shape for every refusal (its own malformed-request answers included). An unexpected error is
logged with its traceback and answered ``500 INTERNAL_ERROR`` without one.

Without TLS the server listens on a loopback address only, unless ``allow_insecure_remote``
is given: tokens would cross the network in the clear. With TLS each connection's handshake
runs in its own worker thread, so a slow client holds no other. At most
:data:`MAX_CONNECTIONS` connections are served at once (the next one waits to be accepted).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, cast

from airfs.catalog.model import CatalogError, Who
from airfs.origin.base import OriginError

from . import files, resources, tables
from .context import Api, Body, Reply, Request
from .errors import ApiError, from_origin
from .tokens import TokenStore
from .uploads import DOWNLOAD_URL, PART_URL, Uploads, is_file_action

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
#: seconds a connection may stay silent
IDLE_TIMEOUT = 120.0
NOBODY = Who(frozenset())
#: an unread request body up to this size is read and dropped after a refusal (the client
#: then gets the answer); above it the connection is closed instead
DRAIN_LIMIT = 16 << 20


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server(ThreadingHTTPServer):
    """Holds what every request needs: the :class:`Api`, the tokens, the uploads, the TLS
    context (or None)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        api: Api,
        tokens: TokenStore,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.api = api
        self.tokens = tokens
        self.uploads = Uploads(api)
        self.tls = tls
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        #: the requests holding a slot (by id): whoever removes one frees its slot, once
        self._holding: set[int] = set()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` in a thread of its own, within a slot; the slot is freed once,
        by the thread when it ends, or here when starting it failed. An exception out of
        ``start()`` may come after the thread began (SIGTERM's ``SystemExit`` raised in its
        wait for the thread): then whichever ends first frees the slot, never both."""
        self._slots.acquire()
        self._holding.add(id(request))
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._free(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._free(request)

    def _free(self, request: Any) -> None:
        try:
            self._holding.remove(id(request))  # one step under the GIL: one caller wins
        except KeyError:
            return
        self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError | TimeoutError):
            # a client that does not speak TLS, or went away during the handshake
            log.info("connection from %s ended: %s", client_address[0], exc)
        else:
            log.exception("connection from %s failed", client_address[0])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"{'https' if self.tls else 'http'}://{shown}:{port}"


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "airfs-catalog"
    timeout = IDLE_TIMEOUT

    def setup(self) -> None:
        # answers go out as headers then body: without this, Nagle's algorithm and the
        # client's delayed ACK hold each small answer back about 40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.server.tls is not None:
            self.request.settimeout(self.timeout)
            self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError, ssl.SSLError) as exc:
            log.info("connection from %s ended: %s", self.client_address[0], exc)

    # -- the standard library's own answers in Unity Catalog's shape ------------------------

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        kind = {501: "NOT_IMPLEMENTED"}.get(code, "BAD_REQUEST" if code < 500 else "INTERNAL_ERROR")
        err = ApiError(code, kind, message or self.responses.get(code, ("error",))[0])
        self.close_connection = True
        self._send(Reply(code, err.body(), {"Connection": "close"}))

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)

    # -- requests ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _body(self) -> Body:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            raise ApiError(411, "INVALID_PARAMETER_VALUE", "send the body with a Content-Length")
        raw = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            raise ApiError(400, "INVALID_PARAMETER_VALUE", f"bad Content-Length {raw!r}")
        return Body(cast(BinaryIO, self.rfile), length)

    def _request(self, body: Body, who: Who, principal: str) -> Request:
        raw_path, _, query = self.path.partition("?")
        try:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, max_num_fields=100)
        except ValueError as exc:
            raise ApiError(400, "INVALID_PARAMETER_VALUE", f"bad query: {exc}") from None
        scheme = "https" if self.server.tls else "http"
        host = self.headers.get("Host") or self.server.url.split("://", 1)[1]
        return Request(
            method=self.command,
            raw_path=raw_path,
            query=dict(pairs),
            headers=cast(Mapping[str, str], self.headers),  # case-insensitive
            who=who,
            principal=principal,
            body=body,
            base_url=f"{scheme}://{host}",
            underscores="databricks-sdk" in self.headers.get("User-Agent", ""),
        )

    def _authenticate(self) -> tuple[Who, str]:
        auth = self.headers.get("Authorization", "")
        scheme, _, text = auth.partition(" ")
        if scheme.lower() != "bearer" or not text.strip():
            raise ApiError(401, "UNAUTHENTICATED", "send Authorization: Bearer <token>")
        try:
            tok = self.server.tokens.verify(text.strip())
        except CatalogError as exc:
            raise ApiError(503, "TEMPORARILY_UNAVAILABLE", str(exc)) from None
        except OriginError as exc:
            raise from_origin(exc, "the token list") from None
        if tok is None:
            raise ApiError(401, "UNAUTHENTICATED", "invalid or revoked token")
        return tok.who(), tok.principal

    def _route(self, body: Body) -> Reply:
        path = self.path.partition("?")[0]
        uploads = self.server.uploads
        if self.command == "PUT" and path.startswith(PART_URL):
            return uploads.put_part(self._request(body, NOBODY, ""), path[len(PART_URL) :])
        if self.command in ("GET", "HEAD") and path.startswith(DOWNLOAD_URL):
            return uploads.get_download(self._request(body, NOBODY, ""), path[len(DOWNLOAD_URL) :])
        if self.command == "GET" and path == "/.well-known/databricks-config":
            return Reply(body={})  # databricks-sdk's discovery probe: no OIDC here, tokens only
        who, principal = self._authenticate()
        req = self._request(body, who, principal)
        api = self.server.api
        if path.startswith(resources.PREFIX):
            decoded = urllib.parse.unquote(path[len(resources.PREFIX) :])
            if "\0" in decoded:
                raise ApiError(400, "INVALID_PARAMETER_VALUE", "path contains a NUL")
            if decoded == "tables" or decoded.startswith("tables/"):
                return tables.handle(api, req, decoded[len("tables") :])
            return resources.handle(api, req, decoded)
        if is_file_action(req):
            return uploads.file_action(req, path[len(files.FILES) :])
        if path.startswith((files.FILES + "/", files.DIRECTORIES + "/")):
            return files.handle(api, req)
        if self.command == "POST" and path == "/api/2.0/fs/create-upload-part-urls":
            return uploads.part_urls(req)
        if self.command == "POST" and path == "/api/2.0/fs/create-download-url":
            return uploads.download_url(req)
        raise ApiError(404, "ENDPOINT_NOT_FOUND", f"no endpoint {self.command} {path}")

    def _serve(self) -> None:
        body: Body | None = None
        try:
            body = self._body()
            reply = self._route(body)
        except ApiError as exc:
            reply = Reply(exc.status, exc.body())
        except Exception:
            log.exception("%s %s failed", self.command, self.path)
            reply = Reply(
                500,
                {
                    "error_code": "INTERNAL_ERROR",
                    "message": "internal error (see the server's log)",
                },
            )
        if body is None or body.left > DRAIN_LIMIT:
            self.close_connection = True  # an unread large body: do not read it to go on
            reply.headers["Connection"] = "close"
        else:
            try:
                body.drain()
            except ApiError:
                self.close_connection = True
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        data = reply.body
        if data is None:
            data = b""
        elif not isinstance(data, bytes):
            data = json.dumps(data).encode()
            reply.headers.setdefault("Content-Type", "application/json")
        self.send_response(reply.status)
        for k, v in reply.headers.items():
            self.send_header(k, v)
        if reply.stream is None and "Content-Length" not in reply.headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if reply.stream is None:
            self.wfile.write(data)
            return
        try:
            for chunk in reply.stream:
                self.wfile.write(chunk)
        except (OriginError, OSError) as exc:
            log.warning("%s %s: transfer ended early: %s", self.command, self.path, exc)
            self.close_connection = True


def make_server(
    api: Api,
    tokens: TokenStore,
    host: str,
    port: int,
    *,
    tls: ssl.SSLContext | None = None,
    allow_insecure_remote: bool = False,
) -> Server:
    """A server bound to ``host:port`` (port 0: any free one); refuses a non-loopback
    address without TLS unless ``allow_insecure_remote``."""
    if tls is None and not is_loopback(host) and not allow_insecure_remote:
        raise CatalogError(
            f"{host} is not a loopback address: give --tls-cert/--tls-key (tokens would cross "
            "the network in the clear), or --allow-insecure-remote"
        )
    return Server((host, port), api, tokens, tls)


def tls_context(cert: str, key: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx
