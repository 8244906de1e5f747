-- Customers of the payments API. Each has one API key.
--
-- API keys look like `sk_<lookup>_<secret>`. The lookup part is stored in the clear so a request
-- can find its row with an index scan; of the whole key only a SHA-256 digest is kept, and the
-- digests are compared in constant time (app/src/customers/api_key.rs). API keys are long random
-- tokens, so a fast hash is enough: there is no password to brute-force.
create table customers (
    id             uuid primary key,                  -- uuid v7, shown as `cus_<hex>`
    name           text not null check (length(name) between 1 and 200),
    api_key_lookup text not null unique,
    api_key_sha256 bytea not null check (length(api_key_sha256) = 32),
    created_at     timestamptz not null default now()
);
