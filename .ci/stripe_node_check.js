// Stripe's official Node library against `payonce stripe-sim`, unchanged but for the host.
//
// Run by .ci/stripe-node-check with STRIPE_SIM_URL set (and NODE_PATH at the pinned library). It
// registers a webhook endpoint (a small HTTP server in this process), creates and confirms a
// PaymentIntent, retrieves, searches (Stripe's query language) and lists it, refunds it, reads a
// decline and a refusal as the library's typed errors, and verifies every delivery with
// stripe.webhooks.constructEvent: Stripe's own library agrees with the simulator's objects,
// headers, errors, lists and signatures. Any failure throws, so the exit status is non-zero.
'use strict';

const http = require('node:http');
const crypto = require('node:crypto');
const Stripe = require('stripe');

const base = new URL(process.env.STRIPE_SIM_URL);
// The library's own retries (with its automatic Idempotency-Key) stay on, as users run it.
const stripe = new Stripe('sk_test_stripe_node_check', {
  host: base.hostname,
  port: base.port,
  protocol: 'http',
  maxNetworkRetries: 2,
});

function check(condition, message) {
  if (!condition) {
    throw new Error(`check failed: ${message}`);
  }
}

async function refused(promise, type) {
  try {
    await promise;
  } catch (error) {
    check(error.type === type, `expected a ${type}, got ${error.type}: ${error.message}`);
    return error;
  }
  throw new Error(`expected a ${type}, but the call succeeded`);
}

const received = [];
const hook = http.createServer((request, response) => {
  const chunks = [];
  request.on('data', (chunk) => chunks.push(chunk));
  request.on('end', () => {
    received.push({ body: Buffer.concat(chunks).toString('utf8'), signature: request.headers['stripe-signature'] });
    response.writeHead(200);
    response.end();
  });
});

