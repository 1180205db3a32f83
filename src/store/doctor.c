/*
 * store/doctor — the store's part of the doctor (src/doctor.c): its
 * durability settings as the handle opened it, its schema version against
 * this library's, and the subjects of its pending effects (which streams a
 * relay is about to publish to).
 *
 * PostgreSQL: fsync, synchronous_commit and full_page_writes (SHOW, on the
 * handle's own connection, so a per-role or per-database setting counts),
 * and the settled floor of schema 9: the outbox identity's cache and the
 * effects stranded below the floor (read by postgres.c, which holds the
 * floor's SQL).
 * SQLite: journal_mode and synchronous as the handle runs them, the file
 * system under the database file where statfs can tell (a network or FUSE
 * file system breaks SQLite's locking and WAL; tmpfs does not survive a
 * reboot), and whether the handle takes part in the writer turn across
 * processes (its turn file, src/store/xturn.c). These are read-only queries
 * on the native handle outside any transaction, made here beside the back
 * ends because the back ends' operation table (backend.h) has no use for
 * them.
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>

#include "doctor_int.h"
#include "store/backend.h"

/* statfs f_type magic numbers (linux/magic.h and the file systems' sources). */
#define FS_NFS   0x6969
#define FS_SMB   0x517B
#define FS_CIFS  0xFF534D42u
#define FS_SMB2  0xFE534D42u
#define FS_FUSE  0x65735546
#define FS_CEPH  0x00C36400
#define FS_AFS   0x5346414F
#define FS_V9FS  0x01021997
#define FS_TMPFS 0x01021994

size_t jsd__doctor_store_payload_max(const jsd_store *store)
{
    return store && store->payload_max ? store->payload_max : JSD_PAYLOAD_DEFAULT_CAP;
}

static void add(jsd_doctor_report *rep, jsd_store *s, const char *check, jsd_doctor_level l,
                const char *fix, const char *fmt, ...) JSD_PRINTF(6, 7);
static void add(jsd_doctor_report *rep, jsd_store *s, const char *check, jsd_doctor_level l,
                const char *fix, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    jsd__doctor_add(rep, check, JSD_DOCTOR_STORE, jsd_store_url(s), l, msg, fix);
}

static void schema_result(jsd_doctor_report *rep, jsd_store *s, bool read, long long v,
                          const char *why)
{
    if (!read)
        add(rep, s, "store.schema", JSD_DOCTOR_UNKNOWN, "check the store",
            "the schema version could not be read: %s", why);
    else if (v > JSD__SCHEMA_VERSION)
        add(rep, s, "store.schema", JSD_DOCTOR_ERROR, "upgrade jsdurable to the store's version",
            "the store's schema is version %lld, newer than this binary's %d", v,
            JSD__SCHEMA_VERSION);
    else if (v < JSD__SCHEMA_VERSION)
        add(rep, s, "store.schema", JSD_DOCTOR_WARN,
            "run migrate (open the store once with this "
            "jsdurable)",
            "the store's schema is version %lld, older than this binary's %d", v,
            JSD__SCHEMA_VERSION);
    else
        add(rep, s, "store.schema", JSD_DOCTOR_OK, "", "schema version %lld, as this binary", v);
}

/* ---- SQLite -------------------------------------------------------------------------- */

static bool sq_text(sqlite3 *db, const char *sql, char *out, size_t cap)
{
    sqlite3_stmt *st = NULL;
    bool ok = false;
    out[0] = '\0';
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        jsd__strlcpy(out, t ? (const char *)t : "", cap);
        ok = true;
    }
    sqlite3_finalize(st);
    return ok;
}

static void sqlite_fs(jsd_doctor_report *rep, jsd_store *s, sqlite3 *db)
{
    const char *path = sqlite3_db_filename(db, "main");
    struct statfs sf;
    if (!path || !*path) {
        add(rep, s, "store.filesystem", JSD_DOCTOR_ERROR, "give the store a file path",
            "the SQLite database is in memory: nothing survives the process");
        return;
    }
    if (statfs(path, &sf) != 0) {
        add(rep, s, "store.filesystem", JSD_DOCTOR_UNKNOWN, "", "statfs(%s) failed", path);
        return;
    }
    unsigned long t = (unsigned long)sf.f_type;
    const char *net = t == FS_NFS                                   ? "NFS"
                      : t == FS_SMB || t == FS_CIFS || t == FS_SMB2 ? "SMB/CIFS"
                      : t == FS_CEPH                                ? "CephFS"
                      : t == FS_AFS                                 ? "AFS"
                      : t == FS_V9FS                                ? "9p"
                                                                    : NULL;
    if (net)
        add(rep, s, "store.filesystem", JSD_DOCTOR_ERROR,
            "put the database on a local disk, or use PostgreSQL",
            "the SQLite database %s is on a network file system (%s): its locks and the WAL's "
            "shared memory do not work there, so commits can be lost or the file corrupted",
            path, net);
    else if (t == FS_FUSE)
        add(rep, s, "store.filesystem", JSD_DOCTOR_WARN,
            "put the database on a local disk unless this FUSE file system is local and honours "
            "fsync and locks",
            "the SQLite database %s is on a FUSE file system: whether fsync and locks hold "
            "cannot be told",
            path);
    else if (t == FS_TMPFS)
        add(rep, s, "store.filesystem", JSD_DOCTOR_WARN, "put the database on a disk",
            "the SQLite database %s is on tmpfs: it does not survive a reboot", path);
    else
        add(rep, s, "store.filesystem", JSD_DOCTOR_OK, "",
            "the SQLite database %s is on a local file system", path);
}

