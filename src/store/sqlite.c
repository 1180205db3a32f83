/*
 * The SQLite back end of the store (the default): one sqlite3 connection per
 * jsd_store, WAL journal, synchronous=FULL (a committed effect survives power
 * loss), a busy timeout, foreign keys on, extended result codes, and every
 * statement prepared once and cached.
 *
 * Concurrency: every writing transaction starts with BEGIN IMMEDIATE, which
 * takes the database's single write lock up front (waiting up to the busy
 * timeout), so a claim in one process and a claim in another are serialised
 * and can never lease the same effect, and no transaction fails half-way with
 * SQLITE_BUSY on a lock upgrade.
 *
 * Within one process, write transactions on one file also take turns in
 * the order they asked (the writer turn, see turn_take), so a relay's claim
 * is not starved by an application committing back to back; across
 * processes a connection waiting for the lock is let go first, for a bounded
 * time (the turn across processes, store/xturn.c).
 *
 * Wake-ups: a process-wide registry keeps one signal (mutex, condition
 * variable, counter) per database file; commits that emitted effects bump it.
 * Commits from other processes are noticed through PRAGMA data_version,
 * checked every 50 ms while a relay waits, every 2 ms for a second after the
 * last such commit (see sq_wait).
 *
 * One idea, the SQLite back end, so one file over 800 lines: the statement
 * table, its prepare-once cache and the error mapping serve every operation,
 * and a split would only move them into a shared header. Policy is not here:
 * the front (store.c, tx.c, outbox.c) decides, this file runs the SQL, and it
 * uses only backend.h and rows.h of the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#ifndef SQLITE_DEFAULT_WAL_AUTOCHECKPOINT
#define SQLITE_DEFAULT_WAL_AUTOCHECKPOINT 1000 /* pages, SQLite's default */
#endif

#include "store/backend.h"
#include "store/xturn.h"

enum {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_SAVEPOINT,
    S_RELEASE,
    S_ROLLBACK_TO,
    S_EMIT_SP,
    S_EMIT_RELEASE,
    S_EMIT_ROLLBACK_TO,
    S_INSERT,
    S_CLAIM,
    S_CLAIM_GAP,
    S_KEYED_ANY,
    S_UNLEASE_OLD,
    S_LEASE_EXPIRED,
    S_LEASE_MARK,
    S_LEASE_DEL,
    S_LEASE_LIVE,
    S_LEASE_INS,
    S_LEASE_GET,
    S_LEASE_SETTLE,
    S_LEASE_END,
    S_RECEIPT,
    S_RECEIPT_RANGE,
    S_RECEIPT_RUN,
    S_FAIL_SEL,
    S_FAIL_SEL_RANGE,
    S_FAIL_UPD,
    S_TROUBLE,
    S_RELEASE_LEASE,
    S_RELEASE_RANGE,
    S_REQUEUE,
    S_NEXT_DUE,
    S_INBOX_GET,
    S_INBOX_GET_MSG,
    S_INBOX_INS,
    S_INBOX_HAS_MSG,
    S_INBOX_RETIRE,
    S_POISON_INS,
    S_POISON_MARK,
    S_POISON_GET,
    S_POISON_LIST,
    S_POISON_UNPUB,
    S_GC_OUT,
    S_GC_IN,
    S_INBOX_AGED,
    S_INBOX_HIGH,
    S_GC_IN_DURABLE,
    S_STATS_PENDING,
    S_STATS_DEAD,
    S_STATS_PUBLISHED,
    S_STATS_INBOX,
    S_STATS_POISON,
    S_STATS_POISON_UNPUB,
    S_DATA_VERSION,
    S_CLAIM_REST,
    S_FLOOR_GET,
    S_FLOOR_SET,
    S_FLOOR_LOWER,
    S_READY_NEXT,
    S_RUN_AT,
    S_RUNS_FROM,
    S_RUN_INS,
    S_READY_COUNT,
    S_STATS_READY,
    S_STATS_RUNS_FROM,
    S_ROW_DUE,
    S_LEASE_RELEASED,
    S_INBOX_SET,
    S_REPLAY_UPSERT,
    S_REPLAY_GET,
    S_REPLAY_PENDING,
    S_REPLAY_OPEN,
    S_REPLAY_FINISH,
    S_STATS_REPLAY,
    S_DFLOOR_RAISE,
    S_DFLOOR_SET,
    S_DFLOOR_GET,
    S__COUNT
};

/* headers: the library's encoding or, from a foreign writer, the
 * headers_json text (rows.c tells them apart). */
#define OUTBOX_COLS                                                                                \
    "id, owner, effect_id, msg_id, subject, coalesce(headers, headers_json), payload, attempts, "  \
    "order_key, created_at, not_before, first_attempt_at"
#define POISON_COLS                                                                                \
    "id, stream, consumer, stream_seq, msg_id, subject, diagnostic, headers, payload, "            \
    "created_at, dlq_stream, dlq_seq"
#define REPLAY_COLS                                                                                \
    "id, stream, consumer, stream_seq, dlq_stream, dlq_seq, state, detail, requested_at, done_at"
#define PENDING "published_at IS NULL AND dead_lettered_at IS NULL"
/* Unordered first attempts due at insert (schema 8): claimed by range, and
 * their receipts recorded as runs, which the settled floor passes ("the
 * settled floor" below). */
#define READY "order_key IS NULL AND attempts = 0 AND not_before <= created_at AND " PENDING
/* The other unordered pending rows (retries, durable timers): leased row by
 * row and receipted in the row, so that they never hold the floor back. */
#define REST "order_key IS NULL AND (attempts > 0 OR not_before > created_at) AND " PENDING
/* Not covered by a run of receipts (o: the outbox row). */
#define UNCOVERED                                                                                  \
    "coalesce((SELECT r.hi FROM jsd_outbox_runs r WHERE r.lo <= jsd_outbox.id "                    \
    "ORDER BY r.lo DESC LIMIT 1), -1) < jsd_outbox.id"
/* A pending row a range lease holds when its id lies in the range (checked
 * in C, range_has): a ready one with no lease of its own (sq_claim, "range
 * leases"). */
#define RANGE_HELD "lease_token IS NULL AND lease_expires IS NULL AND " READY
/* The backlog of one half (order_key IS NULL / IS NOT NULL), through its
 * partial pending index (see S_TROUBLE). */
#define STATS_PENDING_PART(key)                                                                    \
    "SELECT count(*) AS n, coalesce(sum(max(next_attempt_at, not_before) <= ?1), 0) AS d, "        \
    "min(CASE WHEN not_before <= ?1 THEN not_before END) AS m "                                    \
    "FROM jsd_outbox "                                                                             \
    "WHERE order_key " key " AND " PENDING

#define STATS_PENDING_REST                                                                         \
    "SELECT count(*) AS n, coalesce(sum(max(next_attempt_at, not_before) <= ?1), 0) AS d, "        \
    "min(CASE WHEN not_before <= ?1 THEN not_before END) AS m "                                    \
    "FROM jsd_outbox INDEXED BY jsd_outbox_rest WHERE " REST

static const char *const sql_text[S__COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_SAVEPOINT] = "SAVEPOINT jsd_sp",
    [S_RELEASE] = "RELEASE jsd_sp",
    [S_ROLLBACK_TO] = "ROLLBACK TO jsd_sp",
    [S_EMIT_SP] = "SAVEPOINT jsd_emit",
    [S_EMIT_RELEASE] = "RELEASE jsd_emit",
    [S_EMIT_ROLLBACK_TO] = "ROLLBACK TO jsd_emit",
    [S_INSERT] = "INSERT INTO jsd_outbox (owner, effect_id, msg_id, subject, headers, payload, "
                 "order_key, created_at, not_before, next_attempt_at) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9) "
                 "ON CONFLICT (owner, effect_id) DO NOTHING",
    /* Keyed effects (see "range leases" below for the others): the head
     * (smallest pending id) of each order key when it is due, leased row by
     * row; see jsd__store_claim. */
    [S_CLAIM] =
        "UPDATE jsd_outbox SET lease_token = ?1, lease_expires = ?2, "
        /* an earlier lease that ended unsettled: maybe published (store.h),
         * first attempted when that lease began (taken as long as this one) */
        "duplicate = CASE WHEN lease_token IS NOT NULL THEN 1 ELSE duplicate END, "
        "first_attempt_at = CASE WHEN lease_token IS NOT NULL THEN coalesce(first_attempt_at, "
        "lease_expires - (?2 - ?3)) ELSE first_attempt_at END WHERE id IN ("
        "SELECT c.id FROM (SELECT min(id) AS hid FROM jsd_outbox "
        "WHERE order_key IS NOT NULL AND " PENDING " GROUP BY order_key) h "
        "JOIN jsd_outbox c ON c.id = h.hid WHERE c.next_attempt_at <= ?3 AND c.not_before <= ?3 "
        "AND (c.lease_expires IS NULL OR c.lease_expires <= ?3) ORDER BY c.id LIMIT ?4) "
        "RETURNING " OUTBOX_COLS ", duplicate",
    /* Unordered due effects between two claimed ranges, in id order. A row
     * with a lease_token is one leased row by row before schema 3 (or by a
     * test standing in for a crashed relay): claimable once it expired; one
     * with only lease_expires (0) was released from a range. */
    [S_CLAIM_GAP] = "SELECT " OUTBOX_COLS ", duplicate, lease_token, lease_expires, "
                    "max(next_attempt_at, not_before, CASE WHEN lease_token IS NULL THEN 0 "
                    "ELSE lease_expires END) <= ?3 FROM jsd_outbox INDEXED BY jsd_outbox_ready "
                    "WHERE " READY " AND id > ?1 AND id < ?2 ORDER BY id LIMIT ?4",
    [S_KEYED_ANY] = "SELECT 1 FROM jsd_outbox INDEXED BY jsd_outbox_keyed "
                    "WHERE order_key IS NOT NULL AND " PENDING " LIMIT 1",
    [S_UNLEASE_OLD] = "UPDATE jsd_outbox SET duplicate = CASE WHEN lease_token IS NOT NULL "
                      "THEN 1 ELSE duplicate END, first_attempt_at = CASE WHEN lease_token IS "
                      "NOT NULL THEN coalesce(first_attempt_at, lease_expires - ?4) ELSE "
                      "first_attempt_at END, lease_token = NULL, lease_expires = NULL "
                      "WHERE id BETWEEN ?1 AND ?2 AND order_key IS NULL "
                      "AND lease_expires <= ?3 AND " PENDING,
    [S_LEASE_EXPIRED] =
        "SELECT token, lo, hi, claimed_at FROM jsd_outbox_lease WHERE expires <= ?1",
    /* The unsettled effects of an expired range: maybe published (store.h). */
    [S_LEASE_MARK] =
        "UPDATE jsd_outbox SET duplicate = 1, first_attempt_at = coalesce(first_attempt_at, ?3) "
        "WHERE id BETWEEN ?1 AND ?2 AND " RANGE_HELD
        " AND next_attempt_at <= ?3 AND not_before <= ?3 AND " UNCOVERED,
    [S_LEASE_DEL] = "DELETE FROM jsd_outbox_lease WHERE token = ?1",
    [S_LEASE_LIVE] = "SELECT lo, hi, released FROM jsd_outbox_lease ORDER BY lo",
    [S_LEASE_INS] = "INSERT INTO jsd_outbox_lease (token, lo, hi, claimed_at, expires, open) "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [S_LEASE_GET] = "SELECT lo, hi, claimed_at FROM jsd_outbox_lease WHERE token = ?1",
    [S_LEASE_SETTLE] = "UPDATE jsd_outbox_lease SET open = open - ?2 WHERE token = ?1",
    [S_LEASE_END] = "DELETE FROM jsd_outbox_lease WHERE token = ?1 AND open <= 0",
    [S_RECEIPT] = "UPDATE jsd_outbox SET stream = ?3, stream_seq = ?4, duplicate = ?5, "
                  "published_at = ?6, lease_token = NULL, lease_expires = NULL "
                  "WHERE id = ?1 AND lease_token = ?2 AND published_at IS NULL",
    [S_RECEIPT_RANGE] =
        "UPDATE jsd_outbox SET stream = ?3, stream_seq = ?4, duplicate = ?5, "
        "published_at = ?6 WHERE id = ?1 AND ?2 IS NOT NULL AND " RANGE_HELD " AND " UNCOVERED,
    /* A run of receipts (run_end): ids ?1..?7 with stream seqs ?4.. in step. */
    [S_RECEIPT_RUN] = "UPDATE jsd_outbox SET stream = ?3, stream_seq = ?4 + (id - ?1), "
                      "duplicate = ?5, published_at = ?6 WHERE id BETWEEN ?1 AND ?7 "
                      "AND ?2 IS NOT NULL AND " RANGE_HELD " AND " UNCOVERED,
    [S_FAIL_SEL] =
        "SELECT attempts FROM jsd_outbox WHERE id = ?1 AND lease_token = ?2 AND " PENDING,
    [S_FAIL_SEL_RANGE] =
        "SELECT attempts FROM jsd_outbox WHERE id = ?1 AND ?2 IS NOT NULL AND " RANGE_HELD,
    [S_FAIL_UPD] = "UPDATE jsd_outbox SET attempts = ?2, last_error = ?3, next_attempt_at = ?4, "
                   "first_attempt_at = coalesce(first_attempt_at, ?7), "
                   "dead_lettered_at = ?5, dead_reason = ?6, lease_token = NULL, "
                   "lease_expires = NULL WHERE id = ?1",
    /* Pending counts go by order key, each half through its partial pending
     * index: PENDING alone matches neither index, and SQLite then scans the
     * whole table, published rows included (seconds behind 5M of them). */
    [S_TROUBLE] = "SELECT (SELECT count(*) FROM jsd_outbox INDEXED BY jsd_outbox_rest WHERE " REST
                  " AND attempts > 0) + (SELECT count(*) FROM jsd_outbox WHERE order_key IS NOT "
                  "NULL AND " PENDING " AND attempts > 0), "
                  "(SELECT count(*) FROM jsd_outbox WHERE dead_lettered_at IS NOT NULL), "
                  "(SELECT count(*) FROM jsd_outbox WHERE dead_lettered_at IS NOT NULL "
                  "AND dead_reason LIKE '%" JSD__FIRST_DUP_REASON "%')",
    [S_RELEASE_LEASE] = "UPDATE jsd_outbox SET lease_token = NULL, lease_expires = NULL "
                        "WHERE id = ?1 AND lease_token = ?2 AND published_at IS NULL",
    /* No longer held by its range (lease_expires 0: claimable, not marked
     * maybe published by a takeover); the next claim clears the mark. */
    [S_RELEASE_RANGE] = "UPDATE jsd_outbox SET lease_expires = 0 WHERE id = ?1 AND ?2 IS NOT NULL "
                        "AND " RANGE_HELD,
    [S_REQUEUE] = "UPDATE jsd_outbox SET dead_lettered_at = NULL, dead_reason = NULL, "
                  "attempts = 0, next_attempt_at = ?2, lease_token = NULL, lease_expires = NULL "
                  "WHERE id = ?1 AND dead_lettered_at IS NOT NULL AND published_at IS NULL",
    /* Only effects a claim could take: unordered ones and the heads of keys. */
    [S_NEXT_DUE] =
        "SELECT min(t) FROM (SELECT min(max(next_attempt_at, not_before, "
        "coalesce(lease_expires, 0))) "
        "AS t FROM jsd_outbox INDEXED BY jsd_outbox_rest WHERE " REST " UNION ALL "
        /* what a range holds is claimable when its lease expires, or earlier */
        "SELECT min(expires) FROM jsd_outbox_lease UNION ALL "
        "SELECT min(max(c.next_attempt_at, c.not_before, coalesce(c.lease_expires, 0))) FROM "
        "(SELECT min(id) AS hid FROM jsd_outbox WHERE order_key IS NOT NULL AND " PENDING
        " GROUP BY order_key) h JOIN jsd_outbox c ON c.id = h.hid)",
    [S_INBOX_GET] = "SELECT outcome, detail, msg_id, stream_seq, created_at FROM jsd_inbox "
                    "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3",
    [S_INBOX_GET_MSG] = "SELECT outcome, detail, msg_id, stream_seq, created_at FROM jsd_inbox "
                        "WHERE stream = ?1 AND consumer = ?2 AND msg_id = ?3 "
                        "ORDER BY created_at, stream_seq LIMIT 1",
    [S_INBOX_INS] =
        "INSERT INTO jsd_inbox (stream, consumer, stream_seq, msg_id, outcome, detail, "
        "created_at, traceparent, tracestate) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
        "ON CONFLICT (stream, consumer, stream_seq) DO NOTHING",
    /* The batch insert's msg id test. One INSERT ... SELECT ... WHERE NOT
     * EXISTS (on jsd_inbox itself) would do both in one statement, but SQLite
     * then stages each row in a temporary table (the SELECT reads the table
     * written to): 6.8 us a row against 4.1 us for this and S_INBOX_INS. */
    [S_INBOX_HAS_MSG] = "SELECT 1 FROM jsd_inbox WHERE stream = ?1 AND consumer = ?2 "
                        "AND msg_id = ?3 LIMIT 1",
    /* jsd__tx_inbox_retire: a fresh negative sequence, below every row of
     * the durable (min over the primary key's prefix: one index probe). */
    [S_INBOX_RETIRE] = "UPDATE jsd_inbox SET stream_seq = (SELECT min(min(stream_seq), 0) - 1 "
                       "FROM jsd_inbox WHERE stream = ?1 AND consumer = ?2) "
                       "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3",
    [S_POISON_INS] = "INSERT INTO jsd_poison (stream, consumer, stream_seq, msg_id, subject, "
                     "diagnostic, headers, payload, created_at) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
                     "ON CONFLICT (stream, consumer, stream_seq) DO NOTHING",
    [S_POISON_MARK] = "UPDATE jsd_poison SET dlq_stream = ?4, dlq_seq = ?5 "
                      "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3",
    [S_POISON_GET] = "SELECT " POISON_COLS " FROM jsd_poison "
                     "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3",
    [S_POISON_LIST] = "SELECT " POISON_COLS " FROM jsd_poison WHERE id > ?1 ORDER BY id LIMIT ?2",
    [S_POISON_UNPUB] = "SELECT " POISON_COLS " FROM jsd_poison WHERE stream = ?1 AND consumer = ?2 "
                       "AND dlq_seq IS NULL AND id > ?3 ORDER BY id LIMIT ?4",
    [S_GC_OUT] = "DELETE FROM jsd_outbox WHERE id IN (SELECT id FROM jsd_outbox "
                 "WHERE published_at IS NOT NULL AND published_at < ?1 "
                 "ORDER BY published_at LIMIT ?2)",
    /* each durable's highest row is its high-water mark: kept */
    [S_GC_IN] = "DELETE FROM jsd_inbox WHERE rowid IN (SELECT rowid FROM jsd_inbox x "
                "WHERE created_at < ?1 AND stream_seq < (SELECT max(y.stream_seq) FROM "
                "jsd_inbox y WHERE y.stream = x.stream AND y.consumer = x.consumer) "
                "ORDER BY created_at LIMIT ?2)",
    [S_INBOX_AGED] = "SELECT stream, consumer, count(*) FROM jsd_inbox WHERE created_at < ?1 "
                     "GROUP BY stream, consumer ORDER BY stream, consumer",
    /* by the primary key's prefix; retired rows (negative) do not count */
    [S_INBOX_HIGH] = "SELECT coalesce(max(stream_seq), 0) FROM jsd_inbox WHERE stream = ?1 AND "
                     "consumer = ?2 AND stream_seq > 0",
    /* by the primary key's prefix: the durable's rows up to its ack floor */
    [S_GC_IN_DURABLE] = "DELETE FROM jsd_inbox WHERE rowid IN (SELECT rowid FROM jsd_inbox "
                        "WHERE stream = ?1 AND consumer = ?2 AND stream_seq <= ?3 "
                        "AND created_at < ?4 AND (?3 = 9223372036854775807 OR stream_seq < "
                        "(SELECT max(stream_seq) FROM jsd_inbox WHERE stream = ?1 AND "
                        "consumer = ?2)) LIMIT ?5)",
    [S_STATS_PENDING] = "SELECT sum(n), sum(d), min(m) FROM (" STATS_PENDING_REST
                        " UNION ALL " STATS_PENDING_PART("IS NOT NULL") ")",
    [S_STATS_DEAD] = "SELECT count(*) FROM jsd_outbox WHERE dead_lettered_at IS NOT NULL",
    [S_STATS_PUBLISHED] = "SELECT (SELECT count(*) FROM jsd_outbox WHERE published_at IS NOT NULL) "
                          "+ (SELECT coalesce(sum(hi - lo + 1), 0) FROM jsd_outbox_runs)",
    [S_STATS_INBOX] = "SELECT count(*) FROM jsd_inbox",
    [S_STATS_POISON] = "SELECT count(*) FROM jsd_poison",
    [S_STATS_POISON_UNPUB] = "SELECT count(*) FROM jsd_poison WHERE dlq_seq IS NULL",
    [S_DATA_VERSION] = "PRAGMA data_version",
    [S_CLAIM_REST] =
        "UPDATE jsd_outbox SET lease_token = ?1, lease_expires = ?2, "
        "duplicate = CASE WHEN lease_token IS NOT NULL THEN 1 ELSE duplicate END, "
        "first_attempt_at = CASE WHEN lease_token IS NOT NULL THEN coalesce(first_attempt_at, "
        "lease_expires - (?2 - ?3)) ELSE first_attempt_at END WHERE id IN ("
        "SELECT id FROM jsd_outbox INDEXED BY jsd_outbox_rest WHERE " REST
        " AND next_attempt_at <= ?3 AND not_before <= ?3 "
        "AND (lease_expires IS NULL OR lease_expires <= ?3) ORDER BY id LIMIT ?4) "
        "RETURNING " OUTBOX_COLS ", duplicate",
    [S_FLOOR_GET] = "SELECT floor FROM jsd_outbox_floor",
    [S_FLOOR_SET] = "UPDATE jsd_outbox_floor SET floor = ?1",
    [S_FLOOR_LOWER] = "UPDATE jsd_outbox_floor SET floor = ?1 WHERE floor > ?1",
    [S_READY_NEXT] = "SELECT id FROM jsd_outbox INDEXED BY jsd_outbox_ready WHERE " READY
                     " AND id >= ?1 ORDER BY id LIMIT 1",
    [S_RUN_AT] = "SELECT lo, hi FROM jsd_outbox_runs WHERE lo <= ?1 ORDER BY lo DESC LIMIT 1",
    [S_RUNS_FROM] = "SELECT lo, hi FROM jsd_outbox_runs WHERE lo >= ?1 ORDER BY lo LIMIT ?2",
    [S_RUN_INS] = "INSERT INTO jsd_outbox_runs (lo, hi, stream, seq, duplicate, published_at) "
                  "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [S_READY_COUNT] = "SELECT count(*) FROM jsd_outbox INDEXED BY jsd_outbox_ready WHERE " READY
                      " AND id BETWEEN ?1 AND ?2",
    [S_STATS_READY] = "SELECT count(*), coalesce(sum(max(next_attempt_at, not_before) <= ?1), 0), "
                      "min(CASE WHEN max(next_attempt_at, not_before) <= ?1 THEN not_before END) "
                      "FROM jsd_outbox INDEXED BY jsd_outbox_ready WHERE " READY " AND id >= ?2",
    [S_STATS_RUNS_FROM] =
        "SELECT coalesce(sum(hi - lo + 1), 0) FROM jsd_outbox_runs WHERE lo >= ?1",
    [S_LEASE_RELEASED] = "UPDATE jsd_outbox_lease SET released = min(coalesce(released, ?2), ?2) "
                         "WHERE token = ?1",
    [S_ROW_DUE] = "SELECT max(next_attempt_at, not_before, coalesce(lease_expires, 0)) "
                  "FROM jsd_outbox WHERE id = ?1",
    [S_INBOX_SET] = "UPDATE jsd_inbox SET outcome = ?4, detail = ?5 "
                    "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3 AND outcome <> ?4",
    /* A new request, or a failed one made pending again; a pending or
     * applied one stays as it is (no row returned). */
    [S_REPLAY_UPSERT] =
        "INSERT INTO jsd_replay (stream, consumer, stream_seq, dlq_stream, dlq_seq, state, "
        "requested_at) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6) "
        "ON CONFLICT (stream, consumer, stream_seq) DO UPDATE SET state = 0, detail = NULL, "
        "done_at = NULL, dlq_stream = excluded.dlq_stream, dlq_seq = excluded.dlq_seq, "
        "requested_at = excluded.requested_at WHERE jsd_replay.state = 2 RETURNING id",
    [S_REPLAY_GET] = "SELECT " REPLAY_COLS " FROM jsd_replay "
                     "WHERE stream = ?1 AND consumer = ?2 AND stream_seq = ?3",
    [S_REPLAY_PENDING] = "SELECT " REPLAY_COLS " FROM jsd_replay WHERE stream = ?1 AND "
                         "consumer = ?2 AND state = 0 AND id > ?3 ORDER BY id LIMIT ?4",
    [S_REPLAY_OPEN] = "SELECT " REPLAY_COLS " FROM jsd_replay WHERE state <> 1 AND id > ?1 "
                      "ORDER BY id LIMIT ?2",
    [S_REPLAY_FINISH] = "UPDATE jsd_replay SET state = ?2, detail = ?3, done_at = ?4 "
                        "WHERE id = ?1 AND state = 0",
    [S_STATS_REPLAY] = "SELECT coalesce(sum(state = 0), 0), coalesce(sum(state = 2), 0) "
                       "FROM jsd_replay",
    /* a recorded floor only rises; recorded_at is when it last rose */
    [S_DFLOOR_RAISE] = "INSERT INTO jsd_durable_floor (stream, consumer, ack_floor, recorded_at) "
                       "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (stream, consumer) DO UPDATE SET "
                       "ack_floor = excluded.ack_floor, recorded_at = excluded.recorded_at "
                       "WHERE excluded.ack_floor > jsd_durable_floor.ack_floor",
    [S_DFLOOR_SET] = "INSERT INTO jsd_durable_floor (stream, consumer, ack_floor, recorded_at) "
                     "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (stream, consumer) DO UPDATE SET "
                     "ack_floor = excluded.ack_floor, recorded_at = excluded.recorded_at",
    [S_DFLOOR_GET] = "SELECT ack_floor, recorded_at FROM jsd_durable_floor "
                     "WHERE stream = ?1 AND consumer = ?2",
};

