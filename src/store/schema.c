/*
 * The schema as one DDL script (jsd_store_schema_write, `jsdurable schema
 * --print`): the statements of every migration of a back end, in order, each
 * followed by the row that records its version, printed from the same lists
 * the back end applies when it opens a store (sqlite.c, postgres.c), so a
 * script a DBA applies with their own tool and a store the library migrated
 * cannot differ. The one step a migration takes in C, drawing the store id
 * (migration 2), is written here as the database's own random draw.
 */
#include <errno.h>
#include <string.h>

#include "store/front.h"

/* 32 random lower-case hex digits drawn by the database. */
#define SQLITE_NEW_ID "lower(hex(randomblob(16)))"
#define PG_NEW_ID     "replace(gen_random_uuid()::text, '-', '')"

/* One statement, "@" replaced by prefix, then ";". */
static void put_stmt(FILE *f, const char *sql, const char *prefix)
{
    for (const char *p = sql; *p; p++) {
        if (*p == '@')
            fputs(prefix, f);
        else
            fputc(*p, f);
    }
    fputs(";\n", f);
}

jsd_status jsd_store_schema_write(FILE *f, jsd_store_backend backend, const char *pg_schema,
                                  jsd_error *err)
{
    jsd_error_clear(err);
    if (!f)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_store_schema_write: no file");
    bool pg = backend == JSD_STORE_POSTGRES;
    if (!pg && backend != JSD_STORE_SQLITE)
        return jsd__err(err, JSD_ERR_INVALID, "unknown store backend %d", (int)backend);
    const char *schema = pg_schema && *pg_schema ? pg_schema : "public";
    if (pg && !jsd__pg_schema_name_valid(schema))
        return jsd__err(err, JSD_ERR_INVALID,
                        "PostgreSQL schema name \"%.64s\" is not valid: use 1..63 of "
                        "[A-Za-z0-9_], not starting with a digit",
                        schema);
    char prefix[72] = "";
    if (pg)
        jsd__snprintf(prefix, sizeof(prefix), "\"%s\".", schema);
    const char *const *(*migration)(int) = pg ? jsd__pg_migration : jsd__sqlite_migration;
    const char *now = pg ? JSD__PG_NOW_MS : JSD__SQLITE_NOW_MS;
    errno = 0;
    fprintf(f,
            "-- jsdurable schema version %d for %s (docs/SQL-CONTRACT.md), the statements\n"
            "-- the library applies when it opens a new store. Apply it to an empty %s\n"
            "-- in one transaction; jsdurable then opens the store without migrating.\n",
            JSD_STORE_SCHEMA_VERSION, pg ? "PostgreSQL" : "SQLite", pg ? "schema" : "database");
    fputs(pg ? "BEGIN;\n" : "BEGIN IMMEDIATE;\n", f);
    if (pg)
        fprintf(f, "CREATE SCHEMA IF NOT EXISTS \"%s\";\n", schema);
    for (const char *const *q = migration(0); *q; q++)
        put_stmt(f, *q, prefix);
    for (int v = 1; v <= JSD_STORE_SCHEMA_VERSION; v++) {
        const char *const *m = migration(v);
        if (!m)
            return jsd__err(err, JSD_ERR_INTERNAL, "schema version %d has no migration", v);
        fprintf(f, "\n-- version %d\n", v);
        for (const char *const *q = m; *q; q++)
            put_stmt(f, *q, prefix);
        if (v == 2)
            fprintf(f,
                    "INSERT INTO %sjsd_meta (key, value) VALUES ('" JSD__META_STORE_ID "', %s);\n",
                    prefix, pg ? PG_NEW_ID : SQLITE_NEW_ID);
        fprintf(f, "INSERT INTO %sjsd_schema_version (version, applied_at) VALUES (%d, %s);\n",
                prefix, v, now);
    }
    fputs("COMMIT;\n", f);
    if (fflush(f) != 0 || ferror(f))
        return jsd__err(err, JSD_ERR_IO, "writing the schema: %s", strerror(errno ? errno : EIO));
    return JSD_OK;
}
