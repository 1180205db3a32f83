/*
 * The PostgreSQL back end of the store (libpq): one PGconn per jsd_store,
 * every library statement prepared once per connection and parameterised,
 * batch operations set-based (binary arrays + unnest / = ANY), results read in
 * binary format.
 *
 * Tables live in a configurable schema; the schema name is validated by
 * store.c ([A-Za-z_][A-Za-z0-9_]*) and quoted into each statement where the
 * SQL text says "@" (identifiers cannot be parameters).
 *
 * DESIGN (several relays, RELAY-4): a claim is one statement,
 *   UPDATE jsd_outbox SET lease... WHERE ctid = ANY(ARRAY(SELECT ctid ...
 *   ORDER BY id LIMIT n FOR UPDATE OF c SKIP LOCKED)) RETURNING ...
 * Rows another relay is claiming are locked and skipped; a row whose claim
 * committed between our snapshot and our lock is re-checked by PostgreSQL
 * (READ COMMITTED re-evaluates the WHERE on the newest version), so its fresh
 * lease excludes it. Receipts and failures are written only WHERE
 * lease_token still matches.
 *
 * Wake-ups: a transaction that emitted effects runs NOTIFY jsd_outbox in the
 * same round trip as its COMMIT (PostgreSQL delivers it only on commit, once
 * per transaction). A relay LISTENs on its own store connection.
 *
 * One idea, the PostgreSQL back end, so one file over 800 lines: the
 * statement table, the binary parameter and array builders, the result
 * readers and the SQLSTATE mapping serve every operation, and a split would
 * only move them into a shared header. Policy is not here: the front
 * (store.c, tx.c, outbox.c) decides, this file runs the SQL, and it uses only
 * backend.h and rows.h of the store.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "store/backend.h"

enum {
    P_INSERT1,
    P_INSERT_MANY,
    P_DELETE_IDS,
    P_CLAIM,
    P_RECEIPTS,
    P_FAIL_SEL,
    P_FAIL_UPD,
    P_TROUBLE,
    P_RELEASE,
    P_REQUEUE,
    P_NEXT_DUE,
    P_INBOX_GET,
    P_INBOX_GET_MSG,
    P_INBOX_INS,
    P_INBOX_INS_MANY,
    P_INBOX_RETIRE_LOCK,
    P_INBOX_RETIRE,
    P_POISON_INS,
    P_POISON_MARK,
    P_POISON_GET,
    P_POISON_LIST,
    P_POISON_UNPUB,
    P_GC,
    P_INBOX_AGED,
    P_INBOX_HIGH,
    P_GC_IN_DURABLE,
    P_STATS,
    P_BACKLOG,
    P_TRY_TAKEOVER,
    P_LOCK_TAKEOVER,
    P_LOCK_RECEIPTS,
    P_LOCK_RECEIPTS_ASYNC,
    P_FLUSH,
    P_FLOOR_RAISE,
    P_GAP_HOLDERS,
    P_GAP_ENDED,
    P_INBOX_SET,
    P_REPLAY_UPSERT,
    P_REPLAY_GET,
    P_REPLAY_PENDING,
    P_REPLAY_OPEN,
    P_REPLAY_FINISH,
    P_DFLOOR_RAISE,
    P_DFLOOR_SET,
    P_DFLOOR_GET,
    P__COUNT
};

#define OUTBOX_COLS                                                                                \
    "id, owner, effect_id, msg_id, subject, headers, payload, attempts, order_key, created_at, "   \
    "not_before"
#define REPLAY_COLS                                                                                \
    "id, stream, consumer, stream_seq, dlq_stream, dlq_seq, state, detail, requested_at, done_at"
#define POISON_COLS                                                                                \
    "id, stream, consumer, stream_seq, msg_id, subject, diagnostic, headers, payload, "            \
    "created_at, dlq_stream, dlq_seq"
#define PENDING "published_at IS NULL AND dead_lettered_at IS NULL"
/* Unordered first attempts due at insert (schema 9): their receipts are
 * recorded as runs, which the settled floor passes ("the settled floor",
 * before floor_raise). c is the table's alias with its dot, or "". */
#define READY_OF(c)                                                                                \
    c "order_key IS NULL AND " c "attempts = 0 AND " c "not_before <= " c "created_at AND " c      \
      "published_at IS NULL AND " c "dead_lettered_at IS NULL"
/* The other unordered pending rows (retries, durable timers): leased and
 * receipted in the row, so that they never hold the floor back. */
#define REST_OF(c)                                                                                 \
    c "order_key IS NULL AND (" c "attempts > 0 OR " c "not_before > " c "created_at) AND " c      \
      "published_at IS NULL AND " c "dead_lettered_at IS NULL"
#define REST_ROWS REST_OF("")
/* A run of receipts holds an id in lo..hi: runs never overlap, so only the
 * last one starting at or below hi can. COVERED: outbox id x is covered. */
#define OVERLAPS(lo, hi)                                                                           \
    "coalesce((SELECT cv.hi FROM @jsd_outbox_runs cv WHERE cv.lo <= " hi " ORDER BY cv.lo DESC "   \
    "LIMIT 1), -1) >= " lo
#define COVERED(x) OVERLAPS(x, x)
/* A lock of pg_locks that every transaction writing the outbox holds from
 * before it draws an id (INSERT takes it when the statement is analysed or
 * its cached plan locked) until it ends. */
#define OUTBOX_WRITER                                                                              \
    "locktype = 'relation' AND relation = '@jsd_outbox'::regclass AND mode = 'RowExclusiveLock'"
/* The advisory lock between takeovers and receipts as runs (pg_claim). */
#define TAKEOVER_KEY "'@jsd_outbox_runs'::regclass::oid::int8"
/* Lower the floor to x (a row below it became claimable again); gen tells
 * a walk that read the floor before to leave it alone. */
#define FLOOR_LOWER(x) "UPDATE @jsd_outbox_floor SET floor = least(floor, " x "), gen = gen + 1"
/* The backlog, counted by order key so each half is read through its partial
 * pending index: PENDING alone matches neither index, and the planner then
 * scans the whole table, published rows included. */
#define BACKLOG_PART(key)                                                                          \
    "SELECT count(*) AS n, count(*) FILTER (WHERE next_attempt_at <= $1) AS d, "                   \
    "min(not_before) FILTER (WHERE not_before <= $1) AS m FROM @jsd_outbox "                       \
    "WHERE order_key " key " AND " PENDING
#define BACKLOG_OF(where)                                                                          \
    "SELECT count(*) AS n, count(*) FILTER (WHERE next_attempt_at <= $1) AS d, "                   \
    "min(not_before) FILTER (WHERE not_before <= $1) AS m FROM @jsd_outbox c WHERE " where
/* Ready rows: from the floor up, less the runs recorded there (below it
 * every ready row is covered by one). */
#define FROM_FLOOR(c) c "id >= (SELECT floor FROM @jsd_outbox_floor) AND NOT " COVERED(c "id")
/* Ready rows not covered by a run: those from the floor up, less the ids of
 * the runs there (a run never straddles the floor, and its rows are due),
 * counted without a probe of the runs per row: such a count, taken while a
 * relay recorded runs, stepped over every run its snapshot could not see
 * for each pending row (minutes with 1M pending, bench-scale). The oldest
 * due age is read off the first few uncovered rows, which are the oldest. */
/* clang-format off */
#define READY_BACKLOG \
    "SELECT greatest(0, r.n - k.n) AS n, greatest(0, r.d - k.n) AS d, f.m FROM " \
    "(SELECT count(*) AS n, count(*) FILTER (WHERE next_attempt_at <= $1) AS d " \
    "FROM @jsd_outbox c WHERE " READY_OF("c.") " AND c.id >= (SELECT floor FROM " \
    "@jsd_outbox_floor)) r, (SELECT coalesce(sum(hi - lo + 1), 0) AS n FROM @jsd_outbox_runs " \
    "WHERE lo >= (SELECT floor FROM @jsd_outbox_floor)) k, (SELECT min(not_before) AS m " \
    "FROM (SELECT not_before FROM @jsd_outbox c WHERE " READY_OF("c.") " AND " \
    FROM_FLOOR("c.") " AND next_attempt_at <= $1 ORDER BY id LIMIT 64) x) f"
#define BACKLOG \
    "SELECT sum(n)::int8 AS n, sum(d)::int8 AS d, min(m) AS m FROM (" READY_BACKLOG \
    " UNION ALL " BACKLOG_OF(REST_OF("c.")) " UNION ALL " BACKLOG_PART("IS NOT NULL") ") u"
/* clang-format on */