/* The writer turn across processes (src/store/xturn.c): the turn file
 * beside the database, opened by this handle or not. Not taking part loses
 * only fairness, never a commit: a warning. */
static void sqlite_turn(jsd_doctor_report *rep, jsd_store *s, sqlite3 *db)
{
    const char *path = sqlite3_db_filename(db, "main");
    int why = 0;
    if (!path || !*path)
        return; /* in memory: store.filesystem says so */
    if (jsd__sqlite_xturn_part(s, &why))
        add(rep, s, "store.turn_file", JSD_DOCTOR_OK, "",
            "write transactions of different processes take turns through %s-jsdturn", path);
    else
        add(rep, s, "store.turn_file", JSD_DOCTOR_WARN,
            "make the turn file a regular file beside the database that the store's user can "
            "create and write",
            "the turn file %s-jsdturn cannot be opened (%s): write transactions of different "
            "processes on this database do not take turns, so an application that commits back "
            "to back can hold the relay's claims back for tens of milliseconds",
            path, why ? strerror(why) : "unknown reason");
}

static void check_sqlite(jsd_doctor_report *rep, jsd_store *s)
{
    sqlite3 *db = jsd__sqlite_handle(s);
    char v[64];
    if (!sq_text(db, "PRAGMA journal_mode", v, sizeof(v)))
        add(rep, s, "store.journal_mode", JSD_DOCTOR_UNKNOWN, "", "PRAGMA journal_mode failed");
    else if (!strcmp(v, "wal"))
        add(rep, s, "store.journal_mode", JSD_DOCTOR_OK, "", "journal_mode is WAL");
    else if (!strcmp(v, "off") || !strcmp(v, "memory"))
        add(rep, s, "store.journal_mode", JSD_DOCTOR_ERROR,
            "put the database where WAL works (a local disk)",
            "journal_mode is %s: a crash during a commit corrupts the database", v);
    else
        add(rep, s, "store.journal_mode", JSD_DOCTOR_WARN,
            "put the database where WAL works (a local disk)",
            "journal_mode is %s, not WAL (the file system refused it?): commits stay durable but "
            "writers block readers",
            v);
    if (!sq_text(db, "PRAGMA synchronous", v, sizeof(v)))
        add(rep, s, "store.synchronous", JSD_DOCTOR_UNKNOWN, "", "PRAGMA synchronous failed");
    else if (!strcmp(v, "2") || !strcmp(v, "3"))
        add(rep, s, "store.synchronous", JSD_DOCTOR_OK, "", "synchronous is %s",
            v[0] == '2' ? "FULL" : "EXTRA");
    else
        add(rep, s, "store.synchronous", JSD_DOCTOR_ERROR,
            "open the store with synchronous=FULL (jsdurable's default)",
            "synchronous is %s: commits made before a power failure can be lost after their "
            "messages were ACKed",
            v[0] == '0' ? "OFF" : "NORMAL");
    sqlite_fs(rep, s, db);
    sqlite_turn(rep, s, db);
    char sv[32];
    bool ok =
        sq_text(db, "SELECT coalesce(max(version), 0) FROM jsd_schema_version", sv, sizeof(sv));
    int64_t ver = 0;
    ok = ok && jsd__parse_i64(sv, 0, INT64_MAX, &ver);
    schema_result(rep, s, ok, (long long)ver, sqlite3_errmsg(db));
}

/* ---- PostgreSQL ---------------------------------------------------------------------- */

