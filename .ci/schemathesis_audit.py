"""Audits a schemathesis run against payonce: no charge that a 2xx answer does not account for.

Reads what schemathesis sent and got (its HAR report), the simulator's ledger of successful
charges (`GET /_sim/charges`), and payonce's own keys and payments (psql). Every charge carries
the client's Idempotency-Key in its metadata (`payonce_idempotency_key`). The audit holds when:

- every charge's key was answered 2xx (201, or 202 for a payment that settled later) to some
  request: a charge under a key that was only ever answered 4xx (or 5xx, or never answered) is
  a request refused *and* charged;
- no key was charged twice, and each charge is the payment payonce recorded for that key;
- payonce's own tables agree: each charge is a payment `succeeded` (or still settling), and no
  payment is `succeeded` without its charge.

Usage: schemathesis_audit.py RUN.har SIMULATOR_URL DATABASE_URL
"""

import collections
import json
import subprocess
import sys
import urllib.request


def decode_key(value):
    """The key payonce stores: an sf-string unquoted and unescaped, a bare token as sent."""
    value = value.strip(" \t")
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        out, escaped = [], False
        for c in value[1:-1]:
            if escaped:
                out.append(c)
                escaped = False
            elif c == "\\":
                escaped = True
            else:
                out.append(c)
        return "".join(out)
    return value


def psql(database_url, sql):
    result = subprocess.run(
        ["psql", database_url, "-XAtF", "\t", "-c", sql], check=True, capture_output=True, text=True
    )
    return [line.split("\t") for line in result.stdout.splitlines() if line]


def main(har_path, sim_url, database_url):
    with open(har_path, encoding="utf-8") as f:
        entries = json.load(f)["log"]["entries"]

    statuses = collections.Counter()
    answers_by_key = collections.defaultdict(set)
    operations = set()
    for entry in entries:
        request, response = entry["request"], entry["response"]
        path = "/" + request["url"].split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        operations.add((request["method"], path if not path.startswith("/v1/payments/") else "/v1/payments/{id}"))
        statuses[response["status"]] += 1
        if request["method"] != "POST" or path != "/v1/payments":
            continue
        keys = [h["value"] for h in request["headers"] if h["name"].lower() == "idempotency-key"]
        if len(keys) == 1:
            answers_by_key[decode_key(keys[0])].add(response["status"])

    with urllib.request.urlopen(sim_url + "_sim/charges") as answer:
        charges = json.load(answer)["charges"]

    failures = []
    charged = collections.Counter()
    for charge in charges:
        metadata = charge.get("metadata") or {}
        key = metadata.get("payonce_idempotency_key")
        charged[key] += 1
        answers = answers_by_key.get(key, set())
        if not any(200 <= status < 300 for status in answers):
            failures.append(f"charge {charge.get('id')} under key {key!r}, never answered 2xx (answers: {sorted(answers)})")
    for key, count in charged.items():
        if count > 1:
            failures.append(f"key {key!r} charged {count} times")

    # payonce's own record: the payment of each charge, and no success without a charge.
    payments = {
        row[0]: row[1]
        for row in psql(
            database_url,
            "select 'pay_' || replace(id::text, '-', ''), status from payments",
        )
    }
    charged_payments = set()
    for charge in charges:
        payment = (charge.get("metadata") or {}).get("payonce_payment")
        charged_payments.add(payment)
        if payments.get(payment) not in ("succeeded", "processing", "requires_action"):
            failures.append(f"charge {charge.get('id')} is for {payment!r}, which payonce has as {payments.get(payment)!r}")
    for payment, status in payments.items():
        if status == "succeeded" and payment not in charged_payments:
            failures.append(f"{payment} is succeeded without a charge in the ledger")

    refused_4xx = sum(1 for answers in answers_by_key.values() if answers and all(400 <= s < 500 for s in answers))
    server_errors = sum(count for status, count in statuses.items() if status >= 500)
    print(
        f"audit: {len(entries)} requests over {len(operations)} method+path pairs, "
        f"answers {dict(sorted(statuses.items()))}; {len(answers_by_key)} payment keys "
        f"({refused_4xx} answered only 4xx); {len(charges)} charges, {len(payments)} payments recorded"
    )
    if server_errors:
        failures.append(f"{server_errors} responses were 5xx")
    for failure in failures:
        print("audit FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
