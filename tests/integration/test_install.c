/*
 * An installed copy, used the way an application outside the tree uses it:
 * `make install PREFIX=<tmp>`, then a small program built with nothing but
 * `cc app.c $(pkg-config --cflags --libs jsdurable)` (PKG_CONFIG_PATH pointing
 * at the prefix) links the installed shared library, runs with
 * LD_LIBRARY_PATH, opens a SQLite store, commits a row of its own through
 * jsd_tx_sqlite() together with one effect, and prints jsd_version(). The
 * checks: the .pc names the prefix given, the program really links
 * libjsdurable.so.0, the store holds the row and the effect, an internal
 * jsd__ symbol cannot be linked against, and the man pages are installed for
 * jsdurable and every command.
 */
#include <stdlib.h>

#include "fixture.h"
#include "test.h"

static char out[65536];

static void run_ok(const char *cmd)
{
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("`%s` exited %d:\n%s", cmd, rc, out);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* The README's library example, made whole: the application's own SQL on the
 * transaction's SQLite handle, an effect, the commit. */
static const char app_src[] =
    "#include <jsdurable.h>\n"
    "#include <sqlite3.h>\n"
    "#include <stdio.h>\n"
    "int main(int argc, char **argv)\n"
    "{\n"
    "    jsd_store *store;\n"
    "    jsd_error err;\n"
    "    jsd_tx *tx;\n"
    "    if (argc != 2 || jsd_store_open(&store, argv[1], &err) != JSD_OK)\n"
    "        return 2;\n"
    "    if (jsd_tx_begin(&tx, store) != JSD_OK)\n"
    "        return 3;\n"
    "    if (sqlite3_exec(jsd_tx_sqlite(tx), \"CREATE TABLE orders(id INTEGER);\"\n"
    "                     \"INSERT INTO orders VALUES (42)\", NULL, NULL, NULL) != SQLITE_OK)\n"
    "        return 4;\n"
    "    static const char body[] = \"{\\\"order_id\\\":42}\";\n"
    "    if (jsd_tx_emit(tx, &(jsd_effect){.owner = \"order-42\", .id = \"created\",\n"
    "                                      .subject = \"orders.created\", .payload = body,\n"
    "                                      .len = sizeof(body) - 1}) != JSD_OK)\n"
    "        return 5;\n"
    "    if (jsd_tx_commit(tx) != JSD_OK)\n"
    "        return 6;\n"
    "    jsd_store_close(store);\n"
    "    printf(\"jsdurable %s\\n\", jsd_version());\n"
    "    return 0;\n"
    "}\n";

/* Calls an internal function: must not link against the installed library. */
static const char internal_src[] =
    "#include <stddef.h>\n"
    "void jsd__wipe(void *p, size_t n);\n"
    "int main(void) { char b[4]; jsd__wipe(b, sizeof(b)); return 0; }\n";

static void install_and_link(void **state)
{
    (void)state;
    const char *top = getenv("JSD_TOP") ? getenv("JSD_TOP") : ".";
    const char *build = getenv("JSD_BUILD") ? getenv("JSD_BUILD") : "build";
    const char *dir = jsd_test_dir();
    char prefix[1024], app[1200], cmd[8192], pcenv[2400];
    snprintf(prefix, sizeof(prefix), "%s/prefix", dir);

    /* Nothing to rebuild (the runner's build is current): this installs. */
    snprintf(cmd, sizeof(cmd), "make --no-print-directory -C '%s' BUILD='%s' PREFIX='%s' install",
             top, build, prefix);
    run_ok(cmd);

    snprintf(pcenv, sizeof(pcenv), "PKG_CONFIG_PATH='%s/lib/pkgconfig'", prefix);
    snprintf(cmd, sizeof(cmd), "%s pkg-config --variable=prefix jsdurable", pcenv);
    run_ok(cmd);
    out[strcspn(out, "\n")] = '\0';
    ASSERT_STREQ(out, prefix);
    snprintf(cmd, sizeof(cmd), "%s pkg-config --cflags --libs jsdurable", pcenv);
    run_ok(cmd);
    ASSERT_CONTAINS(out, "-ljsdurable");
    ASSERT_CONTAINS(out, "-lsqlite3"); /* Requires: the API hands out sqlite3 and PGconn */
    ASSERT_CONTAINS(out, "-lpq");

    /* Outside the tree: only the installed header, library and .pc. */
    snprintf(app, sizeof(app), "%s/app.c", dir);
    write_file(app, app_src);
    /* A sanitized build (make check-asan / check-tsan) installs a library
     * that needs its sanitizer's runtime: the application links it too. */
    const char *app_cflags = getenv("JSD_APP_CFLAGS") ? getenv("JSD_APP_CFLAGS") : "";
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && %s sh -c 'cc -std=c11 -Wall -Werror %s -o app app.c "
             "$(pkg-config --cflags --libs jsdurable)'",
             dir, pcenv, app_cflags);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "readelf -d '%s/app'", dir);
    run_ok(cmd);
    ASSERT_CONTAINS(out, "[libjsdurable.so.0]");
    snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH='%s/lib' ldd '%s/app'", prefix, dir);
    run_ok(cmd);
    char want[1200];
    snprintf(want, sizeof(want), "libjsdurable.so.0 => %s/lib/libjsdurable.so.0", prefix);
    ASSERT_CONTAINS(out, want);

    snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH='%s/lib' '%s/app' 'sqlite:%s/app.db'", prefix, dir,
             dir);
    run_ok(cmd);
    ASSERT_STREQ(out, "jsdurable " JSD_VERSION "\n");
    snprintf(cmd, sizeof(cmd),
             "sqlite3 '%s/app.db' 'SELECT count(*) FROM orders; SELECT owner || \"/\" || "
             "effect_id || \" \" || subject FROM jsd_outbox_state'",
             dir);
    run_ok(cmd);
    ASSERT_STREQ(out, "1\norder-42/created orders.created\n");

    /* Internals stay internal: the shared library does not export them. */
    snprintf(cmd, sizeof(cmd), "%s/internal.c", dir);
    write_file(cmd, internal_src);
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && %s sh -c 'cc %s -o internal internal.c "
             "$(pkg-config --cflags --libs jsdurable)'",
             dir, pcenv, app_cflags);
    ASSERT_NE(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "jsd__wipe");

    /* A man page for the tool and one for every command its --help lists. */
    snprintf(cmd, sizeof(cmd), "MANPATH='%s/share/man' man -w jsdurable", prefix);
    run_ok(cmd);
    snprintf(want, sizeof(want), "%s/share/man/man1/jsdurable.1", prefix);
    ASSERT_CONTAINS(out, want);
    snprintf(cmd, sizeof(cmd), "'%s/bin/jsdurable' --help", prefix);
    run_ok(cmd);
    char help[sizeof(out)];
    memcpy(help, out, sizeof(out));
    int pages = 0;
    for (char *l = strstr(help, "\nCommands:\n"); l && (l = strchr(l + 1, '\n')) && l[1] == ' ';) {
        char name[64];
        if (sscanf(l + 1, " %63s", name) != 1)
            break;
        snprintf(cmd, sizeof(cmd), "MANPATH='%s/share/man' man -w jsdurable-%s", prefix, name);
        run_ok(cmd);
        snprintf(cmd, sizeof(cmd), "MANPATH='%s/share/man' MANWIDTH=200 man jsdurable-%s", prefix,
                 name);
        run_ok(cmd);
        snprintf(want, sizeof(want), "jsdurable %s", name); /* its usage line */
        ASSERT_CONTAINS(out, want);
        pages++;
    }
    ASSERT_TRUE(pages >= 10);
}

JSD_TEST_MAIN(cmocka_unit_test(install_and_link))