/* Schema migrations: MIGRATIONS[v - 1] takes the schema from v - 1 to v;
 * each records itself in VERSION_TABLE. */
static const char *const VERSION_TABLE[] = {
    "CREATE TABLE IF NOT EXISTS jsd_schema_version ("
    " version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    NULL};
/* The outbox's indexes, made by migration 1 and again by 4's rebuild. */
#define OUTBOX_INDEXES                                                                             \
    "CREATE INDEX jsd_outbox_ready ON jsd_outbox (id) WHERE order_key IS NULL AND " PENDING,       \
        "CREATE INDEX jsd_outbox_keyed ON jsd_outbox (order_key, id) "                             \
        "WHERE order_key IS NOT NULL AND " PENDING,                                                \
        "CREATE INDEX jsd_outbox_published ON jsd_outbox (published_at) "                          \
        "WHERE published_at IS NOT NULL",                                                          \
        "CREATE INDEX jsd_outbox_dead ON jsd_outbox (dead_lettered_at) "                           \
        "WHERE dead_lettered_at IS NOT NULL"
static const char *const migration_1[] = {
    "CREATE TABLE jsd_outbox ("
    " id INTEGER PRIMARY KEY,"
    " owner TEXT NOT NULL,"
    " effect_id TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " subject TEXT NOT NULL,"
    " headers BLOB,"
    " payload BLOB NOT NULL,"
    " order_key TEXT,"
    " created_at INTEGER NOT NULL,"
    " not_before INTEGER NOT NULL,"
    " next_attempt_at INTEGER NOT NULL,"
    " lease_token TEXT,"
    " lease_expires INTEGER,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " last_error TEXT,"
    " dead_lettered_at INTEGER,"
    " dead_reason TEXT,"
    " stream TEXT,"
    " stream_seq INTEGER,"
    " duplicate INTEGER,"
    " published_at INTEGER,"
    " UNIQUE (owner, effect_id))",
    OUTBOX_INDEXES,
    "CREATE TABLE jsd_inbox ("
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq INTEGER NOT NULL,"
    " msg_id TEXT,"
    " outcome INTEGER NOT NULL,"
    " detail TEXT,"
    " created_at INTEGER NOT NULL,"
    " PRIMARY KEY (stream, consumer, stream_seq))",
    "CREATE INDEX jsd_inbox_msg ON jsd_inbox (stream, consumer, msg_id) WHERE msg_id IS NOT NULL",
    "CREATE INDEX jsd_inbox_created ON jsd_inbox (created_at)",
    "CREATE TABLE jsd_poison ("
    " id INTEGER PRIMARY KEY,"
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq INTEGER NOT NULL,"
    " msg_id TEXT,"
    " subject TEXT NOT NULL,"
    " diagnostic TEXT NOT NULL,"
    " headers BLOB,"
    " payload BLOB,"
    " created_at INTEGER NOT NULL,"
    " dlq_stream TEXT,"
    " dlq_seq INTEGER,"
    " UNIQUE (stream, consumer, stream_seq))",
    NULL};

/* 2: the store's identity (the default message-id namespace). The store_id
 * row itself is inserted by migrate() with a random value drawn in C. Rows
 * already in jsd_outbox keep the msg_id they were committed with. */
static const char *const migration_2[] = {
    "CREATE TABLE jsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)", NULL};

/* 3: range leases (PostgreSQL's migration 3 gives its outbox room for HOT
 * lease updates instead; the version is shared by both back ends). An unordered claim no longer
 * writes a lease into each row: it records one row here for the claimed id range (see "range
 * leases" at sq_claim). Rows leased the old way are still claimable when their lease expires
 * (S_CLAIM_GAP). */
static const char *const migration_3[] = {"CREATE TABLE jsd_outbox_lease ("
                                          " token TEXT PRIMARY KEY,"
                                          " lo INTEGER NOT NULL,"
                                          " hi INTEGER NOT NULL,"
                                          " claimed_at INTEGER NOT NULL,"
                                          " expires INTEGER NOT NULL,"
                                          " open INTEGER NOT NULL)",
                                          NULL};

/* 4: the SQL contract (docs/SQL-CONTRACT.md): an application in any language
 * writes an effect with INSERT INTO jsd_outbox(owner, effect_id, subject,
 * payload) VALUES (?, ?, ?, ?). SQLite cannot change a column's default or
 * constraints in place, so the table is rebuilt: every row is copied with its
 * id and msg_id, the indexes are made again as migration 1 made them. The
 * new table takes
 *   - defaults for the timestamps (unix ms from julianday: 3.40 has no
 *     'subsec'). next_attempt_at cannot default to another column: a writer
 *     that sets only not_before gets next_attempt_at = now, and the claim
 *     waits for both (S_CLAIM, S_CLAIM_GAP, S_NEXT_DUE);
 *   - msg_id NULL: the claim derives it in its transaction and stores it
 *     (fill_msg_ids);
 *   - headers_json, JSON object text; headers stays the library's encoding;
 *   - named CHECK constraints with the limits of include/jsdurable/store.h,
 *     so SQLite's message names the rule; see FOREIGN_ONLY for the rows they
 *     hold. The rules on each header (names, values, count, size) need
 *     json_each, which a CHECK cannot call, and any INSERT trigger makes
 *     every library INSERT open a statement journal (jsd_tx_emit_batch ran
 *     at 60 % of its rate with one): the relay applies them at claim.
 * Rows copied from before are not held to the new rules (the copy runs with
 * ignore_check_constraints): one that breaks them is dead-lettered by the
 * relay with its reason when claimed (jsd__batch_add), as is any row whose
 * writer turned the checks off. */
#define NOW_MS JSD__SQLITE_NOW_MS
/* a text of control characters, for GLOB '*[...]*' */
#define CTRL_CLASS                                                                                 \
    "'*[' || char(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, "     \
    "22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 127) || ']*'"
#define IDENT_OK(col)                                                                              \
    "typeof(" col ") = 'text' AND length(CAST(" col                                                \
    " AS BLOB)) <= " JSD__XSTR(JSD_IDENT_MAX) " AND " col " NOT GLOB " CTRL_CLASS
/* A row the library writes carries its msg_id, and tx.c checked it with the
 * same rules (rules.c) before the INSERT: the constraints that cost a
 * per-character scan hold only for rows written without one (a foreign
 * writer's; without this, jsd_tx_emit_batch on SQLite ran at 40 % of its
 * former rate). */
#define FOREIGN_ONLY "msg_id IS NOT NULL OR ("
#define OUTBOX_V4_COLS                                                                             \
    "id, owner, effect_id, msg_id, subject, headers, payload, order_key, created_at, not_before, " \
    "next_attempt_at, lease_token, lease_expires, attempts, last_error, dead_lettered_at, "        \
    "dead_reason, stream, stream_seq, duplicate, published_at"
/* clang-format off */
/* The outbox table of schema 4 on (migration 4), by name, with its primary
 * key's clause (pk) and columns added since (extra). */
#define OUTBOX_TABLE(name, pk, extra) \
    "CREATE TABLE " name " (" \
    " id INTEGER PRIMARY KEY" pk "," \
    " owner TEXT NOT NULL DEFAULT ''," \
    " effect_id TEXT NOT NULL," \
    " msg_id TEXT," \
    " subject TEXT NOT NULL," \
    " headers BLOB," \
    " payload BLOB NOT NULL," \
    " order_key TEXT," \
    " created_at INTEGER NOT NULL DEFAULT " NOW_MS "," \
    " not_before INTEGER NOT NULL DEFAULT " NOW_MS "," \
    " next_attempt_at INTEGER NOT NULL DEFAULT " NOW_MS "," \
    " lease_token TEXT," \
    " lease_expires INTEGER," \
    " attempts INTEGER NOT NULL DEFAULT 0," \
    " last_error TEXT," \
    " dead_lettered_at INTEGER," \
    " dead_reason TEXT," \
    " stream TEXT," \
    " stream_seq INTEGER," \
    " duplicate INTEGER," \
    " published_at INTEGER," \
    " headers_json TEXT," extra \
    " UNIQUE (owner, effect_id)," \
    " CONSTRAINT jsd_outbox_owner CHECK (" FOREIGN_ONLY IDENT_OK("owner") "))," \
    " CONSTRAINT jsd_outbox_effect_id CHECK (" FOREIGN_ONLY "effect_id <> '' AND " \
    IDENT_OK("effect_id") "))," \
    " CONSTRAINT jsd_outbox_order_key CHECK (" FOREIGN_ONLY "order_key IS NULL OR " \
    "(order_key <> '' AND " IDENT_OK("order_key") ")))," \
    " CONSTRAINT jsd_outbox_subject_length CHECK (" FOREIGN_ONLY "typeof(subject) = 'text' AND " \
    "length(CAST(subject AS BLOB)) BETWEEN 1 AND " JSD__XSTR(JSD_SUBJECT_MAX) "))," \
    " CONSTRAINT jsd_outbox_subject_exact CHECK (" FOREIGN_ONLY \
    "subject NOT GLOB '*[^A-Za-z0-9_.-]*' AND substr(subject, 1, 1) <> '.' AND " \
    "substr(subject, -1) <> '.' AND instr(subject, '..') = 0))," \
    " CONSTRAINT jsd_outbox_subject_reserved CHECK (" FOREIGN_ONLY "subject <> '_INBOX' AND " \
    "subject NOT GLOB '_INBOX.*'))," \
    " CONSTRAINT jsd_outbox_payload CHECK (" FOREIGN_ONLY "typeof(payload) IN ('blob', 'text') " \
    "AND length(CAST(payload AS BLOB)) <= " JSD__XSTR(JSD__PAYLOAD_CAP_SQL) "))," \
    " CONSTRAINT jsd_outbox_msg_id CHECK (msg_id IS NULL OR (typeof(msg_id) = 'text' AND " \
    "length(msg_id) BETWEEN 1 AND " JSD__XSTR(JSD__MSG_ID_CHARS) "))," \
    " CONSTRAINT jsd_outbox_times CHECK (" FOREIGN_ONLY "typeof(created_at) = 'integer' AND " \
    "typeof(not_before) = 'integer' AND typeof(next_attempt_at) = 'integer' AND " \
    "not_before >= 0))," \
    " CONSTRAINT jsd_outbox_headers_json CHECK (headers_json IS NULL OR " \
    "(typeof(headers_json) = 'text' AND json_valid(headers_json) AND " \
    "json_type(headers_json) = 'object'))," \
    " CONSTRAINT jsd_outbox_headers_one_form CHECK (headers IS NULL OR headers_json IS NULL))"
static const char *const migration_4[] = {
    OUTBOX_TABLE("jsd_outbox_v4", "", ""),
    "PRAGMA ignore_check_constraints = ON",
    "INSERT INTO jsd_outbox_v4 (" OUTBOX_V4_COLS ") SELECT " OUTBOX_V4_COLS " FROM jsd_outbox",
    "PRAGMA ignore_check_constraints = OFF",
    "DROP TABLE jsd_outbox",
    "ALTER TABLE jsd_outbox_v4 RENAME TO jsd_outbox",
    OUTBOX_INDEXES,
    NULL};
/* clang-format on */

/* 5: the duplicate-window horizon and trace context: see postgres.c's
 * migration_5. */
static const char *const migration_5[] = {
    "ALTER TABLE jsd_outbox ADD COLUMN first_attempt_at INTEGER",
    "ALTER TABLE jsd_inbox ADD COLUMN traceparent TEXT",
    "ALTER TABLE jsd_inbox ADD COLUMN tracestate TEXT", NULL};

/* 6: PostgreSQL's outbox fillfactor (postgres.c's migration_6); SQLite has
 * none, and the version is shared by both back ends. */
static const char *const migration_6[] = {NULL};

/* 7: PostgreSQL's insert rule for header values (postgres.c's migration_7);
 * SQLite checks headers_json when the relay claims a row, with the same rule
 * (rules.c), and the version is shared by both back ends. */
static const char *const migration_7[] = {NULL};

/* 8: receipts of first attempts as runs, and the settled floor ("the
 * settled floor" below); publication state read through jsd_outbox_state
 * (docs/SQL-CONTRACT.md). */
#define OUTBOX_V8_COLS OUTBOX_V4_COLS ", headers_json, first_attempt_at"
static const char *const migration_8[] = {
    /* AUTOINCREMENT: an id is never handed out again, even after the rows
     * above it were deleted, so nothing new lands below the floor */
    OUTBOX_TABLE("jsd_outbox_v8", " AUTOINCREMENT", " first_attempt_at INTEGER,"),
    "PRAGMA ignore_check_constraints = ON",
    "INSERT INTO jsd_outbox_v8 (" OUTBOX_V8_COLS ") SELECT " OUTBOX_V8_COLS " FROM jsd_outbox",
    "PRAGMA ignore_check_constraints = OFF",
    "DROP TABLE jsd_outbox",
    "ALTER TABLE jsd_outbox_v8 RENAME TO jsd_outbox",
    "CREATE INDEX jsd_outbox_ready ON jsd_outbox (id) WHERE " READY,
    "CREATE INDEX jsd_outbox_rest ON jsd_outbox (id) WHERE " REST,
    "CREATE INDEX jsd_outbox_keyed ON jsd_outbox (order_key, id) "
    "WHERE order_key IS NOT NULL AND " PENDING,
    "CREATE INDEX jsd_outbox_published ON jsd_outbox (published_at) "
    "WHERE published_at IS NOT NULL",
    "CREATE INDEX jsd_outbox_dead ON jsd_outbox (dead_lettered_at) "
    "WHERE dead_lettered_at IS NOT NULL",
    "CREATE TABLE jsd_outbox_runs ("
    " lo INTEGER PRIMARY KEY,"
    " hi INTEGER NOT NULL,"
    " stream TEXT NOT NULL,"
    " seq INTEGER NOT NULL,"
    " duplicate INTEGER NOT NULL,"
    " published_at INTEGER NOT NULL)",
    "CREATE INDEX jsd_outbox_runs_published ON jsd_outbox_runs (published_at)",
    "CREATE TABLE jsd_outbox_floor (one INTEGER PRIMARY KEY CHECK (one = 1), floor INTEGER NOT "
    "NULL)",
    "INSERT INTO jsd_outbox_floor (one, floor) VALUES (1, 0)",
    "ALTER TABLE jsd_outbox_lease ADD COLUMN released INTEGER",
    "CREATE VIEW jsd_outbox_state AS SELECT o.id AS id, o.owner AS owner, "
    "o.effect_id AS effect_id, o.msg_id AS msg_id, o.subject AS subject, o.headers AS headers, "
    "o.headers_json AS headers_json, o.payload AS payload, o.order_key AS order_key, "
    "o.created_at AS created_at, o.not_before AS not_before, "
    "o.next_attempt_at AS next_attempt_at, o.lease_token AS lease_token, "
    "o.lease_expires AS lease_expires, o.attempts AS attempts, o.last_error AS last_error, "
    "o.dead_lettered_at AS dead_lettered_at, o.dead_reason AS dead_reason, "
    "CASE WHEN r.lo IS NULL THEN o.stream ELSE r.stream END AS stream, "
    "CASE WHEN r.lo IS NULL THEN o.stream_seq ELSE r.seq + (o.id - r.lo) END AS stream_seq, "
    "CASE WHEN r.lo IS NULL THEN o.duplicate ELSE r.duplicate END AS duplicate, "
    "CASE WHEN r.lo IS NULL THEN o.published_at ELSE r.published_at END AS published_at, "
    "o.first_attempt_at AS first_attempt_at "
    "FROM jsd_outbox o LEFT JOIN jsd_outbox_runs r ON r.lo = (SELECT max(x.lo) FROM "
    "jsd_outbox_runs x WHERE x.lo <= o.id) AND r.hi >= o.id",
    NULL};

/* 9: PostgreSQL's receipts as runs (postgres.c's migration_9); SQLite has
 * had them since 8. */
static const char *const migration_9[] = {NULL};

/* 10: replay requests (`jsdurable dlq replay --store`): a dead letter to be
 * applied again by the durable that parked it, and by no other (issue 42,
 * item 6). state: 0 pending, 1 applied, 2 failed. */
static const char *const migration_10[] = {
    "CREATE TABLE jsd_replay ("
    " id INTEGER PRIMARY KEY,"
    " stream TEXT NOT NULL,"
    " consumer TEXT NOT NULL,"
    " stream_seq INTEGER NOT NULL,"
    " dlq_stream TEXT NOT NULL,"
    " dlq_seq INTEGER NOT NULL,"
    " state INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),"
    " detail TEXT,"
    " requested_at INTEGER NOT NULL,"
    " done_at INTEGER,"
    " UNIQUE (stream, consumer, stream_seq))",
    "CREATE INDEX jsd_replay_pending ON jsd_replay (stream, consumer, id) WHERE state = 0", NULL};

/* 11: each durable's acknowledged floor as the server reported it, recorded
 * by its running consumer and by gc before it removes inbox rows (issue 42):
 * where a lost durable is re-created (consumer_position.c). */
static const char *const migration_11[] = {"CREATE TABLE jsd_durable_floor ("
                                           " stream TEXT NOT NULL,"
                                           " consumer TEXT NOT NULL,"
                                           " ack_floor INTEGER NOT NULL,"
                                           " recorded_at INTEGER NOT NULL,"
                                           " PRIMARY KEY (stream, consumer))",
                                           NULL};

static const char *const *const MIGRATIONS[] = {migration_1, migration_2,  migration_3, migration_4,
                                                migration_5, migration_6,  migration_7, migration_8,
                                                migration_9, migration_10, migration_11};

const char *const *jsd__sqlite_migration(int v)
{
    if (v == 0)
        return VERSION_TABLE;
    return v >= 1 && v <= (int)JSD_ARRAY_LEN(MIGRATIONS) ? MIGRATIONS[v - 1] : NULL;
}

/* ---- the wake-up registry and the writer turn --------------------------------------- */

/* A write transaction waiting for its turn (turn_take), on its own stack. */
typedef struct turn_waiter {
    pthread_cond_t cv;
    bool granted;
    struct turn_waiter *next;
} turn_waiter;

typedef struct wake {
    char *path;
    int refs;
    uint64_t counter;
    pthread_cond_t cv;
    /* the writer turn: held by one write transaction of this process, the
     * others wait in the order they asked (all under wake_mu) */
    bool turn_busy;
    turn_waiter *turn_head, *turn_tail;
    bool xturn_warned; /* a turn file that could not be opened was logged */
    struct wake *next;
} wake;

static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static wake *wake_list;

static wake *wake_get(const char *path)
{
    pthread_mutex_lock(&wake_mu);
    wake *w = wake_list;
    while (w && strcmp(w->path, path) != 0)
        w = w->next;
    if (w) {
        w->refs++;
    } else if ((w = jsd__calloc(1, sizeof(*w))) && (w->path = jsd__strdup(path))) {
        jsd__cond_init_mono(&w->cv);
        w->refs = 1;
        w->next = wake_list;
        wake_list = w;
    } else {
        jsd__free(w);
        w = NULL;
    }
    pthread_mutex_unlock(&wake_mu);
    return w;
}

static void wake_put(wake *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&wake_mu);
    if (--w->refs == 0) {
        wake **pp = &wake_list;
        while (*pp != w)
            pp = &(*pp)->next;
        *pp = w->next;
        pthread_cond_destroy(&w->cv);
        jsd__free(w->path);
        jsd__free(w);
    }
    pthread_mutex_unlock(&wake_mu);
}