static const char *const sql_text[P__COUNT] = {
    [P_INSERT1] = "INSERT INTO @jsd_outbox (owner, effect_id, msg_id, subject, headers, payload, "
                  "order_key, created_at, not_before, next_attempt_at) "
                  "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) "
                  "ON CONFLICT (owner, effect_id) DO NOTHING",
    [P_INSERT_MANY] = "INSERT INTO @jsd_outbox (owner, effect_id, msg_id, subject, headers, "
                      "payload, order_key, created_at, not_before, next_attempt_at) "
                      "SELECT u.* FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
                      "$5::bytea[], $6::bytea[], $7::text[], $8::int8[], $9::int8[], $9::int8[]) "
                      "AS u(owner, effect_id, msg_id, subject, headers, payload, order_key, "
                      "created_at, not_before, next_attempt_at) WHERE NOT EXISTS (SELECT 1 FROM "
                      "@jsd_outbox o WHERE o.owner = u.owner AND o.effect_id = u.effect_id) "
                      "RETURNING id",
    [P_DELETE_IDS] =
        "DELETE FROM @jsd_outbox WHERE id = ANY($1::int8[]) RETURNING owner, effect_id",
/* Four data-modifying CTEs, each an UPDATE of rows locked FOR UPDATE
 * SKIP LOCKED: first the due heads (smallest pending id) of order keys,
 * at most half the batch (k), then unordered due effects in id order for
 * the rest: retries and durable timers (v, REST_OF), ready rows whose
 * lease expired unsettled (t, only in a takeover claim: $6, pg_claim), and
 * ready rows never leased or released (u), both from the settled floor up
 * (schema 9). Each is a plain scan of its own partial index (the single
 * UNION this replaced cost a second pass over the ids and a sort); keys
 * and unordered effects each get at least half of a full batch, so
 * neither starves the other. A ready row covered by a run of receipts
 * keeps the lease it was published under: t skips it (COVERED), u never
 * sees it (its lease is not NULL). t stops at the first ready row with no
 * lease: unbounded, it stepped over every pending row on each claim from
 * the start (relay.postgres.scale_pending, 1M pending, fell to 0.72 x of
 * 100k), and one condition for both in u's scan made the generic plan read
 * them all (3.8k msg/s). Leased rows above that one are reached once u has
 * claimed it, in the same claim or the next. The claim's writes touch no
 * indexed column: with the table's fillfactor (migration 6) they are HOT
 * updates. The rows come back keyed first; the caller sorts them by id. $5
 * is the claim floor (see pg_claim). The claim's own transaction commits without
 * waiting for its WAL flush (synchronous_commit off for this transaction
 * only: set_config(..., true) in the CTE async_commit, which u's LIMIT
 * reads so that it runs): a claim lost in a server crash is answered by
 * the relay's reading of the stream (relay.c DESIGN 8). The UPDATE finds
 * the rows its subquery locked by their tuple ids (a TID scan), not by a
 * second probe of the primary key per row: about 6 % more relay.postgres
 * (medians of eight same-minute pairs, docs/PERFORMANCE.md). A locked row
 * cannot move before the claim commits. A row the lock met in a version
 * newer than the statement's snapshot (another session released it
 * meanwhile) is not found by that scan, or fails its re-check of the
 * ctid: it is skipped, locked but unleased, and the next claim takes it.
 * So the UPDATE writes only rows its subquery locked and re-checked, as
 * with ids. */
/* Its own transaction commits without waiting for its WAL flush. */
#define NO_FLUSH_WAIT "set_config('synchronous_commit', 'off', true)"
#define LOCK_RECEIPTS "SELECT pg_advisory_xact_lock_shared(" TAKEOVER_KEY ")"
#define CLAIM_SET                                                                                  \
    "UPDATE @jsd_outbox o SET lease_token = $1, lease_expires = $2, " /* an earlier lease that     \
                                                                         ended unsettled: maybe    \
                                                                         published (store.h) */    \
    "duplicate = CASE WHEN o.lease_token IS NOT NULL THEN true ELSE o.duplicate END, "             \
    "first_attempt_at = CASE WHEN o.lease_token IS NOT NULL THEN coalesce(o.first_attempt_at, "    \
    "o.lease_expires - ($2 - $3)) ELSE o.first_attempt_at END "                                    \
    "WHERE o.ctid = ANY(ARRAY(SELECT c.ctid FROM @jsd_outbox c WHERE "
#define CLAIM_DUE                                                                                  \
    "AND c.published_at IS NULL AND c.dead_lettered_at IS NULL AND c.next_attempt_at <= $3 "       \
    "AND (c.lease_expires IS NULL OR c.lease_expires <= $3) ORDER BY c.id "
#define CLAIM_COLS                                                                                 \
    "o.id, o.owner, o.effect_id, o.msg_id, o.subject, "                                            \
    "coalesce(o.headers, convert_to(o.headers_json::text, 'UTF8')), o.payload, o.attempts, "       \
    "o.order_key, o.created_at, o.not_before, o.duplicate, o.first_attempt_at"
    /* clang-format off */
    [P_CLAIM] = "WITH async_commit AS (SELECT " NO_FLUSH_WAIT "), "
                "fl AS (SELECT floor FROM @jsd_outbox_floor), "
                "k AS (" CLAIM_SET "c.id = ANY(ARRAY(SELECT min(id) FROM @jsd_outbox "
                "WHERE order_key IS NOT NULL AND " PENDING " GROUP BY order_key)) " CLAIM_DUE
                "LIMIT ($4 + 1) / 2 FOR UPDATE OF c SKIP LOCKED)) RETURNING " CLAIM_COLS "), "
                "v AS (" CLAIM_SET REST_OF("c.") " " CLAIM_DUE
                "LIMIT $4 - (SELECT count(*) FROM k) FOR UPDATE OF c SKIP LOCKED)) "
                "RETURNING " CLAIM_COLS "), "
                "t AS (" CLAIM_SET "$6::bool AND current_setting('jsd.takeover', true) = 'true' "
                "AND " READY_OF("c.") " AND c.id >= (SELECT floor FROM fl) "
                "AND c.id < (SELECT coalesce(min(x.id), 9223372036854775807) FROM @jsd_outbox x "
                "WHERE " READY_OF("x.") " AND x.id >= (SELECT floor FROM fl) "
                "AND x.lease_token IS NULL) "
                "AND c.lease_token IS NOT NULL AND NOT " COVERED("c.id") " " CLAIM_DUE
                "LIMIT $4 - (SELECT count(*) FROM k) - (SELECT count(*) FROM v) "
                "FOR UPDATE OF c SKIP LOCKED)) RETURNING " CLAIM_COLS "), "
                "u AS (" CLAIM_SET READY_OF("c.") " AND c.lease_token IS NULL "
                "AND c.id >= greatest($5, (SELECT floor FROM fl)) " CLAIM_DUE
                "LIMIT $4 - (SELECT count(*) FROM k) - (SELECT count(*) FROM v) "
                "- (SELECT count(*) FROM t) - (SELECT count(*) - 1 FROM async_commit) "
                "FOR UPDATE OF c SKIP LOCKED)) RETURNING " CLAIM_COLS ") "
                "SELECT * FROM k UNION ALL SELECT * FROM v UNION ALL SELECT * FROM t "
                "UNION ALL SELECT * FROM u",
    /* clang-format on */
    /* One element per run of receipts (pg_receipts): rows lo..hi, every one
     * of them a receipt of the call, stream numbers seq.. in id order. A
     * run whose rows are all ready and leased under $1, and which overlaps
     * no run recorded before (a receipt written twice), becomes one row of
     * jsd_outbox_runs (ok, ins); any other is written into its rows, as
     * before schema 9 (upd). Returns the receipts applied. */
    /* clang-format off */
    [P_RECEIPTS] = "WITH r AS (SELECT * FROM unnest($2::int8[], $3::int8[], $4::text[], "
                   "$5::int8[], $6::bool[], $7::int8[]) AS r(lo, hi, stream, seq, dup, at)), "
                   "ok AS (SELECT r.* FROM r WHERE (SELECT count(*) FROM @jsd_outbox o "
                   "WHERE o.id BETWEEN r.lo AND r.hi AND o.lease_token = $1 AND "
                   READY_OF("o.") ") = r.hi - r.lo + 1 AND NOT " OVERLAPS("r.lo", "r.hi") "), "
                   "ins AS (INSERT INTO @jsd_outbox_runs (lo, hi, stream, seq, duplicate, "
                   "published_at) SELECT lo, hi, stream, seq, dup, at FROM ok "
                   "RETURNING hi - lo + 1 AS n), "
                   "upd AS (UPDATE @jsd_outbox o SET stream = r.stream, "
                   "stream_seq = r.seq + (o.id - r.lo), duplicate = r.dup, published_at = r.at, "
                   "lease_token = NULL, lease_expires = NULL FROM r "
                   "WHERE o.id BETWEEN r.lo AND r.hi AND o.lease_token = $1 "
                   "AND o.published_at IS NULL AND r.lo NOT IN (SELECT lo FROM ok) "
                   "AND NOT " COVERED("o.id") " RETURNING 1) "
                   "SELECT (SELECT coalesce(sum(n), 0) FROM ins)::int8 + (SELECT count(*) FROM upd)",
    /* clang-format on */
    [P_FAIL_SEL] = "SELECT id, attempts FROM @jsd_outbox WHERE id = ANY($2::int8[]) "
                   "AND lease_token = $1 AND " PENDING " AND NOT " COVERED("id") " FOR UPDATE",
    [P_FAIL_UPD] = "UPDATE @jsd_outbox o SET attempts = u.attempts, last_error = u.err, "
                   "next_attempt_at = u.next, dead_lettered_at = u.dead_at, "
                   "dead_reason = u.reason, lease_token = NULL, lease_expires = NULL, "
                   "first_attempt_at = coalesce(o.first_attempt_at, u.first) "
                   "FROM unnest($2::int8[], $3::int4[], $4::text[], $5::int8[], $6::int8[], "
                   "$7::text[], $8::int8[]) AS u(id, attempts, err, next, dead_at, reason, first) "
                   "WHERE o.id = u.id AND o.lease_token = $1",
    [P_TROUBLE] = "SELECT (SELECT count(*) FROM @jsd_outbox WHERE " REST_ROWS
                  " AND attempts > 0) + (SELECT count(*) FROM @jsd_outbox WHERE order_key IS NOT "
                  "NULL AND " PENDING " AND attempts > 0), "
                  "(SELECT count(*) FROM @jsd_outbox WHERE dead_lettered_at IS NOT NULL), "
                  "(SELECT count(*) FROM @jsd_outbox WHERE dead_lettered_at IS NOT NULL "
                  "AND dead_reason LIKE '%" JSD__FIRST_DUP_REASON "%')",
    [P_RELEASE] = "UPDATE @jsd_outbox SET lease_token = NULL, lease_expires = NULL "
                  "WHERE id = ANY($2::int8[]) AND lease_token = $1 AND published_at IS NULL "
                  "AND NOT " COVERED("id"),
    /* A requeued first attempt is a ready row again: the floor comes down
     * to it in the same transaction. */
    /* clang-format off */
    [P_REQUEUE] = "WITH q AS (UPDATE @jsd_outbox SET dead_lettered_at = NULL, "
                  "dead_reason = NULL, attempts = 0, next_attempt_at = $2, lease_token = NULL, "
                  "lease_expires = NULL WHERE id = ANY($1::int8[]) AND dead_lettered_at IS NOT "
                  "NULL AND published_at IS NULL RETURNING id), "
                  "f AS (" FLOOR_LOWER("(SELECT min(id) FROM q)") " WHERE EXISTS (SELECT 1 FROM q)) "
                  "SELECT count(*) FROM q",
    /* clang-format on */
    /* Only effects a claim could take: unordered ones and the heads of keys. */
    /* clang-format off */
    [P_NEXT_DUE] = "SELECT min(t) FROM (SELECT min(GREATEST(next_attempt_at, "
                   "coalesce(lease_expires, 0))) AS t FROM @jsd_outbox c WHERE " REST_OF("c.")
                   " UNION ALL SELECT min(GREATEST(next_attempt_at, coalesce(lease_expires, 0))) "
                   "FROM @jsd_outbox c WHERE " READY_OF("c.") " AND " FROM_FLOOR("c.")
                   " UNION ALL SELECT min(GREATEST(c.next_attempt_at, "
                   "coalesce(c.lease_expires, 0))) FROM (SELECT min(id) AS hid FROM @jsd_outbox "
                   "WHERE order_key IS NOT NULL AND " PENDING " GROUP BY order_key) h "
                   "JOIN @jsd_outbox c ON c.id = h.hid) AS x",
    /* clang-format on */
    [P_INBOX_GET] = "SELECT outcome, detail, msg_id, stream_seq, created_at FROM @jsd_inbox "
                    "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3",
    [P_INBOX_GET_MSG] = "SELECT outcome, detail, msg_id, stream_seq, created_at FROM @jsd_inbox "
                        "WHERE stream = $1 AND consumer = $2 AND msg_id = $3 "
                        "ORDER BY created_at, stream_seq LIMIT 1",
    [P_INBOX_INS] = "INSERT INTO @jsd_inbox (stream, consumer, stream_seq, msg_id, outcome, "
                    "detail, created_at, traceparent, tracestate) "
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                    "ON CONFLICT (stream, consumer, stream_seq) DO NOTHING",
    /* jsd__tx_inbox_retire: a fresh negative sequence, below every row of
     * the durable. Two consumers of one durable retiring rows at once (a
     * stream re-created, a server rolled back) would read the same min():
     * retirements take turns under this lock, held to the end of the
     * transaction, and the UPDATE (a statement of its own, so its snapshot
     * is taken once the lock is held) sees the other's row. */
    [P_INBOX_RETIRE_LOCK] = "SELECT pg_advisory_xact_lock('@jsd_inbox'::regclass::oid::int8)",
    [P_INBOX_RETIRE] = "UPDATE @jsd_inbox SET stream_seq = (SELECT LEAST(min(stream_seq), 0) - 1 "
                       "FROM @jsd_inbox WHERE stream = $1 AND consumer = $2) "
                       "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3",
    /* A batch's rows in one statement. NOT EXISTS sees the rows recorded
     * before the statement only: msg ids are kept distinct by the caller. */
    [P_INBOX_INS_MANY] = "INSERT INTO @jsd_inbox (stream, consumer, stream_seq, msg_id, outcome, "
                         "detail, created_at, traceparent, tracestate) SELECT $1::text, "
                         "$2::text, u.seq, u.mid, $3::int4, NULL, $4::int8, u.tp, u.ts FROM "
                         "unnest($5::int8[], $6::text[], $7::text[], $8::text[]) "
                         "AS u(seq, mid, tp, ts) "
                         /* One index probe per delivery, whatever the statistics:
                          * as NOT EXISTS, the generic plan cached while the inbox
                          * was young hashed every msg id of the consumer for each
                          * batch (ingress fell from 44k to 17k msg/s in a fresh
                          * database until autoanalyze). A NULL mid matches no row. */
                         "LEFT JOIN LATERAL (SELECT 1 AS hit FROM @jsd_inbox i "
                         "WHERE i.stream = $1::text AND i.consumer = $2::text "
                         "AND i.msg_id = u.mid LIMIT 1) x ON true WHERE x.hit IS NULL "
                         "ON CONFLICT (stream, consumer, stream_seq) DO NOTHING "
                         "RETURNING stream_seq",
    [P_POISON_INS] = "INSERT INTO @jsd_poison (stream, consumer, stream_seq, msg_id, subject, "
                     "diagnostic, headers, payload, created_at) "
                     "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                     "ON CONFLICT (stream, consumer, stream_seq) DO NOTHING",
    [P_POISON_MARK] = "UPDATE @jsd_poison SET dlq_stream = $4, dlq_seq = $5 "
                      "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3",
    [P_POISON_GET] = "SELECT " POISON_COLS " FROM @jsd_poison "
                     "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3",
    [P_POISON_LIST] = "SELECT " POISON_COLS " FROM @jsd_poison WHERE id > $1 ORDER BY id "
                      "LIMIT $2",
    [P_POISON_UNPUB] = "SELECT " POISON_COLS " FROM @jsd_poison WHERE stream = $1 AND "
                       "consumer = $2 AND dlq_seq IS NULL AND id > $3 ORDER BY id LIMIT $4",
    /* Runs published before $1 go with their rows, oldest first, at most $2
     * ids in all (c: each run's last id to go, "cut"); a run cut short keeps
     * its later rows (lo moves up). Then receipts in rows, up to $2 effects
     * in all, and $3 inbox rows (0: none). The rows of the runs are deleted by their
     * ids (one primary-key probe each): joined to c by range, the planner
     * scanned the whole ready index for every run (7 s a step of 1000 with
     * 5M rows behind, bench-scale). */
    /* clang-format off */
    [P_GC] = "WITH c AS (SELECT lo, hi, least(hi, lo + $2 - (acc - (hi - lo + 1)) - 1) AS cut "
             "FROM (SELECT lo, hi, (sum(hi - lo + 1) OVER (ORDER BY published_at, lo))::int8 "
             "AS acc FROM @jsd_outbox_runs WHERE published_at < $1 ORDER BY published_at, lo "
             "LIMIT $2) x WHERE acc - (hi - lo + 1) < $2), "
             "rd AS (DELETE FROM @jsd_outbox d WHERE d.id = ANY(ARRAY(SELECT "
             "generate_series(c.lo, c.cut) FROM c)) AND " READY_OF("d.") "), "
             "rg AS (DELETE FROM @jsd_outbox_runs g USING c WHERE g.lo = c.lo AND c.cut = c.hi), "
             "rc AS (UPDATE @jsd_outbox_runs g SET seq = g.seq + (c.cut + 1 - g.lo), "
             "lo = c.cut + 1 FROM c WHERE g.lo = c.lo AND c.cut < c.hi), "
             "n AS (SELECT coalesce(sum(cut - lo + 1), 0)::int8 AS ids FROM c), "
             "o AS (DELETE FROM @jsd_outbox WHERE id IN (SELECT id FROM @jsd_outbox "
             "WHERE published_at IS NOT NULL AND published_at < $1 ORDER BY published_at "
             "LIMIT greatest(0, $2 - (SELECT ids FROM n))) RETURNING 1), "
             "i AS (DELETE FROM @jsd_inbox WHERE (stream, consumer, stream_seq) IN ("
             "SELECT stream, consumer, stream_seq FROM @jsd_inbox x WHERE created_at < $1 "
             "AND stream_seq < (SELECT max(y.stream_seq) FROM @jsd_inbox y "
             "WHERE y.stream = x.stream AND y.consumer = x.consumer) "
             "ORDER BY created_at LIMIT $3) RETURNING 1) "
             "SELECT (SELECT ids FROM n) + (SELECT count(*) FROM o) + (SELECT count(*) FROM i)",
    /* clang-format on */
    [P_INBOX_AGED] = "SELECT stream, consumer, count(*) FROM @jsd_inbox WHERE created_at < $1 "
                     "GROUP BY stream, consumer ORDER BY stream, consumer",
    /* by the primary key's prefix; retired rows (negative) do not count */
    [P_INBOX_HIGH] = "SELECT coalesce(max(stream_seq), 0) FROM @jsd_inbox WHERE stream = $1 AND "
                     "consumer = $2 AND stream_seq > 0",
    /* by the primary key's prefix: the durable's rows up to its ack floor,
     * but its highest row (the high-water mark) unless it is dropped */
    [P_GC_IN_DURABLE] = "DELETE FROM @jsd_inbox WHERE (stream, consumer, stream_seq) IN ("
                        "SELECT stream, consumer, stream_seq FROM @jsd_inbox WHERE stream = $1 "
                        "AND consumer = $2 AND stream_seq <= $3 AND created_at < $4 "
                        "AND ($3 = 9223372036854775807 OR stream_seq < (SELECT max(stream_seq) "
                        "FROM @jsd_inbox WHERE stream = $1 AND consumer = $2)) LIMIT $5)",
    [P_STATS] = "SELECT b.n, b.d, b.m, "
                "(SELECT count(*) FROM @jsd_outbox WHERE published_at IS NOT NULL) "
                "+ (SELECT coalesce(sum(hi - lo + 1), 0) FROM @jsd_outbox_runs)::int8, "
                "(SELECT count(*) FROM @jsd_outbox WHERE dead_lettered_at IS NOT NULL), "
                "(SELECT count(*) FROM @jsd_inbox), "
                "(SELECT count(*) FROM @jsd_poison), "
                "(SELECT count(*) FROM @jsd_poison WHERE dlq_seq IS NULL), "
                "(SELECT count(*) FROM @jsd_replay WHERE state = 0), "
                "(SELECT count(*) FROM @jsd_replay WHERE state = 2) FROM (" BACKLOG ") b",
    [P_BACKLOG] = BACKLOG,
    /* A takeover claim's lock (pg_claim): tried, or waited for; the claim's
     * t reads whether it holds it. */
    [P_TRY_TAKEOVER] = "SELECT set_config('jsd.takeover', pg_try_advisory_xact_lock(" TAKEOVER_KEY
                       ")::text, true)",
    [P_LOCK_TAKEOVER] = "SELECT set_config('jsd.takeover', 'true', true), "
                        "pg_advisory_xact_lock(" TAKEOVER_KEY ")",
    [P_LOCK_RECEIPTS] = LOCK_RECEIPTS,
    /* The same for receipts whose flush is left to pg_sync_receipts. */
    [P_LOCK_RECEIPTS_ASYNC] = LOCK_RECEIPTS ", " NO_FLUSH_WAIT,
    /* A transaction that writes WAL, committed synchronously: its commit
     * waits for the WAL up to its own record to be flushed (and replicated,
     * with synchronous standbys), so every commit before it is too
     * (pg_sync_receipts). What it writes is a transactional logical
     * message, empty, which changes no table (a logical decoding client
     * that asks for messages sees it, with this prefix). An id alone
     * (txid_current()) is not enough: a transaction that wrote no WAL
     * before its commit record commits without waiting for the flush
     * (test_relay_horizon, receipt_flush_answer_lost, found it). */
    [P_FLUSH] = "SELECT pg_logical_emit_message(true, 'jsdurable.receipts', '')",
    [P_FLOOR_RAISE] = "SELECT gap, bound FROM @jsd_outbox_floor_raise($1::int8, $2::int8)",
    /* The transactions that write the outbox now (prepared ones too: their
     * pid is NULL), other than this statement's own: every one that drew
     * an id below the walk's top and has not ended is among them. */
    [P_GAP_HOLDERS] = "SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM "
                      "pg_locks WHERE " OUTBOX_WRITER " AND pid IS DISTINCT FROM pg_backend_pid()",
    [P_GAP_ENDED] = "SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE " OUTBOX_WRITER
                    " AND virtualtransaction = ANY($1::text[]))",
    [P_INBOX_SET] = "UPDATE @jsd_inbox SET outcome = $4, detail = $5 "
                    "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3 AND outcome <> $4",
    /* A new request, or a failed one made pending again; a pending or
     * applied one stays as it is (no row returned). */
    [P_REPLAY_UPSERT] =
        "INSERT INTO @jsd_replay AS r (stream, consumer, stream_seq, dlq_stream, dlq_seq, state, "
        "requested_at) VALUES ($1, $2, $3, $4, $5, 0, $6) "
        "ON CONFLICT (stream, consumer, stream_seq) DO UPDATE SET state = 0, detail = NULL, "
        "done_at = NULL, dlq_stream = excluded.dlq_stream, dlq_seq = excluded.dlq_seq, "
        "requested_at = excluded.requested_at WHERE r.state = 2 RETURNING id",
    [P_REPLAY_GET] = "SELECT " REPLAY_COLS " FROM @jsd_replay "
                     "WHERE stream = $1 AND consumer = $2 AND stream_seq = $3",
    [P_REPLAY_PENDING] = "SELECT " REPLAY_COLS " FROM @jsd_replay WHERE stream = $1 AND "
                         "consumer = $2 AND state = 0 AND id > $3 ORDER BY id LIMIT $4",
    [P_REPLAY_OPEN] = "SELECT " REPLAY_COLS " FROM @jsd_replay WHERE state <> 1 AND id > $1 "
                      "ORDER BY id LIMIT $2",
    [P_REPLAY_FINISH] = "UPDATE @jsd_replay SET state = $2, detail = $3, done_at = $4 "
                        "WHERE id = $1 AND state = 0",
    /* a recorded floor only rises; recorded_at is when it last rose */
    [P_DFLOOR_RAISE] = "INSERT INTO @jsd_durable_floor AS f (stream, consumer, ack_floor, "
                       "recorded_at) VALUES ($1, $2, $3, $4) ON CONFLICT (stream, consumer) DO "
                       "UPDATE SET ack_floor = excluded.ack_floor, recorded_at = "
                       "excluded.recorded_at WHERE excluded.ack_floor > f.ack_floor",
    [P_DFLOOR_SET] = "INSERT INTO @jsd_durable_floor (stream, consumer, ack_floor, recorded_at) "
                     "VALUES ($1, $2, $3, $4) ON CONFLICT (stream, consumer) DO UPDATE SET "
                     "ack_floor = excluded.ack_floor, recorded_at = excluded.recorded_at",
    [P_DFLOOR_GET] = "SELECT ack_floor, recorded_at FROM @jsd_durable_floor "
                     "WHERE stream = $1 AND consumer = $2",
};

/* Every migration records itself here. */
static const char *const VERSION_TABLE[] = {
    "CREATE TABLE IF NOT EXISTS @jsd_schema_version ("
    " version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
    NULL};

static const char *const migration_1[] = {
    "CREATE TABLE @jsd_outbox ("
    " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " owner TEXT NOT NULL,"
    " effect_id TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " subject TEXT NOT NULL,"
    " headers BYTEA,"
    " payload BYTEA NOT NULL,"
    " order_key TEXT,"
    " created_at BIGINT NOT NULL,"
    " not_before BIGINT NOT NULL,"
    " next_attempt_at BIGINT NOT NULL,"
    " lease_token TEXT,"
    " lease_expires BIGINT,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " last_error TEXT,"
    " dead_lettered_at BIGINT,"
    " dead_reason TEXT,"
    " stream TEXT,"
    " stream_seq BIGINT,"
    " duplicate BOOLEAN,"
    " published_at BIGINT,"
    " CONSTRAINT jsd_outbox_identity UNIQUE (owner, effect_id))",
    "CREATE INDEX jsd_outbox_ready ON @jsd_outbox (id) WHERE order_key IS NULL AND " PENDING,
    "CREATE INDEX jsd_outbox_keyed ON @jsd_outbox (order_key, id) "
    "WHERE order_key IS NOT NULL AND " PENDING,
    "CREATE INDEX jsd_outbox_published ON @jsd_outbox (published_at) "
    "WHERE published_at IS NOT NULL",
    "CREATE INDEX jsd_outbox_dead ON @jsd_outbox (dead_lettered_at) "
    "WHERE dead_lettered_at IS NOT NULL",
    "CREATE TABLE @jsd_inbox ("
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq BIGINT NOT NULL,"
    " msg_id TEXT,"
    " outcome INTEGER NOT NULL,"
    " detail TEXT,"
    " created_at BIGINT NOT NULL,"
    " PRIMARY KEY (stream, consumer, stream_seq))",
    "CREATE INDEX jsd_inbox_msg ON @jsd_inbox (stream, consumer, msg_id) WHERE msg_id IS NOT NULL",
    "CREATE INDEX jsd_inbox_created ON @jsd_inbox (created_at)",
    "CREATE TABLE @jsd_poison ("
    " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq BIGINT NOT NULL,"
    " msg_id TEXT,"
    " subject TEXT NOT NULL,"
    " diagnostic TEXT NOT NULL,"
    " headers BYTEA,"
    " payload BYTEA,"
    " created_at BIGINT NOT NULL,"
    " dlq_stream TEXT,"
    " dlq_seq BIGINT,"
    " UNIQUE (stream, consumer, stream_seq))",
    NULL};

/* 2: the store's identity (the default message-id namespace); see sqlite.c. */
static const char *const migration_2[] = {
    "CREATE TABLE @jsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)", NULL};

/* 3: room on every outbox page for the lease a claim writes, so that the
 * claim's update stays on its page as a heap-only tuple (HOT: the lease
 * columns are in no index) and adds no index entries the next claim's scan
 * must step over; only the receipt's update makes a new indexed version.
 * Pages written before the migration keep their old packing. Each receipt
 * leaves a dead entry in the pending index until vacuum: vacuum the outbox
 * after 5000 + 1 % of its rows changed, not the default 20 %, which in a
 * table keeping millions of published rows for the duplicate window would
 * let claims step over hundreds of thousands of them. */
static const char *const migration_3[] = {
    "ALTER TABLE @jsd_outbox SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, "
    "autovacuum_vacuum_threshold = 5000)",
    NULL};

