"""`ggmlpy viz --serve`: the written file over HTTP on the loopback interface only, for
dumps too large to open comfortably from file:// in some browsers. Blocks until Ctrl-C."""
from __future__ import annotations

import functools
import http.server
import os
import sys


def serve(path: str, port: int = 0) -> None:
    directory, name = os.path.split(os.path.abspath(path))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving http://127.0.0.1:{httpd.server_address[1]}/{name} (Ctrl-C stops)", file=sys.stderr)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
