/*
 * jsdurable migrate — create a store's tables, or bring them up to the schema
 * version this jsdurable knows, and say which version the store is at: the
 * step a deployment runs before the application and the relay start, so
 * that an application in another language can write the outbox (the SQL
 * contract, docs/SQL-CONTRACT.md) before any jsdurable process has opened
 * the store. Opening a store migrates it (jsd_store_open); this command does
 * only that, and reports.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: jsdurable migrate --store URL [--json]\n\n"
        "Create the store's tables, or upgrade them to schema version %d, in one\n"
        "transaction, and print the version. A store already at it is left as it is.\n\n"
        "  --store URL   sqlite:PATH, a file path, or postgres://...[?schema=NAME] ($JSD_STORE);\n"
        "                with ?namespace=NAME the store records NAME as the namespace of\n"
        "                rows written without a msg id (docs/SQL-CONTRACT.md), if none is yet\n"
        "  --json        one JSON object: store, backend, from, version, namespace, store_id\n\n"
        "Exit codes: 0 done; 73 store cannot be opened; 74 read-only or full;\n"
        "78 schema newer than this jsdurable (nothing changed).\n\n"
        "Example:\n"
        "  jsdurable migrate --store postgres://app@db/app?schema=outbox\n",
        JSD_STORE_SCHEMA_VERSION);
}

int cmd_migrate(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    bool as_json = false;
    int opt;
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'h':
            usage(stdout);
            return CLI_OK;
        default:
            usage(stderr);
            return CLI_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("migrate", "unexpected argument \"%s\"", argv[optind]);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("migrate", "--store URL (or $JSD_STORE) is required");
        return CLI_USAGE;
    }
    jsd_store *s = NULL;
    int rc = cli_store_open("migrate", url, &s);
    if (rc != 0)
        return rc;
    int from = jsd_store_schema_found(s);
    const char *backend = jsd_store_backend_of(s) == JSD_STORE_POSTGRES ? "postgres" : "sqlite";
    if (as_json) {
        json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:s, s:s}", "store", jsd_store_url(s),
                              "backend", backend, "from", from, "version", JSD_STORE_SCHEMA_VERSION,
                              "namespace", jsd_store_namespace(s), "store_id", jsd_store_id(s));
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!text) {
            jsd_store_close(s);
            cli_err("migrate", "out of memory");
            return CLI_SOFTWARE;
        }
        printf("%s\n", text);
        free(text);
    } else if (from == 0) {
        printf("created schema version %d in %s\n", JSD_STORE_SCHEMA_VERSION, jsd_store_url(s));
    } else if (from < JSD_STORE_SCHEMA_VERSION) {
        printf("upgraded %s from schema version %d to %d\n", jsd_store_url(s), from,
               JSD_STORE_SCHEMA_VERSION);
    } else {
        printf("%s is at schema version %d; nothing to do\n", jsd_store_url(s),
               JSD_STORE_SCHEMA_VERSION);
    }
    jsd_store_close(s);
    return CLI_OK;
}
