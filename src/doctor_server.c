/*
 * doctor_server — the server's fsync policy, read from its HTTP monitoring
 * port (GET /varz) with libcurl, for the doctor's "server.fsync" check.
 *
 * What nats-server reports (checked against the servers the tests run):
 * 2.10 has jetstream.config.sync_interval (nanoseconds; the default is two
 * minutes) and, when configured with `sync_interval: always`, also
 * jetstream.config.sync_always = true (sync_interval then still shows the
 * default). 2.9.10 reports neither and refuses `sync_interval` in its
 * configuration file: its file store syncs on its own schedule, which the
 * doctor cannot read, so such a server is "unknown", never guessed.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "doctor_int.h"
#include "store/store.h"

#define VARZ_MAX (4u * 1024 * 1024)

typedef struct body {
    char *p;
    size_t n;
    bool too_big;
} body;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *user)
{
    body *b = user;
    size_t len = size * nmemb;
    if (b->n + len > VARZ_MAX) {
        b->too_big = true;
        return 0;
    }
    char *np = jsd__realloc(b->p, b->n + len + 1);
    if (!np)
        return 0;
    memcpy(np + b->n, ptr, len);
    b->n += len;
    np[b->n] = '\0';
    b->p = np;
    return len;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_OK;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* GET url into b; JSD_OK, or why (cap bytes) says what failed. */
static jsd_status http_get(const char *url, int timeout_ms, body *b, char *why, size_t cap)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        jsd__snprintf(why, cap, "libcurl could not start: %s", curl_easy_strerror(curl_init_rc));
        return JSD_ERR_INTERNAL;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        jsd__snprintf(why, cap, "libcurl could not start");
        return JSD_ERR_NOMEM;
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 5000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        jsd__snprintf(why, cap, "%s",
                      b->too_big  ? "the answer is over 4 MiB"
                      : errbuf[0] ? errbuf
                                  : curl_easy_strerror(rc));
        return JSD_ERR_IO;
    }
    if (code != 200) {
        jsd__snprintf(why, cap, "HTTP status %ld", code);
        return JSD_ERR_IO;
    }
    return JSD_OK;
}

static void fmt_ns(int64_t ns, char *out, size_t cap)
{
    int64_t ms = ns / 1000000LL;
    if (ms >= 1000 && ms % 1000 == 0)
        jsd__snprintf(out, cap, "%lld s", (long long)(ms / 1000));
    else
        jsd__snprintf(out, cap, "%lld ms", (long long)ms);
}

/* Releases with a known JetStream data-loss defect, and the release that
 * fixed it. 2.10.20 to 2.10.22 could delete a stream after process kills
 * (Jepsen's NATS analysis; fixed in 2.10.23). */
static const struct {
    int major, minor, from_patch, to_patch;
    const char *defect, *fixed;
} lossy[] = {
    {2, 10, 20, 22, "can delete a whole stream after its servers are killed", "2.10.23"},
};

void jsd__doctor_check_version(jsd_doctor_report *rep, const char *version)
{
    char msg[512], fix[160];
    int ma = 0, mi = 0, pa = 0;
    if (!version || sscanf(version, "%d.%d.%d", &ma, &mi, &pa) != 3) {
        jsd__doctor_add(rep, "server.version", JSD_DOCTOR_SERVER, version ? version : "",
                        JSD_DOCTOR_UNKNOWN,
                        "the server's version is unknown (TLS handshake first hides it)", "");
        return;
    }
    for (size_t i = 0; i < sizeof(lossy) / sizeof(lossy[0]); i++) {
        if (ma == lossy[i].major && mi == lossy[i].minor && pa >= lossy[i].from_patch &&
            pa <= lossy[i].to_patch) {
            jsd__snprintf(msg, sizeof(msg),
                          "nats-server %s has a known JetStream data-loss defect: it %s "
                          "(%d.%d.%d to %d.%d.%d; fixed in %s)",
                          version, lossy[i].defect, ma, mi, lossy[i].from_patch, ma, mi,
                          lossy[i].to_patch, lossy[i].fixed);
            jsd__snprintf(fix, sizeof(fix), "upgrade every server to nats-server %s or later",
                          lossy[i].fixed);
            jsd__doctor_add(rep, "server.version", JSD_DOCTOR_SERVER, version, JSD_DOCTOR_ERROR,
                            msg, fix);
            return;
        }
    }
    jsd__snprintf(msg, sizeof(msg), "nats-server %s has no known JetStream data-loss defect",
                  version);
    jsd__doctor_add(rep, "server.version", JSD_DOCTOR_SERVER, version, JSD_DOCTOR_OK, msg, "");
}

