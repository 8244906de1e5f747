-- Operators of the admin dashboard (`payonce admins create NAME`).
--
-- Only an argon2id hash of each password is kept, as a PHC string ($argon2id$v=19$m=…$salt$hash):
-- unlike API keys, passwords are chosen by people and must be slow to brute-force.
create table admins (
    id            uuid primary key,                  -- uuid v7
    name          text not null unique check (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    password_hash text not null check (password_hash like '$argon2%'),
    created_at    timestamptz not null default now()
);

-- Recent failed logins, for the login rate limit (app/src/admin/auth.rs). A table rather than
-- memory so that the limit holds across every server sharing the database. Keyed by the name
-- tried *and* the client address: a limit on the name alone would let anyone lock an operator
-- out, a limit on the address alone would not slow a botnet down.
create table admin_login_failures (
    id        bigint generated always as identity primary key,
    name      text not null,
    client_ip text not null,   -- the peer address as text (IPv4 or IPv6)
    failed_at timestamptz not null default now()
);

create index admin_login_failures_pair on admin_login_failures (name, client_ip, failed_at);
create index admin_login_failures_ip on admin_login_failures (client_ip, failed_at);

-- The dashboard counts expired (reaped) keys from their events, every few seconds.
create index idempotency_events_expired on idempotency_events (created_at) where kind = 'expired';