/* ---- state and helpers ------------------------------------------------------------- */

typedef struct sq {
    sqlite3 *db;
    sqlite3_stmt *st[S__COUNT];
    wake *wake;
    uint64_t seen;
    int64_t data_version;
    int busy_timeout_ms;
    int64_t lively_until_ms; /* poll data_version fast until then (monotonic) */
    int64_t busy_since_us;   /* when the current wait for the lock began */
    bool turn_held;          /* this connection's write transaction holds the turn */
    jsd__xturn xturn;        /* the turn across processes (xturn.c) */
    bool in_begin;           /* BEGIN IMMEDIATE is running */
    /* failures_read -> failures_write: the rows read as held by a range */
    int64_t *fail_range;
    size_t fail_range_n;
    /* receipts committed without a sync, and the WAL file that syncs them
     * (sq_sync_receipts); used by the relay's receipt writer alone */
    bool receipts_unsynced;
    int wal_fd; /* -1: not open */
    char *wal_path;
} sq;

#define SQ(s) ((sq *)(s)->be)

/* DESIGN (the writer turn). SQLite's write lock is not a queue: a connection
 * that finds it held retries (sq_busy, every 100 µs), and one that releases
 * it can take it again before any waiter's next retry. An application that
 * commits back to back (each commit holds the lock for its fsync) then kept a
 * relay's claim out until it paused: in bench_relay's latency run (commits
 * at 1k/s that fall behind after a slow fsync and catch up) claims waited up
 * to 98 ms, and the commit -> PubAck p99 was 37-112 ms against a p50 of
 * 0.6-0.9 ms. So in one process the write transactions on one file take
 * turns: BEGIN IMMEDIATE (S_BEGIN) first waits for the turn, in the order
 * asked, and the turn passes on as soon as the transaction has ended
 * (committed, rolled back, or ended by SQLite after an error). A waiter
 * gives up after the busy timeout with SQLITE_BUSY, as BEGIN IMMEDIATE would,
 * so a thread that holds a transaction on one connection and begins one on
 * another gets JSD_ERR_BUSY, as before, not a deadlock. Transactions of
 * other processes meet SQLite's lock, made fairer by the turn across
 * processes (store/xturn.c: run() lets another process's waiter go first
 * before BEGIN IMMEDIATE, and sq_busy says that this connection waits). */
static jsd_status turn_take(jsd_store *s, const char *what)
{
    sq *q = SQ(s);
    wake *w = q->wake;
    if (!w || q->turn_held)
        return JSD_OK;
    pthread_mutex_lock(&wake_mu);
    if (!w->turn_busy) {
        w->turn_busy = true;
        q->turn_held = true;
        pthread_mutex_unlock(&wake_mu);
        return JSD_OK;
    }
    turn_waiter me = {.granted = false};
    if (jsd__cond_init_mono(&me.cv) != 0) {
        pthread_mutex_unlock(&wake_mu);
        return jsd__store_err(s, JSD_ERR_NOMEM, "%s: cannot wait for the write turn", what);
    }
    if (w->turn_tail)
        w->turn_tail->next = &me;
    else
        w->turn_head = &me;
    w->turn_tail = &me;
    int64_t deadline = jsd__mono_ms() + JSD_MAX(q->busy_timeout_ms, 0);
    while (!me.granted && jsd__cond_wait_until_ms(&me.cv, &wake_mu, deadline))
        ;
    if (!me.granted) { /* timed out: leave the queue */
        turn_waiter **pp = &w->turn_head, *prev = NULL;
        while (*pp != &me) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = me.next;
        if (w->turn_tail == &me)
            w->turn_tail = prev;
    }
    pthread_mutex_unlock(&wake_mu);
    pthread_cond_destroy(&me.cv);
    q->turn_held = me.granted;
    if (me.granted)
        return JSD_OK;
    jsd__store_err(s, JSD_ERR_BUSY,
                   "%s: another transaction of this process held the store's write lock past "
                   "the busy timeout (%d ms)",
                   what, q->busy_timeout_ms);
    s->err.sqlite_code = SQLITE_BUSY;
    return JSD_ERR_BUSY;
}

/* Pass the turn on to the first waiter, if any. */
static void turn_give(sq *q)
{
    wake *w = q->wake;
    q->turn_held = false;
    pthread_mutex_lock(&wake_mu);
    turn_waiter *n = w->turn_head;
    if (n) { /* the turn stays busy: it is the next waiter's now */
        w->turn_head = n->next;
        if (!w->turn_head)
            w->turn_tail = NULL;
        n->granted = true;
        pthread_cond_signal(&n->cv);
    } else {
        w->turn_busy = false;
    }
    pthread_mutex_unlock(&wake_mu);
}

/* Pass the turn on once this connection's transaction has ended. */
static void turn_give_if_ended(sq *q)
{
    if (q->turn_held && sqlite3_get_autocommit(q->db))
        turn_give(q);
}

/* s's back-end state when s is an open SQLite store; NULL otherwise (the
 * accessors for tests, the doctor and jsd__sqlite_handle). */
static sq *sqlite_of(jsd_store *s)
{
    return s && s->backend == JSD_STORE_SQLITE ? SQ(s) : NULL;
}

int64_t jsd__sqlite_xturn_yields(jsd_store *s, int64_t *deaf_until_us)
{
    sq *q = sqlite_of(s);
    if (!q)
        return -1;
    if (deaf_until_us)
        *deaf_until_us = q->xturn.deaf_until_us;
    return q->xturn.yields;
}

bool jsd__sqlite_xturn_part(jsd_store *s, int *why)
{
    sq *q = sqlite_of(s);
    *why = q ? q->xturn.open_errno : 0;
    return q && q->xturn.fd >= 0;
}

int jsd__sqlite_turn_waiting(jsd_store *s)
{
    sq *q = sqlite_of(s);
    if (!q || !q->wake)
        return -1;
    int n = 0;
    pthread_mutex_lock(&wake_mu);
    for (const turn_waiter *t = q->wake->turn_head; t; t = t->next)
        n++;
    pthread_mutex_unlock(&wake_mu);
    return n;
}

/* DESIGN (busy waits): sqlite3_busy_timeout() sleeps 1, 2, 5, 10 ... 100 ms
 * between retries, so a relay claim that finds an application's commit holding
 * the write lock trails it by tens to hundreds of ms (measured: 440 ms mean at
 * 1k commits/s). A write lock is held for about one fsync (~1-5 ms), so this
 * handler retries every 100 µs, still giving up after busy_timeout_ms. A retry
 * is one failed lock attempt (a few µs of CPU). */
static int sq_busy(void *arg, int count)
{
    sq *q = arg;
    int64_t now = jsd__mono_us();
    if (count == 0) {
        q->busy_since_us = now;
        if (q->in_begin)
            jsd__xturn_announce(&q->xturn);
    }
    if (now - q->busy_since_us >= (int64_t)q->busy_timeout_ms * 1000)
        return 0;
    struct timespec ts = {0, 100000L};
    nanosleep(&ts, NULL);
    return 1;
}

/* Map a SQLite result to a status and record it on the store. */
static jsd_status sq_fail(jsd_store *s, int rc, const char *what)
{
    sqlite3 *db = SQ(s) ? SQ(s)->db : NULL;
    int prim = rc & 0xff;
    jsd_status st;
    const char *hint = "";
    int sys = db ? sqlite3_system_errno(db) : 0;
    switch (prim) {
    case SQLITE_READONLY:
        st = JSD_ERR_READONLY;
        hint = "; the store file or its folder is read-only: jsdurable must write it";
        break;
    case SQLITE_FULL:
        st = JSD_ERR_FULL;
        hint = "; the disk holding the store is full: free space, nothing was committed";
        break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        st = JSD_ERR_BUSY;
        hint = "; another connection held the write lock past the busy timeout";
        break;
    case SQLITE_CONSTRAINT:
        st = (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) ? JSD_ERR_EXISTS
                                                                                    : JSD_ERR_STORE;
        break;
    case SQLITE_NOMEM:
        st = JSD_ERR_NOMEM;
        break;
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
        st = sys == ENOSPC ? JSD_ERR_FULL : sys == EROFS ? JSD_ERR_READONLY : JSD_ERR_IO;
        if (st == JSD_ERR_FULL)
            hint = "; the disk holding the store is full: free space, nothing was committed";
        break;
    default:
        st = JSD_ERR_STORE;
    }
    jsd__store_err(s, st, "%s failed on store \"%s\": %s (SQLite code %d)%s", what, s->url_safe,
                   db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), rc, hint);
    s->err.sqlite_code = rc;
    return st;
}

static sqlite3_stmt *stmt(jsd_store *s, int id)
{
    sq *q = SQ(s);
    if (!q->st[id]) {
        int rc = sqlite3_prepare_v3(q->db, sql_text[id], -1, SQLITE_PREPARE_PERSISTENT, &q->st[id],
                                    NULL);
        if (rc != SQLITE_OK) {
            sq_fail(s, rc, "preparing a statement");
            q->st[id] = NULL;
        }
    }
    return q->st[id];
}

