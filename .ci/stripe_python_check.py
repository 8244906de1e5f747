"""Stripe's official Python library against `payonce stripe-sim`, unchanged but for api_base.

Run by .ci/stripe-python-check with STRIPE_SIM_URL set. It registers a webhook endpoint (a small
HTTP server in this process), creates and confirms a PaymentIntent, retrieves it, searches it,
refunds it, authorizes others and captures part of one and cancels the other, and verifies every delivery with stripe.Webhook.construct_event: Stripe's own library
agrees with the simulator's wire format and signatures. Any failure raises, so the exit status
is non-zero.
"""

import http.server
import json
import os
import threading
import time
import uuid

import stripe

stripe.api_key = "sk_test_stripe_python_check"
stripe.api_base = os.environ["STRIPE_SIM_URL"]
# The library's own retries (with its automatic Idempotency-Key) stay on, as users run it.

received = []


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        received.append((body, self.headers.get("Stripe-Signature", "")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
threading.Thread(target=server.serve_forever, daemon=True).start()
hook_url = f"http://127.0.0.1:{server.server_port}/hook"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


endpoint = stripe.WebhookEndpoint.create(url=hook_url, enabled_events=["*"], description="stripe-python check")
check(endpoint.id.startswith("we_") and endpoint.secret.startswith("whsec_"), f"endpoint: {endpoint}")

tag = f"pay_{uuid.uuid4().hex}"
intent = stripe.PaymentIntent.create(
    amount=1250,
    currency="usd",
    payment_method="pm_card_visa",
    confirm=True,
    automatic_payment_methods={"enabled": True, "allow_redirects": "never"},
    metadata={"payonce_payment": tag},
)
check(intent.status == "succeeded", f"created: {intent.status}")
check(intent.automatic_payment_methods.allow_redirects == "never", "automatic_payment_methods rendered")

fetched = stripe.PaymentIntent.retrieve(intent.id)
check(fetched.id == intent.id and fetched.amount_received == 1250, f"retrieved: {fetched}")

found = stripe.PaymentIntent.search(query=f"metadata['payonce_payment']:'{tag}'")
check([hit.id for hit in found.data] == [intent.id], f"search: {found}")
check(not stripe.PaymentIntent.search(query="metadata['payonce_payment']:'pay_none'").data, "search miss")

refund = stripe.Refund.create(payment_intent=intent.id, amount=500, reason="requested_by_customer")
check(refund.status == "succeeded" and refund.amount == 500, f"refund: {refund}")
try:
    stripe.Refund.create(payment_intent=intent.id, amount=5000)
    raise AssertionError("a refund above what remains was accepted")
except stripe.InvalidRequestError as error:
    check(error.code == "amount_too_large" and error.param == "amount", f"too much: {error}")
check(stripe.Charge.retrieve(fetched.latest_charge).amount_refunded == 500, "charge shows the refund")

# Authorize now, capture part later; authorize and cancel.
def authorize():
    held = stripe.PaymentIntent.create(
        amount=2000,
        currency="usd",
        payment_method="pm_card_visa",
        confirm=True,
        capture_method="manual",
        automatic_payment_methods={"enabled": True, "allow_redirects": "never"},
    )
    check(held.status == "requires_capture" and held.amount_capturable == 2000, f"authorized: {held}")
    return held


held = authorize()
captured = stripe.PaymentIntent.capture(held.id, amount_to_capture=1500)
check(captured.status == "succeeded" and captured.amount_received == 1500, f"captured: {captured}")
check(stripe.Charge.retrieve(captured.latest_charge).amount_captured == 1500, "the charge shows the capture")
try:
    stripe.PaymentIntent.capture(held.id)
    raise AssertionError("a second capture was accepted")
except stripe.InvalidRequestError as error:
    check(error.code == "payment_intent_unexpected_state", f"captured twice: {error}")
canceled = stripe.PaymentIntent.cancel(authorize().id, cancellation_reason="abandoned")
check(canceled.status == "canceled" and canceled.cancellation_reason == "abandoned", f"canceled: {canceled}")

try:
    stripe.PaymentIntent.create(amount=100, currency="usd", payment_method="pm_card_visa", confirm=True)
    raise AssertionError("a confirmation without return_url was accepted")
except stripe.InvalidRequestError as error:
    check(error.param == "return_url", f"return_url rule: {error}")

wanted = {"payment_intent.created", "payment_intent.succeeded", "charge.succeeded", "refund.created", "charge.refunded",
          "payment_intent.amount_capturable_updated", "charge.captured", "payment_intent.canceled"}
deadline = time.monotonic() + 15
while time.monotonic() < deadline and not wanted <= {json.loads(body)["type"] for body, _ in received}:
    time.sleep(0.05)
for body, signature in received:
    event = stripe.Webhook.construct_event(body, signature, endpoint.secret)
    check(event.object == "event", f"event: {event}")
seen = {json.loads(body)["type"] for body, _ in received}
check(wanted <= seen, f"deliveries: {sorted(seen)}")
check(stripe.Event.retrieve(json.loads(received[0][0])["id"]).id, "events retrievable")

stripe.WebhookEndpoint.delete(endpoint.id)
print(f"stripe-python {stripe.VERSION}: endpoint, PaymentIntent, retrieve, search, refund, capture, cancel and "
      f"{len(received)} signed deliveries all agree with the simulator")