/* One text value of a query with up to one parameter into out; false with why. */
static bool pg_text(PGconn *c, const char *sql, const char *param, char *out, size_t cap, char *why,
                    size_t wcap)
{
    const char *params[1] = {param};
    PGresult *r = PQexecParams(c, sql, param ? 1 : 0, NULL, param ? params : NULL, NULL, NULL, 0);
    bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) >= 1;
    out[0] = '\0';
    if (ok)
        jsd__strlcpy(out, PQgetvalue(r, 0, 0), cap);
    else
        jsd__snprintf(why, wcap, "%s",
                      PQntuples(r) == 0 && PQresultStatus(r) == PGRES_TUPLES_OK
                          ? "no row"
                          : PQerrorMessage(c));
    PQclear(r);
    return ok;
}

/* The schema holding this store's tables: the one whose jsd_meta has this
 * handle's store id (the URL's schema parameter is not kept by the front). */
static bool pg_schema_of(PGconn *c, jsd_store *s, char *out, size_t cap)
{
    PGresult *r = PQexec(c, "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                            "c.relnamespace WHERE c.relname = 'jsd_meta' AND c.relkind = 'r'");
    bool found = false;
    for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r) && !found; i++) {
        char *ident = PQescapeIdentifier(c, PQgetvalue(r, i, 0), strlen(PQgetvalue(r, i, 0)));
        char q[400], v[80], why[200];
        if (!ident)
            continue;
        jsd__snprintf(q, sizeof(q), "SELECT value FROM %s.jsd_meta WHERE key = $1", ident);
        PQfreemem(ident);
        if (pg_text(c, q, JSD__META_STORE_ID, v, sizeof(v), why, sizeof(why)) &&
            !strcmp(v, jsd_store_id(s))) {
            jsd__strlcpy(out, PQgetvalue(r, i, 0), cap);
            found = true;
        }
    }
    PQclear(r);
    return found;
}

/* The settled floor (schema 9; src/store/postgres.c): the outbox's ids in
 * the order they were drawn, and no unpublished first attempt below it. */
static void check_pg_floor(jsd_doctor_report *rep, jsd_store *s, const char *schema)
{
    jsd__pg_floor_state st;
    if (jsd__pg_floor_check(s, &st) != JSD_OK) {
        add(rep, s, "store.outbox_floor", JSD_DOCTOR_UNKNOWN, "check the store",
            "the outbox floor could not be read: %s", jsd_store_errmsg(s));
        return;
    }
    if (st.id_cache > 1)
        add(rep, s, "store.outbox_ids", JSD_DOCTOR_ERROR,
            "ALTER TABLE jsd_outbox ALTER COLUMN id SET CACHE 1 (in the store's schema)",
            "the outbox's id sequence hands each session %lld ids at a time: sessions then "
            "commit ids out of the order they drew them in, and an effect can land below the "
            "relay's settled floor and never be published (docs/SQL-CONTRACT.md)",
            (long long)st.id_cache);
    else if (st.id_cache < 0)
        add(rep, s, "store.outbox_ids", JSD_DOCTOR_UNKNOWN, "check the store",
            "the outbox's id column has no identity sequence");
    else
        add(rep, s, "store.outbox_ids", JSD_DOCTOR_OK, "",
            "the outbox's ids are drawn one at a time (sequence cache 1)");
    if (st.stranded > 0) {
        char fix[400];
        jsd__snprintf(fix, sizeof(fix),
                      "let the relay find them: UPDATE jsd_outbox_floor SET floor = least(floor, "
                      "%lld), gen = gen + 1 (in schema \"%s\")",
                      (long long)st.first_stranded, schema);
        add(rep, s, "store.outbox_floor", JSD_DOCTOR_WARN, fix,
            "%lld unpublished effect(s) below the outbox's settled floor (id %lld) have no "
            "receipt, and no relay claims them: the first is id %lld (an id drawn outside "
            "the outbox's identity, or out of order)",
            (long long)st.stranded, (long long)st.floor, (long long)st.first_stranded);
    } else
        add(rep, s, "store.outbox_floor", JSD_DOCTOR_OK, "",
            "every effect below the settled floor (id %lld) has its receipt", (long long)st.floor);
}