/* 4: the SQL contract (docs/SQL-CONTRACT.md). A foreign writer calls
 * jsd_emit(...) in its own transaction, or INSERTs (owner, effect_id,
 * subject, payload) itself: created_at defaults to the insert's clock, and
 * the BEFORE INSERT trigger jsd_outbox_fill sets not_before, next_attempt_at
 * and msg_id when the writer left them NULL, the msg id derived as
 * jsd_effect_msg_id derives it (sha256() over the length-delimited parts)
 * under the namespace of jsd_msg_id_namespace(). The library's own inserts
 * set them all, so the trigger's WHEN skips them. headers_json takes JSON
 * object headers; headers stays the library's encoding. The same trigger
 * checks a new row against the contract's rules (PG_RULE), raising
 * check_violation with the rule's name: rows from before are not rewritten
 * nor refused; one that breaks a rule is dead-lettered by the relay when
 * claimed, as is a row whose writer went around the trigger
 * (jsd__batch_add). */
#define PG_NOW_MS JSD__PG_NOW_MS
/* Negated character classes and octet_length(), never a counted repetition
 * ({1,64}) nor translate(): each of those cost 20 us a row, and the
 * library's own INSERTs pay for every CHECK. */
#define PG_IDENT_OK(col)                                                                           \
    "octet_length(" col ") <= " JSD__XSTR(JSD_IDENT_MAX) " AND " col " !~ '[\\x01-\\x1f\\x7f]'"
/* One rule of the contract, checked by jsd_outbox_fill: the first broken
 * one is named in r. In the trigger rather than as CHECK constraints, which
 * PostgreSQL prepares again for every INSERT statement (11 of them cost the
 * library's own single-row INSERT 120 us); the library's rows, which set
 * every column the trigger fills, skip it. */
#define PG_RULE(name, ok)                                                                          \
    "IF r IS NULL AND NOT coalesce((" ok "), true) THEN r := '" name "'; END IF; "
/* clang-format off */
/* The insert trigger of the SQL contract (migration 4, and 7 with the
 * header-value rule of subject.h's jsd__header_value_edges), and the
 * headers_json rules it applies. */
#define PG_OUTBOX_FILL(value_rule) \
    "CREATE OR REPLACE FUNCTION @jsd_outbox_fill() RETURNS trigger LANGUAGE plpgsql AS $$ " \
    "DECLARE rule text; r text; BEGIN " \
    "NEW.created_at := coalesce(NEW.created_at, " PG_NOW_MS "); " \
    "NEW.not_before := coalesce(NEW.not_before, NEW.created_at); " \
    "NEW.next_attempt_at := coalesce(NEW.next_attempt_at, NEW.not_before); " \
    "IF NEW.msg_id IS NULL THEN NEW.msg_id := @jsd_msg_id(NEW.owner, NEW.effect_id); END IF; " \
    PG_RULE("jsd_outbox_owner", PG_IDENT_OK("NEW.owner")) \
    PG_RULE("jsd_outbox_effect_id", "NEW.effect_id <> '' AND " PG_IDENT_OK("NEW.effect_id")) \
    PG_RULE("jsd_outbox_order_key", "NEW.order_key IS NULL OR (NEW.order_key <> '' AND " \
            PG_IDENT_OK("NEW.order_key") ")") \
    PG_RULE("jsd_outbox_subject_length", \
            "octet_length(NEW.subject) BETWEEN 1 AND " JSD__XSTR(JSD_SUBJECT_MAX)) \
    PG_RULE("jsd_outbox_subject_exact", "NEW.subject !~ '[^A-Za-z0-9_.-]' AND " \
            "left(NEW.subject, 1) <> '.' AND right(NEW.subject, 1) <> '.' AND " \
            "strpos(NEW.subject, '..') = 0") \
    PG_RULE("jsd_outbox_subject_reserved", \
            "NEW.subject <> '_INBOX' AND left(NEW.subject, 7) <> '_INBOX.'") \
    PG_RULE("jsd_outbox_payload", "octet_length(NEW.payload) <= " JSD__XSTR(JSD__PAYLOAD_CAP_SQL)) \
    PG_RULE("jsd_outbox_msg_id", "octet_length(NEW.msg_id) BETWEEN 1 AND " \
            JSD__XSTR(JSD__MSG_ID_CHARS) " AND NEW.msg_id !~ '[^!-~]'") \
    PG_RULE("jsd_outbox_times", "NEW.not_before >= 0") \
    PG_RULE("jsd_outbox_headers_one_form", "NEW.headers IS NULL OR NEW.headers_json IS NULL") \
    "IF r IS NOT NULL THEN RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = r, " \
    "MESSAGE = r || ': the effect (owner ' || quote_literal(coalesce(NEW.owner, '')) || ', id ' " \
    "|| quote_literal(coalesce(NEW.effect_id, '')) || ') breaks this rule of the outbox " \
    "(docs/SQL-CONTRACT.md)'; END IF; " \
    "rule := @jsd_headers_rule(NEW.headers_json); " \
    "IF rule = 'json' THEN RAISE EXCEPTION USING ERRCODE = 'check_violation', " \
    "CONSTRAINT = 'jsd_outbox_headers_json', MESSAGE = 'jsd_outbox_headers_json: headers_json " \
    "is not a JSON object ({\"Name\": \"value\", ...})'; END IF; " \
    "IF rule IN ('count', 'name', 'value', 'size') THEN RAISE EXCEPTION USING " \
    "ERRCODE = 'check_violation', CONSTRAINT = 'jsd_outbox_header' || " \
    "CASE WHEN rule IN ('count', 'size') THEN 's_' ELSE '_' END || rule, MESSAGE = CASE rule " \
    "WHEN 'count' THEN 'jsd_outbox_headers_count: headers_json holds more than " \
    JSD__XSTR(JSD_HEADERS_MAX) " headers' " \
    "WHEN 'name' THEN 'jsd_outbox_header_name: a header name is 1.." JSD__XSTR(JSD_HEADER_NAME_MAX) \
    " bytes of printable ASCII without spaces or '':'' and does not start with \"Nats-\"' " \
    "WHEN 'value' THEN 'jsd_outbox_header_value: a header value is a JSON string of " value_rule "' " \
    "ELSE 'jsd_outbox_headers_size: the headers take more than " JSD__XSTR(JSD__HEADERS_OWN_MAX) \
    " bytes as encoded on the wire (name: value CRLF each)' END; END IF; " \
    "RETURN NEW; END $$"
#define PG_HEADERS_RULE(value_more) \
    "CREATE OR REPLACE FUNCTION @jsd_headers_rule(h jsonb) RETURNS text LANGUAGE plpgsql " \
    "IMMUTABLE PARALLEL SAFE AS $$ BEGIN IF h IS NULL THEN RETURN NULL; END IF; " \
    "IF jsonb_typeof(h) <> 'object' THEN RETURN 'json'; END IF; " \
    "RETURN (SELECT CASE " \
    "WHEN count(*) > " JSD__XSTR(JSD_HEADERS_MAX) " THEN 'count' " \
    "WHEN bool_or(key = '' OR octet_length(key) > " JSD__XSTR(JSD_HEADER_NAME_MAX) \
    " OR key ~ '[^!-9;-~]' " \
    "OR upper(left(key, 5)) = 'NATS-') THEN 'name' " \
    "WHEN bool_or(jsonb_typeof(value) <> 'string' OR octet_length(value #>> '{}') > " \
    JSD__XSTR(JSD_HEADER_VALUE_MAX) " OR (value #>> '{}') ~ '[\\r\\n]'" value_more ") THEN 'value' " \
    "WHEN coalesce(sum(octet_length(key) + octet_length(value #>> '{}') + 4), 0) > " \
    JSD__XSTR(JSD__HEADERS_OWN_MAX) " THEN 'size' END FROM jsonb_each(h)); END $$"
static const char *const migration_4[] = {
    /* the IF EXISTS of a first run says "skipping" at NOTICE: not worth a log line */
    "SET LOCAL client_min_messages = warning",
    "ALTER TABLE @jsd_outbox ADD COLUMN IF NOT EXISTS headers_json JSONB",
    "ALTER TABLE @jsd_outbox ALTER COLUMN owner SET DEFAULT ''",
    "ALTER TABLE @jsd_outbox ALTER COLUMN created_at SET DEFAULT " PG_NOW_MS,
    "CREATE OR REPLACE FUNCTION @jsd_ld(t text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT "
    "PARALLEL SAFE AS "
    "$$ SELECT int8send(length(convert_to(t, 'UTF8'))::int8) || convert_to(t, 'UTF8') $$",
    "CREATE OR REPLACE FUNCTION @jsd_msg_id_namespace() RETURNS text LANGUAGE sql STABLE AS "
    "$$ SELECT coalesce((SELECT value FROM @jsd_meta WHERE key = '" JSD__META_NAMESPACE "'), "
    "(SELECT value FROM @jsd_meta WHERE key = '" JSD__META_STORE_ID "')) $$",
    "CREATE OR REPLACE FUNCTION @jsd_msg_id(owner text, effect_id text) RETURNS text LANGUAGE sql "
    "STABLE AS "
    "$$ SELECT encode(sha256(@jsd_ld('jsdurable.effect.v2') || @jsd_ld(@jsd_msg_id_namespace()) "
    "|| @jsd_ld(coalesce($1, '')) || @jsd_ld($2)), 'hex') $$",
    PG_OUTBOX_FILL("at most " JSD__XSTR(JSD_HEADER_VALUE_MAX) " bytes without CR or LF"),
    "DROP TRIGGER IF EXISTS jsd_outbox_fill ON @jsd_outbox",
    "CREATE TRIGGER jsd_outbox_fill BEFORE INSERT ON @jsd_outbox FOR EACH ROW "
    "WHEN (NEW.msg_id IS NULL OR NEW.not_before IS NULL OR NEW.next_attempt_at IS NULL "
    "OR NEW.created_at IS NULL OR NEW.headers_json IS NOT NULL) EXECUTE FUNCTION @jsd_outbox_fill()",
    /* The first header rule h breaks: json, count, name, value, size; NULL
     * when none. */
    PG_HEADERS_RULE(""),
    /* An effect from any language, inside the caller's transaction: the
     * msg id back; a repeated (owner, id) raises unique_violation as
     * jsd_tx_emit answers JSD_ERR_EXISTS (here the transaction is aborted,
     * unless the caller wrapped the call in a savepoint). NOTIFY wakes the
     * relays at commit, as jsd_tx_commit does. */
    "CREATE OR REPLACE FUNCTION @jsd_emit(owner text, id text, subject text, payload bytea, "
    "headers jsonb DEFAULT NULL, not_before timestamptz DEFAULT NULL, "
    "order_key text DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$ DECLARE mid text; BEGIN "
    "INSERT INTO @jsd_outbox AS o (owner, effect_id, subject, payload, headers_json, not_before, "
    "order_key) VALUES (coalesce(jsd_emit.owner, ''), jsd_emit.id, jsd_emit.subject, "
    "coalesce(jsd_emit.payload, ''::bytea), jsd_emit.headers, "
    "(floor(extract(epoch FROM jsd_emit.not_before) * 1000))::bigint, jsd_emit.order_key) "
    "ON CONFLICT ON CONSTRAINT jsd_outbox_identity DO NOTHING RETURNING o.msg_id INTO mid; "
    "IF mid IS NULL THEN RAISE EXCEPTION USING ERRCODE = 'unique_violation', "
    "CONSTRAINT = 'jsd_outbox_identity', MESSAGE = format('jsd_emit: effect (owner %L, id %L) "
    "already exists: an effect identity is emitted once', coalesce(jsd_emit.owner, ''), "
    "jsd_emit.id); END IF; PERFORM pg_notify('" JSD__PG_CHANNEL "', ''); RETURN mid; END $$",
    NULL};
/* clang-format on */

/* 5: the duplicate-window horizon and trace context (both back ends): when
 * an effect's first attempt may have reached the broker (the relay watches
 * it against the stream's window: src/relay_horizon.c), and the W3C trace
 * context of each applied delivery. Nullable columns: no rewrite. */
static const char *const migration_5[] = {
    "ALTER TABLE @jsd_outbox ADD COLUMN first_attempt_at BIGINT",
    "ALTER TABLE @jsd_inbox ADD COLUMN traceparent TEXT",
    "ALTER TABLE @jsd_inbox ADD COLUMN tracestate TEXT", NULL};

/* 6: room on its page for nearly every row's lease version (issue 12). At
 * migration 3's fillfactor 70 a page of rows with 256-byte payloads (~430
 * bytes each) keeps ~2.9 KB free, and a lease version is its row plus ~44
 * bytes of lease: 308 of 512 claim updates found no room on their page
 * (tests/integration/test_store.c, pg_claims_stay_on_their_page), each then
 * a new row version elsewhere with an entry in every index. At 50 a page
 * keeps about as much free as its rows take: 44 of 512 moved, and the
 * relay's throughput rose 15-20 % in same-minute pairs (docs/PERFORMANCE.md,
 * run M); 40 measured no better. Pages written before keep their packing;
 * published rows are packed at 50 too. */
static const char *const migration_6[] = {"ALTER TABLE @jsd_outbox SET (fillfactor = 50)", NULL};

/* 7: header values as subject.h's jsd__header_value_edges has them: not
 * empty, no white space first or last (nats.c 3.4.1 receivers cannot read an
 * empty value back and drop the white space), refused at insert as the
 * other rules are. Rows already in the outbox keep their values; the relay
 * dead-letters such a row with the reason when it claims it. */
/* clang-format off */
static const char *const migration_7[] = {
    PG_HEADERS_RULE(" OR (value #>> '{}') = '' OR (value #>> '{}') ~ '^\\s' "
                    "OR (value #>> '{}') ~ '\\s$'"),
    PG_OUTBOX_FILL("1.." JSD__XSTR(JSD_HEADER_VALUE_MAX) " bytes without CR or LF and without "
                   "white space first or last"),
    NULL};
/* clang-format on */

/* 8: the SQL contract's view of publication state (docs/SQL-CONTRACT.md):
 * the outbox row as it is here; SQLite's resolves receipts recorded as runs
 * (sqlite.c's migration_8). */
static const char *const migration_8[] = {
    "CREATE VIEW @jsd_outbox_state AS SELECT id, owner, effect_id, msg_id, subject, headers, "
    "headers_json, payload, order_key, created_at, not_before, next_attempt_at, lease_token, "
    "lease_expires, attempts, last_error, dead_lettered_at, dead_reason, stream, stream_seq, "
    "duplicate, published_at, first_attempt_at FROM @jsd_outbox",
    NULL};

/* 9: receipts of first attempts as runs, and the settled floor ("the
 * settled floor", before floor_raise); issue 12. A receipt written into
 * its row made a second, non-HOT version of each effect, with an entry in
 * every index; a run is one small row per publication run. The ready index
 * now holds first attempts due at insert only (READY_OF), the others have
 * their own (jsd_outbox_rest). DROP INDEX takes the outbox's ACCESS
 * EXCLUSIVE lock, so no writer is between drawing an id and committing it
 * while the floor starts at the first ready row. */
/* clang-format off */
static const char *const migration_9[] = {
    "DROP INDEX @jsd_outbox_ready",
    "CREATE INDEX jsd_outbox_ready ON @jsd_outbox (id) WHERE " READY_OF(""),
    "CREATE INDEX jsd_outbox_rest ON @jsd_outbox (id) WHERE " REST_OF(""),
    "CREATE TABLE @jsd_outbox_runs ("
    " lo BIGINT PRIMARY KEY,"
    " hi BIGINT NOT NULL CHECK (hi >= lo),"
    " stream TEXT NOT NULL,"
    " seq BIGINT NOT NULL,"
    " duplicate BOOLEAN NOT NULL,"
    " published_at BIGINT NOT NULL)",
    "CREATE INDEX jsd_outbox_runs_published ON @jsd_outbox_runs (published_at)",
    "CREATE TABLE @jsd_outbox_floor ("
    " one INTEGER PRIMARY KEY CHECK (one = 1),"
    " floor BIGINT NOT NULL,"
    " gen BIGINT NOT NULL)",
    "INSERT INTO @jsd_outbox_floor (one, floor, gen) SELECT 1, coalesce(min(id) FILTER (WHERE "
    READY_OF("") "), max(id) + 1, 1), 0 FROM @jsd_outbox",
    "CREATE OR REPLACE VIEW @jsd_outbox_state AS SELECT o.id, o.owner, o.effect_id, o.msg_id, "
    "o.subject, o.headers, o.headers_json, o.payload, o.order_key, o.created_at, o.not_before, "
    "o.next_attempt_at, CASE WHEN r.lo IS NULL THEN o.lease_token END AS lease_token, "
    "CASE WHEN r.lo IS NULL THEN o.lease_expires END AS lease_expires, o.attempts, "
    "o.last_error, o.dead_lettered_at, o.dead_reason, "
    "CASE WHEN r.lo IS NULL THEN o.stream ELSE r.stream END AS stream, "
    "CASE WHEN r.lo IS NULL THEN o.stream_seq ELSE r.seq + (o.id - r.lo) END AS stream_seq, "
    "CASE WHEN r.lo IS NULL THEN o.duplicate ELSE r.duplicate END AS duplicate, "
    "CASE WHEN r.lo IS NULL THEN o.published_at ELSE r.published_at END AS published_at, "
    "o.first_attempt_at FROM @jsd_outbox o LEFT JOIN LATERAL (SELECT x.* FROM (SELECT * FROM "
    "@jsd_outbox_runs y WHERE y.lo <= o.id ORDER BY y.lo DESC LIMIT 1) x WHERE x.hi >= o.id) r "
    "ON true",
    /* One walk of the floor (floor_raise): from the floor up, over runs
     * and rows that are not ready, to the first ready row no run covers,
     * the top (the largest id + 1) or the first id missing (drawn by a
     * transaction still open, or by one that rolled back): that one is
     * passed only inside skip_lo..skip_hi - 1, which the caller gives once
     * every transaction that was open at the walk that found it has
     * ended; until then it is answered as the gap, with the top as bound.
     * The floor is written only if nobody lowered it meanwhile (gen). */
    "CREATE OR REPLACE FUNCTION @jsd_outbox_floor_raise(skip_lo int8, skip_hi int8, "
    "OUT gap int8, OUT bound int8) LANGUAGE plpgsql AS $$ "
    "DECLARE f int8; g int8; x int8; top int8; h int8; rdy bool; steps int := 0; BEGIN "
    "PERFORM set_config('synchronous_commit', 'off', true); "
    "SELECT fl.floor, fl.gen INTO f, g FROM @jsd_outbox_floor fl; "
    "SELECT coalesce(max(o.id), 0) + 1 INTO top FROM @jsd_outbox o; "
    "x := f; "
    "WHILE x < top AND steps < 100000 LOOP "
    "steps := steps + 1; "
    "SELECT cv.hi INTO h FROM @jsd_outbox_runs cv WHERE cv.lo <= x ORDER BY cv.lo DESC LIMIT 1; "
    "IF h >= x THEN x := h + 1; CONTINUE; END IF; "
    "SELECT (" READY_OF("o.") ") INTO rdy FROM @jsd_outbox o WHERE o.id = x; "
    "IF FOUND THEN EXIT WHEN rdy; x := x + 1; CONTINUE; END IF; "
    "IF x >= skip_lo AND x < skip_hi THEN "
    "x := least(skip_hi, (SELECT min(o.id) FROM @jsd_outbox o WHERE o.id > x), "
    "(SELECT min(cv.lo) FROM @jsd_outbox_runs cv WHERE cv.lo > x)); CONTINUE; END IF; "
    "gap := x; bound := top; EXIT; "
    "END LOOP; "
    "IF x > f THEN UPDATE @jsd_outbox_floor SET floor = x WHERE gen = g AND floor = f; END IF; "
    "END $$",
    NULL};