static void done(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* Run a statement that returns no rows. */
static jsd_status run(jsd_store *s, int id, const char *what)
{
    sqlite3_stmt *st = stmt(s, id);
    if (!st)
        return s->err.status;
    sq *q = SQ(s);
    bool begin = id == S_BEGIN;
    if (begin) {
        jsd_status taken = turn_take(s, what);
        if (taken != JSD_OK)
            return taken;
        jsd__xturn_yield(&q->xturn);
    }
    q->in_begin = begin;
    int rc = sqlite3_step(st);
    q->in_begin = false;
    jsd__xturn_withdraw(&q->xturn);
    done(st);
    turn_give_if_ended(q);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return sq_fail(s, rc, what);
    return JSD_OK;
}

static jsd_status exec_sql(jsd_store *s, const char *sql, const char *what)
{
    int rc = sqlite3_exec(SQ(s)->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? JSD_OK : sq_fail(s, rc, what);
}

static void bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

static void bind_blob(sqlite3_stmt *st, int i, const void *v, size_t n)
{
    if (v)
        sqlite3_bind_blob64(st, i, n ? v : "", n, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

static const char *col_text(sqlite3_stmt *st, int i, size_t *len)
{
    const char *t = (const char *)sqlite3_column_text(st, i);
    if (len)
        *len = (size_t)sqlite3_column_bytes(st, i);
    return t;
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    size_t n;
    const char *t = col_text(st, i, &n);
    return t ? jsd__strndup(t, n) : NULL;
}

/* In a transaction of its own: begin, or run inside the open one. */
static jsd_status own_begin(jsd_store *s, const char *what)
{
    return run(s, S_BEGIN, what);
}

static jsd_status own_end(jsd_store *s, jsd_status rc, const char *what)
{
    if (rc == JSD_OK)
        return run(s, S_COMMIT, what);
    jsd_error keep = s->err;
    run(s, S_ROLLBACK, "rollback");
    s->err = keep;
    return rc;
}

/* ---- operations -------------------------------------------------------------------- */

static void sq_close(jsd_store *s)
{
    sq *q = SQ(s);
    if (!q)
        return;
    for (int i = 0; i < S__COUNT; i++)
        sqlite3_finalize(q->st[i]);
    sqlite3_close_v2(q->db);
    if (q->turn_held) /* closed inside a transaction, which SQLite rolled back */
        turn_give(q);
    if (q->wal_fd >= 0)
        close(q->wal_fd);
    jsd__xturn_close(&q->xturn);
    jsd__free(q->wal_path);
    jsd__free(q->fail_range);
    wake_put(q->wake);
    jsd__free(q);
    s->be = NULL;
}

static int64_t read_data_version(jsd_store *s)
{
    sqlite3_stmt *st = stmt(s, S_DATA_VERSION);
    int64_t v = -1;
    if (st && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    if (st)
        done(st);
    return v;
}

static jsd_status sq_tx(jsd_store *s, jsd__txop op)
{
    switch (op) {
    case JSD__TX_BEGIN:
        return run(s, S_BEGIN, "BEGIN");
    case JSD__TX_COMMIT:
        return run(s, S_COMMIT, "COMMIT");
    case JSD__TX_COMMIT_NOTIFY: {
        jsd_status rc = run(s, S_COMMIT, "COMMIT");
        if (rc == JSD_OK && SQ(s)->wake) {
            wake *w = SQ(s)->wake;
            pthread_mutex_lock(&wake_mu);
            w->counter++;
            pthread_cond_broadcast(&w->cv);
            pthread_mutex_unlock(&wake_mu);
        }
        return rc;
    }
    case JSD__TX_ROLLBACK:
        if (sqlite3_get_autocommit(SQ(s)->db)) {
            turn_give_if_ended(SQ(s));
            return JSD_OK; /* SQLite already rolled back (e.g. after SQLITE_FULL) */
        }
        return run(s, S_ROLLBACK, "ROLLBACK");
    case JSD__TX_SAVEPOINT:
        return run(s, S_SAVEPOINT, "SAVEPOINT");
    case JSD__TX_RELEASE:
        return run(s, S_RELEASE, "RELEASE SAVEPOINT");
    case JSD__TX_ROLLBACK_TO: {
        jsd_status rc = run(s, S_ROLLBACK_TO, "ROLLBACK TO SAVEPOINT");
        return rc == JSD_OK ? run(s, S_RELEASE, "RELEASE SAVEPOINT") : rc;
    }
    }
    return JSD_ERR_INTERNAL;
}

static jsd_status sq_emit(jsd_store *s, const jsd__row *rows, size_t n, size_t *dup_index)
{
    sqlite3_stmt *st = stmt(s, S_INSERT);
    if (!st)
        return s->err.status;
    jsd_status rc = JSD_OK;
    if (n > 1 && (rc = run(s, S_EMIT_SP, "SAVEPOINT")) != JSD_OK)
        return rc;
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        const jsd__row *r = &rows[i];
        bind_text(st, 1, r->owner);
        bind_text(st, 2, r->effect_id);
        bind_text(st, 3, r->msg_id);
        bind_text(st, 4, r->subject);
        bind_blob(st, 5, r->headers, r->headers_len);
        bind_blob(st, 6, r->payload, r->len);
        bind_text(st, 7, r->order_key);
        sqlite3_bind_int64(st, 8, r->created_at);
        sqlite3_bind_int64(st, 9, r->not_before);
        int x = sqlite3_step(st);
        done(st);
        if (x != SQLITE_DONE) {
            rc = sq_fail(s, x, "emitting an effect");
        } else if (sqlite3_changes(SQ(s)->db) == 0) {
            *dup_index = i;
            rc = JSD_ERR_EXISTS;
        }
    }
    if (n > 1) {
        jsd_error keep = s->err;
        if (rc != JSD_OK && !sqlite3_get_autocommit(SQ(s)->db))
            run(s, S_EMIT_ROLLBACK_TO, "ROLLBACK TO SAVEPOINT");
        if (!sqlite3_get_autocommit(SQ(s)->db)) {
            jsd_status r2 = run(s, S_EMIT_RELEASE, "RELEASE SAVEPOINT");
            if (rc == JSD_OK)
                rc = r2;
            else
                s->err = keep;
        }
    }
    return rc;
}

/* A transaction of the relay's that commits without the WAL sync (the
 * DESIGN blocks at sq_claim and sq_receipts): synchronous=NORMAL for it
 * alone, FULL again after it, keeping the transaction's own status and
 * error unless FULL cannot be restored. */
static jsd_status sync_normal(jsd_store *s, const char *who)
{
    char what[64];
    jsd__snprintf(what, sizeof(what), "%s: setting synchronous=NORMAL", who);
    return exec_sql(s, "PRAGMA synchronous=NORMAL", what);
}

static jsd_status sync_full_again(jsd_store *s, jsd_status rc, const char *who)
{
    char what[64];
    jsd__snprintf(what, sizeof(what), "%s: restoring synchronous=FULL", who);
    jsd_error keep = s->err;
    jsd_status back = exec_sql(s, "PRAGMA synchronous=FULL", what);
    if (back != JSD_OK)
        return back;
    s->err = keep;
    return rc;
}

/* DESIGN (claims commit without fsync): a claim only writes a lease. It
 * commits with synchronous=NORMAL (WAL: no fsync at commit; the WAL is synced
 * by the next FULL commit on any connection, which syncs every frame before
 * its own, and before each checkpoint), and the connection goes back to FULL
 * right after, so every other transaction, above all the application's
 * emitting commits, keeps synchronous=FULL. What can be lost is only the
 * lease, and only in an operating-system crash or power loss (a process crash
 * loses nothing in WAL mode): WAL needs every process that uses the file to
 * be on the same host (shared memory), so every process that could hold that
 * lease died in the same crash, and a rolled-back lease makes the effect claimable at
 * once, as its expiry would later; a publication made under it is repeated
 * with the same msg id (crash ordering, src/relay.c). Why: the claim sits on
 * the commit -> PubAck path, and this machine's fdatasync takes 0.2 ms
 * median, 5 ms p99, 41 ms max (docs/PERFORMANCE.md). Receipts are synced at
 * every commit (right after it, outside the write lock, sq_receipts): a lost
 * receipt means a republication that only the stream's duplicate window
 * collapses, and without a sync per receipt commit the number of such
 * effects after a power loss would grow from the in-flight ones to every
 * receipt since the WAL was last synced. */
static jsd_status sq_claim_tx(jsd_store *s, int max, int64_t lease_ms, const char *token,
                              int64_t now, jsd__effect_batch *out);
static jsd_status sq_claim(jsd_store *s, int max, int64_t lease_ms, const char *token, int64_t now,
                           jsd__effect_batch *out)
{
    jsd_status rc = sync_normal(s, "claim");
    if (rc != JSD_OK)
        return rc;
    /* Nor does a claim run the WAL's automatic checkpoint (copying the WAL
     * into the database file and syncing it): the next receipt or application
     * commit does, off the commit -> PubAck path. */
    sqlite3_wal_autocheckpoint(SQ(s)->db, 0);
    rc = sq_claim_tx(s, max, lease_ms, token, now, out);
    sqlite3_wal_autocheckpoint(SQ(s)->db, SQLITE_DEFAULT_WAL_AUTOCHECKPOINT);
    /* if FULL cannot be restored, the leased effects come back when the lease
     * expires */
    return sync_full_again(s, rc, "claim");
}

/* Read one claimed row (columns as OUTBOX_COLS, then duplicate) into the
 * batch. */
static jsd_status add_claimed(jsd_store *s, sqlite3_stmt *st, bool maybe, jsd__effect_batch *out)
{
    jsd__claimed_row row = {.row_id = sqlite3_column_int64(st, 0)};
    row.owner = col_text(st, 1, &row.owner_len);
    row.effect_id = col_text(st, 2, &row.id_len);
    row.msg_id = col_text(st, 3, &row.msg_id_len);
    row.subject = col_text(st, 4, &row.subject_len);
    row.headers = sqlite3_column_blob(st, 5);
    row.headers_len = (size_t)sqlite3_column_bytes(st, 5);
    row.payload = sqlite3_column_blob(st, 6);
    row.len = (size_t)sqlite3_column_bytes(st, 6);
    row.attempts = sqlite3_column_int(st, 7);
    row.order_key = col_text(st, 8, &row.order_key_len);
    row.created_at = sqlite3_column_int64(st, 9);
    row.not_before = sqlite3_column_int64(st, 10);
    row.first_attempt_at = sqlite3_column_int64(st, 11); /* NULL reads as 0 */
    row.maybe_published = maybe || sqlite3_column_int(st, 12) != 0;
    jsd_status rc = jsd__batch_add(out, &row);
    if (rc != JSD_OK)
        jsd__store_err(s, rc, "claim: cannot hold effect %lld in memory", (long long)row.row_id);
    return rc;
}

/* Rows leased row by row by statement id (S_CLAIM, S_CLAIM_REST: token,
 * lease expiry, now, at most max). */
static jsd_status claim_by_row(jsd_store *s, int id, int max, int64_t lease_ms, const char *token,
                               int64_t now, jsd__effect_batch *out)
{
    sqlite3_stmt *st = stmt(s, id);
    if (!st)
        return s->err.status;
    bind_text(st, 1, token);
    sqlite3_bind_int64(st, 2, now + lease_ms);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_int(st, 4, max);
    jsd_status rc = JSD_OK;
    int x;
    while (rc == JSD_OK && (x = sqlite3_step(st)) == SQLITE_ROW)
        rc = add_claimed(s, st, false, out);
    if (rc == JSD_OK && x != SQLITE_DONE && x != SQLITE_ROW)
        rc = sq_fail(s, x, "claim");
    done(st);
    return rc;
}

/* Keyed heads, leased row by row (S_CLAIM). */
static jsd_status claim_keyed(jsd_store *s, int max, int64_t lease_ms, const char *token,
                              int64_t now, jsd__effect_batch *out)
{
    sqlite3_stmt *st = stmt(s, S_KEYED_ANY);
    if (!st)
        return s->err.status;
    int x = sqlite3_step(st);
    done(st);
    if (x == SQLITE_DONE)
        return JSD_OK; /* no keyed effect pending: skip the GROUP BY */
    if (x != SQLITE_ROW)
        return sq_fail(s, x, "claim");
    return claim_by_row(s, S_CLAIM, max, lease_ms, token, now, out);
}

/* DESIGN (the settled floor, schema 8). The receipts of first attempts
 * claimed by range (READY rows) are recorded as runs (jsd_outbox_runs: ids
 * lo..hi with stream seqs seq.. in step), not in their rows, which stay in
 * the ready index. The floor (jsd_outbox_floor) keeps claims from stepping
 * over them: every ready row below it is covered by a run or lies in a
 * range lease row (live, or expired and not yet taken over). It moves up
 * by floor_raise (after receipts, before claims) and down wherever a row
 * below it becomes claimable again, in the same transaction: a range taken
 * over (to its lo), a row released from a range, a dead letter requeued,
 * a published effect unpublished. Ids never come back below it: the
 * outbox's id is AUTOINCREMENT (schema 8), so a new row lands above every
 * id ever handed out, even after rows were deleted by hand. Retries and
 * durable timers are not ready rows: leased row by row and receipted in
 * the row, they never hold the floor back while others are published past
 * them. */
#define FLOOR_STEPS 256 /* the most runs and ranges one walk passes */

static jsd_status floor_lower(jsd_store *s, int64_t id)
{
    sqlite3_stmt *st = stmt(s, S_FLOOR_LOWER);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, id);
    int x = sqlite3_step(st);
    done(st);
    return x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "lowering the floor");
}

/* The run covering id into *lo, *hi (false when none does). */
static jsd_status run_at(jsd_store *s, int64_t id, bool *covered, int64_t *lo, int64_t *hi)
{
    sqlite3_stmt *st = stmt(s, S_RUN_AT);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, id);
    int x = sqlite3_step(st);
    *covered = false;
    if (x == SQLITE_ROW) {
        *lo = sqlite3_column_int64(st, 0);
        *hi = sqlite3_column_int64(st, 1);
        *covered = *hi >= id;
    }
    done(st);
    return x == SQLITE_ROW || x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "reading receipt runs");
}

typedef struct span {
    int64_t lo, hi;
    int64_t released; /* a range's lowest row released back, -1 none */
} span;

#define LIVE_MAX 256 /* range leases looked at; more wait for the next claim */

/* The floor (*f), and the range lease rows by lo into ls (at most
 * LIVE_MAX; *more, when not NULL, tells whether there were more). */
static jsd_status floor_and_leases(jsd_store *s, int64_t *f, span *ls, size_t *n, bool *more)
{
    sqlite3_stmt *st = stmt(s, S_FLOOR_GET);
    if (!st)
        return s->err.status;
    int x = sqlite3_step(st);
    *f = x == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    done(st);
    if (x != SQLITE_ROW && x != SQLITE_DONE)
        return sq_fail(s, x, "reading the floor");
    if (!(st = stmt(s, S_LEASE_LIVE)))
        return s->err.status;
    *n = 0;
    while ((x = sqlite3_step(st)) == SQLITE_ROW && *n < LIVE_MAX) {
        ls[*n].lo = sqlite3_column_int64(st, 0);
        ls[*n].hi = sqlite3_column_int64(st, 1);
        ls[*n].released =
            sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 2);
        (*n)++;
    }
    if (more)
        *more = x == SQLITE_ROW;
    done(st);
    return x == SQLITE_ROW || x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "reading leases");
}

/* From f up: the first ready row that no run covers and no range holds
 * (*next, or -1 when there is none), and how far the floor may rise (*f). */
static jsd_status floor_walk(jsd_store *s, const span *ls, size_t nl, int64_t *f, int64_t *next)
{
    sqlite3_stmt *st = stmt(s, S_READY_NEXT);
    if (!st)
        return s->err.status;
    *next = -1;
    for (int step = 0; step < FLOOR_STEPS; step++) {
        sqlite3_bind_int64(st, 1, *f);
        int x = sqlite3_step(st);
        int64_t id = x == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
        done(st);
        if (x != SQLITE_ROW && x != SQLITE_DONE)
            return sq_fail(s, x, "walking the floor");
        if (id < 0)
            return JSD_OK; /* nothing ready from *f on */
        bool covered = false;
        int64_t lo = 0, hi = 0;
        jsd_status rc = run_at(s, id, &covered, &lo, &hi);
        if (rc != JSD_OK)
            return rc;
        for (size_t i = 0; i < nl && !covered; i++) {
            if (ls[i].lo > id || id > ls[i].hi)
                continue;
            if (ls[i].released >= id) {
                /* the range holds what lies before its released row */
                *f = ls[i].released;
                *next = ls[i].released;
                return JSD_OK;
            }
            covered = true;
            hi = ls[i].hi;
        }
        if (!covered) {
            *f = id;
            *next = id;
            return JSD_OK;
        }
        *f = hi + 1;
    }
    return JSD_OK;
}

/* Raise the floor *f (read with the ranges ls by floor_and_leases) as far
 * as the runs and ranges allow, and store it (a write transaction). */
static jsd_status floor_raise(jsd_store *s, const span *ls, size_t nl, int64_t *f)
{
    int64_t was = *f, next = -1;
    jsd_status rc = floor_walk(s, ls, nl, f, &next);
    if (rc != JSD_OK || *f == was)
        return rc;
    sqlite3_stmt *st = stmt(s, S_FLOOR_SET);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, *f);
    int x = sqlite3_step(st);
    done(st);
    return x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "raising the floor");
}

/* Take over the ranges whose lease expired: their unsettled effects are
 * marked maybe published and become claimable. */
static jsd_status take_over_expired(jsd_store *s, int64_t now)
{
    sqlite3_stmt *st = stmt(s, S_LEASE_EXPIRED), *mark = stmt(s, S_LEASE_MARK),
                 *del = stmt(s, S_LEASE_DEL);
    if (!st || !mark || !del)
        return s->err.status;
    sqlite3_bind_int64(st, 1, now);
    jsd_status rc = JSD_OK;
    int x;
    /* Few rows (one per batch in flight); changing the table being read is
     * avoided by taking one expired range per pass. */
    while (rc == JSD_OK && (x = sqlite3_step(st)) == SQLITE_ROW) {
        char token[JSD__LEASE_TOKEN_MAX + 1];
        jsd__strlcpy(token, (const char *)sqlite3_column_text(st, 0), sizeof(token));
        int64_t lo = sqlite3_column_int64(st, 1), hi = sqlite3_column_int64(st, 2),
                at = sqlite3_column_int64(st, 3);
        done(st);
        sqlite3_bind_int64(mark, 1, lo);
        sqlite3_bind_int64(mark, 2, hi);
        sqlite3_bind_int64(mark, 3, at);
        x = sqlite3_step(mark);
        done(mark);
        if (x == SQLITE_DONE && (rc = floor_lower(s, lo)) != JSD_OK)
            break;
        if (x == SQLITE_DONE) {
            bind_text(del, 1, token);
            x = sqlite3_step(del);
            done(del);
        }
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "claim: taking over an expired lease");
        sqlite3_bind_int64(st, 1, now);
    }
    if (rc == JSD_OK && x != SQLITE_DONE)
        rc = sq_fail(s, x, "claim: reading expired leases");
    done(st);
    return rc;
}

#define RUNS_MAX 256 /* runs above the floor looked between; more wait */

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Unordered effects: the first run of due ready rows above the floor and
 * between the ranges held and the runs recorded, held by one range lease
 * row. A ready row that cannot be claimed yet (leased row by row, or not
 * due) ends the claim before it, or the claim begins after it, so that a
 * range holds only the rows it claimed. */
static jsd_status claim_range(jsd_store *s, int max, int64_t lease_ms, const char *token,
                              int64_t now, jsd__effect_batch *out)
{
    /* what claims step around: the ranges held, and the runs at and above
     * the floor (below it everything is covered or held) */
    span ex[LIVE_MAX + RUNS_MAX + 1];
    size_t ne = 0;
    bool more = false;
    int64_t f = 0;
    jsd_status rc = take_over_expired(s, now);
    if (rc == JSD_OK)
        rc = floor_and_leases(s, &f, ex, &ne, &more);
    if (rc == JSD_OK)
        rc = floor_raise(s, ex, ne, &f);
    if (rc != JSD_OK)
        return rc;
    int64_t end = more ? ex[ne - 1].hi + 1 : INT64_MAX; /* beyond: not looked at */
    bool covered = false;
    int64_t rlo = 0, rhi = 0;
    if ((rc = run_at(s, f, &covered, &rlo, &rhi)) != JSD_OK)
        return rc;
    if (covered)
        ex[ne++] = (span){rlo, rhi, -1};
    sqlite3_stmt *st = stmt(s, S_RUNS_FROM);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, f);
    sqlite3_bind_int(st, 2, RUNS_MAX + 1);
    int x;
    size_t nr = 0;
    while ((x = sqlite3_step(st)) == SQLITE_ROW) {
        span r = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1), -1};
        if (nr++ == RUNS_MAX) {
            end = JSD_MIN(end, r.lo);
            break;
        }
        ex[ne++] = r;
    }
    done(st);
    if (x != SQLITE_DONE && x != SQLITE_ROW)
        return sq_fail(s, x, "claim: reading receipt runs");
    qsort(ex, ne, sizeof(*ex), span_cmp);
    if (!(st = stmt(s, S_CLAIM_GAP)))
        return s->err.status;
    size_t first = out->n;
    bool old_leases = false, stopped = false;
    int64_t from = f - 1; /* a gap starts after from */
    for (size_t g = 0; g <= ne && out->n == first && !stopped && rc == JSD_OK; g++) {
        int64_t to = g < ne ? JSD_MIN(ex[g].lo, end) : end; /* and ends before to */
        if (to > from + 1) {
            sqlite3_bind_int64(st, 1, from);
            sqlite3_bind_int64(st, 2, to);
            sqlite3_bind_int64(st, 3, now);
            sqlite3_bind_int(st, 4, max);
            while (rc == JSD_OK && (x = sqlite3_step(st)) == SQLITE_ROW) {
                if (!sqlite3_column_int(st, 15)) {
                    /* held by a row lease, or not due: a range never spans
                     * it, so it ends the claim, or the claim starts after it */
                    if (out->n > first) {
                        stopped = true;
                        break;
                    }
                    continue;
                }
                bool leased = sqlite3_column_type(st, 13) != SQLITE_NULL;
                old_leases |= sqlite3_column_type(st, 14) != SQLITE_NULL;
                rc = add_claimed(s, st, leased, out);
            }
            if (rc == JSD_OK && x != SQLITE_DONE && x != SQLITE_ROW)
                rc = sq_fail(s, x, "claim");
            done(st);
        }
        if (g < ne)
            from = JSD_MAX(from, ex[g].hi);
        if (from >= end - 1)
            break;
    }
    size_t n = out->n - first;
    if (rc != JSD_OK || n == 0)
        return rc;
    int64_t lo = out->items[first].row_id, hi = out->items[out->n - 1].row_id;
    if (old_leases) {
        /* rows leased the old way (expired) or released: the range holds
         * them from now on */
        if (!(st = stmt(s, S_UNLEASE_OLD)))
            return s->err.status;
        sqlite3_bind_int64(st, 1, lo);
        sqlite3_bind_int64(st, 2, hi);
        sqlite3_bind_int64(st, 3, now);
        sqlite3_bind_int64(st, 4, lease_ms);
        x = sqlite3_step(st);
        done(st);
        if (x != SQLITE_DONE)
            return sq_fail(s, x, "claim");
    }
    if (!(st = stmt(s, S_LEASE_INS)))
        return s->err.status;
    bind_text(st, 1, token);
    sqlite3_bind_int64(st, 2, lo);
    sqlite3_bind_int64(st, 3, hi);
    sqlite3_bind_int64(st, 4, now);
    sqlite3_bind_int64(st, 5, now + lease_ms);
    sqlite3_bind_int64(st, 6, (int64_t)n);
    x = sqlite3_step(st);
    done(st);
    if (x == SQLITE_CONSTRAINT_PRIMARYKEY)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "claim: lease token %s still holds an earlier claim; draw a fresh "
                              "token for each claim",
                              token);
    return x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "claim: recording the lease");
}

