"""A plain OpenAI-compatible chat endpoint on 127.0.0.1 for ``graftpool eval --endpoint``'s tests
(``evaluate_endpoint`` speaks to any such server): each test gives the answer a request gets."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[dict], tuple[int, dict]]
"""A request's JSON body -> the HTTP status and the JSON reply."""


def boxed_choices(body: dict, content: str = "\\boxed{1}") -> dict:
    """A chat completion's ``n`` choices, each the same answer."""
    return {"choices": [{"index": i, "message": {"role": "assistant", "content": content}} for i in range(body["n"])]}


@contextmanager
def chat_endpoint(answer: Answer) -> Iterator[str]:
    """The server's ``/v1`` URL while the block runs; shut down after."""

    class Chat(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
            code, reply = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