/* clang-format on */

/* 10: replay requests (`jsdurable dlq replay --store`): a dead letter to be
 * applied again by the durable that parked it, and by no other (issue 42,
 * item 6). state: 0 pending, 1 applied, 2 failed. */
static const char *const migration_10[] = {
    "CREATE TABLE @jsd_replay ("
    " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq BIGINT NOT NULL,"
    " dlq_stream TEXT NOT NULL,"
    " dlq_seq BIGINT NOT NULL,"
    " state INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),"
    " detail TEXT,"
    " requested_at BIGINT NOT NULL,"
    " done_at BIGINT,"
    " CONSTRAINT jsd_replay_delivery UNIQUE (stream, consumer, stream_seq))",
    "CREATE INDEX jsd_replay_pending ON @jsd_replay (stream, consumer, id) WHERE state = 0", NULL};

/* 11: each durable's acknowledged floor as the server reported it, recorded
 * by its running consumer and by gc before it removes inbox rows (issue 42):
 * where a lost durable is re-created (consumer_position.c). */
static const char *const migration_11[] = {"CREATE TABLE @jsd_durable_floor ("
                                           " stream TEXT NOT NULL,"
                                           " consumer TEXT NOT NULL,"
                                           " ack_floor BIGINT NOT NULL,"
                                           " recorded_at BIGINT NOT NULL,"
                                           " PRIMARY KEY (stream, consumer))",
                                           NULL};

static const char *const *const MIGRATIONS[] = {migration_1, migration_2,  migration_3, migration_4,
                                                migration_5, migration_6,  migration_7, migration_8,
                                                migration_9, migration_10, migration_11};

const char *const *jsd__pg_migration(int v)
{
    if (v == 0)
        return VERSION_TABLE;
    return v >= 1 && v <= (int)JSD_ARRAY_LEN(MIGRATIONS) ? MIGRATIONS[v - 1] : NULL;
}

/* Type OIDs of the binary array elements we send. */
#define OID_BOOL  16
#define OID_BYTEA 17
#define OID_INT8  20
#define OID_INT4  23
#define OID_TEXT  25

typedef struct pg {
    PGconn *conn;
    char schema[64];
    char prefix[72]; /* "schema". */
    bool prepared[P__COUNT];
    bool listening;
    bool begin_pending;      /* jsd_tx_begin ran; BEGIN goes with the next statement */
    bool plans_set;          /* relay_plans ran on this session */
    int64_t claim_floor;     /* see pg_claim */
    int64_t floor_since_ms;  /* monotonic: when the floor left 0 */
    int64_t takeover_due_ms; /* monotonic: a claim waits for the takeover lock from then */
    int64_t gap, gap_bound;  /* the id missing where the floor stopped, and the top then */
    char *gap_holders;       /* the transactions open then: text[], binary */
    int gap_holders_len;
    /* receipts committed without their flush (pg_receipts), and whether the
     * session they ran on was reset before it (pg_sync_receipts) */
    enum { RECEIPTS_FLUSHED, RECEIPTS_UNFLUSHED, RECEIPTS_FLUSH_LOST } receipts;
    char *password; /* to scrub from libpq's messages; wiped */
} pg;

#define PG(s) ((pg *)(s)->be)

/* ---- errors ------------------------------------------------------------------------- */

/* Copy libpq's text into out on one line, with the URL password hidden. */
static void clean_msg(jsd_store *s, const char *in, char *out, size_t cap)
{
    size_t o = 0;
    const char *pw = PG(s) ? PG(s)->password : NULL;
    size_t pwl = pw ? strlen(pw) : 0;
    for (const char *p = in ? in : ""; *p && o + 1 < cap;) {
        if (pwl && strncmp(p, pw, pwl) == 0) {
            for (const char *r = "***"; *r && o + 1 < cap; r++)
                out[o++] = *r;
            p += pwl;
            continue;
        }
        char c = *p++;
        if (c == '\n' || c == '\t' || c == '\r') {
            while (*p == '\n' || *p == '\t' || *p == '\r')
                p++;
            if (*p && o + 2 < cap) {
                out[o++] = ';';
                out[o++] = ' ';
            }
            continue;
        }
        out[o++] = c;
    }
    while (o > 0 && (out[o - 1] == ' ' || out[o - 1] == ';'))
        o--;
    out[o] = '\0';
}

static jsd_status map_sqlstate(const char *st)
{
    if (!st || !*st)
        return JSD_ERR_STORE;
    if (!strcmp(st, "23505"))
        return JSD_ERR_EXISTS;
    if (!strcmp(st, "53100"))
        return JSD_ERR_FULL;
    if (!strcmp(st, "25006"))
        return JSD_ERR_READONLY;
    if (!strcmp(st, "40001") || !strcmp(st, "40P01") || !strcmp(st, "55P03"))
        return JSD_ERR_BUSY;
    if (!strncmp(st, "08", 2) || !strcmp(st, "57P01") || !strcmp(st, "57P02") ||
        !strcmp(st, "57P03"))
        return JSD_ERR_CONNECT;
    if (!strncmp(st, "28", 2))
        return JSD_ERR_AUTH;
    if (!strcmp(st, "53200"))
        return JSD_ERR_NOMEM;
    return JSD_ERR_STORE;
}

/* Record a failed result (res may be NULL: the connection's message). */
static jsd_status pg_fail(jsd_store *s, PGresult *res, const char *what)
{
    pg *p = PG(s);
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *text = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (!text)
        text = PQerrorMessage(p->conn);
    jsd_status st = map_sqlstate(state);
    if (st == JSD_ERR_STORE && PQstatus(p->conn) == CONNECTION_BAD)
        st = JSD_ERR_CONNECT;
    char clean[300];
    clean_msg(s, text, clean, sizeof(clean));
    const char *hint = st == JSD_ERR_FULL ? "; the database disk is full: nothing was committed"
                       : st == JSD_ERR_CONNECT ? "; the connection to PostgreSQL is lost"
                                               : "";
    jsd__store_err(s, st, "%s failed on store \"%s\": %s (SQLSTATE %s)%s", what, s->url_safe, clean,
                   state ? state : "none", hint);
    if (state)
        jsd__strlcpy(s->err.sqlstate, state, sizeof(s->err.sqlstate));
    return st;
}

/* ---- statements --------------------------------------------------------------------- */

/* Substitute "@" with the quoted schema prefix. */
static char *with_schema(jsd_store *s, const char *sql)
{
    size_t n = 0, at = 0, pl = strlen(PG(s)->prefix);
    for (const char *p = sql; *p; p++, n++)
        at += *p == '@';
    char *out = jsd__malloc(n + at * pl + 1);
    if (!out)
        return NULL;
    char *o = out;
    for (const char *p = sql; *p; p++) {
        if (*p == '@') {
            memcpy(o, PG(s)->prefix, pl);
            o += pl;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

/* Run sql (statements returning no rows) as it is. */
static jsd_status command(jsd_store *s, const char *sql, const char *what)
{
    PGresult *r = PQexec(PG(s)->conn, sql);
    jsd_status rc = PQresultStatus(r) == PGRES_COMMAND_OK ? JSD_OK : pg_fail(s, r, what);
    PQclear(r);
    return rc;
}

/* Session settings the library relies on, made on every connection: when
 * it opens and again after each PQreset (a new server session).
 * - client_min_messages = warning: a NOTICE of the library's own statements
 *   is noise in the application's log (pg_notice logs what still comes).
 * - jit = off: every statement of the library is a short one, and
 *   PostgreSQL turns its JIT on by a plan's estimated cost, compiling for
 *   tens of milliseconds to save microseconds. A generic plan's estimate
 *   for a range of ids in an outbox of a few hundred thousand rows crosses
 *   jit_above_cost: on 1M rows each receipt statement (P_RECEIPTS) took
 *   133 ms instead of 3 (EXPLAIN ANALYZE), and bench-scale's relay behind
 *   5M published rows fell from 23k to 2.2k msg/s (docs/PERFORMANCE.md,
 *   run S9). An application that wants JIT for its own statements on this
 *   connection turns it on for its transaction alone (SET LOCAL jit = on). */
static jsd_status session_setup(jsd_store *s)
{
    /* never behind an owed BEGIN: a rolled-back transaction would undo it */
    return command(s, "SET client_min_messages = warning; SET jit = off",
                   "configuring the session");
}

/* A new server session on the same connection: PQreset, then what the old
 * session held is forgotten (prepared statements, LISTEN, plan settings)
 * and the session settings are made again. */
static jsd_status session_reset(jsd_store *s)
{
    pg *p = PG(s);
    PQreset(p->conn);
    if (p->receipts == RECEIPTS_UNFLUSHED)
        p->receipts = RECEIPTS_FLUSH_LOST;
    memset(p->prepared, 0, sizeof(p->prepared));
    p->listening = false;
    p->plans_set = false;
    if (PQstatus(p->conn) != CONNECTION_OK)
        return pg_fail(s, NULL, "reconnecting to PostgreSQL");
    return session_setup(s);
}

/* The connection is usable, re-established when it broke outside a transaction. */
static jsd_status ready(jsd_store *s)
{
    pg *p = PG(s);
    if (PQstatus(p->conn) == CONNECTION_OK)
        return JSD_OK;
    if (s->tx.active)
        return pg_fail(s, NULL, "the store connection");
    jsd_status rc = session_reset(s);
    if (rc != JSD_OK)
        return rc;
    JSD_INFO("store", "reconnected to PostgreSQL store \"%s\"", s->url_safe);
    return JSD_OK;
}

/* DESIGN (deferred BEGIN): jsd_tx_begin sends nothing. The transaction's
 * BEGIN goes in one pipeline with its first statement (libpq pipeline
 * mode: BEGIN, the prepared statement, one Sync), so an application
 * transaction costs one round trip less: an emit-only one is two (the
 * INSERT with its BEGIN, NOTIFY with COMMIT), not three. Nothing else
 * changes: every statement of the transaction still runs after BEGIN, on
 * the server, in order. Statements that do not go through pexec send the
 * BEGIN first on its own (begin_owed): savepoints, and the connection an
 * application gets from jsd_tx_pg. A transaction in which nothing ran
 * commits or rolls back without a round trip. */

/* The first result of the pipeline's next query; its other results (and
 * the NULL that ends them) are read and cleared. */
static PGresult *next_query_result(PGconn *c)
{
    PGresult *first = PQgetResult(c), *r;
    if (first)
        while ((r = PQgetResult(c)) != NULL)
            PQclear(r);
    return first;
}

/* BEGIN, then prepared statement name, in one pipeline. Returns the
 * statement's result, or a failed BEGIN's (the statement then did not
 * run); NULL when libpq could not send or the connection broke (the error
 * is in PQerrorMessage, and the caller's PQresultStatus(NULL) is a
 * failure). */
static PGresult *begin_and_exec(jsd_store *s, const char *name, int n, const char *const *vals,
                                const int *lens, const int *fmts)
{
    PGconn *c = PG(s)->conn;
    PG(s)->begin_pending = false;
    if (!PQenterPipelineMode(c))
        return NULL;
    PGresult *out = NULL;
    if (PQsendQueryParams(c, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) &&
        PQsendQueryPrepared(c, name, n, vals, lens, fmts, 1) && PQpipelineSync(c)) {
        PGresult *begin = next_query_result(c);
        out = next_query_result(c); /* PIPELINE_ABORTED after a failed BEGIN */
        if (PQresultStatus(begin) != PGRES_COMMAND_OK) {
            PQclear(out);
            out = begin;
        } else {
            PQclear(begin);
        }
        PGresult *r;
        while (PQstatus(c) != CONNECTION_BAD && (r = PQgetResult(c)) != NULL) {
            bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
            PQclear(r);
            if (sync)
                break;
        }
    }
    if (!PQexitPipelineMode(c) && PQstatus(c) != CONNECTION_BAD) {
        /* the Sync was not reached: the outcome is not known */
        PQclear(out);
        return NULL;
    }
    return out;
}

/* Execute prepared statement id; NULL on failure (error recorded). want is
 * PGRES_TUPLES_OK or PGRES_COMMAND_OK. */
/* Prepare statement id on this session once; its name into name[16]. */
static bool prepare(jsd_store *s, int id, char *name, const char *what)
{
    pg *p = PG(s);
    jsd__snprintf(name, 16, "jsd_%d", id);
    if (p->prepared[id])
        return true;
    char *sql = with_schema(s, sql_text[id]);
    if (!sql) {
        jsd__store_err(s, JSD_ERR_NOMEM, "out of memory preparing a statement");
        return false;
    }
    PGresult *r = PQprepare(p->conn, name, sql, 0, NULL);
    jsd__free(sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        pg_fail(s, r, what);
    PQclear(r);
    p->prepared[id] = ok;
    return ok;
}

static PGresult *pexec(jsd_store *s, int id, int n, const char *const *vals, const int *lens,
                       const int *fmts, ExecStatusType want, const char *what)
{
    pg *p = PG(s);
    char name[16];
    if (!prepare(s, id, name, what))
        return NULL;
    PGresult *r = p->begin_pending ? begin_and_exec(s, name, n, vals, lens, fmts)
                                   : PQexecPrepared(p->conn, name, n, vals, lens, fmts, 1);
    if (PQresultStatus(r) != want) {
        pg_fail(s, r, what);
        PQclear(r);
        return NULL;
    }
    return r;
}

/* Statement id in a transaction of its own behind lock statement lock_id:
 * BEGIN, the lock, the statement, COMMIT, in one pipeline (one round trip).
 * The statement's snapshot is taken after the lock is granted. Never inside
 * an application's transaction (the relay's sessions have none). Returns
 * the statement's result as pexec does; a failed commit fails it. */
static PGresult *locked_exec(jsd_store *s, int lock_id, bool *locked, int id, int n,
                             const char *const *vals, const int *lens, const int *fmts,
                             ExecStatusType want, const char *what)
{
    PGconn *c = PG(s)->conn;
    char lock[16], name[16];
    if (!prepare(s, lock_id, lock, what) || !prepare(s, id, name, what))
        return NULL;
    if (!PQenterPipelineMode(c)) {
        pg_fail(s, NULL, what);
        return NULL;
    }
    PGresult *res[4] = {NULL};
    bool sent = PQsendQueryParams(c, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) &&
                PQsendQueryPrepared(c, lock, 0, NULL, NULL, NULL, 1) &&
                PQsendQueryPrepared(c, name, n, vals, lens, fmts, 1) &&
                PQsendQueryParams(c, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) && PQpipelineSync(c);
    bool synced = false;
    if (sent) {
        for (int i = 0; i < 4; i++)
            res[i] = next_query_result(c);
        PGresult *r;
        while (PQstatus(c) != CONNECTION_BAD && (r = PQgetResult(c)) != NULL) {
            synced = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
            PQclear(r);
            if (synced)
                break;
        }
    }
    if (!PQexitPipelineMode(c) || !synced) {
        /* the pipeline's end was not reached: what ran is not known, and
         * the session is reset so that no half transaction stays open */
        for (int i = 0; i < 4; i++)
            PQclear(res[i]);
        pg_fail(s, NULL, what);
        jsd_error keep = s->err;
        session_reset(s);
        s->err = keep;
        return NULL;
    }
    /* the first failure is the one to report; the rest were aborted */
    int bad = -1;
    ExecStatusType ok[4] = {PGRES_COMMAND_OK, PGRES_TUPLES_OK, want, PGRES_COMMAND_OK};
    for (int i = 0; i < 4 && bad < 0; i++)
        if (PQresultStatus(res[i]) != ok[i])
            bad = i;
    if (locked) /* the lock statement's text answer: "true" when it holds the lock */
        *locked = bad < 0 && PQntuples(res[1]) == 1 && PQgetvalue(res[1], 0, 0)[0] == 't';
    if (bad >= 0) {
        pg_fail(s, res[bad], what);
        if (PQtransactionStatus(c) != PQTRANS_IDLE) /* the failed transaction is still open */
            PQclear(PQexec(c, "ROLLBACK"));
    }
    for (int i = 0; i < 4; i++)
        if (i != 2 || bad >= 0)
            PQclear(res[i]);
    return bad >= 0 ? NULL : res[2];
}

/* A transaction's BEGIN still owed by jsd_tx_begin, sent on its own: for
 * statements that do not go through pexec (savepoints, the application's
 * own SQL on jsd_tx_pg's connection). */
static jsd_status begin_owed(jsd_store *s)
{
    pg *p = PG(s);
    if (!p->begin_pending)
        return JSD_OK;
    p->begin_pending = false;
    return command(s, "BEGIN", "BEGIN");
}

static jsd_status simple(jsd_store *s, const char *sql, const char *what)
{
    jsd_status rc = begin_owed(s);
    return rc == JSD_OK ? command(s, sql, what) : rc;
}

/* Binary result readers. */
static int64_t get_i64(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    const unsigned char *v = (const unsigned char *)PQgetvalue(r, row, col);
    int len = PQgetlength(r, row, col);
    uint64_t x = 0;
    for (int i = 0; i < len && i < 8; i++)
        x = (x << 8) | v[i];
    if (len == 4)
        return (int32_t)(uint32_t)x;
    if (len == 1)
        return v[0] != 0;
    return (int64_t)x;
}

static const char *get_str(const PGresult *r, int row, int col, size_t *len)
{
    if (PQgetisnull(r, row, col)) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = (size_t)PQgetlength(r, row, col);
    return PQgetvalue(r, row, col);
}

static char *get_dup(const PGresult *r, int row, int col)
{
    size_t n;
    const char *v = get_str(r, row, col, &n);
    return v ? jsd__strndup(v, n) : NULL;
}

/* Parameter helpers. */
typedef struct params {
    const char *v[12];
    int len[12];
    int fmt[12];
    char num[12][24];
    int n;
} params;

static void p_text(params *p, const char *v)
{
    p->v[p->n] = v;
    p->len[p->n] = 0;
    p->fmt[p->n] = 0;
    p->n++;
}

static void p_i64(params *p, int64_t v)
{
    jsd__snprintf(p->num[p->n], sizeof(p->num[0]), "%lld", (long long)v);
    p_text(p, p->num[p->n]);
}

static void p_bin(params *p, const void *v, size_t n)
{
    p->v[p->n] = (const char *)v; /* NULL is SQL NULL */
    p->len[p->n] = (int)n;
    p->fmt[p->n] = 1;
    p->n++;
}

/* A one-dimensional array in PostgreSQL's binary format. */
typedef struct arr {
    unsigned char *buf;
    size_t len, cap;
    uint32_t count;
    bool has_null, oom;
    uint32_t oid;
} arr;

static void put32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static void arr_init(arr *a, uint32_t oid)
{
    memset(a, 0, sizeof(*a));
    a->oid = oid;
    a->len = 20; /* header written by arr_done */
}

static void arr_raw(arr *a, const void *v, int32_t n)
{
    size_t need = a->len + 4 + (n > 0 ? (size_t)n : 0);
    if (a->oom)
        return;
    if (need > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < need)
            cap *= 2;
        unsigned char *nb = jsd__realloc(a->buf, cap);
        if (!nb) {
            a->oom = true;
            return;
        }
        a->buf = nb;
        a->cap = cap;
    }
    put32(a->buf + a->len, (uint32_t)n);
    a->len += 4;
    if (n > 0) {
        memcpy(a->buf + a->len, v, (size_t)n);
        a->len += (size_t)n;
    }
    if (n < 0)
        a->has_null = true;
    a->count++;
}

static void arr_str(arr *a, const char *v)
{
    arr_raw(a, v, v ? (int32_t)strlen(v) : -1);
}

static void arr_i64(arr *a, int64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)v >> (56 - 8 * i));
    arr_raw(a, b, 8);
}

static void arr_i64_or_null(arr *a, int64_t v, bool null)
{
    if (null)
        arr_raw(a, NULL, -1);
    else
        arr_i64(a, v);
}

static void arr_i32(arr *a, int32_t v)
{
    unsigned char b[4];
    put32(b, (uint32_t)v);
    arr_raw(a, b, 4);
}

static void arr_bool(arr *a, bool v)
{
    unsigned char b = v ? 1 : 0;
    arr_raw(a, &b, 1);
}

static bool arr_done(arr *a)
{
    if (a->oom)
        return false;
    if (!a->buf) {
        a->buf = jsd__malloc(20);
        if (!a->buf)
            return false;
        a->cap = 20;
    }
    put32(a->buf, 1);
    put32(a->buf + 4, a->has_null ? 1 : 0);
    put32(a->buf + 8, a->oid);
    put32(a->buf + 12, a->count);
    put32(a->buf + 16, 1);
    return true;
}

static void arr_free(arr *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jsd__free(a[i].buf);
}

static void p_arr(params *p, const arr *a)
{
    p_bin(p, a->buf, a->len);
}

/* ---- operations ---------------------------------------------------------------------- */

static void pg_close(jsd_store *s)
{
    pg *p = PG(s);
    if (!p)
        return;
    PQfinish(p->conn);
    jsd__free(p->gap_holders);
    jsd__free_secret(p->password);
    jsd__free(p);
    s->be = NULL;
}

static jsd_status pg_tx(jsd_store *s, jsd__txop op)
{
    switch (op) {
    case JSD__TX_BEGIN: {
        jsd_status rc = ready(s);
        if (rc == JSD_OK)
            PG(s)->begin_pending = true; /* sent with the first statement */
        return rc;
    }
    case JSD__TX_COMMIT:
    case JSD__TX_COMMIT_NOTIFY: {
        if (PG(s)->begin_pending) { /* nothing ran: nothing to commit */
            PG(s)->begin_pending = false;
            return JSD_OK;
        }
        /* One round trip; NOTIFY is delivered only if the COMMIT succeeds. */
        PGresult *r = PQexec(
            PG(s)->conn, op == JSD__TX_COMMIT ? "COMMIT" : "NOTIFY " JSD__PG_CHANNEL "; COMMIT");
        jsd_status rc;
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            rc = pg_fail(s, r, "COMMIT");
            /* The server refused: it rolled back. A lost connection leaves the
             * outcome unknown. */
            size_t l = strlen(s->err.msg);
            jsd__snprintf(s->err.msg + l, sizeof(s->err.msg) - l, "%s",
                          PQstatus(PG(s)->conn) == CONNECTION_BAD
                              ? "; whether the transaction committed is unknown"
                              : "; the transaction was rolled back, nothing was committed");
        } else if (strcmp(PQcmdStatus(r), "COMMIT") != 0)
            rc = jsd__store_err(s, JSD_ERR_STORE,
                                "COMMIT on store \"%s\" rolled back instead: an earlier statement "
                                "of the transaction failed, so nothing was committed",
                                s->url_safe);
        else
            rc = JSD_OK;
        PQclear(r);
        return rc;
    }
    case JSD__TX_ROLLBACK:
        PG(s)->begin_pending = false;
        if (PQtransactionStatus(PG(s)->conn) == PQTRANS_IDLE)
            return JSD_OK;
        return simple(s, "ROLLBACK", "ROLLBACK");
    case JSD__TX_SAVEPOINT:
        return simple(s, "SAVEPOINT jsd_sp", "SAVEPOINT");
    case JSD__TX_RELEASE:
        return simple(s, "RELEASE SAVEPOINT jsd_sp", "RELEASE SAVEPOINT");
    case JSD__TX_ROLLBACK_TO:
        return simple(s, "ROLLBACK TO SAVEPOINT jsd_sp; RELEASE SAVEPOINT jsd_sp",
                      "ROLLBACK TO SAVEPOINT");
    }
    return JSD_ERR_INTERNAL;
}

