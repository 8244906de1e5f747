-- A refund can fail after it succeeded (Stripe: the refund could not reach the customer's card,
-- the money comes back to the merchant; its status goes succeeded -> failed, refund.failed). The
-- refund is then failed like any other, its amount given back to the payment once, and this says
-- when it was reversed, for the payment's page.
alter table refunds add column reversed_at timestamptz;
