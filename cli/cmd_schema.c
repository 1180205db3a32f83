/*
 * jsdurable schema — print the store's full DDL (tables, indexes,
 * constraints, triggers, functions, version rows) for SQLite or PostgreSQL,
 * for a DBA to review or to apply with their own migration tool instead of
 * letting jsdurable create the tables. The text comes from the library
 * (jsd_store_schema_write), from the same migration lists it applies itself.
 */
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable schema --print [--backend sqlite|postgres] [--schema NAME]\n\n"
            "Print the DDL of schema version %d as one script, the statements jsdurable runs\n"
            "when it creates a store. Applied to an empty database (sqlite3 FILE < s.sql,\n"
            "psql -v ON_ERROR_STOP=1 -f s.sql), it makes a store jsdurable opens as it is.\n\n"
            "  --print           print the DDL (the only action)\n"
            "  --backend NAME    sqlite (default) or postgres\n"
            "  --schema NAME     PostgreSQL schema for the tables (default public)\n\n"
            "Example:\n"
            "  jsdurable schema --print --backend postgres --schema outbox > outbox.sql\n",
            JSD_STORE_SCHEMA_VERSION);
}

int cmd_schema(int argc, char **argv)
{
    static const struct option longopts[] = {{"print", no_argument, NULL, 'p'},
                                             {"backend", required_argument, NULL, 'b'},
                                             {"schema", required_argument, NULL, 's'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    bool print = false;
    jsd_store_backend backend = JSD_STORE_SQLITE;
    const char *schema = NULL;
    int opt;
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 'p':
            print = true;
            break;
        case 'b':
            if (!strcmp(optarg, "sqlite"))
                backend = JSD_STORE_SQLITE;
            else if (!strcmp(optarg, "postgres") || !strcmp(optarg, "postgresql"))
                backend = JSD_STORE_POSTGRES;
            else {
                cli_err("schema", "--backend takes sqlite or postgres, not \"%s\"", optarg);
                return CLI_USAGE;
            }
            break;
        case 's':
            schema = optarg;
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
        cli_err("schema", "unexpected argument \"%s\"", argv[optind]);
        return CLI_USAGE;
    }
    if (!print) {
        cli_err("schema", "say what to do: --print");
        return CLI_USAGE;
    }
    if (schema && backend != JSD_STORE_POSTGRES) {
        cli_err("schema", "--schema names a PostgreSQL schema: add --backend postgres");
        return CLI_USAGE;
    }
    jsd_error err;
    jsd_status st = jsd_store_schema_write(stdout, backend, schema, &err);
    if (st != JSD_OK) {
        cli_err("schema", "%s", err.msg);
        return st == JSD_ERR_INVALID ? CLI_USAGE : cli_exit_for(st);
    }
    return CLI_OK;
}
