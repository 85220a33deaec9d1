"""A stand-in server for the rescore reference tests (tests/test_rescore_reference.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rocm_dspark.runtime.client import VllmClient

VOCAB = 97


def model_argmax(context: list[int]) -> int:
    return (context[-1] * 7 + len(context) * 3) % VOCAB


def drafter_argmax(context: list[int]) -> int:  # what the overwritten buffer yields instead
    return (context[-1] * 11 + 5) % VOCAB


class StandIn:
    """`limit`: the capture size (prefills of at most this many tokens are corrupted, None: never);
    `nospec`: a server without --speculative-config (never corrupted); `wrong_at`: the output index where
    generation emits a token that is not the model's argmax."""

    def __init__(self, *, limit: int | None = 64, wrong_at: int | None = None, max_model_len: int = 4096):
        self.limit, self.wrong_at, self.max_model_len = limit, wrong_at, max_model_len
        self.requests: list[int] = []  # prompt lengths of the prompt_logprobs requests
        stand_in = self

        class H(BaseHTTPRequestHandler):
            def reply(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self.reply({"object": "list", "data": [
                        {"id": "m", "object": "model", "max_model_len": stand_in.max_model_len}]})
                self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.reply(stand_in.answer(body))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        # A check for shutdown every 0.05 s, not serve_forever's 0.5 s: each `with StandIn()` ends in one poll.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, body: dict) -> dict:
        prompt = body["prompt"]
        ids = list(prompt) if isinstance(prompt, list) else [1 + b % (VOCAB - 1) for b in prompt.encode()]
        if body.get("prompt_logprobs"):
            self.requests.append(len(ids))
            corrupted = self.limit is not None and len(ids) <= self.limit
            entries = [None]
            for i in range(1, len(ids)):
                top = (drafter_argmax if corrupted else model_argmax)(ids[:i])
                given = ids[i]
                entry = {str(top): {"logprob": -0.05, "rank": 1, "decoded_token": "t"}}
                if given != top:
                    entry[str(given)] = {"logprob": -4.0, "rank": 7, "decoded_token": "g"}
                entries.append(entry)
            return {"choices": [{"text": "", "prompt_logprobs": entries}]}
        out = []
        for j in range(body["max_tokens"]):
            token = model_argmax(ids + out)
            if j == self.wrong_at:
                token = (token + 1) % VOCAB
            out.append(token)
        return {"prompt_token_ids": ids, "choices": [{"text": "x", "token_ids": out}]}

    def __enter__(self):
        self.thread.start()
        return VllmClient("127.0.0.1", self.httpd.server_address[1])

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