/* The namespace of rows written without a msg_id (docs/SQL-CONTRACT.md):
 * jsd_meta's "namespace", else the store id. "" when neither is usable. */
static void foreign_namespace(jsd_store *s, char ns[JSD_NAMESPACE_MAX + 1])
{
    ns[0] = '\0';
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(SQ(s)->db,
                           "SELECT coalesce((SELECT value FROM jsd_meta WHERE key = "
                           "'" JSD__META_NAMESPACE "'), (SELECT value FROM jsd_meta WHERE key = "
                           "'" JSD__META_STORE_ID "'))",
                           -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_TEXT) {
        const char *v = (const char *)sqlite3_column_text(st, 0);
        if (jsd__namespace_valid(v, NULL))
            jsd__strlcpy(ns, v, JSD_NAMESPACE_MAX + 1);
    }
    sqlite3_finalize(st);
}

/* Claimed rows a foreign writer left without a msg_id get the one
 * jsd_tx_emit derives (jsd_effect_msg_id under the foreign namespace),
 * stored back in the claim's transaction so that every retry publishes it
 * again. Rare (a prepared statement per claim that meets such rows). */
static jsd_status fill_msg_ids(jsd_store *s, jsd__effect_batch *out, size_t first)
{
    char ns[JSD_NAMESPACE_MAX + 1] = "";
    bool looked = false;
    sqlite3_stmt *up = NULL;
    jsd_status rc = JSD_OK;
    for (size_t i = first; i < out->n && rc == JSD_OK; i++) {
        jsd__claimed *c = &out->items[i];
        if (c->msg_id[0] || c->defect[0])
            continue;
        if (!looked) {
            foreign_namespace(s, ns);
            looked = true;
        }
        if (!ns[0] || jsd_effect_msg_id(ns, c->owner, c->effect_id, c->msg_id) != JSD_OK) {
            c->msg_id[0] = '\0'; /* dead-lettered: "its msg_id is empty" */
            continue;
        }
        int x = up ? SQLITE_OK
                   : sqlite3_prepare_v2(SQ(s)->db,
                                        "UPDATE jsd_outbox SET msg_id = ?2 WHERE id = ?1 AND "
                                        "(msg_id IS NULL OR msg_id = '')",
                                        -1, &up, NULL);
        if (x == SQLITE_OK) {
            sqlite3_bind_int64(up, 1, c->row_id);
            bind_text(up, 2, c->msg_id);
            x = sqlite3_step(up);
            sqlite3_reset(up);
        }
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "claim: storing a derived msg_id");
    }
    sqlite3_finalize(up);
    return rc;
}

static jsd_status sq_claim_tx(jsd_store *s, int max, int64_t lease_ms, const char *token,
                              int64_t now, jsd__effect_batch *out)
{
    jsd_status rc = own_begin(s, "claim");
    if (rc != JSD_OK)
        return rc;
    size_t first = out->n;
    /* Keyed heads take at most half a batch when unordered effects wait too,
     * and retries and timers at most half of the rest. */
    rc = claim_keyed(s, max > 1 ? max / 2 : 1, lease_ms, token, now, out);
    int left = max - (int)(out->n - first);
    if (rc == JSD_OK && left > 0)
        rc = claim_by_row(s, S_CLAIM_REST, left > 1 ? left / 2 : 1, lease_ms, token, now, out);
    left = max - (int)(out->n - first);
    if (rc == JSD_OK && left > 0)
        rc = claim_range(s, left, lease_ms, token, now, out);
    if (rc == JSD_OK)
        rc = fill_msg_ids(s, out, first);
    return own_end(s, rc, "claim");
}

/* The range lease of token, if it is still there (not taken over). */
typedef struct range {
    bool live;
    int64_t lo, hi, claimed_at;
} range;

static jsd_status range_get(jsd_store *s, const char *token, range *r)
{
    memset(r, 0, sizeof(*r));
    sqlite3_stmt *st = stmt(s, S_LEASE_GET);
    if (!st)
        return s->err.status;
    bind_text(st, 1, token);
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        r->live = true;
        r->lo = sqlite3_column_int64(st, 0);
        r->hi = sqlite3_column_int64(st, 1);
        r->claimed_at = sqlite3_column_int64(st, 2);
    }
    done(st);
    return x == SQLITE_ROW || x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "reading a lease");
}

static bool range_has(const range *r, int64_t id)
{
    return r->live && id >= r->lo && id <= r->hi;
}

/* settled effects of the range are no longer held; the range ends with its
 * last one */
static jsd_status range_settle(jsd_store *s, const char *token, size_t settled)
{
    if (settled == 0)
        return JSD_OK;
    sqlite3_stmt *up = stmt(s, S_LEASE_SETTLE), *end = stmt(s, S_LEASE_END);
    if (!up || !end)
        return s->err.status;
    bind_text(up, 1, token);
    sqlite3_bind_int64(up, 2, (int64_t)settled);
    int x = sqlite3_step(up);
    done(up);
    if (x == SQLITE_DONE) {
        bind_text(end, 1, token);
        x = sqlite3_step(end);
        done(end);
    }
    return x == SQLITE_DONE ? JSD_OK : sq_fail(s, x, "settling a lease");
}

static jsd_status sq_receipts_tx(jsd_store *s, const char *token, const jsd__receipt *r, size_t n,
                                 size_t *applied);

/* DESIGN (receipts synced outside the write lock). With synchronous=FULL a
 * WAL commit syncs the WAL while it holds the database's write lock, so the
 * relay's next claim and the application's commits waited one fsync for
 * every receipt commit (the disk's tail: the commit -> PubAck p99, issue 12).
 * The relay's writer commits receipts with synchronous=NORMAL instead and
 * then syncs the WAL file itself (sq_sync_receipts), outside the lock, before
 * it counts them written (relay_writer.c). Nothing else is weakened:
 *   - until that sync the receipts can be lost only to an operating-system
 *     crash or power loss, as at a crash between the PubAck and the commit:
 *     the effects are published again with the same msg id (crash ordering,
 *     src/relay.c);
 *   - a power loss keeps a prefix of the WAL (its frames are checksummed in
 *     order), so anything committed after the receipts, a claim of the next
 *     effect of their keys among it, is lost with them;
 *   - frames a checkpoint has copied into the database file are synced there
 *     by the checkpoint (WAL syncs before it, the database file after it,
 *     also with NORMAL), so a restarted WAL overwriting them loses nothing;
 *   - the WAL file of a database with an open connection is never replaced,
 *     and the sync checks its inode before each sync. No lock is held on a WAL
 *     file (WAL mode locks the database and -shm files), so opening and
 *     closing one here cannot drop SQLite's POSIX locks. */
static jsd_status sq_receipts(jsd_store *s, const char *token, const jsd__receipt *r, size_t n,
                              size_t *applied, bool sync)
{
    sq *q = SQ(s);
    if (sync || !q->wal_path)
        return sq_receipts_tx(s, token, r, n, applied);
    jsd_status rc = sync_normal(s, "receipts");
    if (rc != JSD_OK)
        return rc;
    rc = sq_receipts_tx(s, token, r, n, applied);
    if (rc == JSD_OK)
        q->receipts_unsynced = true;
    return sync_full_again(s, rc, "receipts");
}

static jsd_status sq_sync_receipts(jsd_store *s)
{
    sq *q = SQ(s);
    if (!q->receipts_unsynced)
        return JSD_OK;
    struct stat now, held;
    if (q->wal_fd >= 0 && (stat(q->wal_path, &now) != 0 || fstat(q->wal_fd, &held) != 0 ||
                           now.st_ino != held.st_ino || now.st_dev != held.st_dev)) {
        close(q->wal_fd);
        q->wal_fd = -1;
    }
    if (q->wal_fd < 0)
        q->wal_fd = open(q->wal_path, O_RDONLY | O_CLOEXEC);
    if (q->wal_fd < 0 || fdatasync(q->wal_fd) != 0) {
        int e = errno;
        JSD_ERROR("store",
                  "cannot sync the store's WAL after recording receipts (%s): they are "
                  "committed, and a power loss before the next sync would have their effects "
                  "published again with the same msg ids",
                  strerror(e));
        return JSD_ERR_IO;
    }
    q->receipts_unsynced = false;
    return JSD_OK;
}

/* One receipt: a row the range holds through the range statement (no lease
 * in the row to check), any other (a keyed head, leased by itself) through
 * the row-lease one. Each is one step of a prepared single-row UPDATE (runs
 * of receipts: receipt_run).
 * DESIGN: not one UPDATE ... FROM (VALUES ...) RETURNING for many rows, as
 * before: SQLite runs both clauses through ephemeral tables, each of which
 * allocates and frees an 88 KB page-cache bulk; on the receipt writer's
 * thread glibc trimmed its arena after each free (madvise, then page faults
 * and TLB shootdowns on the next allocation: 6 270 madvise calls in 300k
 * effects against 20 now), which doubled the CPU per effect of a relay
 * process until glibc's trim threshold had grown (issue 12,
 * docs/PERFORMANCE.md). */
static jsd_status receipt_one(jsd_store *s, const char *token, bool by_range, const jsd__receipt *e,
                              size_t *changed)
{
    sqlite3_stmt *st = stmt(s, by_range ? S_RECEIPT_RANGE : S_RECEIPT);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, e->row_id);
    bind_text(st, 2, token);
    bind_text(st, 3, e->stream);
    sqlite3_bind_int64(st, 4, (int64_t)e->seq);
    sqlite3_bind_int(st, 5, e->duplicate ? 1 : 0);
    sqlite3_bind_int64(st, 6, e->published_at_ms);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "recording a receipt");
    *changed = (size_t)sqlite3_changes(SQ(s)->db);
    return JSD_OK;
}

/* The end (exclusive) of the run of receipts from r[i]: rows of the range
 * with consecutive ids and stream seqs, one stream, one duplicate flag and
 * one publication time, which one statement records (S_RECEIPT_RUN); i + 1
 * for a row outside the range. A batch of one relay's publications is
 * mostly such runs: its ids come from one claimed range and the stream
 * numbers them in the order they were written. */
static size_t run_end(const range *rg, const jsd__receipt *r, size_t n, size_t i)
{
    size_t j = i + 1;
    if (!range_has(rg, r[i].row_id))
        return j;
    while (j < n && jsd__receipt_continues(&r[i], &r[j - 1], &r[j]) && range_has(rg, r[j].row_id))
        j++;
    return j;
}

/* Record the run r[0..len) as one row of jsd_outbox_runs when every row of
 * its ids is still a ready one (an index-only count; the live range holds
 * them, so no one else publishes them): *done tells whether it was. */
static jsd_status receipt_run_row(jsd_store *s, const jsd__receipt *r, size_t len, bool *done_,
                                  bool *dup)
{
    *done_ = false;
    *dup = false;
    sqlite3_stmt *st = stmt(s, S_READY_COUNT);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, r[0].row_id);
    sqlite3_bind_int64(st, 2, r[len - 1].row_id);
    int x = sqlite3_step(st);
    int64_t n = x == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    done(st);
    if (x != SQLITE_ROW)
        return sq_fail(s, x, "recording receipts");
    if (n != (int64_t)len || r[len - 1].row_id - r[0].row_id + 1 != (int64_t)len)
        return JSD_OK;
    /* a run already there (these receipts recorded before) takes nothing */
    bool covered = false;
    int64_t lo = 0, hi = 0;
    jsd_status rc = run_at(s, r[len - 1].row_id, &covered, &lo, &hi);
    if (rc != JSD_OK)
        return rc;
    if (hi >= r[0].row_id) {
        *done_ = true;
        *dup = true;
        return JSD_OK;
    }
    if (!(st = stmt(s, S_RUN_INS)))
        return s->err.status;
    sqlite3_bind_int64(st, 1, r[0].row_id);
    sqlite3_bind_int64(st, 2, r[len - 1].row_id);
    bind_text(st, 3, r[0].stream);
    sqlite3_bind_int64(st, 4, (int64_t)r[0].seq);
    sqlite3_bind_int(st, 5, r[0].duplicate ? 1 : 0);
    sqlite3_bind_int64(st, 6, r[0].published_at_ms);
    x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "recording receipts");
    *done_ = true;
    return JSD_OK;
}

/* Record the run r[0..len) with one UPDATE; *changed rows were written. */
static jsd_status receipt_run(jsd_store *s, const char *token, const jsd__receipt *r, size_t len,
                              size_t *changed)
{
    sqlite3_stmt *st = stmt(s, S_RECEIPT_RUN);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, r[0].row_id);
    bind_text(st, 2, token);
    bind_text(st, 3, r[0].stream);
    sqlite3_bind_int64(st, 4, (int64_t)r[0].seq);
    sqlite3_bind_int(st, 5, r[0].duplicate ? 1 : 0);
    sqlite3_bind_int64(st, 6, r[0].published_at_ms);
    sqlite3_bind_int64(st, 7, r[len - 1].row_id);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "recording receipts");
    *changed = (size_t)sqlite3_changes(SQ(s)->db);
    return JSD_OK;
}

/* One receipt by itself, counted into *a (rows written) and *ra (of them,
 * rows the range held). */
static jsd_status receipt_single(jsd_store *s, const char *token, const range *rg,
                                 const jsd__receipt *e, size_t *a, size_t *ra)
{
    bool in_range = range_has(rg, e->row_id);
    size_t changed = 0;
    jsd_status rc = receipt_one(s, token, in_range, e, &changed);
    if (rc == JSD_OK && in_range && changed == 0)
        /* in the range's ids but not held by it (a keyed row, or one
         * leased the old way): the row's own lease decides */
        rc = receipt_one(s, token, false, e, &changed);
    else if (in_range)
        *ra += changed;
    *a += changed;
    return rc;
}

/* DESIGN: a run of receipts costs one statement (~1 us of CPU less per
 * effect than a prepared single-row UPDATE each, issue 12). When the run
 * statement writes fewer rows than the run holds (a row of it not held by
 * the range: keyed, leased the old way, or taken over), each row of the run
 * is recorded by itself as before: the rows the run statement wrote no
 * longer match either single-row statement (published_at IS NULL, a
 * lease_token of their own), so no row is counted twice, and each of them
 * got the seq of its own receipt, because the run holds only receipts whose
 * seqs step with their ids. */
static jsd_status sq_receipts_tx(jsd_store *s, const char *token, const jsd__receipt *r, size_t n,
                                 size_t *applied)
{
    jsd_status rc = own_begin(s, "recording receipts");
    if (rc != JSD_OK)
        return rc;
    range rg;
    if ((rc = range_get(s, token, &rg)) != JSD_OK)
        return own_end(s, rc, "receipts");
    size_t a = 0, ra = 0;
    for (size_t i = 0; i < n && rc == JSD_OK;) {
        size_t end = run_end(&rg, r, n, i), changed = 0;
        bool as_run = false, recorded_before = false;
        if (range_has(&rg, r[i].row_id) &&
            (rc = receipt_run_row(s, &r[i], end - i, &as_run, &recorded_before)) != JSD_OK)
            break;
        if (as_run) {
            if (!recorded_before) {
                a += end - i;
                ra += end - i;
            }
            i = end;
            continue;
        }
        if (end - i > 1) {
            rc = receipt_run(s, token, &r[i], end - i, &changed);
            a += changed;
            ra += changed;
            if (changed == end - i)
                i = end;
        }
        for (; i < end && rc == JSD_OK; i++)
            rc = receipt_single(s, token, &rg, &r[i], &a, &ra);
    }
    if (rc == JSD_OK)
        rc = range_settle(s, token, ra);
    if (rc == JSD_OK && ra > 0) {
        span ls[LIVE_MAX];
        size_t nl = 0;
        int64_t f = 0;
        rc = floor_and_leases(s, &f, ls, &nl, NULL);
        if (rc == JSD_OK)
            rc = floor_raise(s, ls, nl, &f);
    }
    rc = own_end(s, rc, "recording receipts");
    *applied = rc == JSD_OK ? a : 0;
    return rc;
}

static jsd_status sq_failures_read(jsd_store *s, const char *token, const int64_t *ids, size_t n,
                                   int *attempts)
{
    sq *q = SQ(s);
    q->fail_range_n = 0;
    jsd_status rc = own_begin(s, "recording failures");
    if (rc != JSD_OK)
        return rc;
    range rg;
    sqlite3_stmt *row = stmt(s, S_FAIL_SEL), *in_range = stmt(s, S_FAIL_SEL_RANGE);
    if (!row || !in_range)
        return own_end(s, s->err.status, "failures");
    if ((rc = range_get(s, token, &rg)) != JSD_OK)
        return own_end(s, rc, "recording failures");
    jsd__free(q->fail_range);
    if (!(q->fail_range = jsd__malloc((n ? n : 1) * sizeof(int64_t))))
        return own_end(s, jsd__store_err(s, JSD_ERR_NOMEM, "out of memory recording failures"),
                       "recording failures");
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        attempts[i] = -1; /* lease lost, or settled */
        for (int k = range_has(&rg, ids[i]) ? 0 : 1; k < 2; k++) {
            sqlite3_stmt *sel = k == 0 ? in_range : row;
            sqlite3_bind_int64(sel, 1, ids[i]);
            bind_text(sel, 2, token);
            int x = sqlite3_step(sel);
            if (x == SQLITE_ROW)
                attempts[i] = sqlite3_column_int(sel, 0);
            done(sel);
            if (x != SQLITE_ROW && x != SQLITE_DONE) {
                rc = sq_fail(s, x, "recording a failure");
                break;
            }
            if (x == SQLITE_ROW) {
                if (k == 0)
                    q->fail_range[q->fail_range_n++] = ids[i];
                break;
            }
        }
    }
    if (rc != JSD_OK)
        return own_end(s, rc, "recording failures");
    return JSD_OK;
}