jsd__doctor_fsync jsd__doctor_check_server(jsd_doctor_report *rep, const char *monitor_url,
                                           int timeout_ms)
{
    jsd__doctor_fsync found = JSD__FSYNC_UNKNOWN;
    char safe[512], url[1024], why[CURL_ERROR_SIZE + 64], msg[1024];
    jsd__store_redact_url(monitor_url, safe, sizeof(safe));
    size_t len = strlen(monitor_url);
    while (len > 0 && monitor_url[len - 1] == '/')
        len--;
    if (len + 6 >= sizeof(url)) {
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_UNKNOWN,
                        "the monitoring URL is too long", "give a shorter --monitor URL");
        return found;
    }
    jsd__snprintf(url, sizeof(url), "%.*s/varz", (int)len, monitor_url);
    body b = {0};
    jsd_status s = http_get(url, timeout_ms, &b, why, sizeof(why));
    if (s != JSD_OK) {
        jsd__snprintf(msg, sizeof(msg), "GET %s/varz failed: %s; the fsync policy is unknown", safe,
                      why);
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_UNKNOWN, msg,
                        "give the server's HTTP monitoring address (its `http` / -m port)");
        jsd__free(b.p);
        return found;
    }
    json_error_t jerr;
    json_t *root = json_loadb(b.p ? b.p : "", b.n, 0, &jerr);
    jsd__free(b.p);
    const char *version = json_string_value(json_object_get(root, "version"));
    json_t *js = json_object_get(root, "jetstream");
    json_t *cfg = json_object_get(js, "config");
    json_t *always = json_object_get(cfg, "sync_always");
    json_t *interval = json_object_get(cfg, "sync_interval");
    if (!root || !json_is_object(root)) {
        jsd__snprintf(msg, sizeof(msg), "%s/varz is not JSON (%s); the fsync policy is unknown",
                      safe, jerr.text);
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_UNKNOWN, msg,
                        "give the server's HTTP monitoring address (its `http` / -m port)");
    } else if (!json_is_object(cfg)) {
        jsd__snprintf(msg, sizeof(msg),
                      "nats-server %s reports no JetStream configuration in /varz; the fsync "
                      "policy is unknown",
                      version ? version : "(version unknown)");
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_UNKNOWN, msg,
                        "point --monitor at a server that runs JetStream");
    } else if (json_is_true(always)) {
        jsd__snprintf(msg, sizeof(msg),
                      "nats-server %s syncs every write to disk before it acknowledges it "
                      "(sync_interval: always)",
                      version ? version : "");
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_OK, msg, "");
        found = JSD__FSYNC_ALWAYS;
    } else if (json_is_integer(interval)) {
        found = JSD__FSYNC_LAZY;
        char iv[64];
        fmt_ns(json_integer_value(interval), iv, sizeof(iv));
        jsd__snprintf(msg, sizeof(msg),
                      "nats-server %s syncs to disk lazily, every %s: messages it acknowledged "
                      "in the last %s before a power failure or OS crash can be lost, though "
                      "the relay holds receipts for them",
                      version ? version : "", iv, iv);
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_WARN, msg,
                        "set jetstream { sync_interval: always } in the server's configuration "
                        "(nats-server 2.10 or later), and run `jsdurable verify` after a crash");
    } else {
        jsd__snprintf(msg, sizeof(msg),
                      "nats-server %s does not report its sync interval in /varz (2.9 neither "
                      "reports nor accepts sync_interval; its file store syncs on its own "
                      "schedule): the fsync policy is unknown",
                      version ? version : "(version unknown)");
        jsd__doctor_add(rep, "server.fsync", JSD_DOCTOR_SERVER, safe, JSD_DOCTOR_UNKNOWN, msg,
                        "upgrade to nats-server 2.10 or later and set jetstream { sync_interval: "
                        "always }");
    }
    json_decref(root);
    return found;
}
