#!/usr/bin/env python3
"""A tiny fake ledger: a payments service that double charges, for the k6 audit's self-test.

A STAND-IN, not payonce and not a model of it. It answers the one payonce call the k6 scripts make,
`POST /v1/payments`, and the one simulator call their teardown audit makes, `GET /_sim/charges`,
from one port, with no idempotency at all: every request is charged, so a key sent twice is
charged twice, as a server whose claim does not work would charge it. Nothing is made up: the
ledger holds exactly the charges the requests caused.

`.ci/loadtest-smoke` runs `loadtest/k6/double_submit.js` against it (each key is sent twice at
once) and requires k6 to fail *because of the double charge*: an audit that could not see one
would make every green run meaningless. Once the lab's `check-then-insert` strategy (which
double charges by design) exists, the self-test moves to it and this file goes.

    python3 loadtest/fake_ledger.py --port 8099
    # BASE_URLS=http://127.0.0.1:8099 SIM_URL=http://127.0.0.1:8099
"""

import argparse
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

charges = []
lock = threading.Lock()
ids = itertools.count(1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as k6 expects

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/payments":
            return self.answer(404, {"title": "not found"})
        request = json.loads(body)
        key = self.headers.get("Idempotency-Key", "").strip('"')
        with lock:
            n = next(ids)
            charges.append(
                {
                    "payment_intent": f"pi_fake{n}",
                    "charge": f"ch_fake{n}",
                    "idempotency_key": None,
                    "amount": request["amount"],
                    "currency": request["currency"],
                    "payment_method": request["payment_method"],
                    "metadata": {"payonce_idempotency_key": key, "payonce_customer": "cus_fake_ledger"},
                    "created": 0,
                }
            )
        payment = {field: request[field] for field in ("amount", "currency", "payment_method")}
        self.answer(201, {"id": f"pay_fake{n}", "object": "payment", "status": "succeeded", **payment})

    def do_GET(self):
        if self.path != "/_sim/charges":
            return self.answer(404, {"title": "not found"})
        with lock:
            self.answer(200, {"charges": list(charges)})

    def answer(self, status, document):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass  # one line per request would drown the smoke's output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"fake ledger (double charges every repeated key) on http://127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