static jsd_status sq_failures_write(jsd_store *s, const char *token, const jsd__failure_update *u,
                                    size_t n)
{
    sq *q = SQ(s);
    jsd_status rc = JSD_OK;
    size_t settled = 0;
    sqlite3_stmt *upd = stmt(s, S_FAIL_UPD);
    if (!upd)
        return own_end(s, s->err.status, "failures");
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        sqlite3_bind_int64(upd, 1, u[i].row_id);
        sqlite3_bind_int(upd, 2, u[i].attempts);
        bind_text(upd, 3, u[i].error);
        sqlite3_bind_int64(upd, 4, u[i].next_attempt_at);
        if (u[i].dead) {
            sqlite3_bind_int64(upd, 5, u[i].dead_at);
            bind_text(upd, 6, u[i].reason);
        } else {
            sqlite3_bind_null(upd, 5);
            sqlite3_bind_null(upd, 6);
        }
        if (u[i].first_attempt_at > 0)
            sqlite3_bind_int64(upd, 7, u[i].first_attempt_at);
        else
            sqlite3_bind_null(upd, 7);
        int x = sqlite3_step(upd);
        done(upd);
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "recording a failure");
        /* the rows were read under token in this transaction (the front
         * passes each row once) */
        for (size_t j = 0; j < q->fail_range_n; j++)
            if (q->fail_range[j] == u[i].row_id) {
                settled++;
                break;
            }
    }
    if (rc == JSD_OK)
        rc = range_settle(s, token, settled);
    q->fail_range_n = 0;
    return own_end(s, rc, "recording failures");
}

static jsd_status sq_trouble(jsd_store *s, jsd__outbox_trouble *o)
{
    sqlite3_stmt *st = stmt(s, S_TROUBLE);
    if (!st)
        return s->err.status;
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        o->failing = sqlite3_column_int64(st, 0);
        o->dead_lettered = sqlite3_column_int64(st, 1);
        o->first_attempt_duplicates = sqlite3_column_int64(st, 2);
    }
    done(st);
    return x == SQLITE_ROW ? JSD_OK : sq_fail(s, x, "counting failing effects");
}

/* A row released from a live range: the range no longer holds it, so the
 * floor comes down to it and may not pass it while the range lasts (the
 * range's released mark); a claim takes it once the range ends. */
static jsd_status range_released(jsd_store *s, const char *token, int64_t id)
{
    sqlite3_stmt *st = stmt(s, S_LEASE_RELEASED);
    if (!st)
        return s->err.status;
    bind_text(st, 1, token);
    sqlite3_bind_int64(st, 2, id);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "releasing leases");
    return floor_lower(s, id);
}

static jsd_status sq_release(jsd_store *s, const char *token, const int64_t *ids, size_t n,
                             size_t *released)
{
    *released = 0;
    jsd_status rc = own_begin(s, "releasing leases");
    if (rc != JSD_OK)
        return rc;
    range rg;
    sqlite3_stmt *row = stmt(s, S_RELEASE_LEASE), *in_range = stmt(s, S_RELEASE_RANGE);
    if (!row || !in_range)
        return own_end(s, s->err.status, "releasing leases");
    if ((rc = range_get(s, token, &rg)) != JSD_OK)
        return own_end(s, rc, "releasing leases");
    size_t k = 0, rk = 0;
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        for (int v = range_has(&rg, ids[i]) ? 0 : 1; v < 2; v++) {
            sqlite3_stmt *st = v == 0 ? in_range : row;
            sqlite3_bind_int64(st, 1, ids[i]);
            bind_text(st, 2, token);
            int x = sqlite3_step(st);
            done(st);
            if (x != SQLITE_DONE) {
                rc = sq_fail(s, x, "releasing leases");
                break;
            }
            if (sqlite3_changes(SQ(s)->db) > 0) {
                k++;
                rk += v == 0;
                if (v == 0)
                    rc = range_released(s, token, ids[i]);
                break;
            }
        }
    }
    if (rc == JSD_OK)
        rc = range_settle(s, token, rk);
    rc = own_end(s, rc, "releasing leases");
    *released = rc == JSD_OK ? k : 0;
    return rc;
}

/* A requeued dead letter is a ready row again when it is an unordered one
 * due at insert: the floor comes down to it. */
static jsd_status sq_requeue(jsd_store *s, const int64_t *ids, size_t n, int64_t now,
                             size_t *requeued)
{
    const char *what = "requeueing dead letters";
    jsd_status rc = own_begin(s, what);
    if (rc != JSD_OK)
        return rc;
    sqlite3_stmt *st = stmt(s, S_REQUEUE);
    if (!st)
        return own_end(s, s->err.status, what);
    size_t k = 0;
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        sqlite3_bind_int64(st, 1, ids[i]);
        sqlite3_bind_int64(st, 2, now);
        int x = sqlite3_step(st);
        done(st);
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, what);
        else if (sqlite3_changes(SQ(s)->db) > 0) {
            k++;
            rc = floor_lower(s, ids[i]);
        }
    }
    rc = own_end(s, rc, what);
    *requeued = rc == JSD_OK ? k : 0;
    return rc;
}

/* The ready rows' part: the first one from the floor that no run covers and
 * no range holds (what a range holds is in S_NEXT_DUE's lease expiry). */
static jsd_status next_due_ready(jsd_store *s, bool *found, int64_t *next)
{
    span ls[LIVE_MAX];
    size_t nl = 0;
    int64_t f = 0, id = -1;
    jsd_status rc = floor_and_leases(s, &f, ls, &nl, NULL);
    if (rc == JSD_OK)
        rc = floor_walk(s, ls, nl, &f, &id);
    if (rc != JSD_OK || id < 0)
        return rc;
    sqlite3_stmt *st = stmt(s, S_ROW_DUE);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, id);
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        int64_t t = sqlite3_column_int64(st, 0);
        *next = *found ? JSD_MIN(*next, t) : t;
        *found = true;
    }
    done(st);
    return x == SQLITE_ROW || x == SQLITE_DONE ? JSD_OK
                                               : sq_fail(s, x, "reading the next due time");
}

static jsd_status sq_next_due(jsd_store *s, bool *found, int64_t *next)
{
    jsd_status rc = exec_sql(s, "BEGIN", "reading the next due time");
    if (rc != JSD_OK)
        return rc;
    sqlite3_stmt *st = stmt(s, S_NEXT_DUE);
    if (!st) {
        rc = s->err.status;
    } else {
        int x = sqlite3_step(st);
        if (x == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            *found = true;
            *next = sqlite3_column_int64(st, 0);
        }
        done(st);
        rc = x == SQLITE_ROW ? JSD_OK : sq_fail(s, x, "reading the next due time");
    }
    if (rc == JSD_OK)
        rc = next_due_ready(s, found, next);
    jsd_error keep = s->err;
    exec_sql(s, "COMMIT", "reading the next due time");
    if (rc != JSD_OK)
        s->err = keep;
    return rc;
}

/* DESIGN (noticing other processes' commits): only PRAGMA data_version tells
 * this connection that another process committed, so a waiting relay reads it
 * every POLL_SLOW_MS; for a second after the last commit it noticed, every
 * POLL_FAST_MS instead (a steady producer in another process is then seen
 * within ~2 ms, an idle relay still wakes only 20 times a second). Commits in
 * this process signal the registry and are seen at once. Either way a wake-up
 * is only a hint to claim. */
#define POLL_FAST_MS   2
#define POLL_SLOW_MS   50
#define POLL_LIVELY_MS 1000

static jsd_status sq_wait(jsd_store *s, int timeout_ms, bool *woken)
{
    sq *q = SQ(s);
    int64_t end = jsd__mono_ms() + timeout_ms;
    for (;;) {
        int64_t poll = jsd__mono_ms() < q->lively_until_ms ? POLL_FAST_MS : POLL_SLOW_MS;
        if (q->wake) {
            pthread_mutex_lock(&wake_mu);
            if (q->wake->counter != q->seen) {
                q->seen = q->wake->counter;
                pthread_mutex_unlock(&wake_mu);
                q->data_version = read_data_version(s);
                *woken = true;
                return JSD_OK;
            }
            int64_t left = end - jsd__mono_ms();
            if (left > 0)
                jsd__cond_wait_ms(&q->wake->cv, &wake_mu, JSD_MIN(left, poll));
            pthread_mutex_unlock(&wake_mu);
        } else {
            jsd__sleep_ms(JSD_MIN(JSD_MAX(end - jsd__mono_ms(), 0), poll));
        }
        int64_t dv = read_data_version(s);
        if (dv != q->data_version) {
            q->data_version = dv;
            q->lively_until_ms = jsd__mono_ms() + POLL_LIVELY_MS;
            *woken = true;
            return JSD_OK;
        }
        if (jsd__mono_ms() >= end)
            return JSD_OK;
    }
}

static jsd_status read_outcome(sqlite3_stmt *st, jsd__inbox_outcome *out)
{
    if (!out)
        return JSD_OK;
    memset(out, 0, sizeof(*out));
    out->code = sqlite3_column_int(st, 0);
    const char *d = col_text(st, 1, NULL);
    jsd__strlcpy(out->detail, d ? d : "", sizeof(out->detail));
    const char *m = col_text(st, 2, NULL);
    jsd__strlcpy(out->msg_id, m ? m : "", sizeof(out->msg_id));
    out->stream_seq = (uint64_t)sqlite3_column_int64(st, 3);
    out->created_at_ms = sqlite3_column_int64(st, 4);
    return JSD_OK;
}

static jsd_status sq_inbox_lookup(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, const char *msg_id, bool *found,
                                  jsd__inbox_outcome *out)
{
    sqlite3_stmt *st = stmt(s, msg_id ? S_INBOX_GET_MSG : S_INBOX_GET);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    if (msg_id)
        bind_text(st, 3, msg_id);
    else
        sqlite3_bind_int64(st, 3, (int64_t)seq);
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        *found = true;
        read_outcome(st, out);
    }
    done(st);
    if (x != SQLITE_ROW && x != SQLITE_DONE)
        return sq_fail(s, x, "inbox lookup");
    return JSD_OK;
}

static jsd_status sq_inbox_insert(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, const char *msg_id, int code, const char *detail,
                                  const jsd__trace *trace, int64_t now)
{
    sqlite3_stmt *st = stmt(s, S_INBOX_INS);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    sqlite3_bind_int64(st, 3, (int64_t)seq);
    bind_text(st, 4, msg_id);
    sqlite3_bind_int(st, 5, code);
    bind_text(st, 6, detail);
    sqlite3_bind_int64(st, 7, now);
    bind_text(st, 8, trace ? trace->parent : NULL);
    bind_text(st, 9, trace ? trace->state : NULL);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "inbox insert");
    return sqlite3_changes(SQ(s)->db) == 0 ? JSD_ERR_EXISTS : JSD_OK;
}

static jsd_status sq_inbox_retire(jsd_store *s, const char *stream, const char *consumer,
                                  uint64_t seq, bool *moved)
{
    sqlite3_stmt *st = stmt(s, S_INBOX_RETIRE);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    sqlite3_bind_int64(st, 3, (int64_t)seq);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "inbox retire");
    *moved = sqlite3_changes(SQ(s)->db) > 0;
    return JSD_OK;
}

/* No round trips to save: per delivery the msg id test (when it has one)
 * and the INSERT, each one execution of a prepared statement. */
static jsd_status sq_inbox_insert_many(jsd_store *s, const char *stream, const char *consumer,
                                       const uint64_t *seqs, const char *const *msg_ids,
                                       const jsd__trace *traces, size_t n, int code, int64_t now,
                                       bool *inserted)
{
    sqlite3_stmt *has = stmt(s, S_INBOX_HAS_MSG);
    sqlite3_stmt *ins = has ? stmt(s, S_INBOX_INS) : NULL;
    if (!ins)
        return s->err.status;
    sqlite3 *db = SQ(s)->db;
    jsd_status rc = JSD_OK;
    bind_text(has, 1, stream);
    bind_text(has, 2, consumer);
    bind_text(ins, 1, stream);
    bind_text(ins, 2, consumer);
    sqlite3_bind_int(ins, 5, code);
    sqlite3_bind_null(ins, 6);
    sqlite3_bind_int64(ins, 7, now);
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        const char *id = msg_ids[i] && *msg_ids[i] ? msg_ids[i] : NULL;
        int x = SQLITE_DONE;
        if (id) {
            bind_text(has, 3, id);
            x = sqlite3_step(has);
            sqlite3_reset(has);
            if (x == SQLITE_ROW)
                continue; /* a re-published duplicate: not inserted */
            if (x != SQLITE_DONE) {
                rc = sq_fail(s, x, "inbox lookup");
                break;
            }
        }
        sqlite3_bind_int64(ins, 3, (int64_t)seqs[i]);
        bind_text(ins, 4, id);
        bind_text(ins, 8, traces ? traces[i].parent : NULL);
        bind_text(ins, 9, traces ? traces[i].state : NULL);
        x = sqlite3_step(ins);
        sqlite3_reset(ins);
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "inbox insert");
        else
            inserted[i] = sqlite3_changes(db) > 0;
    }
    done(has);
    done(ins);
    return rc;
}

static jsd_status sq_poison_insert(jsd_store *s, const jsd__poison *p, int64_t now, bool *inserted)
{
    sqlite3_stmt *st = stmt(s, S_POISON_INS);
    if (!st)
        return s->err.status;
    bind_text(st, 1, p->stream);
    bind_text(st, 2, p->consumer);
    sqlite3_bind_int64(st, 3, (int64_t)p->stream_seq);
    bind_text(st, 4, p->msg_id);
    bind_text(st, 5, p->subject);
    bind_text(st, 6, p->diagnostic);
    bind_blob(st, 7, p->headers, p->headers_len);
    bind_blob(st, 8, p->payload ? p->payload : "", p->len);
    sqlite3_bind_int64(st, 9, now);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "poison insert");
    *inserted = sqlite3_changes(SQ(s)->db) > 0;
    return JSD_OK;
}

static jsd_status sq_poison_mark(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq, const char *dlq_stream, uint64_t dlq_seq)
{
    sqlite3_stmt *st = stmt(s, S_POISON_MARK);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    sqlite3_bind_int64(st, 3, (int64_t)seq);
    bind_text(st, 4, dlq_stream);
    sqlite3_bind_int64(st, 5, (int64_t)dlq_seq);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "marking a poison record published");
    if (sqlite3_changes(SQ(s)->db) == 0)
        return jsd__store_err(s, JSD_ERR_NOT_FOUND, "no poison record for that delivery");
    return JSD_OK;
}

/* ---- replay requests ---- */

static void replay_row(sqlite3_stmt *st, jsd_replay_request *r)
{
    memset(r, 0, sizeof(*r));
    r->id = sqlite3_column_int64(st, 0);
    const char *t = col_text(st, 1, NULL);
    jsd__strlcpy(r->stream, t ? t : "", sizeof(r->stream));
    t = col_text(st, 2, NULL);
    jsd__strlcpy(r->consumer, t ? t : "", sizeof(r->consumer));
    r->stream_seq = (uint64_t)sqlite3_column_int64(st, 3);
    t = col_text(st, 4, NULL);
    jsd__strlcpy(r->dlq_stream, t ? t : "", sizeof(r->dlq_stream));
    r->dlq_seq = (uint64_t)sqlite3_column_int64(st, 5);
    r->state = (jsd_replay_state)sqlite3_column_int(st, 6);
    t = col_text(st, 7, NULL);
    jsd__strlcpy(r->detail, t ? t : "", sizeof(r->detail));
    r->requested_at_ms = sqlite3_column_int64(st, 8);
    r->done_at_ms = sqlite3_column_int64(st, 9);
}

static jsd_status sq_replay_request(jsd_store *s, const jsd_replay_request *r, int64_t now,
                                    jsd_replay_request *out, bool *queued)
{
    sqlite3_stmt *st = stmt(s, S_REPLAY_UPSERT);
    if (!st)
        return s->err.status;
    bind_text(st, 1, r->stream);
    bind_text(st, 2, r->consumer);
    sqlite3_bind_int64(st, 3, (int64_t)r->stream_seq);
    bind_text(st, 4, r->dlq_stream);
    sqlite3_bind_int64(st, 5, (int64_t)r->dlq_seq);
    sqlite3_bind_int64(st, 6, now);
    int x = sqlite3_step(st);
    *queued = x == SQLITE_ROW;
    if (x == SQLITE_ROW)
        x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "recording a replay request");
    if (!(st = stmt(s, S_REPLAY_GET)))
        return s->err.status;
    bind_text(st, 1, r->stream);
    bind_text(st, 2, r->consumer);
    sqlite3_bind_int64(st, 3, (int64_t)r->stream_seq);
    x = sqlite3_step(st);
    if (x == SQLITE_ROW)
        replay_row(st, out);
    done(st);
    if (x != SQLITE_ROW)
        return x == SQLITE_DONE ? jsd__store_err(s, JSD_ERR_INTERNAL, "replay request vanished")
                                : sq_fail(s, x, "reading a replay request");
    return JSD_OK;
}

static jsd_status sq_replay_list(jsd_store *s, const char *stream, const char *consumer,
                                 int64_t after_id, size_t max, jsd_replay_request *out, size_t *n)
{
    sqlite3_stmt *st = stmt(s, stream ? S_REPLAY_PENDING : S_REPLAY_OPEN);
    if (!st)
        return s->err.status;
    int k = 1;
    if (stream) {
        bind_text(st, k++, stream);
        bind_text(st, k++, consumer);
    }
    sqlite3_bind_int64(st, k++, after_id);
    sqlite3_bind_int64(st, k, (int64_t)max);
    int x;
    *n = 0;
    while ((x = sqlite3_step(st)) == SQLITE_ROW && *n < max)
        replay_row(st, &out[(*n)++]);
    done(st);
    if (x != SQLITE_ROW && x != SQLITE_DONE)
        return sq_fail(s, x, "reading replay requests");
    return JSD_OK;
}

static jsd_status sq_replay_finish(jsd_store *s, int64_t id, int state, const char *detail,
                                   int64_t now, bool *finished)
{
    sqlite3_stmt *st = stmt(s, S_REPLAY_FINISH);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, state);
    bind_text(st, 3, detail);
    sqlite3_bind_int64(st, 4, now);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "completing a replay request");
    *finished = sqlite3_changes(SQ(s)->db) > 0;
    return JSD_OK;
}

static jsd_status sq_floor_put(jsd_store *s, const char *stream, const char *consumer,
                               uint64_t floor, int64_t now, bool set)
{
    sqlite3_stmt *st = stmt(s, set ? S_DFLOOR_SET : S_DFLOOR_RAISE);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    sqlite3_bind_int64(st, 3, (int64_t)floor);
    sqlite3_bind_int64(st, 4, now);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "recording a durable's ack floor");
    return JSD_OK;
}

static jsd_status sq_floor_get(jsd_store *s, const char *stream, const char *consumer,
                               uint64_t *floor, int64_t *at)
{
    sqlite3_stmt *st = stmt(s, S_DFLOOR_GET);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        int64_t v = sqlite3_column_int64(st, 0);
        *floor = v > 0 ? (uint64_t)v : 0;
        *at = sqlite3_column_int64(st, 1);
    }
    done(st);
    if (x != SQLITE_ROW && x != SQLITE_DONE)
        return sq_fail(s, x, "reading a durable's recorded ack floor");
    return JSD_OK;
}

static jsd_status sq_inbox_set(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                               int code, const char *detail, bool *changed)
{
    sqlite3_stmt *st = stmt(s, S_INBOX_SET);
    if (!st)
        return s->err.status;
    bind_text(st, 1, stream);
    bind_text(st, 2, consumer);
    sqlite3_bind_int64(st, 3, (int64_t)seq);
    sqlite3_bind_int(st, 4, code);
    bind_text(st, 5, detail);
    int x = sqlite3_step(st);
    done(st);
    if (x != SQLITE_DONE)
        return sq_fail(s, x, "inbox outcome update");
    *changed = sqlite3_changes(SQ(s)->db) > 0;
    return JSD_OK;
}

static void *blob_dup(sqlite3_stmt *st, int i, size_t *len)
{
    const void *b = sqlite3_column_blob(st, i);
    *len = (size_t)sqlite3_column_bytes(st, i);
    if (sqlite3_column_type(st, i) == SQLITE_NULL)
        return NULL;
    return jsd__memdup(b ? b : "", *len ? *len : 1);
}

