/*
 * jsdurable gc — retention (STORE-4): remove published outbox effects and
 * inbox rows older than a horizon, in bounded transactions, printing progress.
 *
 * The horizon must not be shorter than the stream's duplicate window: a
 * retired effect republished after its row is gone would not be recognised,
 * and an inbox row removed while the broker may still redeliver would let a
 * delivery apply twice. gc refuses a horizon under --dedup-window (default
 * 2m, JetStream's default) or under --min-horizon (the operator's own floor,
 * e.g. ack_wait x max_deliver + backoff). Dead-lettered effects and poison
 * records are evidence and are never removed.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable gc --store URL --older-than DURATION [--batch N]\n"
            "                    [--dedup-window DURATION] [--min-horizon DURATION]\n\n"
            "Remove published outbox effects and inbox rows older than DURATION, at most\n"
            "N of each per transaction. Durations: 250ms, 30s, 5m, 2h, 7d.\n\n"
            "  --store URL              sqlite:PATH, a file path, or postgres://... ($JSD_STORE)\n"
            "  --older-than DURATION    the horizon (required)\n"
            "  --batch N                rows per transaction, 1..100000 (default 1000)\n"
            "  --dedup-window DURATION  the stream's duplicate window (default 2m); a\n"
            "                           shorter horizon is refused\n"
            "  --min-horizon DURATION   refuse any horizon shorter than this too (e.g. the\n"
            "                           longest redelivery time of your consumers)\n\n"
            "Dead-lettered effects and poison records are kept.\n\n"
            "Exit codes: 0 done; 78 horizon refused (nothing removed); 73 store cannot be\n"
            "opened; 74 store read-only or full.\n\n"
            "Example:\n"
            "  jsdurable gc --store sqlite:app.db --older-than 7d --batch 5000\n");
}

static bool parse_dur(const char *what, const char *arg, int64_t *out)
{
    if (!cli_parse_duration_ms(arg, out)) {
        cli_err("gc", "%s takes a duration such as 30s, 5m, 2h or 7d, not \"%s\"", what, arg);
        return false;
    }
    return true;
}

int cmd_gc(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"older-than", required_argument, NULL, 'o'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"dedup-window", required_argument, NULL, 'w'},
                                             {"min-horizon", required_argument, NULL, 'm'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    int64_t older = -1, window = 120000, floor_ms = 0;
    long batch = 1000;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'o':
            if (!parse_dur("--older-than", optarg, &older))
                return CLI_USAGE;
            break;
        case 'w':
            if (!parse_dur("--dedup-window", optarg, &window))
                return CLI_USAGE;
            break;
        case 'm':
            if (!parse_dur("--min-horizon", optarg, &floor_ms))
                return CLI_USAGE;
            break;
        case 'b':
            if (!cli_parse_long(optarg, 1, 100000, &batch)) {
                cli_err("gc", "--batch takes 1..100000");
                return CLI_USAGE;
            }
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
        cli_err("gc", "unexpected argument \"%s\"", argv[optind]);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url || older < 0) {
        cli_err("gc", "--store URL (or $JSD_STORE) and --older-than DURATION are required");
        return CLI_USAGE;
    }
    if (older < window) {
        cli_err("gc",
                "--older-than %lld ms is shorter than the duplicate window (%lld ms): a "
                "republished effect or a redelivery could then apply twice; nothing removed",
                (long long)older, (long long)window);
        return CLI_CONFIG;
    }
    if (older < floor_ms) {
        cli_err("gc", "--older-than %lld ms is shorter than --min-horizon %lld ms; nothing removed",
                (long long)older, (long long)floor_ms);
        return CLI_CONFIG;
    }
    jsd_store *s = NULL;
    jsd_error err;
    jsd_status st = jsd_store_open(&s, url, &err);
    if (st != JSD_OK) {
        cli_err("gc", "%s", err.msg[0] ? err.msg : jsd_status_str(st));
        return cli_exit_for(st);
    }
    int64_t total = 0, k = 0;
    int steps = 0;
    do {
        st = jsd_store_gc_step(s, older, (int)batch, &k);
        if (st != JSD_OK) {
            cli_err("gc", "%s (%lld rows removed before this)", jsd_store_errmsg(s),
                    (long long)total);
            jsd_store_close(s);
            return cli_exit_for(st);
        }
        total += k;
        if (k > 0 && ++steps % 10 == 0)
            fprintf(stderr, "jsdurable gc: %lld rows removed so far\n", (long long)total);
    } while (k > 0);
    printf("removed %lld rows (published effects and inbox rows older than %lld ms) from %s\n",
           (long long)total, (long long)older, jsd_store_url(s));
    jsd_store_close(s);
    return CLI_OK;
}
