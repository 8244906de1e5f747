-- Every day's partition of the key events carries the statistics of a tombstone's client key.
--
-- 20261231000201 made them on the partitioned table (ANALYZE keeps none of a partial index's
-- expression), but the planner estimates the scan of one day's partition from that partition's
-- own statistics, which had none of the expression. It guessed again that a search's prefix
-- matches 0.5 % of a day's tombstones, and walked every tombstone in key order, newest first, to
-- find a page of matches: when none matched (a `pay_…` or `pi_…` id, a prefix of live keys only),
-- it read all of them. The keys table's three searches took 420-480 ms at ten million keys
-- (docs/performance.md, "Ten million keys"); with these, the search indexes are asked (0.8 ms
-- instead of 34 ms for that part at a million keys).

-- A new day's partition copies the parent's extended statistics (INCLUDING STATISTICS), as it
-- copies its defaults and constraints. Otherwise as in 20261231000101.
create or replace function payonce_add_daily_partitions(parent text, first_day date, last_day date) returns integer
    language plpgsql as $$
declare
    day date;
    child text;
    made integer := 0;
begin
    for day in select d::date from generate_series(first_day, last_day, interval '1 day') as d loop
        child := parent || '_p' || to_char(day, 'YYYYMMDD');
        continue when to_regclass(child) is not null;
        execute format('create table %I (like %I including defaults including constraints including statistics)',
                       child, parent);
        execute format('alter table %I attach partition %I for values from (%L) to (%L)', parent, child,
                       day::timestamp at time zone 'UTC', (day + 1)::timestamp at time zone 'UTC');
        made := made + 1;
    end loop;
    return made;
end
$$;

-- The partitions that exist already get them here; autovacuum's next ANALYZE of each fills them.
do $$
declare
    child text;
begin
    for child in select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid
                 where i.inhparent = 'idempotency_events'::regclass loop
        execute format('create statistics if not exists %I on (detail->>''key'') from %I',
                       child || '_tombstone_key_stats', child);
    end loop;
end
$$;