static jsd_status sq_poison_read(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq, int64_t after_id, size_t max,
                                 jsd__poison_record **out, size_t *n)
{
    /* seq 0 (never a stream sequence): the unpublished records of (stream, consumer). */
    sqlite3_stmt *st = stmt(s, !stream ? S_POISON_LIST : seq ? S_POISON_GET : S_POISON_UNPUB);
    if (!st)
        return s->err.status;
    if (stream && !seq) {
        bind_text(st, 1, stream);
        bind_text(st, 2, consumer);
        sqlite3_bind_int64(st, 3, after_id);
        sqlite3_bind_int64(st, 4, (int64_t)max);
    } else if (stream) {
        bind_text(st, 1, stream);
        bind_text(st, 2, consumer);
        sqlite3_bind_int64(st, 3, (int64_t)seq);
    } else {
        sqlite3_bind_int64(st, 1, after_id);
        sqlite3_bind_int64(st, 2, (int64_t)max);
    }
    jsd__poison_record *recs = NULL;
    size_t k = 0, cap = 0;
    jsd_status rc = JSD_OK;
    int x;
    while ((x = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            size_t nc = cap ? cap * 2 : 8;
            jsd__poison_record *nr = jsd__realloc(recs, nc * sizeof(*nr));
            if (!nr) {
                rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading poison records");
                break;
            }
            recs = nr;
            cap = nc;
        }
        jsd__poison_record *r = &recs[k++];
        memset(r, 0, sizeof(*r));
        r->id = sqlite3_column_int64(st, 0);
        r->stream = col_dup(st, 1);
        r->consumer = col_dup(st, 2);
        r->stream_seq = (uint64_t)sqlite3_column_int64(st, 3);
        r->msg_id = col_dup(st, 4);
        if (!r->msg_id)
            r->msg_id = jsd__strdup("");
        r->subject = col_dup(st, 5);
        r->diagnostic = col_dup(st, 6);
        r->headers = blob_dup(st, 7, &r->headers_len);
        r->payload = blob_dup(st, 8, &r->len);
        r->created_at_ms = sqlite3_column_int64(st, 9);
        r->dlq_stream = col_dup(st, 10);
        r->dlq_seq = (uint64_t)sqlite3_column_int64(st, 11);
        if (!r->stream || !r->consumer || !r->msg_id || !r->subject || !r->diagnostic) {
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading poison records");
            break;
        }
    }
    if (rc == JSD_OK && x != SQLITE_DONE)
        rc = sq_fail(s, x, "reading poison records");
    done(st);
    if (rc != JSD_OK) {
        jsd__poison_records_free(recs, k);
        return rc;
    }
    *out = recs;
    *n = k;
    return JSD_OK;
}

static jsd_status tool_prepare(jsd_store *s, const char *sql, sqlite3_stmt **st);

/* Runs published before cutoff go with their rows, oldest first, at most
 * batch rows in all: a run cut short keeps its later rows (lo moves up). */
static jsd_status gc_runs(jsd_store *s, int64_t cutoff, int batch, int64_t *k)
{
    static const char *const sql[] = {
        "SELECT lo, hi FROM jsd_outbox_runs WHERE published_at < ?1 ORDER BY published_at "
        "LIMIT ?2",
        "DELETE FROM jsd_outbox WHERE id BETWEEN ?1 AND ?2 AND " READY,
        "DELETE FROM jsd_outbox_runs WHERE lo = ?1 AND hi <= ?2",
        "UPDATE jsd_outbox_runs SET seq = seq + (?2 + 1 - lo), lo = ?2 + 1 WHERE lo = ?1 "
        "AND hi > ?2"};
    sqlite3_stmt *st[4] = {NULL};
    jsd_status rc = JSD_OK;
    for (int i = 0; i < 4 && rc == JSD_OK; i++)
        rc = tool_prepare(s, sql[i], &st[i]);
    span runs[64];
    size_t nr = 0;
    if (rc == JSD_OK) {
        sqlite3_bind_int64(st[0], 1, cutoff);
        sqlite3_bind_int(st[0], 2, (int)JSD_MIN(64, batch));
        int x;
        while ((x = sqlite3_step(st[0])) == SQLITE_ROW && nr < 64)
            runs[nr++] = (span){sqlite3_column_int64(st[0], 0), sqlite3_column_int64(st[0], 1), -1};
        if (x != SQLITE_DONE && x != SQLITE_ROW)
            rc = sq_fail(s, x, "retention");
    }
    for (size_t i = 0; i < nr && rc == JSD_OK && *k < batch; i++) {
        int64_t to = JSD_MIN(runs[i].hi, runs[i].lo + (batch - *k) - 1);
        sqlite3_bind_int64(st[1], 1, runs[i].lo);
        sqlite3_bind_int64(st[1], 2, to);
        int x = sqlite3_step(st[1]);
        sqlite3_reset(st[1]);
        if (x == SQLITE_DONE)
            *k += to - runs[i].lo + 1; /* the run's ids, rows deleted by hand too */
        for (int j = 2; j < 4 && x == SQLITE_DONE; j++) {
            sqlite3_bind_int64(st[j], 1, runs[i].lo);
            sqlite3_bind_int64(st[j], 2, to);
            x = sqlite3_step(st[j]);
            sqlite3_reset(st[j]);
        }
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "retention");
    }
    for (int i = 0; i < 4; i++)
        sqlite3_finalize(st[i]);
    return rc;
}

static jsd_status sq_gc_step(jsd_store *s, int64_t cutoff, int batch, bool inbox, int64_t *removed)
{
    jsd_status rc = own_begin(s, "retention");
    if (rc != JSD_OK)
        return rc;
    int64_t k = 0, runs = 0;
    rc = gc_runs(s, cutoff, batch, &runs);
    /* at most batch effects (runs first, then receipts in rows) and batch
     * inbox rows */
    int ids[2] = {S_GC_OUT, S_GC_IN};
    int limit[2] = {batch - (int)runs, inbox ? batch : 0};
    k = runs;
    for (int i = 0; i < 2 && rc == JSD_OK; i++) {
        if (limit[i] <= 0)
            continue;
        sqlite3_stmt *st = stmt(s, ids[i]);
        if (!st) {
            rc = s->err.status;
            break;
        }
        sqlite3_bind_int64(st, 1, cutoff);
        sqlite3_bind_int(st, 2, limit[i]);
        int x = sqlite3_step(st);
        done(st);
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "retention");
        else
            k += sqlite3_changes(SQ(s)->db);
    }
    rc = own_end(s, rc, "retention");
    *removed = rc == JSD_OK ? k : 0;
    return rc;
}

static jsd_status sq_inbox_aged(jsd_store *s, int64_t cutoff, jsd_inbox_aged **out, size_t *n)
{
    sqlite3_stmt *st = stmt(s, S_INBOX_AGED);
    if (!st)
        return s->err.status;
    sqlite3_bind_int64(st, 1, cutoff);
    jsd_inbox_aged *a = NULL;
    size_t k = 0, cap = 0;
    jsd_status rc = JSD_OK;
    int x;
    while ((x = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            size_t ncap = cap ? 2 * cap : 8;
            jsd_inbox_aged *na = jsd__realloc(a, ncap * sizeof(*a));
            if (!na) {
                rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading inbox durables");
                break;
            }
            a = na;
            cap = ncap;
        }
        a[k] = (jsd_inbox_aged){.stream = col_dup(st, 0),
                                .durable = col_dup(st, 1),
                                .rows = sqlite3_column_int64(st, 2)};
        k++;
        if (!a[k - 1].stream || !a[k - 1].durable) {
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading inbox durables");
            break;
        }
    }
    done(st);
    if (rc == JSD_OK && x != SQLITE_DONE)
        rc = sq_fail(s, x, "reading inbox durables");
    if (rc != JSD_OK) {
        jsd_inbox_aged_free(a, k);
        return rc;
    }
    *out = a;
    *n = k;
    return JSD_OK;
}

static jsd_status sq_inbox_high(jsd_store *s, const char *stream, const char *consumer,
                                uint64_t *seq)
{
    sqlite3_stmt *st = stmt(s, S_INBOX_HIGH);
    if (!st)
        return s->err.status;
    sqlite3_bind_text(st, 1, stream, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, consumer, -1, SQLITE_STATIC);
    int x = sqlite3_step(st);
    int64_t v = x == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    done(st);
    if (x != SQLITE_ROW)
        return sq_fail(s, x, "reading the inbox high-water mark");
    *seq = v > 0 ? (uint64_t)v : 0;
    return JSD_OK;
}

static jsd_status sq_gc_inbox(jsd_store *s, const char *stream, const char *consumer,
                              int64_t cutoff, int64_t max_seq, int batch, int64_t *removed)
{
    jsd_status rc = own_begin(s, "retention");
    if (rc != JSD_OK)
        return rc;
    int64_t k = 0;
    sqlite3_stmt *st = stmt(s, S_GC_IN_DURABLE);
    if (!st) {
        rc = s->err.status;
    } else {
        bind_text(st, 1, stream);
        bind_text(st, 2, consumer);
        sqlite3_bind_int64(st, 3, max_seq);
        sqlite3_bind_int64(st, 4, cutoff);
        sqlite3_bind_int(st, 5, batch);
        int x = sqlite3_step(st);
        done(st);
        if (x != SQLITE_DONE)
            rc = sq_fail(s, x, "retention");
        else
            k = sqlite3_changes(SQ(s)->db);
    }
    rc = own_end(s, rc, "retention");
    *removed = rc == JSD_OK ? k : 0;
    return rc;
}

static jsd_status count1(jsd_store *s, int id, int64_t *out)
{
    sqlite3_stmt *st = stmt(s, id);
    if (!st)
        return s->err.status;
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    done(st);
    return x == SQLITE_ROW ? JSD_OK : sq_fail(s, x, "reading store counts");
}

/* The ready rows' part of the backlog: those from the lowest of the floor
 * and the ranges held, less the runs recorded there (below it all are
 * covered). *oldest: the earliest not_before of a due one, approximately
 * (rows of runs above that point count in it). */
static jsd_status stats_ready(jsd_store *s, int64_t now, jsd_store_stats *o, int64_t *oldest)
{
    span ls[LIVE_MAX];
    size_t nl = 0;
    int64_t from = 0;
    jsd_status rc = floor_and_leases(s, &from, ls, &nl, NULL);
    if (rc != JSD_OK)
        return rc;
    for (size_t i = 0; i < nl; i++)
        from = JSD_MIN(from, ls[i].lo);
    sqlite3_stmt *st = stmt(s, S_STATS_READY), *ru = stmt(s, S_STATS_RUNS_FROM);
    if (!st || !ru)
        return s->err.status;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, from);
    int x = sqlite3_step(st);
    int64_t n = 0, d = 0, covered = 0, m = INT64_MAX;
    if (x == SQLITE_ROW) {
        n = sqlite3_column_int64(st, 0);
        d = sqlite3_column_int64(st, 1);
        if (sqlite3_column_type(st, 2) != SQLITE_NULL)
            m = sqlite3_column_int64(st, 2);
    }
    done(st);
    if (x != SQLITE_ROW)
        return sq_fail(s, x, "reading store counts");
    sqlite3_bind_int64(ru, 1, from);
    x = sqlite3_step(ru);
    if (x == SQLITE_ROW)
        covered = sqlite3_column_int64(ru, 0);
    done(ru);
    if (x != SQLITE_ROW)
        return sq_fail(s, x, "reading store counts");
    o->backlog += JSD_MAX(0, n - covered);
    o->due += JSD_MAX(0, d - covered);
    if (d > covered)
        *oldest = JSD_MIN(*oldest, m);
    return JSD_OK;
}

static jsd_status sq_stats(jsd_store *s, int64_t now, bool backlog_only, jsd_store_stats *o)
{
    /* One read transaction, so the counts agree with each other. */
    jsd_status rc = exec_sql(s, "BEGIN", "reading store counts");
    if (rc != JSD_OK)
        return rc;
    sqlite3_stmt *st = stmt(s, S_STATS_PENDING);
    if (!st) {
        rc = s->err.status;
        goto out;
    }
    sqlite3_bind_int64(st, 1, now);
    int x = sqlite3_step(st);
    int64_t oldest = INT64_MAX;
    if (x == SQLITE_ROW) {
        o->backlog = sqlite3_column_int64(st, 0);
        o->due = sqlite3_column_int64(st, 1);
        if (sqlite3_column_type(st, 2) != SQLITE_NULL)
            oldest = sqlite3_column_int64(st, 2);
    }
    done(st);
    if (x != SQLITE_ROW) {
        rc = sq_fail(s, x, "reading store counts");
        goto out;
    }
    if ((rc = stats_ready(s, now, o, &oldest)) != JSD_OK)
        goto out;
    if (oldest != INT64_MAX)
        o->oldest_due_age_ms = JSD_MAX(0, now - oldest);
    if (backlog_only)
        goto out;
    if ((rc = count1(s, S_STATS_DEAD, &o->dead_lettered)) != JSD_OK ||
        (rc = count1(s, S_STATS_PUBLISHED, &o->published)) != JSD_OK ||
        (rc = count1(s, S_STATS_INBOX, &o->inbox_rows)) != JSD_OK ||
        (rc = count1(s, S_STATS_POISON, &o->poison_records)) != JSD_OK ||
        (rc = count1(s, S_STATS_POISON_UNPUB, &o->poison_unpublished)) != JSD_OK)
        goto out;
    if ((st = stmt(s, S_STATS_REPLAY)) == NULL) {
        rc = s->err.status;
        goto out;
    }
    x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        o->replay_pending = sqlite3_column_int64(st, 0);
        o->replay_failed = sqlite3_column_int64(st, 1);
    }
    done(st);
    if (x != SQLITE_ROW)
        rc = sq_fail(s, x, "reading store counts");
out:;
    jsd_error keep = s->err;
    exec_sql(s, "COMMIT", "reading store counts");
    if (rc != JSD_OK)
        s->err = keep;
    return rc;
}

/* ---- the outbox tools (jsdurable outbox, verify) -------------------------------------
 * Kept apart from the relay's statements: prepared per call (a tool runs a
 * few of them, not thousands a second) and never in the hot path. */

#define TOOL_COLS                                                                                  \
    "id, owner, effect_id, msg_id, subject, order_key, attempts, created_at, not_before, "         \
    "next_attempt_at, last_error, dead_lettered_at, dead_reason, stream, stream_seq, duplicate, "  \
    "published_at, lease_token, lease_expires, length(payload), "                                  \
    "(SELECT max(l.expires) FROM jsd_outbox_lease l WHERE o.id BETWEEN l.lo AND l.hi)"

/* The ids of the first ?3 unpublished rows after ?1 (of subject ?2 when
 * given): pending ones, or with the dead letters too (dead). Each kind is
 * read through its own index: ready rows from the floor up, and below it
 * those in a range lease (live, or expired and not yet taken over) that no
 * run covers. Through jsd_outbox_state the first pending row of an outbox
 * that keeps millions of published ones came after resolving the run of
 * each of them (1.7 s with 3M kept, on every relay start: the doctor's
 * pending subjects). The planner is told the way: left to choose, it read
 * the rows in id order for the keyed and dead ones (0.7 s) and built an
 * automatic index over the outbox to join the range leases (3.3 s). */
/* clang-format off */
#define PAGE_TAIL " AND id > ?1 AND (?2 IS NULL OR subject = ?2) ORDER BY id LIMIT ?3"
#define DEAD_IDS \
    "SELECT id FROM jsd_outbox INDEXED BY jsd_outbox_dead WHERE dead_lettered_at IS NOT NULL"
#define UNPUBLISHED_IDS(dead) \
    "SELECT id FROM (SELECT id FROM (SELECT id FROM jsd_outbox WHERE " READY " AND id >= " \
    "(SELECT floor FROM jsd_outbox_floor) AND " UNCOVERED PAGE_TAIL ") " \
    "UNION ALL SELECT id FROM (SELECT DISTINCT jsd_outbox.id AS id FROM jsd_outbox_lease l " \
    "CROSS JOIN jsd_outbox NOT INDEXED WHERE jsd_outbox.id BETWEEN l.lo AND l.hi " \
    "AND jsd_outbox.id < (SELECT floor FROM jsd_outbox_floor) AND " READY " AND " UNCOVERED \
    PAGE_TAIL ") UNION ALL SELECT id FROM (SELECT id FROM jsd_outbox WHERE " REST PAGE_TAIL \
    ") UNION ALL SELECT id FROM (SELECT id FROM jsd_outbox INDEXED BY jsd_outbox_keyed " \
    "WHERE order_key IS NOT NULL AND " PENDING PAGE_TAIL ")" dead ") ORDER BY id LIMIT ?3"
#define DEAD_UNPUBLISHED \
    " UNION ALL SELECT id FROM (" DEAD_IDS " AND published_at IS NULL" PAGE_TAIL ")"
/* clang-format on */

static jsd_status tool_prepare(jsd_store *s, const char *sql, sqlite3_stmt **st)
{
    int rc = sqlite3_prepare_v2(SQ(s)->db, sql, -1, st, NULL);
    return rc == SQLITE_OK ? JSD_OK : sq_fail(s, rc, "preparing an outbox tool query");
}

static void tool_text(sqlite3_stmt *st, int i, char *out, size_t cap)
{
    const char *t = col_text(st, i, NULL);
    jsd__strlcpy(out, t ? t : "", cap);
}

static void tool_row(sqlite3_stmt *st, int64_t now, jsd_outbox_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->row_id = sqlite3_column_int64(st, 0);
    tool_text(st, 1, e->owner, sizeof(e->owner));
    tool_text(st, 2, e->effect_id, sizeof(e->effect_id));
    tool_text(st, 3, e->msg_id, sizeof(e->msg_id));
    tool_text(st, 4, e->subject, sizeof(e->subject));
    tool_text(st, 5, e->order_key, sizeof(e->order_key));
    e->attempts = sqlite3_column_int(st, 6);
    e->created_at_ms = sqlite3_column_int64(st, 7);
    e->not_before_ms = sqlite3_column_int64(st, 8);
    e->next_attempt_at_ms = sqlite3_column_int64(st, 9);
    tool_text(st, 10, e->last_error, sizeof(e->last_error));
    e->dead_lettered_at_ms = sqlite3_column_int64(st, 11);
    tool_text(st, 12, e->dead_reason, sizeof(e->dead_reason));
    tool_text(st, 13, e->stream, sizeof(e->stream));
    e->stream_seq = (uint64_t)sqlite3_column_int64(st, 14);
    e->duplicate = sqlite3_column_int(st, 15) != 0;
    e->published_at_ms = sqlite3_column_int64(st, 16);
    bool published = sqlite3_column_type(st, 16) != SQLITE_NULL;
    bool dead = sqlite3_column_type(st, 11) != SQLITE_NULL;
    e->state = published ? JSD_OUTBOX_PUBLISHED : dead ? JSD_OUTBOX_DEAD : JSD_OUTBOX_PENDING;
    e->payload_len = (size_t)sqlite3_column_int64(st, 19);
    if (e->state != JSD_OUTBOX_PENDING)
        return;
    /* a row lease, or (unordered, no row lease) the range lease covering it */
    if (sqlite3_column_type(st, 17) != SQLITE_NULL)
        e->lease_expires_ms = sqlite3_column_int64(st, 18);
    else if (sqlite3_column_type(st, 18) == SQLITE_NULL &&
             sqlite3_column_type(st, 5) == SQLITE_NULL)
        e->lease_expires_ms = sqlite3_column_int64(st, 20);
    e->leased = e->lease_expires_ms > now;
    if (!e->leased)
        e->lease_expires_ms = 0;
}