static jsd_status emit_one(jsd_store *s, const jsd__row *r, size_t *dup_index)
{
    params p = {.n = 0};
    p_text(&p, r->owner);
    p_text(&p, r->effect_id);
    p_text(&p, r->msg_id);
    p_text(&p, r->subject);
    p_bin(&p, r->headers, r->headers_len);
    p_bin(&p, r->payload, r->len);
    p_text(&p, r->order_key);
    p_i64(&p, r->created_at);
    p_i64(&p, r->not_before);
    PGresult *res =
        pexec(s, P_INSERT1, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "emitting an effect");
    if (!res)
        return s->err.status;
    bool inserted = strcmp(PQcmdTuples(res), "1") == 0;
    PQclear(res);
    if (!inserted) {
        *dup_index = 0;
        return JSD_ERR_EXISTS;
    }
    return JSD_OK;
}

static jsd_status pg_emit(jsd_store *s, const jsd__row *rows, size_t n, size_t *dup_index)
{
    if (n == 1)
        return emit_one(s, rows, dup_index);
    arr a[9];
    static const uint32_t oids[9] = {OID_TEXT,  OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA,
                                     OID_BYTEA, OID_TEXT, OID_INT8, OID_INT8};
    for (int i = 0; i < 9; i++)
        arr_init(&a[i], oids[i]);
    for (size_t i = 0; i < n; i++) {
        const jsd__row *r = &rows[i];
        arr_str(&a[0], r->owner);
        arr_str(&a[1], r->effect_id);
        arr_str(&a[2], r->msg_id);
        arr_str(&a[3], r->subject);
        arr_raw(&a[4], r->headers, r->headers ? (int32_t)r->headers_len : -1);
        arr_raw(&a[5], r->payload, (int32_t)r->len);
        arr_str(&a[6], r->order_key);
        arr_i64(&a[7], r->created_at);
        arr_i64(&a[8], r->not_before);
    }
    jsd_status rc = JSD_OK;
    params p = {.n = 0};
    for (int i = 0; i < 9; i++) {
        if (!arr_done(&a[i])) {
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory emitting %zu effects", n);
            goto out;
        }
        p_arr(&p, &a[i]);
    }
    /* NOT EXISTS instead of ON CONFLICT: speculative insertion doubles the
     * cost of a batch. The front has refused repeats inside the batch; an
     * identity committed concurrently by another transaction meets the unique
     * index instead (23505), which aborts this transaction. */
    PGresult *res =
        pexec(s, P_INSERT_MANY, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "emitting effects");
    if (!res) {
        rc = s->err.status;
        if (rc == JSD_ERR_EXISTS)
            *dup_index = n; /* which one is not known */
        goto out;
    }
    size_t got = (size_t)PQntuples(res);
    if (got < n) {
        /* Some identity already existed: undo the rows this statement inserted so
         * the batch is all or nothing, learning their identities as they go, and
         * name the first input row that was not among them. */
        arr ids;
        arr_init(&ids, OID_INT8);
        for (size_t k = 0; k < got; k++)
            arr_i64(&ids, get_i64(res, (int)k, 0));
        PQclear(res);
        res = NULL;
        rc = JSD_ERR_EXISTS;
        if (got > 0) {
            params d = {.n = 0};
            if (!arr_done(&ids)) {
                rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory undoing a batch");
            } else {
                p_arr(&d, &ids);
                res = pexec(s, P_DELETE_IDS, d.n, d.v, d.len, d.fmt, PGRES_TUPLES_OK,
                            "undoing a partly inserted batch");
                if (!res)
                    rc = s->err.status;
            }
        }
        arr_free(&ids, 1);
        size_t first = n, undone = res ? (size_t)PQntuples(res) : 0;
        for (size_t i = 0; i < n && first == n; i++) {
            bool found = false;
            for (size_t k = 0; k < undone && !found; k++) {
                size_t ol, il;
                const char *o = get_str(res, (int)k, 0, &ol);
                const char *e = get_str(res, (int)k, 1, &il);
                found = ol == strlen(rows[i].owner) && !memcmp(o, rows[i].owner, ol) &&
                        il == strlen(rows[i].effect_id) && !memcmp(e, rows[i].effect_id, il);
            }
            /* A repeat inside the batch also counts: it was inserted once. */
            for (size_t j = 0; j < i && found; j++)
                if (!strcmp(rows[j].owner, rows[i].owner) &&
                    !strcmp(rows[j].effect_id, rows[i].effect_id))
                    found = false;
            if (!found)
                first = i;
        }
        *dup_index = first < n ? first : 0;
    }
    PQclear(res);
out:
    arr_free(a, 9);
    return rc;
}

static int by_row_id(const void *a, const void *b)
{
    int64_t x = ((const jsd__claimed *)a)->row_id, y = ((const jsd__claimed *)b)->row_id;
    return (x > y) - (x < y);
}

/* A relay's sessions (its claims; the receipt writer's) never plan a
 * sequential scan of the outbox (enable_seqscan = off: the planner takes one
 * only where no index serves), and plan each prepared statement once, not
 * at each execution (plan_cache_mode = force_generic_plan). PostgreSQL's
 * default switches a prepared statement to a generic plan after five
 * executions when that looks no dearer, and keeps it until the table's
 * statistics change: one made while the outbox was still small (a relay
 * started on an empty outbox) found the claim's rows by a sequential scan,
 * whose cost grew with the table until autovacuum analyzed it. In
 * bench_relay's latency run (fresh outbox, 1k effects/s) claims then took
 * 2-3.7 ms instead of 0.5-1.2 and the commit -> PubAck p50 moved between
 * 2.7 and 10 ms from run to run. Every statement of these sessions has an
 * index to use (EXPLAIN of the claim's generic plan on an empty, unanalyzed
 * outbox: index scans only). Left to itself with seqscans off, the server
 * kept planning the claim and the receipts at every execution (their
 * generic plans' estimates looked dearer): statement logs of bench_relay's
 * throughput run showed binds of 0.28 ms for a claim, 0.81 ms for a batch's
 * receipts and 0.12 ms for the floor walk, against 0.16 / 0.07 / 0.09 ms
 * with generic plans, about 3.5 µs of server CPU per effect; the claims'
 * and receipts' executions took as long either way (4.1 / 1.4 ms against
 * 4.1 / 1.6 ms). (force_custom_plan, tried first, cost a claim ~0.3 ms:
 * p50 2.6-2.8 against 3.2-3.6 ms, p99 5.2-5.5 against 6.5-7.2 ms.) */
static jsd_status relay_plans(jsd_store *s)
{
    pg *p = PG(s);
    if (p->plans_set || s->tx.active)
        return JSD_OK;
    jsd_status rc = simple(s, "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan",
                           "planning the relay's statements");
    if (rc != JSD_OK && PQstatus(p->conn) == CONNECTION_OK) {
        /* refused: the default plans are slower on a growing outbox, never
         * wrong */
        JSD_WARN("store", "%s; the relay keeps PostgreSQL's default plan choice",
                 jsd_store_errmsg(s));
        rc = JSD_OK;
    }
    if (rc == JSD_OK)
        p->plans_set = true;
    return rc;
}

#define TAKEOVER_WAIT_MS 2000

static jsd_status pg_claim(jsd_store *s, int max, int64_t lease_ms, const char *token, int64_t now,
                           jsd__effect_batch *out)
{
    jsd_status rc = ready(s);
    if (rc == JSD_OK)
        rc = relay_plans(s);
    if (rc != JSD_OK)
        return rc;
    /* The claim floor. A receipt leaves the published row's entry in the
     * pending index until vacuum removes it, and a claim's index scan from
     * the start steps over every such entry: with tens of thousands
     * published since the last vacuum a claim took 60-110 ms instead of 3.
     * So after a full batch the next claim of unordered effects starts
     * above the largest id it took (everything due and free below it was
     * just claimed, or is leased elsewhere, or not due). Effects below the
     * floor that become claimable later (a lease that expires, a backoff or
     * a not-before that ends) are found by a claim from the start, made
     * whenever a claim comes back short and at least once a second. */
    pg *pp = PG(s);
    int64_t mono = jsd__mono_ms();
    if (pp->claim_floor > 0 && mono - pp->floor_since_ms >= 1000)
        pp->claim_floor = 0;
    /* A takeover claim (t in P_CLAIM, $6) also takes ready rows whose lease
     * expired unsettled. It holds the advisory lock TAKEOVER_KEY, which
     * receipts written as runs hold shared, taken before the claim's
     * snapshot: that snapshot sees every run committed before, and no run
     * commits until the claim has, so it never takes a row a run covers.
     * Every claim from the start is one. It tries the lock and, when a
     * receipt holds it, claims without taking over rather than wait (the
     * commit -> PubAck path); after TAKEOVER_WAIT_MS without it, it waits.
     * The claim reads whether it holds it (jsd.takeover). */
    bool takeover = pp->claim_floor == 0, locked = false;
    if (pp->takeover_due_ms == 0)
        pp->takeover_due_ms = mono + TAKEOVER_WAIT_MS;
    int lock_id = mono >= pp->takeover_due_ms ? P_LOCK_TAKEOVER : P_TRY_TAKEOVER;
    params p = {.n = 0};
    p_text(&p, token);
    p_i64(&p, now + lease_ms);
    p_i64(&p, now);
    p_i64(&p, max);
    p_i64(&p, pp->claim_floor);
    p_text(&p, takeover ? "true" : "false");
    PGresult *r = takeover ? locked_exec(s, lock_id, &locked, P_CLAIM, p.n, p.v, p.len, p.fmt,
                                         PGRES_TUPLES_OK, "claim")
                           : pexec(s, P_CLAIM, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "claim");
    if (locked)
        pp->takeover_due_ms = mono + TAKEOVER_WAIT_MS;
    if (!r)
        return s->err.status;
    int n = PQntuples(r);
    for (int i = 0; i < n && rc == JSD_OK; i++) {
        jsd__claimed_row row = {.row_id = get_i64(r, i, 0)};
        row.owner = get_str(r, i, 1, &row.owner_len);
        row.effect_id = get_str(r, i, 2, &row.id_len);
        row.msg_id = get_str(r, i, 3, &row.msg_id_len);
        row.subject = get_str(r, i, 4, &row.subject_len);
        row.headers = (const unsigned char *)get_str(r, i, 5, &row.headers_len);
        row.payload = (const unsigned char *)get_str(r, i, 6, &row.len);
        row.attempts = (int)get_i64(r, i, 7);
        row.order_key = get_str(r, i, 8, &row.order_key_len);
        row.created_at = get_i64(r, i, 9);
        row.not_before = get_i64(r, i, 10);
        row.maybe_published =
            !PQgetisnull(r, i, 11) && PQgetvalue(r, i, 11)[0] != 0; /* binary bool */
        row.first_attempt_at = PQgetisnull(r, i, 12) ? 0 : get_i64(r, i, 12);
        rc = jsd__batch_add(out, &row);
        if (rc != JSD_OK)
            jsd__store_err(s, rc, "claim: cannot hold effect %lld in memory; its lease will expire",
                           (long long)row.row_id);
    }
    PQclear(r);
    if (rc == JSD_OK && out->n > 1)
        qsort(out->items, out->n, sizeof(out->items[0]), by_row_id);
    if (rc == JSD_OK && n == max) {
        int64_t top = 0;
        for (size_t i = 0; i < out->n; i++)
            if (!out->items[i].order_key)
                top = JSD_MAX(top, out->items[i].row_id);
        if (top > 0) {
            if (pp->claim_floor == 0)
                pp->floor_since_ms = mono;
            pp->claim_floor = top + 1;
        }
    } else {
        pp->claim_floor = 0;
    }
    return rc;
}

static void floor_raise(jsd_store *s);