async function main() {
  await new Promise((resolve) => hook.listen(0, '127.0.0.1', resolve));
  const hookUrl = `http://127.0.0.1:${hook.address().port}/hook`;

  const endpoint = await stripe.webhookEndpoints.create({
    url: hookUrl,
    enabled_events: ['*'],
    description: 'stripe-node check',
  });
  check(endpoint.id.startsWith('we_') && endpoint.secret.startsWith('whsec_'), `endpoint: ${JSON.stringify(endpoint)}`);

  // Create and confirm, as payonce does.
  const tag = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
  const intent = await stripe.paymentIntents.create({
    amount: 1250,
    currency: 'usd',
    payment_method: 'pm_card_visa',
    confirm: true,
    automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
    metadata: { payonce_payment: tag },
  });
  check(intent.status === 'succeeded', `created: ${intent.status}`);
  check(intent.automatic_payment_methods.allow_redirects === 'never', 'automatic_payment_methods rendered');
  const headers = intent.lastResponse.headers;
  check(intent.lastResponse.requestId.startsWith('req_'), 'Request-Id');
  check(headers['stripe-version'] === stripe.getApiField('version'), `Stripe-Version: ${headers['stripe-version']}`);
  check(headers['idempotency-key'] === intent.lastResponse.idempotencyKey, 'the Idempotency-Key echoed');
  check(headers['original-request'] === intent.lastResponse.requestId, 'Original-Request');

  const fetched = await stripe.paymentIntents.retrieve(intent.id, { expand: ['latest_charge'] });
  check(fetched.id === intent.id && fetched.amount_received === 1250, `retrieved: ${JSON.stringify(fetched)}`);
  check(fetched.latest_charge.payment_method_details.card.last4 === '4242', 'the charge, expanded');
  check(fetched.latest_charge.outcome.type === 'authorized', 'the charge outcome');

  const found = await stripe.paymentIntents.search({ query: `metadata['payonce_payment']:'${tag}'` });
  check(found.data.map((hit) => hit.id).join() === intent.id, `search: ${JSON.stringify(found)}`);
  const language = await stripe.paymentIntents.search({ query: `amount>1000 AND -status:'processing' AND customer:null` });
  check(language.data.some((hit) => hit.id === intent.id), 'the query language');
  const none = await stripe.paymentIntents.search({ query: "metadata['payonce_payment']:'pay_none'" });
  check(none.data.length === 0 && none.has_more === false, 'search miss');
  await refused(stripe.paymentIntents.search({ query: "status:'a' AND amount>1 OR amount<1" }), 'StripeInvalidRequestError');

  const refund = await stripe.refunds.create({ payment_intent: intent.id, amount: 500, reason: 'requested_by_customer' });
  check(refund.status === 'succeeded' && refund.amount === 500, `refund: ${JSON.stringify(refund)}`);
  const tooMuch = await refused(stripe.refunds.create({ payment_intent: intent.id, amount: 5000 }), 'StripeInvalidRequestError');
  check(tooMuch.code === 'amount_too_large' && tooMuch.param === 'amount', `too much: ${tooMuch.message}`);
  check(tooMuch.doc_url && tooMuch.raw.request_log_url.includes(tooMuch.requestId), 'doc_url and request_log_url');
  const charge = await stripe.charges.retrieve(fetched.latest_charge.id);
  check(charge.amount_refunded === 500, 'the charge shows the refund');

  const declined = await refused(
    stripe.paymentIntents.create({
      amount: 700,
      currency: 'usd',
      payment_method: 'pm_card_chargeDeclinedInsufficientFunds',
      confirm: true,
      payment_method_types: ['card'],
    }),
    'StripeCardError',
  );
  check(declined.code === 'card_declined' && declined.decline_code === 'insufficient_funds', `decline: ${declined.message}`);
  check(declined.payment_intent.status === 'requires_payment_method', 'the PaymentIntent in the error');
  check(declined.payment_method.card.last4 === '9995', 'the PaymentMethod in the error');

  // Authorize now, capture part later; authorize and cancel.
  const authorize = async () => {
    const held = await stripe.paymentIntents.create({
      amount: 2000,
      currency: 'usd',
      payment_method: 'pm_card_visa',
      confirm: true,
      capture_method: 'manual',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
    });
    check(held.status === 'requires_capture' && held.amount_capturable === 2000, `authorized: ${JSON.stringify(held)}`);
    return held;
  };
  const held = await authorize();
  const captured = await stripe.paymentIntents.capture(held.id, { amount_to_capture: 1500 });
  check(captured.status === 'succeeded' && captured.amount_received === 1500, `captured: ${JSON.stringify(captured)}`);
  const twice = await refused(stripe.paymentIntents.capture(held.id), 'StripeInvalidRequestError');
  check(twice.code === 'payment_intent_unexpected_state' && twice.payment_intent.status === 'succeeded', `twice: ${twice.message}`);
  const canceled = await stripe.paymentIntents.cancel((await authorize()).id, { cancellation_reason: 'abandoned' });
  check(canceled.status === 'canceled' && canceled.cancellation_reason === 'abandoned', `canceled: ${JSON.stringify(canceled)}`);

  const returnUrl = await refused(
    stripe.paymentIntents.create({ amount: 100, currency: 'usd', payment_method: 'pm_card_visa', confirm: true }),
    'StripeInvalidRequestError',
  );
  check(returnUrl.param === 'return_url', `return_url rule: ${returnUrl.message}`);

  // Lists, and the library's auto-pagination over them (one object a page).
  const refunds = await stripe.refunds.list({ payment_intent: intent.id });
  check(refunds.data.length === 1 && refunds.data[0].id === refund.id, 'refund list');
  const paged = [];
  for await (const listed of stripe.paymentIntents.list({ limit: 1 })) {
    paged.push(listed.id);
  }
  const all = (await stripe.paymentIntents.list({ limit: 100 })).data.map((listed) => listed.id);
  check(paged.length > 1 && paged.join() === all.join() && paged.includes(intent.id), `paginated list: ${paged}`);
  const events = await stripe.events.list({ type: 'payment_intent.*', limit: 100 });
  check(events.data.every((event) => event.type.startsWith('payment_intent.')), 'event list by type');

  const wanted = [
    'payment_intent.created',
    'payment_intent.succeeded',
    'charge.succeeded',
    'refund.created',
    'charge.refunded',
    'payment_intent.amount_capturable_updated',
    'charge.captured',
    'payment_intent.canceled',
  ];
  const seen = () => new Set(received.map(({ body }) => JSON.parse(body).type));
  const deadline = Date.now() + 15000;
  while (Date.now() < deadline && !wanted.every((type) => seen().has(type))) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  check(wanted.every((type) => seen().has(type)), `deliveries: ${[...seen()].sort()}`);
  for (const { body, signature } of received) {
    const event = stripe.webhooks.constructEvent(body, signature, endpoint.secret);
    check(event.object === 'event', `event: ${body}`);
  }
  let tampered = false;
  try {
    stripe.webhooks.constructEvent(received[0].body.replace('"event"', '"evnt"'), received[0].signature, endpoint.secret);
  } catch (error) {
    tampered = error.type === 'StripeSignatureVerificationError';
  }
  check(tampered, 'a tampered delivery fails verification');
  check((await stripe.events.retrieve(JSON.parse(received[0].body).id)).id, 'events retrievable');

  const deleted = await stripe.webhookEndpoints.del(endpoint.id);
  check(deleted.deleted === true, 'endpoint deleted');
  console.log(
    `stripe-node ${Stripe.PACKAGE_VERSION} (API ${stripe.getApiField('version')}): endpoint, create and confirm, ` +
      `retrieve, search, refund, capture, cancel, lists, typed errors and ${received.length} signed deliveries all agree ` +
      'with the simulator',
  );
}

main()
  .catch((error) => {
    console.error(error);
    process.exitCode = 1;
  })
  .finally(() => hook.close());