static void check_pg(jsd_doctor_report *rep, jsd_store *s)
{
    PGconn *c = jsd__pg_handle(s);
    char v[64], why[300];
    if (!pg_text(c, "SHOW fsync", NULL, v, sizeof(v), why, sizeof(why)))
        add(rep, s, "store.fsync", JSD_DOCTOR_UNKNOWN, "", "SHOW fsync failed: %s", why);
    else if (strcmp(v, "on") != 0)
        add(rep, s, "store.fsync", JSD_DOCTOR_ERROR, "set fsync = on in postgresql.conf",
            "fsync is %s: a power failure or OS crash can lose committed transactions and "
            "corrupt the database",
            v);
    else
        add(rep, s, "store.fsync", JSD_DOCTOR_OK, "", "fsync is on");
    if (!pg_text(c, "SHOW synchronous_commit", NULL, v, sizeof(v), why, sizeof(why)))
        add(rep, s, "store.synchronous_commit", JSD_DOCTOR_UNKNOWN, "",
            "SHOW synchronous_commit failed: %s", why);
    else if (!strcmp(v, "off"))
        add(rep, s, "store.synchronous_commit", JSD_DOCTOR_ERROR,
            "set synchronous_commit = on (for the server, or ALTER ROLE/DATABASE ... SET)",
            "synchronous_commit is off: a crash can lose the last commits after the consumer "
            "ACKed their messages (applied, acknowledged, then gone)");
    else
        add(rep, s, "store.synchronous_commit", JSD_DOCTOR_OK, "", "synchronous_commit is %s", v);
    if (!pg_text(c, "SHOW full_page_writes", NULL, v, sizeof(v), why, sizeof(why)))
        add(rep, s, "store.full_page_writes", JSD_DOCTOR_UNKNOWN, "",
            "SHOW full_page_writes failed: %s", why);
    else if (strcmp(v, "on") != 0)
        add(rep, s, "store.full_page_writes", JSD_DOCTOR_ERROR,
            "set full_page_writes = on (unless the file system never tears pages, e.g. ZFS)",
            "full_page_writes is %s: a page torn by a crash cannot be repaired from the WAL", v);
    else
        add(rep, s, "store.full_page_writes", JSD_DOCTOR_OK, "", "full_page_writes is on");

    char schema[128];
    if (!pg_schema_of(c, s, schema, sizeof(schema))) {
        schema_result(rep, s, false, 0, "no schema holds this store's jsd_meta");
        return;
    }
    char *ident = PQescapeIdentifier(c, schema, strlen(schema));
    char q[400];
    jsd__snprintf(q, sizeof(q), "SELECT coalesce(max(version), 0) FROM %s.jsd_schema_version",
                  ident ? ident : "\"?\"");
    PQfreemem(ident);
    int64_t ver = 0;
    bool ok = pg_text(c, q, NULL, v, sizeof(v), why, sizeof(why)) &&
              jsd__parse_i64(v, 0, INT64_MAX, &ver);
    schema_result(rep, s, ok, (long long)ver, why);
    if (ok && ver >= 9 && ver <= JSD__SCHEMA_VERSION)
        check_pg_floor(rep, s, schema);
}

void jsd__doctor_check_store(jsd_doctor_report *rep, jsd_store *store)
{
    if (store->backend == JSD_STORE_SQLITE)
        check_sqlite(rep, store);
    else
        check_pg(rep, store);
}

/* ---- pending subjects ---------------------------------------------------------------- */

/* Among the oldest pending effects only, so the query stays cheap on a big backlog. */
#define PENDING_SCAN 10000
#define PENDING_PAGE 256 /* effects per jsd_outbox_list call */

static bool listed(char *const *list, size_t n, const char *subject)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], subject))
            return true;
    return false;
}

/* The pending effects come a page at a time from jsd_outbox_list, which
 * reads each kind of pending row through its own index (not the view,
 * which resolves every published row on the way). */
jsd_status jsd__doctor_outbox_subjects(jsd_store *s, size_t max, char ***out, size_t *n,
                                       jsd_error *err)
{
    *out = NULL;
    *n = 0;
    char **list = jsd__calloc(max ? max : 1, sizeof(*list));
    jsd_outbox_entry *page = jsd__calloc(PENDING_PAGE, sizeof(*page));
    if (!list || !page) {
        jsd__free(list);
        jsd__free(page);
        return jsd__err(err, JSD_ERR_NOMEM, "doctor: out of memory");
    }
    jsd_outbox_query q = {.state = JSD_OUTBOX_PENDING};
    size_t got = 0, seen = 0;
    bool full = false;
    jsd_status rc;
    do {
        q.limit = JSD_MIN((size_t)PENDING_PAGE, (size_t)PENDING_SCAN - seen);
        if ((rc = jsd_outbox_list(s, &q, page, &got)) != JSD_OK)
            break;
        for (size_t i = 0; i < got && !full; i++) {
            if (listed(list, *n, page[i].subject))
                continue;
            list[*n] = jsd__strdup(page[i].subject);
            full = !list[*n] || ++*n == max;
        }
        seen += got;
        if (got)
            q.after_row_id = page[got - 1].row_id;
    } while (got == q.limit && seen < PENDING_SCAN && !full);
    jsd__free(page);
    if (rc != JSD_OK) {
        for (size_t i = 0; i < *n; i++)
            jsd__free(list[i]);
        jsd__free(list);
        *n = 0;
        return jsd__err(err, JSD_ERR_STORE, "reading pending subjects: %s", jsd_store_errmsg(s));
    }
    *out = list;
    return JSD_OK;
}