static jsd_status pg_receipts(jsd_store *s, const char *token, const jsd__receipt *rc_in, size_t n,
                              size_t *applied, bool sync)
{
    jsd_status rc = ready(s);
    if (rc == JSD_OK)
        rc = relay_plans(s);
    if (rc != JSD_OK)
        return rc;
    /* One element per run of receipts (jsd__receipt_continues): every id
     * between a run's first and last is one of its receipts, so the
     * statement's range names no other row (a row of the same lease whose
     * PubAck is not in stays untouched).
     * DESIGN (issue 12): the receipt was one element per row, joined to the
     * outbox by one primary-key probe each; a batch of one relay's
     * publications is mostly runs (its ids come from one claim in id order
     * and the stream numbers them in the order they were written; the
     * publication time, in ms, splits them about once a millisecond). One
     * range scan per run instead. pgbench over a copy of the outbox, 390
     * batches of 256, one range per batch against one element per row:
     * 17.2 / 17.5 against 19.1 / 19.3 µs of server CPU per effect;
     * alternating bench_relay rounds (medians of 3): 28.4 / 28.5 / 28.5k
     * against 26.8 / 28.0 / 27.2k msg/s, relay.latency.postgres within its
     * noise. */
    arr a[6];
    arr_init(&a[0], OID_INT8);
    arr_init(&a[1], OID_INT8);
    arr_init(&a[2], OID_TEXT);
    arr_init(&a[3], OID_INT8);
    arr_init(&a[4], OID_BOOL);
    arr_init(&a[5], OID_INT8);
    for (size_t i = 0, j; i < n; i = j) {
        j = i + 1;
        while (j < n && jsd__receipt_continues(&rc_in[i], &rc_in[j - 1], &rc_in[j]))
            j++;
        arr_i64(&a[0], rc_in[i].row_id);
        arr_i64(&a[1], rc_in[j - 1].row_id);
        arr_str(&a[2], rc_in[i].stream);
        arr_i64(&a[3], (int64_t)rc_in[i].seq);
        arr_bool(&a[4], rc_in[i].duplicate);
        arr_i64(&a[5], rc_in[i].published_at_ms);
    }
    params p = {.n = 0};
    p_text(&p, token);
    for (int i = 0; i < 6 && rc == JSD_OK; i++) {
        if (!arr_done(&a[i]))
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory recording receipts");
        p_arr(&p, &a[i]);
    }
    if (rc == JSD_OK) {
        /* in a transaction of its own, under the takeover lock shared
         * (pg_claim); committed synchronously, or without waiting for its
         * flush, which pg_sync_receipts then makes for every such commit
         * (relay.c DESIGN 8) */
        PGresult *r =
            locked_exec(s, sync ? P_LOCK_RECEIPTS : P_LOCK_RECEIPTS_ASYNC, NULL, P_RECEIPTS, p.n,
                        p.v, p.len, p.fmt, PGRES_TUPLES_OK, "recording receipts");
        if (r) {
            *applied = (size_t)get_i64(r, 0, 0);
            PQclear(r);
            if (!sync && PG(s)->receipts == RECEIPTS_FLUSHED)
                PG(s)->receipts = RECEIPTS_UNFLUSHED;
        } else {
            rc = s->err.status;
        }
    }
    arr_free(a, 6);
    if (rc == JSD_OK && sync)
        floor_raise(s);
    return rc;
}

/* The receipts committed by pg_receipts(sync false) since the last call
 * become durable: one synchronous commit flushes the WAL up to its own
 * record, theirs included, as long as the session they were committed on
 * is still the one (a server that crashed and came back may have lost
 * them; the session's reset says so). Then one walk of the floor for all
 * of them. */
static jsd_status pg_sync_receipts(jsd_store *s)
{
    pg *p = PG(s);
    int state = p->receipts;
    p->receipts = RECEIPTS_FLUSHED;
    if (state == RECEIPTS_FLUSHED)
        return JSD_OK;
    PGresult *r = NULL;
    if (state == RECEIPTS_FLUSH_LOST)
        jsd__store_err(s, JSD_ERR_STORE, "the connection broke before the receipts' flush");
    else
        r = pexec(s, P_FLUSH, 0, NULL, NULL, NULL, PGRES_TUPLES_OK,
                  "flushing the receipts' commits");
    if (!r) {
        JSD_WARN("store", "%s: the receipts just committed may be lost; they are recorded again",
                 jsd_store_errmsg(s));
        return s->err.status;
    }
    PQclear(r);
    floor_raise(s);
    return JSD_OK;
}

/* DESIGN (the settled floor, schema 9). The receipts of first attempts
 * (ready rows, READY_OF) leased by one relay in a row of ids are recorded
 * as runs (jsd_outbox_runs: ids lo..hi with stream seqs seq.. in step),
 * not in their rows, which stay in the ready index with the lease they
 * were published under. The floor (jsd_outbox_floor) keeps claims from
 * stepping over them: every ready row below it is covered by a run, and
 * every id below it that has no row will never have one. It moves up by
 * the walk jsd_outbox_floor_raise (migration_9) after each receipt
 * transaction, and comes down (FLOOR_LOWER, gen + 1) wherever a
 * row below it becomes claimable again, in the same transaction: a dead
 * letter requeued, a published effect unpublished. Retries and durable
 * timers are not ready rows: leased and receipted in the row, they never
 * hold the floor back.
 *
 * Unlike SQLite, PostgreSQL hands out ids to transactions that commit in
 * any order: an id missing at the walk may belong to a transaction still
 * open, whose row would land below the floor, never to be claimed. So the
 * walk stops at a missing id (the gap) and answers it with the top it saw
 * (the largest id + 1). Every id below the top was drawn before the walk
 * (the identity's sequence hands them out in order: CACHE 1, the default;
 * docs/SQL-CONTRACT.md), by a transaction that held the outbox's ROW
 * EXCLUSIVE lock by then and holds it until it ends (OUTBOX_WRITER).
 * floor_raise notes those transactions (pg_locks: their virtual ids, which
 * are never reused while the server runs) and, once none of them holds the
 * lock any more, lets the walk pass the ids missing below that top: they
 * will never be filled. A long transaction elsewhere (a report) does not
 * hold the floor; one that wrote the outbox does, while it is open. */
static bool gap_ended(jsd_store *s)
{
    pg *p = PG(s);
    params q = {.n = 0};
    p_bin(&q, p->gap_holders, (size_t)p->gap_holders_len);
    PGresult *r =
        pexec(s, P_GAP_ENDED, q.n, q.v, q.len, q.fmt, PGRES_TUPLES_OK, "raising the outbox floor");
    bool ended = r && PQntuples(r) == 1 && get_i64(r, 0, 0) != 0;
    PQclear(r);
    return ended;
}

/* The gap noted by gap_note is passed or gone. */
static void gap_forget(pg *p)
{
    jsd__free(p->gap_holders);
    p->gap_holders = NULL;
    p->gap = 0;
}

static void gap_note(jsd_store *s, int64_t gap, int64_t bound)
{
    pg *p = PG(s);
    PGresult *r =
        pexec(s, P_GAP_HOLDERS, 0, NULL, NULL, NULL, PGRES_TUPLES_OK, "raising the outbox floor");
    gap_forget(p);
    if (r && PQntuples(r) == 1) {
        size_t n;
        const char *v = get_str(r, 0, 0, &n);
        if (v && (p->gap_holders = jsd__malloc(n ? n : 1)) != NULL) {
            memcpy(p->gap_holders, v, n);
            p->gap_holders_len = (int)n;
            p->gap = gap;
            p->gap_bound = bound;
        }
    }
    PQclear(r);
}

/* One walk of the floor; its failure fails nothing (the receipts are
 * committed, and a floor left low costs claims time, never an effect). */
static void floor_raise(jsd_store *s)
{
    pg *p = PG(s);
    jsd_error keep = s->err;
    bool pass = p->gap > 0 && gap_ended(s);
    params q = {.n = 0};
    if (pass) {
        p_i64(&q, p->gap);
        p_i64(&q, p->gap_bound);
    } else {
        p_text(&q, NULL);
        p_text(&q, NULL);
    }
    PGresult *r = pexec(s, P_FLOOR_RAISE, q.n, q.v, q.len, q.fmt, PGRES_TUPLES_OK,
                        "raising the outbox floor");
    if (r && PQntuples(r) == 1) {
        int64_t gap = PQgetisnull(r, 0, 0) ? 0 : get_i64(r, 0, 0);
        if (gap == 0) {
            gap_forget(p);
        } else if (pass || gap != p->gap) {
            gap_note(s, gap, get_i64(r, 0, 1));
        }
    } else {
        JSD_DEBUG("store", "%s", jsd_store_errmsg(s));
    }
    PQclear(r);
    s->err = keep;
}

static jsd_status ids_array(jsd_store *s, arr *a, const int64_t *ids, size_t n)
{
    arr_init(a, OID_INT8);
    for (size_t i = 0; i < n; i++)
        arr_i64(a, ids[i]);
    if (!arr_done(a))
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory building an id list");
    return JSD_OK;
}

/* End a transaction of this file's own: commit on JSD_OK, else roll back
 * keeping the error. */
static jsd_status own_end(jsd_store *s, jsd_status rc)
{
    if (rc == JSD_OK)
        return pg_tx(s, JSD__TX_COMMIT);
    jsd_error keep = s->err;
    pg_tx(s, JSD__TX_ROLLBACK);
    s->err = keep;
    return rc;
}

static jsd_status pg_failures_read(jsd_store *s, const char *token, const int64_t *ids_in, size_t n,
                                   int *attempts)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    arr ids;
    rc = ids_array(s, &ids, ids_in, n);
    if (rc != JSD_OK) {
        arr_free(&ids, 1);
        return rc;
    }
    if ((rc = simple(s, "BEGIN", "recording failures")) != JSD_OK) {
        arr_free(&ids, 1);
        return rc;
    }
    params p = {.n = 0};
    p_text(&p, token);
    p_arr(&p, &ids);
    PGresult *r =
        pexec(s, P_FAIL_SEL, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "recording failures");
    arr_free(&ids, 1);
    if (!r)
        return own_end(s, s->err.status);
    for (size_t i = 0; i < n; i++)
        attempts[i] = -1; /* lease lost, or already settled */
    for (int k = 0; k < PQntuples(r); k++) {
        int64_t id = get_i64(r, k, 0);
        int cur = (int)get_i64(r, k, 1);
        for (size_t i = 0; i < n; i++)
            if (ids_in[i] == id)
                attempts[i] = cur;
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_failures_write(jsd_store *s, const char *token, const jsd__failure_update *f,
                                    size_t n)
{
    jsd_status rc = JSD_OK;
    if (n == 0)
        return own_end(s, rc);
    arr u[7];
    static const uint32_t oids[7] = {OID_INT8, OID_INT4, OID_TEXT, OID_INT8,
                                     OID_INT8, OID_TEXT, OID_INT8};
    for (int i = 0; i < 7; i++)
        arr_init(&u[i], oids[i]);
    for (size_t i = 0; i < n; i++) {
        arr_i64(&u[0], f[i].row_id);
        arr_i32(&u[1], f[i].attempts);
        arr_str(&u[2], f[i].error);
        arr_i64(&u[3], f[i].next_attempt_at);
        arr_i64_or_null(&u[4], f[i].dead_at, !f[i].dead);
        arr_str(&u[5], f[i].dead ? f[i].reason : NULL);
        arr_i64_or_null(&u[6], f[i].first_attempt_at, f[i].first_attempt_at <= 0);
    }
    params q = {.n = 0};
    p_text(&q, token);
    for (int i = 0; i < 7 && rc == JSD_OK; i++) {
        if (!arr_done(&u[i]))
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory recording failures");
        p_arr(&q, &u[i]);
    }
    if (rc == JSD_OK) {
        PGresult *ur =
            pexec(s, P_FAIL_UPD, q.n, q.v, q.len, q.fmt, PGRES_COMMAND_OK, "recording failures");
        if (!ur)
            rc = s->err.status;
        PQclear(ur);
    }
    arr_free(u, 7);
    return own_end(s, rc);
}

static jsd_status pg_release(jsd_store *s, const char *token, const int64_t *ids, size_t n,
                             size_t *released)
{
    jsd_status rc = ready(s);
    arr a;
    if (rc != JSD_OK)
        return rc;
    if ((rc = ids_array(s, &a, ids, n)) == JSD_OK) {
        params p = {.n = 0};
        p_text(&p, token);
        p_arr(&p, &a);
        PGresult *r =
            pexec(s, P_RELEASE, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "releasing leases");
        if (r)
            *released = (size_t)strtoul(PQcmdTuples(r), NULL, 10);
        else
            rc = s->err.status;
        PQclear(r);
    }
    arr_free(&a, 1);
    return rc;
}

static jsd_status pg_requeue(jsd_store *s, const int64_t *ids, size_t n, int64_t now,
                             size_t *requeued)
{
    jsd_status rc = ready(s);
    arr a;
    if (rc != JSD_OK)
        return rc;
    if ((rc = ids_array(s, &a, ids, n)) == JSD_OK) {
        params p = {.n = 0};
        p_arr(&p, &a);
        p_i64(&p, now);
        PGresult *r =
            pexec(s, P_REQUEUE, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "requeueing dead letters");
        if (r)
            *requeued = (size_t)get_i64(r, 0, 0);
        else
            rc = s->err.status;
        PQclear(r);
    }
    arr_free(&a, 1);
    return rc;
}

static jsd_status pg_trouble(jsd_store *s, jsd__outbox_trouble *o)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    PGresult *r =
        pexec(s, P_TROUBLE, 0, NULL, NULL, NULL, PGRES_TUPLES_OK, "counting failing effects");
    if (!r)
        return s->err.status;
    if (PQntuples(r) == 1) {
        o->failing = get_i64(r, 0, 0);
        o->dead_lettered = get_i64(r, 0, 1);
        o->first_attempt_duplicates = get_i64(r, 0, 2);
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_next_due(jsd_store *s, bool *found, int64_t *next)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    PGresult *r =
        pexec(s, P_NEXT_DUE, 0, NULL, NULL, NULL, PGRES_TUPLES_OK, "reading the next due time");
    if (!r)
        return s->err.status;
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        *found = true;
        *next = get_i64(r, 0, 0);
    }
    PQclear(r);
    return JSD_OK;
}

static bool drain_notifies(PGconn *c)
{
    bool any = false;
    PGnotify *n;
    while ((n = PQnotifies(c)) != NULL) {
        any = true;
        PQfreemem(n);
    }
    return any;
}

static jsd_status pg_wait(jsd_store *s, int timeout_ms, bool *woken)
{
    pg *p = PG(s);
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    if (!p->listening) {
        if ((rc = simple(s, "LISTEN " JSD__PG_CHANNEL, "LISTEN")) != JSD_OK)
            return rc;
        p->listening = true;
        /* A commit between the caller's last claim and this LISTEN sent its
         * NOTIFY to nobody: answer "woken" once, so the caller claims again
         * now that every later commit reaches this session. */
        *woken = true;
        return JSD_OK;
    }
    int64_t end = jsd__mono_ms() + timeout_ms;
    for (;;) {
        if (!PQconsumeInput(p->conn))
            return pg_fail(s, NULL, "waiting for a wake-up");
        if (drain_notifies(p->conn)) {
            *woken = true;
            return JSD_OK;
        }
        int64_t left = end - jsd__mono_ms();
        if (left <= 0)
            return JSD_OK;
        struct pollfd pfd = {.fd = PQsocket(p->conn), .events = POLLIN};
        if (pfd.fd < 0)
            return pg_fail(s, NULL, "waiting for a wake-up");
        (void)poll(&pfd, 1, (int)JSD_MIN(left, 1000));
    }
}

static void fill_outcome(const PGresult *r, jsd__inbox_outcome *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    out->code = (int)get_i64(r, 0, 0);
    size_t n;
    const char *d = get_str(r, 0, 1, &n);
    if (d) {
        n = JSD_MIN(n, sizeof(out->detail) - 1);
        memcpy(out->detail, d, n);
        out->detail[n] = '\0';
    }
    const char *m = get_str(r, 0, 2, &n);
    if (m) {
        n = JSD_MIN(n, sizeof(out->msg_id) - 1);
        memcpy(out->msg_id, m, n);
        out->msg_id[n] = '\0';
    }
    out->stream_seq = (uint64_t)get_i64(r, 0, 3);
    out->created_at_ms = get_i64(r, 0, 4);
}

static jsd_status pg_inbox_lookup(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, const char *msg_id, bool *found,
                                  jsd__inbox_outcome *out)
{
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    if (msg_id)
        p_text(&p, msg_id);
    else
        p_i64(&p, (int64_t)seq);
    PGresult *r = pexec(s, msg_id ? P_INBOX_GET_MSG : P_INBOX_GET, p.n, p.v, p.len, p.fmt,
                        PGRES_TUPLES_OK, "inbox lookup");
    if (!r)
        return s->err.status;
    if (PQntuples(r) > 0) {
        *found = true;
        fill_outcome(r, out);
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_inbox_insert(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, const char *msg_id, int code, const char *detail,
                                  const jsd__trace *trace, int64_t now)
{
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, (int64_t)seq);
    p_text(&p, msg_id);
    p_i64(&p, code);
    p_text(&p, detail);
    p_i64(&p, now);
    p_text(&p, trace ? trace->parent : NULL);
    p_text(&p, trace ? trace->state : NULL);
    PGresult *r = pexec(s, P_INBOX_INS, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "inbox insert");
    if (!r)
        return s->err.status;
    bool ins = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    return ins ? JSD_OK : JSD_ERR_EXISTS;
}

static jsd_status pg_inbox_retire(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, bool *moved)
{
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, (int64_t)seq);
    PGresult *r =
        pexec(s, P_INBOX_RETIRE_LOCK, 0, NULL, NULL, NULL, PGRES_TUPLES_OK, "inbox retire (lock)");
    if (!r)
        return s->err.status;
    PQclear(r);
    r = pexec(s, P_INBOX_RETIRE, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "inbox retire");
    if (!r)
        return s->err.status;
    *moved = strcmp(PQcmdTuples(r), "0") != 0;
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_inbox_insert_many(jsd_store *s, const char *stream, const char *consumer,
                                       const uint64_t *seqs, const char *const *msg_ids,
                                       const jsd__trace *traces, size_t n, int code, int64_t now,
                                       bool *inserted)
{
    arr a[4];
    arr_init(&a[0], OID_INT8);
    for (int k = 1; k < 4; k++)
        arr_init(&a[k], OID_TEXT);
    for (size_t i = 0; i < n; i++) {
        arr_i64(&a[0], (int64_t)seqs[i]);
        arr_str(&a[1], msg_ids[i] && *msg_ids[i] ? msg_ids[i] : NULL);
        arr_str(&a[2], traces ? traces[i].parent : NULL);
        arr_str(&a[3], traces ? traces[i].state : NULL);
    }
    if (!arr_done(&a[0]) || !arr_done(&a[1]) || !arr_done(&a[2]) || !arr_done(&a[3])) {
        arr_free(a, 4);
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory building the inbox rows");
    }
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, code);
    p_i64(&p, now);
    for (int k = 0; k < 4; k++)
        p_arr(&p, &a[k]);
    PGresult *r =
        pexec(s, P_INBOX_INS_MANY, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "inbox insert");
    arr_free(a, 4);
    if (!r)
        return s->err.status;
    /* RETURNING comes in the order of the input as a rule: search on from
     * the last match, so the common case is one pass. */
    size_t at = 0;
    for (int k = 0, rows = PQntuples(r); k < rows; k++) {
        uint64_t seq = (uint64_t)get_i64(r, k, 0);
        for (size_t tried = 0; tried < n; tried++, at = (at + 1) % n) {
            if (seqs[at] == seq) {
                inserted[at] = true;
                at = (at + 1) % n;
                break;
            }
        }
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_poison_insert(jsd_store *s, const jsd__poison *pz, int64_t now, bool *inserted)
{
    params p = {.n = 0};
    p_text(&p, pz->stream);
    p_text(&p, pz->consumer);
    p_i64(&p, (int64_t)pz->stream_seq);
    p_text(&p, pz->msg_id);
    p_text(&p, pz->subject);
    p_text(&p, pz->diagnostic);
    p_bin(&p, pz->headers, pz->headers_len);
    p_bin(&p, pz->payload ? pz->payload : "", pz->len);
    p_i64(&p, now);
    PGresult *r = pexec(s, P_POISON_INS, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "poison insert");
    if (!r)
        return s->err.status;
    *inserted = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_poison_mark(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq, const char *dlq_stream, uint64_t dlq_seq)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, (int64_t)seq);
    p_text(&p, dlq_stream);
    p_i64(&p, (int64_t)dlq_seq);
    PGresult *r = pexec(s, P_POISON_MARK, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK,
                        "marking a poison record published");
    if (!r)
        return s->err.status;
    bool hit = strcmp(PQcmdTuples(r), "0") != 0;
    PQclear(r);
    return hit ? JSD_OK
               : jsd__store_err(s, JSD_ERR_NOT_FOUND, "no poison record for that delivery");
}

/* ---- replay requests ---- */

static void replay_copy(const PGresult *r, int row, int col, char *out, size_t cap)
{
    size_t n;
    const char *v = get_str(r, row, col, &n);
    n = v ? JSD_MIN(n, cap - 1) : 0;
    if (n)
        memcpy(out, v, n);
    out[n] = '\0';
}

static void replay_row(const PGresult *r, int row, jsd_replay_request *x)
{
    memset(x, 0, sizeof(*x));
    x->id = get_i64(r, row, 0);
    replay_copy(r, row, 1, x->stream, sizeof(x->stream));
    replay_copy(r, row, 2, x->consumer, sizeof(x->consumer));
    x->stream_seq = (uint64_t)get_i64(r, row, 3);
    replay_copy(r, row, 4, x->dlq_stream, sizeof(x->dlq_stream));
    x->dlq_seq = (uint64_t)get_i64(r, row, 5);
    x->state = (jsd_replay_state)get_i64(r, row, 6);
    replay_copy(r, row, 7, x->detail, sizeof(x->detail));
    x->requested_at_ms = get_i64(r, row, 8);
    x->done_at_ms = get_i64(r, row, 9);
}

static jsd_status pg_replay_request(jsd_store *s, const jsd_replay_request *q, int64_t now,
                                    jsd_replay_request *out, bool *queued)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, q->stream);
    p_text(&p, q->consumer);
    p_i64(&p, (int64_t)q->stream_seq);
    p_text(&p, q->dlq_stream);
    p_i64(&p, (int64_t)q->dlq_seq);
    p_i64(&p, now);
    PGresult *r = pexec(s, P_REPLAY_UPSERT, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK,
                        "recording a replay request");
    if (!r)
        return s->err.status;
    *queued = PQntuples(r) > 0;
    PQclear(r);
    p.n = 0;
    p_text(&p, q->stream);
    p_text(&p, q->consumer);
    p_i64(&p, (int64_t)q->stream_seq);
    r = pexec(s, P_REPLAY_GET, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "reading a replay request");
    if (!r)
        return s->err.status;
    bool found = PQntuples(r) > 0;
    if (found)
        replay_row(r, 0, out);
    PQclear(r);
    return found ? JSD_OK : jsd__store_err(s, JSD_ERR_INTERNAL, "replay request vanished");
}

