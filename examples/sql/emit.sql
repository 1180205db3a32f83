-- An effect from plain psql: the application's row and its outbox effect in
-- one transaction, written with the store's jsd_emit(...) function
-- (docs/SQL-CONTRACT.md). `jsdurable relay` publishes it once after COMMIT;
-- the rolled-back transaction below publishes nothing.
--
--   jsdurable migrate --store 'postgres://app@db/app'
--   psql 'postgres://app@db/app' -v ON_ERROR_STOP=1 -v subject=orders.created -f examples/sql/emit.sql
--   jsdurable relay --store 'postgres://app@db/app' --until-idle
--
-- Variables: subject (required).

CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, amount_cents BIGINT NOT NULL);

BEGIN;
INSERT INTO invoices VALUES ('inv-1', 4200);
-- owner, id, subject, payload, headers (optional), not before (optional), order key (optional)
SELECT jsd_emit('invoice-inv-1', 'issued', :'subject',
                convert_to('{"invoice":"inv-1","amount_cents":4200}', 'UTF8'),
                '{"X-Trace": "psql-1"}') AS msg_id;
COMMIT;

BEGIN;
INSERT INTO invoices VALUES ('inv-2', 100);
SELECT jsd_emit('invoice-inv-2', 'issued', :'subject', convert_to('{}', 'UTF8')) AS msg_id;
ROLLBACK;

-- A plain INSERT is the same contract; the relay finds it at its next poll.
BEGIN;
INSERT INTO invoices VALUES ('inv-3', 990);
INSERT INTO jsd_outbox (owner, effect_id, subject, payload, headers_json)
VALUES ('invoice-inv-3', 'issued', :'subject',
        convert_to('{"invoice":"inv-3","amount_cents":990}', 'UTF8'), '{"X-Trace": "psql-3"}');
COMMIT;