static jsd_status sq_tool_list(jsd_store *s, const jsd_outbox_query *q, int64_t now,
                               jsd_outbox_entry *out, size_t *n)
{
    char sql[4096];
    if (q->state != JSD_OUTBOX_PUBLISHED)
        jsd__snprintf(sql, sizeof(sql),
                      "SELECT " TOOL_COLS " FROM jsd_outbox_state o WHERE id IN (%s) ORDER BY id",
                      q->state == JSD_OUTBOX_PENDING ? UNPUBLISHED_IDS("")
                      : q->state == JSD_OUTBOX_DEAD  ? DEAD_IDS PAGE_TAIL
                                                     : UNPUBLISHED_IDS(DEAD_UNPUBLISHED));
    else
        jsd__snprintf(sql, sizeof(sql), "%s",
                      "SELECT " TOOL_COLS " FROM jsd_outbox_state o WHERE id > ?1 AND (?2 IS NULL "
                      "OR subject = ?2) AND published_at IS NOT NULL AND published_at >= ?4 "
                      "ORDER BY id LIMIT ?3");
    sqlite3_stmt *st = NULL;
    jsd_status rc = tool_prepare(s, sql, &st);
    if (rc != JSD_OK)
        return rc;
    sqlite3_bind_int64(st, 1, q->after_row_id);
    bind_text(st, 2, q->subject);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)q->limit);
    if (q->state == JSD_OUTBOX_PUBLISHED)
        sqlite3_bind_int64(st, 4, q->published_since_ms);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW && *n < q->limit)
        tool_row(st, now, &out[(*n)++]);
    if (r != SQLITE_ROW && r != SQLITE_DONE)
        rc = sq_fail(s, r, "listing the outbox");
    sqlite3_finalize(st);
    return rc;
}

static jsd_status sq_tool_get(jsd_store *s, const char *owner, const char *effect_id, int64_t now,
                              jsd_outbox_entry *out, bool *found)
{
    sqlite3_stmt *st = NULL;
    jsd_status rc = tool_prepare(
        s, "SELECT " TOOL_COLS " FROM jsd_outbox_state o WHERE owner = ?1 AND effect_id = ?2", &st);
    if (rc != JSD_OK)
        return rc;
    bind_text(st, 1, owner);
    bind_text(st, 2, effect_id);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        tool_row(st, now, out);
        *found = true;
    } else if (r != SQLITE_DONE) {
        rc = sq_fail(s, r, "reading an outbox effect");
    }
    sqlite3_finalize(st);
    return rc;
}

static jsd_status sq_tool_reasons(jsd_store *s, jsd_outbox_reason *out, size_t cap, size_t *n)
{
    sqlite3_stmt *st = NULL;
    jsd_status rc = tool_prepare(s,
                                 "SELECT substr(coalesce(dead_reason, ''), 1, 200) AS r, count(*) "
                                 "FROM jsd_outbox WHERE dead_lettered_at IS NOT NULL GROUP BY r "
                                 "ORDER BY count(*) DESC, r LIMIT ?1",
                                 &st);
    if (rc != JSD_OK)
        return rc;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)cap);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW && *n < cap) {
        tool_text(st, 0, out[*n].reason, sizeof(out[*n].reason));
        out[*n].count = sqlite3_column_int64(st, 1);
        (*n)++;
    }
    if (r != SQLITE_ROW && r != SQLITE_DONE)
        rc = sq_fail(s, r, "counting dead-letter reasons");
    sqlite3_finalize(st);
    return rc;
}

/* An effect whose receipt is in a run: the run is split around it, and the
 * row is pending again as the row statement leaves one (maybe published,
 * a first attempt), so the floor comes down to it. */
static jsd_status unpublish_run(jsd_store *s, const jsd__unpublish *u, int64_t now, size_t *done)
{
    static const char *const sql[] = {
        "SELECT lo, hi, seq, duplicate, published_at FROM jsd_outbox_runs WHERE lo = "
        "(SELECT max(lo) FROM jsd_outbox_runs WHERE lo <= ?1) AND hi >= ?1 AND stream = ?2 "
        "AND seq + (?1 - lo) = ?3",
        "DELETE FROM jsd_outbox_runs WHERE lo = ?1",
        "INSERT INTO jsd_outbox_runs (lo, hi, stream, seq, duplicate, published_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        "UPDATE jsd_outbox SET duplicate = 1, attempts = 0, last_error = ?2, next_attempt_at = ?3, "
        "lease_token = NULL, lease_expires = NULL WHERE id = ?1"};
    sqlite3_stmt *st[4] = {NULL};
    jsd_status rc = JSD_OK;
    for (int i = 0; i < 4 && rc == JSD_OK; i++)
        rc = tool_prepare(s, sql[i], &st[i]);
    int64_t lo = 0, hi = 0, seq = 0, dup = 0, at = 0, id = u->row_id;
    int x = SQLITE_DONE;
    if (rc == JSD_OK) {
        sqlite3_bind_int64(st[0], 1, id);
        bind_text(st[0], 2, u->stream);
        sqlite3_bind_int64(st[0], 3, (sqlite3_int64)u->seq);
        x = sqlite3_step(st[0]);
        if (x == SQLITE_ROW) {
            lo = sqlite3_column_int64(st[0], 0);
            hi = sqlite3_column_int64(st[0], 1);
            seq = sqlite3_column_int64(st[0], 2);
            dup = sqlite3_column_int64(st[0], 3);
            at = sqlite3_column_int64(st[0], 4);
        }
    }
    if (rc == JSD_OK && x == SQLITE_ROW) {
        sqlite3_bind_int64(st[1], 1, lo);
        x = sqlite3_step(st[1]);
        int64_t part[2][3] = {{lo, id - 1, seq}, {id + 1, hi, seq + (id + 1 - lo)}};
        for (int p = 0; p < 2 && x == SQLITE_DONE; p++) {
            if (part[p][1] < part[p][0])
                continue;
            sqlite3_bind_int64(st[2], 1, part[p][0]);
            sqlite3_bind_int64(st[2], 2, part[p][1]);
            bind_text(st[2], 3, u->stream);
            sqlite3_bind_int64(st[2], 4, part[p][2]);
            sqlite3_bind_int64(st[2], 5, dup);
            sqlite3_bind_int64(st[2], 6, at);
            x = sqlite3_step(st[2]);
            sqlite3_reset(st[2]);
        }
        if (x == SQLITE_DONE) {
            sqlite3_bind_int64(st[3], 1, id);
            bind_text(st[3], 2, u->why);
            sqlite3_bind_int64(st[3], 3, now);
            x = sqlite3_step(st[3]);
        }
        if (x == SQLITE_DONE && (rc = floor_lower(s, id)) == JSD_OK)
            (*done)++;
    }
    if (rc == JSD_OK && x != SQLITE_DONE)
        rc = sq_fail(s, x, "republishing a lost effect");
    for (int i = 0; i < 4; i++)
        sqlite3_finalize(st[i]);
    return rc;
}

static jsd_status sq_tool_unpublish(jsd_store *s, const jsd__unpublish *u, size_t n, int64_t now,
                                    size_t *done)
{
    sqlite3_stmt *st = NULL;
    jsd_status rc = tool_prepare(
        s,
        "UPDATE jsd_outbox SET stream = NULL, stream_seq = NULL, published_at = NULL, "
        "duplicate = 1, attempts = 0, last_error = ?4, next_attempt_at = ?5, "
        "lease_token = NULL, lease_expires = NULL, dead_lettered_at = NULL, dead_reason = NULL "
        "WHERE id = ?1 AND stream = ?2 AND stream_seq = ?3 AND published_at IS NOT NULL",
        &st);
    if (rc != JSD_OK)
        return rc;
    if ((rc = own_begin(s, "republishing lost effects")) != JSD_OK) {
        sqlite3_finalize(st);
        return rc;
    }
    for (size_t i = 0; i < n && rc == JSD_OK; i++) {
        sqlite3_bind_int64(st, 1, u[i].row_id);
        bind_text(st, 2, u[i].stream);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)u[i].seq);
        bind_text(st, 4, u[i].why);
        sqlite3_bind_int64(st, 5, now);
        /* A receipt in the row (a retry's, a keyed head's, or a first
         * attempt's that no run took) is cleared here; one in a run is
         * taken out of it (unpublish_run). Either way the effect is a first
         * attempt again (attempts 0), an unordered one a ready row, which
         * claims seek only from the settled floor up, and the floor may be
         * far above it: so the floor comes down to it in both cases (issue
         * 42: lowered after a run only, effects with their receipt in the
         * row were taken back and never published again). For a keyed row
         * or a timer, which claims find by other means, that costs one walk
         * of the floor back up. The row's write and the floor's are in this
         * one transaction: no commit leaves a ready row below the floor. */
        int r = sqlite3_step(st);
        if (r != SQLITE_DONE)
            rc = sq_fail(s, r, "republishing a lost effect");
        else if (sqlite3_changes(SQ(s)->db) == 0)
            rc = unpublish_run(s, &u[i], now, done);
        else if ((rc = floor_lower(s, u[i].row_id)) == JSD_OK)
            (*done)++;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    rc = own_end(s, rc, "republishing lost effects");
    if (rc != JSD_OK)
        *done = 0;
    return rc;
}

static const jsd__store_ops sqlite_ops = {
    .close = sq_close,
    .tx = sq_tx,
    .emit = sq_emit,
    .claim = sq_claim,
    .receipts = sq_receipts,
    .sync_receipts = sq_sync_receipts,
    .failures_read = sq_failures_read,
    .failures_write = sq_failures_write,
    .release = sq_release,
    .requeue = sq_requeue,
    .trouble = sq_trouble,
    .next_due = sq_next_due,
    .wait = sq_wait,
    .inbox_lookup = sq_inbox_lookup,
    .inbox_insert = sq_inbox_insert,
    .inbox_insert_many = sq_inbox_insert_many,
    .inbox_retire = sq_inbox_retire,
    .poison_insert = sq_poison_insert,
    .poison_mark = sq_poison_mark,
    .replay_request = sq_replay_request,
    .replay_list = sq_replay_list,
    .replay_finish = sq_replay_finish,
    .floor_put = sq_floor_put,
    .floor_get = sq_floor_get,
    .inbox_set = sq_inbox_set,
    .poison_read = sq_poison_read,
    .gc_step = sq_gc_step,
    .inbox_aged = sq_inbox_aged,
    .inbox_high = sq_inbox_high,
    .gc_inbox = sq_gc_inbox,
    .stats = sq_stats,
    /* the outbox tools */
    .tool_list = sq_tool_list,
    .tool_get = sq_tool_get,
    .tool_reasons = sq_tool_reasons,
    .tool_unpublish = sq_tool_unpublish,
};

/* ---- open and migrate -------------------------------------------------------------- */

static jsd_status migrate(jsd_store *s)
{
    jsd_status rc = exec_sql(s, "BEGIN IMMEDIATE", "opening the store (migration)");
    if (rc != JSD_OK)
        return rc;
    rc = exec_sql(s, VERSION_TABLE[0], "creating jsd_schema_version");
    int64_t cur = 0;
    if (rc == JSD_OK) {
        sqlite3_stmt *st = NULL;
        int x = sqlite3_prepare_v2(
            SQ(s)->db, "SELECT coalesce(max(version), 0) FROM jsd_schema_version", -1, &st, NULL);
        if (x == SQLITE_OK && (x = sqlite3_step(st)) == SQLITE_ROW)
            cur = sqlite3_column_int64(st, 0);
        else
            rc = sq_fail(s, x, "reading the schema version");
        sqlite3_finalize(st);
    }
    if (rc == JSD_OK && cur > JSD__SCHEMA_VERSION)
        rc = jsd__store_err(s, JSD_ERR_SCHEMA,
                            "store \"%s\" has schema version %lld, newer than this jsdurable "
                            "knows (%d): upgrade jsdurable, or open an older copy of the store",
                            s->url_safe, (long long)cur, JSD__SCHEMA_VERSION);
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
            rc = exec_sql(s, *q, "applying a schema migration");
        if (rc == JSD_OK && v == 2) {
            char id[33], ins[160];
            if ((rc = jsd__store_new_id(s, id)) == JSD_OK) {
                jsd__snprintf(ins, sizeof(ins),
                              "INSERT INTO jsd_meta (key, value) VALUES ('" JSD__META_STORE_ID
                              "', '%s')",
                              id);
                rc = exec_sql(s, ins, "recording the store id");
            }
        }
        if (rc == JSD_OK) {
            char ins[128];
            jsd__snprintf(
                ins, sizeof(ins),
                "INSERT INTO jsd_schema_version (version, applied_at) VALUES (%lld, %lld)",
                (long long)v, (long long)jsd__now_ms());
            rc = exec_sql(s, ins, "recording the schema version");
        }
    }
    if (rc == JSD_OK) {
        sqlite3_stmt *st = NULL;
        int x = sqlite3_prepare_v2(
            SQ(s)->db, "SELECT value FROM jsd_meta WHERE key = '" JSD__META_STORE_ID "'", -1, &st,
            NULL);
        if (x == SQLITE_OK && (x = sqlite3_step(st)) == SQLITE_ROW) {
            const char *id = (const char *)sqlite3_column_text(st, 0);
            s->meta_id_found = id != NULL;
            jsd__strlcpy(s->meta_id, id ? id : "", sizeof(s->meta_id));
        } else if (x == SQLITE_DONE)
            s->meta_id_found = false;
        else
            rc = sq_fail(s, x, "reading the store id");
        sqlite3_finalize(st);
    }
    if (rc == JSD_OK && s->ns[0]) {
        /* the first operator namespace becomes that of rows written without
         * a msg_id (validated: [A-Za-z0-9._-] only) */
        char ins[192];
        jsd__snprintf(ins, sizeof(ins),
                      "INSERT INTO jsd_meta (key, value) VALUES ('" JSD__META_NAMESPACE
                      "', '%s') ON CONFLICT (key) DO NOTHING",
                      s->ns);
        rc = exec_sql(s, ins, "recording the namespace");
    }
    if (rc == JSD_OK)
        return exec_sql(s, "COMMIT", "committing the schema migration");
    jsd_error keep = s->err;
    if (!sqlite3_get_autocommit(SQ(s)->db))
        sqlite3_exec(SQ(s)->db, "ROLLBACK", NULL, NULL, NULL);
    s->err = keep;
    return rc;
}

/* A connection that cannot open the turn file works as before the turn
 * across processes, without its fairness: said once per file and process,
 * at warn, since every later connection would say the same. */
static void xturn_warn_once(jsd_store *s)
{
    sq *q = SQ(s);
    if (q->xturn.fd >= 0 || q->xturn.open_errno == 0 || !q->wake)
        return;
    pthread_mutex_lock(&wake_mu);
    bool first = !q->wake->xturn_warned;
    q->wake->xturn_warned = true;
    pthread_mutex_unlock(&wake_mu);
    if (first)
        JSD_WARN("store",
                 "store \"%s\": its turn file (the database's name + \"-jsdturn\") cannot be "
                 "opened (%s); its write transactions do not take turns with other processes' "
                 "and may wait longer for SQLite's lock",
                 s->url_safe, strerror(q->xturn.open_errno));
}

jsd_status jsd__sqlite_open(jsd_store *s, const char *path, jsd_error *err)
{
    jsd_status rc;
    sq *q = jsd__calloc(1, sizeof(*q));
    if (!q)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory opening the store");
    q->wal_fd = -1;
    q->xturn.fd = -1;
    s->be = q;
    s->ops = &sqlite_ops;
    s->backend = JSD_STORE_SQLITE;
    int x = sqlite3_open_v2(path, &q->db,
                            SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (x != SQLITE_OK) {
        rc = sq_fail(s, x, "opening the SQLite file");
        goto fail;
    }
    sqlite3_extended_result_codes(q->db, 1);
    q->busy_timeout_ms = s->busy_timeout_ms;
    if (q->busy_timeout_ms > 0)
        sqlite3_busy_handler(q->db, sq_busy, q);
    if (sqlite3_db_readonly(q->db, "main") == 1) {
        rc = jsd__store_err(s, JSD_ERR_READONLY,
                            "store \"%s\" can only be opened read-only (file, folder or mount "
                            "not writable): jsdurable must write it",
                            s->url_safe);
        s->err.sqlite_code = SQLITE_READONLY;
        goto fail;
    }
    /* A new database gets 8 KiB pages (it is a no-op on one that exists:
     * its page size is fixed once written). The relay's receipts rewrite
     * the rows of a batch, and every page they touch is one WAL frame,
     * written with its own system calls; with rows of a 256-byte payload a
     * batch of 256 fills ~36 pages of 4 KiB. Alternating bench_relay runs
     * (issue 12), 4 / 8 / 16 KiB: 65.9 / 70.7 / 69.5k msg/s and 9.8 / 9.1 /
     * 8.9 µs CPU per effect (medians of 5), relay.latency p99 at 1k
     * commits/s 1.7-3.2 / 2.0-3.2 / 2.2-3.6 ms (a small commit writes
     * whole pages), ingress within the noise. 8 KiB takes most of the gain
     * and none of the latency. */
    if ((rc = exec_sql(s, "PRAGMA page_size=8192", "setting the page size")) != JSD_OK)
        goto fail;
    /* journal_mode answers with the mode in force. */
    sqlite3_stmt *st = NULL;
    x = sqlite3_prepare_v2(q->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (x == SQLITE_OK)
        x = sqlite3_step(st);
    if (x != SQLITE_ROW) {
        sqlite3_finalize(st);
        rc = sq_fail(s, x, "switching the store to WAL");
        goto fail;
    }
    bool wal = sqlite3_strnicmp((const char *)sqlite3_column_text(st, 0), "wal", 3) == 0;
    sqlite3_finalize(st);
    if (!wal && strcmp(path, ":memory:") != 0) {
        rc = jsd__store_err(s, JSD_ERR_STORE,
                            "store \"%s\" cannot use WAL journaling (a network or read-only file "
                            "system?): jsdurable needs WAL",
                            s->url_safe);
        goto fail;
    }
    if ((rc = exec_sql(s, "PRAGMA synchronous=FULL", "setting synchronous=FULL")) != JSD_OK ||
        (rc = exec_sql(s, "PRAGMA foreign_keys=ON", "enabling foreign keys")) != JSD_OK ||
        (rc = migrate(s)) != JSD_OK)
        goto fail;
    const char *fn = sqlite3_db_filename(q->db, "main");
    if (fn && *fn) {
        const char *walf = sqlite3_filename_wal(fn);
        if (walf && *walf && !(q->wal_path = jsd__strdup(walf))) {
            rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory opening the store");
            goto fail;
        }
    }
    jsd__xturn_open(&q->xturn, fn);
    q->wake = wake_get(fn && *fn ? fn : path);
    xturn_warn_once(s);
    if (q->wake) {
        pthread_mutex_lock(&wake_mu);
        q->seen = q->wake->counter;
        pthread_mutex_unlock(&wake_mu);
    }
    q->data_version = read_data_version(s);
    return JSD_OK;
fail:
    jsd__err_copy(err, &s->err);
    sq_close(s);
    return rc;
}

struct sqlite3 *jsd__sqlite_handle(jsd_store *s)
{
    sq *q = sqlite_of(s);
    return q ? q->db : NULL;
}