static jsd_status pg_replay_list(jsd_store *s, const char *stream, const char *consumer,
                                 int64_t after_id, size_t max, jsd_replay_request *out, size_t *n)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    if (stream) {
        p_text(&p, stream);
        p_text(&p, consumer);
    }
    p_i64(&p, after_id);
    p_i64(&p, (int64_t)max);
    PGresult *r = pexec(s, stream ? P_REPLAY_PENDING : P_REPLAY_OPEN, p.n, p.v, p.len, p.fmt,
                        PGRES_TUPLES_OK, "reading replay requests");
    if (!r)
        return s->err.status;
    *n = 0;
    for (int k = 0, rows = PQntuples(r); k < rows && *n < max; k++)
        replay_row(r, k, &out[(*n)++]);
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_replay_finish(jsd_store *s, int64_t id, int state, const char *detail,
                                   int64_t now, bool *finished)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_i64(&p, id);
    p_i64(&p, state);
    p_text(&p, detail);
    p_i64(&p, now);
    PGresult *r = pexec(s, P_REPLAY_FINISH, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK,
                        "completing a replay request");
    if (!r)
        return s->err.status;
    *finished = strcmp(PQcmdTuples(r), "0") != 0;
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_floor_put(jsd_store *s, const char *stream, const char *consumer,
                               uint64_t floor, int64_t now, bool set)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, (int64_t)floor);
    p_i64(&p, now);
    PGresult *r = pexec(s, set ? P_DFLOOR_SET : P_DFLOOR_RAISE, p.n, p.v, p.len, p.fmt,
                        PGRES_COMMAND_OK, "recording a durable's ack floor");
    if (!r)
        return s->err.status;
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_floor_get(jsd_store *s, const char *stream, const char *consumer,
                               uint64_t *floor, int64_t *at)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    PGresult *r = pexec(s, P_DFLOOR_GET, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK,
                        "reading a durable's recorded ack floor");
    if (!r)
        return s->err.status;
    if (PQntuples(r) == 1) {
        int64_t v = get_i64(r, 0, 0);
        *floor = v > 0 ? (uint64_t)v : 0;
        *at = get_i64(r, 0, 1);
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_inbox_set(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                               int code, const char *detail, bool *changed)
{
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, (int64_t)seq);
    p_i64(&p, code);
    p_text(&p, detail);
    PGresult *r =
        pexec(s, P_INBOX_SET, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "inbox outcome update");
    if (!r)
        return s->err.status;
    *changed = strcmp(PQcmdTuples(r), "0") != 0;
    PQclear(r);
    return JSD_OK;
}

static void *bin_dup(const PGresult *r, int row, int col, size_t *len)
{
    const char *v = get_str(r, row, col, len);
    if (!v)
        return NULL;
    return jsd__memdup(v, *len ? *len : 1);
}

static jsd_status pg_poison_read(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq, int64_t after_id, size_t max,
                                 jsd__poison_record **out, size_t *n)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    if (stream) {
        p_text(&p, stream);
        p_text(&p, consumer);
    }
    if (stream && seq) {
        p_i64(&p, (int64_t)seq);
    } else {
        p_i64(&p, after_id);
        p_i64(&p, (int64_t)max);
    }
    /* seq 0 (never a stream sequence): the unpublished records of (stream, consumer). */
    PGresult *r = pexec(s,
                        !stream ? P_POISON_LIST
                        : seq   ? P_POISON_GET
                                : P_POISON_UNPUB,
                        p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "reading poison records");
    if (!r)
        return s->err.status;
    size_t k = (size_t)PQntuples(r);
    jsd__poison_record *recs = jsd__calloc(k ? k : 1, sizeof(*recs));
    if (!recs) {
        PQclear(r);
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading poison records");
    }
    for (size_t i = 0; i < k; i++) {
        int row = (int)i;
        jsd__poison_record *x = &recs[i];
        x->id = get_i64(r, row, 0);
        x->stream = get_dup(r, row, 1);
        x->consumer = get_dup(r, row, 2);
        x->stream_seq = (uint64_t)get_i64(r, row, 3);
        x->msg_id = get_dup(r, row, 4);
        if (!x->msg_id)
            x->msg_id = jsd__strdup("");
        x->subject = get_dup(r, row, 5);
        x->diagnostic = get_dup(r, row, 6);
        x->headers = bin_dup(r, row, 7, &x->headers_len);
        x->payload = bin_dup(r, row, 8, &x->len);
        x->created_at_ms = get_i64(r, row, 9);
        x->dlq_stream = get_dup(r, row, 10);
        x->dlq_seq = (uint64_t)get_i64(r, row, 11);
        if (!x->stream || !x->consumer || !x->msg_id || !x->subject || !x->diagnostic)
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading poison records");
    }
    PQclear(r);
    if (rc != JSD_OK) {
        jsd__poison_records_free(recs, k);
        return rc;
    }
    *out = recs;
    *n = k;
    return JSD_OK;
}

static jsd_status pg_gc_step(jsd_store *s, int64_t cutoff, int batch, bool inbox, int64_t *removed)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_i64(&p, cutoff);
    p_i64(&p, batch);
    p_i64(&p, inbox ? batch : 0);
    PGresult *r = pexec(s, P_GC, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "retention");
    if (!r)
        return s->err.status;
    *removed = get_i64(r, 0, 0);
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_inbox_high(jsd_store *s, const char *stream, const char *consumer,
                                uint64_t *seq)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    PGresult *r = pexec(s, P_INBOX_HIGH, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK,
                        "reading the inbox high-water mark");
    if (!r)
        return s->err.status;
    int64_t v = PQntuples(r) == 1 ? get_i64(r, 0, 0) : 0;
    PQclear(r);
    *seq = v > 0 ? (uint64_t)v : 0;
    return JSD_OK;
}

static jsd_status pg_inbox_aged(jsd_store *s, int64_t cutoff, jsd_inbox_aged **out, size_t *n)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_i64(&p, cutoff);
    PGresult *r =
        pexec(s, P_INBOX_AGED, p.n, p.v, p.len, p.fmt, PGRES_TUPLES_OK, "reading inbox durables");
    if (!r)
        return s->err.status;
    size_t k = (size_t)PQntuples(r);
    jsd_inbox_aged *a = k ? jsd__calloc(k, sizeof(*a)) : NULL;
    if (k && !a) {
        PQclear(r);
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading inbox durables");
    }
    for (size_t i = 0; i < k && rc == JSD_OK; i++) {
        a[i].stream = get_dup(r, (int)i, 0);
        a[i].durable = get_dup(r, (int)i, 1);
        a[i].rows = get_i64(r, (int)i, 2);
        if (!a[i].stream || !a[i].durable)
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading inbox durables");
    }
    PQclear(r);
    if (rc != JSD_OK) {
        jsd_inbox_aged_free(a, k);
        return rc;
    }
    *out = a;
    *n = k;
    return JSD_OK;
}

static jsd_status pg_gc_inbox(jsd_store *s, const char *stream, const char *consumer,
                              int64_t cutoff, int64_t max_seq, int batch, int64_t *removed)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_text(&p, stream);
    p_text(&p, consumer);
    p_i64(&p, max_seq);
    p_i64(&p, cutoff);
    p_i64(&p, batch);
    PGresult *r = pexec(s, P_GC_IN_DURABLE, p.n, p.v, p.len, p.fmt, PGRES_COMMAND_OK, "retention");
    if (!r)
        return s->err.status;
    *removed = strtoll(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_stats(jsd_store *s, int64_t now, bool backlog_only, jsd_store_stats *o)
{
    jsd_status rc = ready(s);
    if (rc != JSD_OK)
        return rc;
    params p = {.n = 0};
    p_i64(&p, now);
    PGresult *r = pexec(s, backlog_only ? P_BACKLOG : P_STATS, p.n, p.v, p.len, p.fmt,
                        PGRES_TUPLES_OK, "reading store counts");
    if (!r)
        return s->err.status;
    o->backlog = get_i64(r, 0, 0);
    o->due = get_i64(r, 0, 1);
    if (!PQgetisnull(r, 0, 2))
        o->oldest_due_age_ms = JSD_MAX(0, now - get_i64(r, 0, 2));
    if (!backlog_only) {
        o->published = get_i64(r, 0, 3);
        o->dead_lettered = get_i64(r, 0, 4);
        o->inbox_rows = get_i64(r, 0, 5);
        o->poison_records = get_i64(r, 0, 6);
        o->poison_unpublished = get_i64(r, 0, 7);
        o->replay_pending = get_i64(r, 0, 8);
        o->replay_failed = get_i64(r, 0, 9);
    }
    PQclear(r);
    return JSD_OK;
}

/* ---- the outbox tools (jsdurable outbox, verify) -------------------------------------
 * Kept apart from the relay's statements: unnamed statements run per call
 * (a tool runs a few, not thousands a second), never in the hot path. */

#define TOOL_COLS                                                                                  \
    "id, owner, effect_id, msg_id, subject, order_key, attempts, created_at, not_before, "         \
    "next_attempt_at, last_error, dead_lettered_at, dead_reason, stream, stream_seq, duplicate, "  \
    "published_at, lease_token, lease_expires, octet_length(payload)"

/* The ids of the first $3 unpublished rows after $1 (of subject $2 when
 * given): pending ones, or with the dead letters too (dead). Each kind is
 * read through its own index, ready rows from the floor up: through
 * jsd_outbox_state, the first pending row of an outbox that keeps millions
 * of published ones was found after resolving the run of every one of them
 * (10 s with 3M kept, on every relay start: the doctor's pending
 * subjects). */
/* clang-format off */
#define PAGE_TAIL " AND c.id > $1::int8 AND ($2::text IS NULL OR c.subject = $2::text) " \
    "ORDER BY c.id LIMIT $3::int8)"
#define UNPUBLISHED_IDS(dead) \
    "SELECT id FROM ((SELECT c.id FROM @jsd_outbox c WHERE " READY_OF("c.") " AND " \
    FROM_FLOOR("c.") PAGE_TAIL " UNION ALL (SELECT c.id FROM @jsd_outbox c WHERE " \
    REST_OF("c.") PAGE_TAIL " UNION ALL (SELECT c.id FROM @jsd_outbox c WHERE " \
    "c.order_key IS NOT NULL AND c." PENDING PAGE_TAIL dead ") a ORDER BY id LIMIT $3::int8"
#define DEAD_UNPUBLISHED \
    " UNION ALL (SELECT c.id FROM @jsd_outbox c WHERE c.dead_lettered_at IS NOT NULL AND " \
    "c.published_at IS NULL" PAGE_TAIL
/* clang-format on */

/* the other states, through the view (pending and unpublished: pg_tool_list) */
static const char *const tool_list_sql[4] = {
    [JSD_OUTBOX_DEAD] = "dead_lettered_at IS NOT NULL",
    [JSD_OUTBOX_PUBLISHED] = "published_at IS NOT NULL AND published_at >= $4::int8",
};

/* Run sql (with "@" for the schema) once; NULL on failure (error recorded). */
static PGresult *tool_exec(jsd_store *s, const char *sql, const params *p, ExecStatusType want,
                           const char *what)
{
    if (ready(s) != JSD_OK)
        return NULL;
    char *full = with_schema(s, sql);
    if (!full) {
        jsd__store_err(s, JSD_ERR_NOMEM, "out of memory preparing %s", what);
        return NULL;
    }
    PGresult *r = PQexecParams(PG(s)->conn, full, p->n, NULL, p->v, p->len, p->fmt, 1);
    jsd__free(full);
    if (PQresultStatus(r) != want) {
        pg_fail(s, r, what);
        PQclear(r);
        return NULL;
    }
    return r;
}

static void tool_text(const PGresult *r, int row, int col, char *out, size_t cap)
{
    size_t len = 0;
    const char *v = get_str(r, row, col, &len);
    if (!v)
        len = 0;
    if (len >= cap)
        len = cap - 1;
    if (len)
        memcpy(out, v, len);
    out[len] = '\0';
}

static void tool_row(const PGresult *r, int i, int64_t now, jsd_outbox_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->row_id = get_i64(r, i, 0);
    tool_text(r, i, 1, e->owner, sizeof(e->owner));
    tool_text(r, i, 2, e->effect_id, sizeof(e->effect_id));
    tool_text(r, i, 3, e->msg_id, sizeof(e->msg_id));
    tool_text(r, i, 4, e->subject, sizeof(e->subject));
    tool_text(r, i, 5, e->order_key, sizeof(e->order_key));
    e->attempts = (int)get_i64(r, i, 6);
    e->created_at_ms = get_i64(r, i, 7);
    e->not_before_ms = get_i64(r, i, 8);
    e->next_attempt_at_ms = get_i64(r, i, 9);
    tool_text(r, i, 10, e->last_error, sizeof(e->last_error));
    e->dead_lettered_at_ms = get_i64(r, i, 11);
    tool_text(r, i, 12, e->dead_reason, sizeof(e->dead_reason));
    tool_text(r, i, 13, e->stream, sizeof(e->stream));
    e->stream_seq = (uint64_t)get_i64(r, i, 14);
    e->duplicate = get_i64(r, i, 15) != 0;
    e->published_at_ms = get_i64(r, i, 16);
    bool published = !PQgetisnull(r, i, 16), dead = !PQgetisnull(r, i, 11);
    e->state = published ? JSD_OUTBOX_PUBLISHED : dead ? JSD_OUTBOX_DEAD : JSD_OUTBOX_PENDING;
    e->payload_len = (size_t)get_i64(r, i, 19);
    if (e->state == JSD_OUTBOX_PENDING && !PQgetisnull(r, i, 18) && get_i64(r, i, 18) > now) {
        e->leased = true;
        e->lease_expires_ms = get_i64(r, i, 18);
    }
}

static jsd_status pg_tool_list(jsd_store *s, const jsd_outbox_query *q, int64_t now,
                               jsd_outbox_entry *out, size_t *n)
{
    char sql[4096];
    if (q->state == JSD_OUTBOX_PENDING || q->state == JSD_OUTBOX_UNPUBLISHED)
        jsd__snprintf(sql, sizeof(sql),
                      "SELECT " TOOL_COLS " FROM @jsd_outbox_state WHERE id = ANY(ARRAY(%s)) "
                      "ORDER BY id",
                      q->state == JSD_OUTBOX_PENDING ? UNPUBLISHED_IDS("")
                                                     : UNPUBLISHED_IDS(DEAD_UNPUBLISHED));
    else
        jsd__snprintf(sql, sizeof(sql),
                      "SELECT " TOOL_COLS
                      " FROM @jsd_outbox_state WHERE id > $1::int8 AND ($2::text IS NULL "
                      "OR subject = $2::text) AND %s ORDER BY id LIMIT $3::int8",
                      tool_list_sql[q->state]);
    params p = {.n = 0};
    p_i64(&p, q->after_row_id);
    p_text(&p, q->subject);
    p_i64(&p, (int64_t)q->limit);
    if (q->state == JSD_OUTBOX_PUBLISHED)
        p_i64(&p, q->published_since_ms);
    PGresult *r = tool_exec(s, sql, &p, PGRES_TUPLES_OK, "listing the outbox");
    if (!r)
        return s->err.status;
    for (int i = 0; i < PQntuples(r) && *n < q->limit; i++)
        tool_row(r, i, now, &out[(*n)++]);
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_tool_get(jsd_store *s, const char *owner, const char *effect_id, int64_t now,
                              jsd_outbox_entry *out, bool *found)
{
    params p = {.n = 0};
    p_text(&p, owner);
    p_text(&p, effect_id);
    PGresult *r = tool_exec(s,
                            "SELECT " TOOL_COLS " FROM @jsd_outbox_state WHERE owner = $1::text "
                            "AND effect_id = $2::text",
                            &p, PGRES_TUPLES_OK, "reading an outbox effect");
    if (!r)
        return s->err.status;
    if (PQntuples(r) == 1) {
        tool_row(r, 0, now, out);
        *found = true;
    }
    PQclear(r);
    return JSD_OK;
}

static jsd_status pg_tool_reasons(jsd_store *s, jsd_outbox_reason *out, size_t cap, size_t *n)
{
    params p = {.n = 0};
    p_i64(&p, (int64_t)cap);
    PGresult *r = tool_exec(s,
                            "SELECT substr(coalesce(dead_reason, ''), 1, 200) AS r, count(*) "
                            "FROM @jsd_outbox WHERE dead_lettered_at IS NOT NULL GROUP BY r "
                            "ORDER BY count(*) DESC, r LIMIT $1::int8",
                            &p, PGRES_TUPLES_OK, "counting dead-letter reasons");
    if (!r)
        return s->err.status;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        tool_text(r, i, 0, out[*n].reason, sizeof(out[*n].reason));
        out[*n].count = get_i64(r, i, 1);
        (*n)++;
    }
    PQclear(r);
    return JSD_OK;
}

#define FLOOR_LOWER_ID FLOOR_LOWER("$1::int8")

static jsd_status pg_tool_unpublish(jsd_store *s, const jsd__unpublish *u, size_t n, int64_t now,
                                    size_t *done)
{
    jsd_status rc = pg_tx(s, JSD__TX_BEGIN);
    if (rc != JSD_OK)
        return rc;
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        params p = {.n = 0};
        p_i64(&p, u[i].row_id);
        p_text(&p, u[i].stream);
        p_i64(&p, (int64_t)u[i].seq);
        p_text(&p, u[i].why);
        p_i64(&p, now);
        /* a receipt in a run: the run gives up the id (what lies below it
         * keeps the run's row, what lies above gets one of its own); one in
         * the row: the row's receipt is cleared. Either way the effect is a
         * first attempt again, so the floor comes down to it. */
        PGresult *r = tool_exec(
            s,
            "WITH r AS (SELECT lo, hi, stream, seq, duplicate, published_at FROM "
            "@jsd_outbox_runs WHERE lo = (SELECT max(lo) FROM @jsd_outbox_runs WHERE lo <= "
            "$1::int8) AND hi >= $1::int8 AND stream = $2::text AND seq + ($1::int8 - lo) = "
            "$3::int8 FOR UPDATE), "
            "below AS (UPDATE @jsd_outbox_runs x SET hi = $1::int8 - 1 FROM r WHERE x.lo = r.lo "
            "AND r.lo < $1::int8), "
            "gone AS (DELETE FROM @jsd_outbox_runs x USING r WHERE x.lo = r.lo "
            "AND r.lo = $1::int8), "
            "above AS (INSERT INTO @jsd_outbox_runs (lo, hi, stream, seq, duplicate, "
            "published_at) SELECT $1::int8 + 1, hi, stream, seq + ($1::int8 + 1 - lo), duplicate, "
            "published_at FROM r WHERE hi > $1::int8), "
            "u AS (UPDATE @jsd_outbox SET stream = NULL, stream_seq = NULL, published_at = NULL, "
            "duplicate = true, attempts = 0, last_error = $4::text, next_attempt_at = $5::int8, "
            "lease_token = NULL, lease_expires = NULL, dead_lettered_at = NULL, "
            "dead_reason = NULL WHERE id = $1::int8 AND ((stream = $2::text "
            "AND stream_seq = $3::int8 AND published_at IS NOT NULL) OR EXISTS (SELECT 1 FROM r)) "
            "RETURNING id), "
            "f AS (" FLOOR_LOWER_ID " WHERE EXISTS (SELECT 1 FROM u)) SELECT count(*) FROM u",
            &p, PGRES_TUPLES_OK, "republishing a lost effect");
        if (!r) {
            rc = s->err.status;
            break;
        }
        *done += (size_t)get_i64(r, 0, 0);
        PQclear(r);
    }
    if (rc == JSD_OK)
        rc = pg_tx(s, JSD__TX_COMMIT_NOTIFY); /* wake the relays */
    else
        own_end(s, rc);
    if (rc != JSD_OK)
        *done = 0;
    return rc;
}

static const jsd__store_ops pg_ops = {
    .close = pg_close,
    .tx = pg_tx,
    .emit = pg_emit,
    .claim = pg_claim,
    .receipts = pg_receipts,
    .sync_receipts = pg_sync_receipts,
    .failures_read = pg_failures_read,
    .failures_write = pg_failures_write,
    .release = pg_release,
    .requeue = pg_requeue,
    .trouble = pg_trouble,
    .next_due = pg_next_due,
    .wait = pg_wait,
    .inbox_lookup = pg_inbox_lookup,
    .inbox_insert = pg_inbox_insert,
    .inbox_insert_many = pg_inbox_insert_many,
    .inbox_retire = pg_inbox_retire,
    .poison_insert = pg_poison_insert,
    .poison_mark = pg_poison_mark,
    .replay_request = pg_replay_request,
    .replay_list = pg_replay_list,
    .replay_finish = pg_replay_finish,
    .floor_put = pg_floor_put,
    .floor_get = pg_floor_get,
    .inbox_set = pg_inbox_set,
    .poison_read = pg_poison_read,
    .gc_step = pg_gc_step,
    .inbox_aged = pg_inbox_aged,
    .inbox_high = pg_inbox_high,
    .gc_inbox = pg_gc_inbox,
    .stats = pg_stats,
    /* the outbox tools */
    .tool_list = pg_tool_list,
    .tool_get = pg_tool_get,
    .tool_reasons = pg_tool_reasons,
    .tool_unpublish = pg_tool_unpublish,
};

/* ---- open and migrate -------------------------------------------------------------- */

static jsd_status run_schema_sql(jsd_store *s, const char *sql, const char *what)
{
    char *q = with_schema(s, sql);
    if (!q)
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory migrating the schema");
    jsd_status rc = simple(s, q, what);
    jsd__free(q);
    return rc;
}

static jsd_status migrate(jsd_store *s)
{
    pg *p = PG(s);
    jsd_status rc = simple(s, "BEGIN", "opening the store (migration)");
    if (rc != JSD_OK)
        return rc;
    /* Serialise migrations of this schema across processes. */
    char key[128];
    jsd__snprintf(key, sizeof(key), "jsdurable.migrate.%s", p->schema);
    const char *kv[1] = {key};
    PGresult *r = PQexecParams(p->conn, "SELECT pg_advisory_xact_lock(hashtext($1))", 1, NULL, kv,
                               NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        rc = pg_fail(s, r, "taking the migration lock");
    PQclear(r);
    if (rc == JSD_OK) {
        const char *sv[1] = {p->schema};
        r = PQexecParams(p->conn, "SELECT 1 FROM pg_namespace WHERE nspname = $1", 1, NULL, sv,
                         NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            rc = pg_fail(s, r, "looking up the schema");
        bool exists = rc == JSD_OK && PQntuples(r) > 0;
        PQclear(r);
        if (rc == JSD_OK && !exists) {
            char sql[128];
            jsd__snprintf(sql, sizeof(sql), "CREATE SCHEMA \"%s\"", p->schema);
            rc = simple(s, sql, "creating the schema");
        }
    }
    if (rc == JSD_OK)
        rc = run_schema_sql(s, VERSION_TABLE[0], "creating jsd_schema_version");
    int64_t cur = 0;
    if (rc == JSD_OK) {
        char *q = with_schema(s, "SELECT coalesce(max(version), 0)::int8 FROM @jsd_schema_version");
        r = q ? PQexecParams(p->conn, q, 0, NULL, NULL, NULL, NULL, 1) : NULL;
        jsd__free(q);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
            cur = get_i64(r, 0, 0);
        else
            rc = r ? pg_fail(s, r, "reading the schema version")
                   : jsd__store_err(s, JSD_ERR_NOMEM, "out of memory migrating the schema");
        PQclear(r);
    }
    if (rc == JSD_OK && cur > JSD__SCHEMA_VERSION)
        rc = jsd__store_err(s, JSD_ERR_SCHEMA,
                            "store \"%s\" (schema \"%s\") has schema version %lld, newer than "
                            "this jsdurable knows (%d): upgrade jsdurable",
                            s->url_safe, p->schema, (long long)cur, JSD__SCHEMA_VERSION);
    if (rc == JSD_OK && cur < 0)
        rc = jsd__store_err(s, JSD_ERR_SCHEMA,
                            "store \"%s\" records schema version %lld, which no jsdurable wrote: "
                            "the jsd_schema_version table was changed by hand",
                            s->url_safe, (long long)cur);
    _Static_assert(JSD_ARRAY_LEN(MIGRATIONS) == JSD__SCHEMA_VERSION, "one migration per version");
    s->schema_found = (int)cur;
    for (size_t m = cur > 0 ? (size_t)cur : 0; rc == JSD_OK && m < JSD_ARRAY_LEN(MIGRATIONS); m++) {
        int64_t v = (int64_t)m + 1;
        for (const char *const *q = MIGRATIONS[m]; *q && rc == JSD_OK; q++)
            rc = run_schema_sql(s, *q, "applying a schema migration");
        if (rc == JSD_OK && v == 2) {
            char id[33], ins[160];
            if ((rc = jsd__store_new_id(s, id)) == JSD_OK) {
                jsd__snprintf(ins, sizeof(ins),
                              "INSERT INTO @jsd_meta (key, value) VALUES ('" JSD__META_STORE_ID
                              "', '%s')",
                              id);
                rc = run_schema_sql(s, ins, "recording the store id");
            }
        }
        if (rc == JSD_OK) {
            char ins[160];
            jsd__snprintf(ins, sizeof(ins),
                          "INSERT INTO @jsd_schema_version (version, applied_at) "
                          "VALUES (%lld, %lld)",
                          (long long)v, (long long)jsd__now_ms());
            rc = run_schema_sql(s, ins, "recording the schema version");
        }
    }
    if (rc == JSD_OK) {
        char *q =
            with_schema(s, "SELECT value FROM @jsd_meta WHERE key = '" JSD__META_STORE_ID "'");
        r = q ? PQexecParams(p->conn, q, 0, NULL, NULL, NULL, NULL, 0) : NULL;
        jsd__free(q);
        if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            s->meta_id_found = PQntuples(r) > 0;
            jsd__strlcpy(s->meta_id, s->meta_id_found ? PQgetvalue(r, 0, 0) : "",
                         sizeof(s->meta_id));
        } else
            rc = r ? pg_fail(s, r, "reading the store id")
                   : jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading the store id");
        PQclear(r);
    }
    if (rc == JSD_OK && s->ns[0]) {
        /* the first operator namespace becomes that of rows written without
         * a msg_id (validated: [A-Za-z0-9._-] only) */
        char ins[192];
        jsd__snprintf(ins, sizeof(ins),
                      "INSERT INTO @jsd_meta (key, value) VALUES ('" JSD__META_NAMESPACE
                      "', '%s') ON CONFLICT (key) DO NOTHING",
                      s->ns);
        rc = run_schema_sql(s, ins, "recording the namespace");
    }
    if (rc == JSD_OK)
        return pg_tx(s, JSD__TX_COMMIT);
    jsd_error keep = s->err;
    pg_tx(s, JSD__TX_ROLLBACK);
    s->err = keep;
    return rc;
}

/* libpq's notices (RAISE WARNING / NOTICE from the application's SQL or a
 * server-side WARNING) go through the project's logger, not raw to stderr:
 * they follow --log-format and the application's sink, at their severity,
 * with the URL password scrubbed like every other libpq text. */
static void pg_notice(void *arg, const PGresult *res)
{
    jsd_store *s = arg;
    const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *text = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (!text)
        text = PQresultErrorMessage(res);
    jsd_log_level lv = JSD_LOG_INFO;
    if (sev && !strncmp(sev, "DEBUG", 5))
        lv = JSD_LOG_DEBUG;
    else if (sev && !strcmp(sev, "WARNING"))
        lv = JSD_LOG_WARN;
    if (!jsd__log_enabled(lv))
        return;
    char clean[600];
    clean_msg(s, text, clean, sizeof(clean));
    jsd__log(lv, "store", "PostgreSQL %s on store \"%s\": %s (SQLSTATE %s)", sev ? sev : "NOTICE",
             s->url_safe, clean, state ? state : "none");
}

/* The password in a postgres URL (user:PASSWORD@ or password=PASSWORD), or NULL. */
static char *url_password(const char *url)
{
    const char *sch = strstr(url, "://");
    if (sch) {
        const char *auth = sch + 3;
        size_t alen = strlen(auth); /* the last @: passwords may hold / ? # or @ */
        const char *at = NULL;
        for (size_t i = 0; i < alen; i++)
            if (auth[i] == '@')
                at = auth + i;
        if (at) {
            const char *colon = memchr(auth, ':', (size_t)(at - auth));
            if (colon && at > colon + 1)
                return jsd__strndup(colon + 1, (size_t)(at - colon - 1));
        }
    }
    const char *pw = strstr(url, "password=");
    if (pw) {
        pw += 9;
        return jsd__strndup(pw, strcspn(pw, "& "));
    }
    return NULL;
}

jsd_status jsd__pg_open(jsd_store *s, const char *conninfo, const char *schema, jsd_error *err)
{
    jsd_status rc;
    pg *p = jsd__calloc(1, sizeof(*p));
    if (!p)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory opening the store");
    s->be = p;
    s->ops = &pg_ops;
    s->backend = JSD_STORE_POSTGRES;
    jsd__strlcpy(p->schema, schema, sizeof(p->schema));
    jsd__snprintf(p->prefix, sizeof(p->prefix), "\"%s\".", schema);
    p->password = url_password(conninfo);

    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
    if (!opts) {
        char clean[300];
        clean_msg(s, perr ? perr : "out of memory", clean, sizeof(clean));
        rc = jsd__store_err(s, perr ? JSD_ERR_CONFIG : JSD_ERR_NOMEM,
                            "store URL \"%s\" is malformed: %s", s->url_safe, clean);
        PQfreemem(perr);
        goto fail;
    }
    PQconninfoFree(opts);
    const char *kw[] = {"connect_timeout", "fallback_application_name", "dbname", NULL};
    const char *vals[] = {"10", "jsdurable", conninfo, NULL};
    p->conn = PQconnectdbParams(kw, vals, 1);
    if (!p->conn) {
        rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory connecting to PostgreSQL");
        goto fail;
    }
    if (PQstatus(p->conn) != CONNECTION_OK) {
        char clean[400];
        clean_msg(s, PQerrorMessage(p->conn), clean, sizeof(clean));
        bool auth = strstr(clean, "authentication failed") || strstr(clean, "password");
        bool malformed = strncmp(clean, "invalid ", 8) == 0;
        rc = jsd__store_err(s,
                            auth        ? JSD_ERR_AUTH
                            : malformed ? JSD_ERR_CONFIG
                                        : JSD_ERR_CONNECT,
                            malformed ? "store URL \"%s\" is malformed: %s"
                                      : "cannot connect to the PostgreSQL store \"%s\": %s",
                            s->url_safe, clean);
        goto fail;
    }
    PQsetNoticeReceiver(p->conn, pg_notice, s);
    if ((rc = session_setup(s)) != JSD_OK || (rc = migrate(s)) != JSD_OK)
        goto fail;
    return JSD_OK;
fail:
    jsd__err_copy(err, &s->err);
    pg_close(s);
    return rc;
}

struct pg_conn *jsd__pg_handle(jsd_store *s)
{
    if (!s || s->backend != JSD_STORE_POSTGRES || !s->be)
        return NULL;
    /* The application's statements on it run inside the transaction: its
     * BEGIN goes first. When that fails (the connection is lost), no
     * statement may run outside the transaction: NULL, and the error is in
     * jsd_store_errmsg. */
    return begin_owed(s) == JSD_OK ? PG(s)->conn : NULL;
}

/* For the doctor (src/store/doctor.c): the settled floor, the ready rows
 * below it that no run covers (the ready rows there less the ids of the
 * runs there, so that the count reads the ready index once rather than
 * probing the runs per row: bench-scale keeps 5M published rows), the
 * first such row when there is one, and how many ids the outbox's identity
 * caches per session ("the settled floor", before floor_raise: above 1,
 * sessions commit ids out of the order they drew them in, and a row can
 * land below the floor). Outside any transaction, on the handle's own
 * connection. */
/* clang-format off */
static const char FLOOR_CHECK[] =
    "SELECT f.floor, ((SELECT count(*) FROM @jsd_outbox o WHERE " READY_OF("o.") " AND o.id < f.floor)"
    " - (SELECT coalesce(sum(least(hi, f.floor - 1) - lo + 1), 0) FROM @jsd_outbox_runs "
    "WHERE lo < f.floor))::int8, (SELECT q.seqcache FROM pg_sequence q WHERE q.seqrelid = "
    "pg_get_serial_sequence('@jsd_outbox', 'id')::regclass) FROM @jsd_outbox_floor f";
static const char FLOOR_FIRST_STRANDED[] =
    "SELECT min(o.id) FROM @jsd_outbox o WHERE " READY_OF("o.") " AND o.id < (SELECT floor FROM "
    "@jsd_outbox_floor) AND NOT " COVERED("o.id");
/* clang-format on */

/* One row of sql (with "@" for the schema), or false (error recorded). */
static bool floor_query(jsd_store *s, const char *sql, PGresult **out)
{
    params p = {.n = 0};
    PGresult *r = tool_exec(s, sql, &p, PGRES_TUPLES_OK, "reading the outbox floor");
    if (r && PQntuples(r) != 1) {
        jsd__store_err(s, JSD_ERR_STORE, "reading the outbox floor: no floor row");
        PQclear(r);
        r = NULL;
    }
    *out = r;
    return r != NULL;
}

jsd_status jsd__pg_floor_check(jsd_store *s, jsd__pg_floor_state *st)
{
    memset(st, 0, sizeof(*st));
    if (!s || s->backend != JSD_STORE_POSTGRES || !s->be)
        return JSD_ERR_INVALID;
    if (s->tx.active)
        return jsd__store_err(s, JSD_ERR_INVALID, "reading the outbox floor inside a transaction");
    PGresult *r = NULL;
    if (!floor_query(s, FLOOR_CHECK, &r))
        return s->err.status;
    st->floor = get_i64(r, 0, 0);
    st->stranded = get_i64(r, 0, 1);
    st->id_cache = PQgetisnull(r, 0, 2) ? -1 : get_i64(r, 0, 2);
    PQclear(r);
    if (st->stranded > 0) {
        if (!floor_query(s, FLOOR_FIRST_STRANDED, &r))
            return s->err.status;
        st->first_stranded = get_i64(r, 0, 0);
        PQclear(r);
    }
    return JSD_OK;
}
