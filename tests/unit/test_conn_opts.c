/*
 * Unit tests for the connection profile's validation (CONN-1, CONN-4, CONN-5):
 * every case here is refused before any network traffic, so no server is
 * needed. Ports used are ones nothing listens on; a test that got past
 * validation would fail with JSD_ERR_CONNECT instead of the status it expects.
 */
#include <openssl/evp.h>
#include <stdlib.h>

#include "test.h"
#include "conn_int.h"

#define SECRET_TOKEN "S3cr3t-T0ken-unit-7f3a"
#define SECRET_PASS  "S3cr3t-Pa55-unit-91bc"

static void base(jsd_conn_opts *o)
{
    jsd_conn_opts_init(o);
    o->servers = "nats://127.0.0.1:1";
    o->startup_budget_ms = 0;
    o->connect_timeout_ms = 200;
}

/* Open must fail with want; the message must contain needle (if given) and
 * neither secret; *out must be NULL. */
static void expect_refused(const jsd_conn_opts *o, jsd_status want, const char *needle)
{
    jsd_conn *c = (jsd_conn *)0x1;
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status s = jsd_conn_open(&c, o, &e);
    if (s != want)
        fail_msg("jsd_conn_open returned %s (%s), expected %s", jsd_status_name(s), e.msg,
                 jsd_status_name(want));
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(e.status, want);
    ASSERT_TRUE(e.msg[0] != '\0');
    if (needle)
        ASSERT_CONTAINS(e.msg, needle);
    ASSERT_NOT_CONTAINS(e.msg, SECRET_TOKEN);
    ASSERT_NOT_CONTAINS(e.msg, SECRET_PASS);
}

static void defaults_are_documented_values(void **state)
{
    (void)state;
    jsd_conn_opts o;
    memset(&o, 0x5a, sizeof(o));
    jsd_conn_opts_init(&o);
    ASSERT_TRUE(o.servers == NULL);
    ASSERT_STREQ(o.name, "jsdurable");
    ASSERT_TRUE(o.token == NULL && o.user == NULL && o.password == NULL);
    ASSERT_EQ(o.tls_required, 0);
    ASSERT_EQ(o.tls_handshake_first, 0);
    ASSERT_EQ(o.connect_timeout_ms, 2000);
    ASSERT_EQ(o.request_timeout_ms, 5000);
    ASSERT_EQ(o.startup_budget_ms, 10000);
    ASSERT_EQ(o.reconnect_attempts, -1);
    ASSERT_EQ(o.reconnect_wait_ms, 250);
    ASSERT_EQ(o.reconnect_jitter_ms, 100);
    ASSERT_EQ(o.reconnect_buffer_bytes, 8 * 1024 * 1024);
    ASSERT_EQ(o.max_pending_msgs, 65536);
    ASSERT_EQ(o.max_pending_bytes, 64 * 1024 * 1024);
    ASSERT_EQ(o.require_jetstream, 1);
    ASSERT_EQ(o.ping_interval_ms, 5000);
    ASSERT_EQ(o.coalesce_writes, 0);
}

static void null_arguments(void **state)
{
    (void)state;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    base(&o);
    ASSERT_STATUS(jsd_conn_open(NULL, &o, NULL), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_conn_open(&c, NULL, NULL), JSD_ERR_INVALID);
    ASSERT_TRUE(c == NULL);
    jsd_conn_close(NULL);
    ASSERT_STREQ(jsd_conn_errmsg(NULL), "");
    ASSERT_STREQ(jsd_conn_servers_redacted(NULL), "");
    ASSERT_EQ(jsd_conn_is_connected(NULL), 0);
    ASSERT_EQ(jsd_conn_reconnects(NULL), 0);
}

static void no_servers(void **state)
{
    (void)state;
    jsd_conn_opts o;
    base(&o);
    o.servers = NULL;
    expect_refused(&o, JSD_ERR_CONFIG, "no NATS server");
    o.servers = "";
    expect_refused(&o, JSD_ERR_CONFIG, "no NATS server");
}

static void bad_urls(void **state)
{
    (void)state;
    static const struct {
        const char *url;
        jsd_status want;
        const char *needle;
    } cases[] = {
        {"127.0.0.1:4222", JSD_ERR_CONFIG, "no scheme"},
        {"http://127.0.0.1:4222", JSD_ERR_CONFIG, "use nats:// or tls://"},
        {"nats://", JSD_ERR_CONFIG, "no host"},
        {"nats://:4222", JSD_ERR_CONFIG, "no host"},
        {"nats://127.0.0.1:0", JSD_ERR_CONFIG, "1..65535"},
        {"nats://127.0.0.1:65536", JSD_ERR_CONFIG, "1..65535"},
        {"nats://127.0.0.1:abc", JSD_ERR_CONFIG, "1..65535"},
        {"nats://127.0.0.1:", JSD_ERR_CONFIG, "bad port"},
        {"nats://127.0.0.1:4222/path", JSD_ERR_CONFIG, "path"},
        {"nats://bad host:4222", JSD_ERR_CONFIG, "invalid character"},
        {"nats://[::1:4222", JSD_ERR_CONFIG, "unclosed"},
        {"nats://a:4222,,nats://b:4222", JSD_ERR_CONFIG, "empty entry"},
        {"nats://a:4222,", JSD_ERR_CONFIG, "empty entry"},
        {"ws://127.0.0.1:8080", JSD_ERR_NOT_SUPPORTED, "WebSocket"},
        {"nats://u:" SECRET_PASS "@127.0.0.1:x", JSD_ERR_CONFIG, "nats://***@127.0.0.1:x"},
        {"nats://" SECRET_TOKEN "@:4222", JSD_ERR_CONFIG, "nats://***@:4222"},
        {"nats://u:" SECRET_PASS "@x@127.0.0.1:bad", JSD_ERR_CONFIG,
         "\"nats://***@127.0.0.1:bad\""},
        {"nats://u:" SECRET_PASS "/x@127.0.0.1:bad", JSD_ERR_CONFIG, "nats://***@127.0.0.1:bad"},
        {"nats://u:" SECRET_PASS "/x@127.0.0.1:1/p", JSD_ERR_CONFIG, NULL},
        /* no scheme, but user-info: it is hidden all the same */
        {"u:" SECRET_PASS "@127.0.0.1:4222", JSD_ERR_CONFIG,
         "\"***@127.0.0.1:4222\" has no scheme"},
        {SECRET_TOKEN "@127.0.0.1:4222", JSD_ERR_CONFIG, "\"***@127.0.0.1:4222\""},
    };
    for (size_t i = 0; i < JSD_ARRAY_LEN(cases); i++) {
        jsd_conn_opts o;
        base(&o);
        o.servers = cases[i].url;
        print_message("url %s\n", strstr(cases[i].url, "S3cr3t") ? "(with secret)" : cases[i].url);
        expect_refused(&o, cases[i].want, cases[i].needle);
    }
}

/* A password that is itself "***" (what redaction writes) is scrubbed once,
 * not searched for in its own replacement for ever; the pre-network check
 * (jsd__conn_opts_check, the fuzz target's entry) gives the same refusal as
 * jsd_conn_open. */
static void star_password_and_the_pre_network_check(void **state)
{
    (void)state;
    jsd_conn_opts o;
    base(&o);
    o.servers = "nats://u:***@127.0.0.1:bad";
    o.user = "u";
    o.password = "***";
    expect_refused(&o, JSD_ERR_CONFIG, "1..65535");
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_STATUS(jsd__conn_opts_check(&o, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "1..65535");
    base(&o);
    ASSERT_STATUS(jsd__conn_opts_check(&o, &e), JSD_OK);
    ASSERT_STATUS(jsd__conn_opts_check(NULL, &e), JSD_ERR_INVALID);
}

static void too_many_urls(void **state)
{
    (void)state;
    char list[2048] = "";
    size_t off = 0;
    jsd_conn_opts o;
    for (int i = 0; i < 33; i++)
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%snats://127.0.0.1:%d",
                                i ? "," : "", 1 + i);
    base(&o);
    o.servers = list;
    expect_refused(&o, JSD_ERR_CONFIG, "more than 32 server URLs");
}

static void at_most_one_auth_method(void **state)
{
    (void)state;
    jsd_conn_opts o;

    base(&o);
    o.token = SECRET_TOKEN;
    o.user = "alice";
    o.password = SECRET_PASS;
    expect_refused(&o, JSD_ERR_CONFIG, "more than one authentication method");

    base(&o);
    o.token = SECRET_TOKEN;
    o.creds_file = "/nonexistent/user.creds";
    expect_refused(&o, JSD_ERR_CONFIG, "more than one authentication method");

    base(&o);
    o.creds_file = "/nonexistent/user.creds";
    o.nkey_seed_file = "/nonexistent/user.nk";
    expect_refused(&o, JSD_ERR_CONFIG, "more than one authentication method");

    base(&o);
    o.user = "alice";
    expect_refused(&o, JSD_ERR_CONFIG, "user given without password");

    base(&o);
    o.password = SECRET_PASS;
    expect_refused(&o, JSD_ERR_CONFIG, "password given without user");

    base(&o);
    o.servers = "nats://alice:" SECRET_PASS "@127.0.0.1:1";
    o.token = SECRET_TOKEN;
    expect_refused(&o, JSD_ERR_CONFIG, "carries credentials");
}

static void ranges_are_checked(void **state)
{
    (void)state;
    jsd_conn_opts o;
#define RANGE_CASE(field, value, needle)                                                           \
    do {                                                                                           \
        base(&o);                                                                                  \
        o.field = value;                                                                           \
        expect_refused(&o, JSD_ERR_CONFIG, needle);                                                \
    } while (0)
    RANGE_CASE(connect_timeout_ms, -1, "connect_timeout_ms is -1");
    RANGE_CASE(connect_timeout_ms, 0, "connect_timeout_ms is 0");
    RANGE_CASE(request_timeout_ms, -5, "request_timeout_ms is -5");
    RANGE_CASE(startup_budget_ms, -1, "startup_budget_ms is -1");
    RANGE_CASE(reconnect_attempts, -2, "reconnect_attempts");
    RANGE_CASE(reconnect_wait_ms, -1, "reconnect_wait_ms is -1");
    RANGE_CASE(reconnect_jitter_ms, -1, "reconnect_jitter_ms is -1");
    RANGE_CASE(reconnect_buffer_bytes, -1, "reconnect_buffer_bytes is -1");
    RANGE_CASE(max_pending_msgs, 0, "max_pending_msgs is 0");
    RANGE_CASE(max_pending_bytes, -1, "max_pending_bytes is -1");
    RANGE_CASE(max_pending_bytes, INT64_C(1) << 31, "max_pending_bytes is 2147483648");
    RANGE_CASE(reconnect_buffer_bytes, 0, "reconnect_buffer_bytes is 0");
    RANGE_CASE(ping_interval_ms, 0, "ping_interval_ms is 0");
    RANGE_CASE(coalesce_writes, 2, "coalesce_writes is 2");
    RANGE_CASE(coalesce_writes, -1, "coalesce_writes is -1");
#undef RANGE_CASE
}

static void js_domain_and_prefix_are_checked(void **state)
{
    (void)state;
    jsd_conn_opts o;
    base(&o);
    o.js_domain = "hub";
    o.js_api_prefix = "$JS.hub.API";
    expect_refused(&o, JSD_ERR_CONFIG, "use only one");
    const char *bad_domains[] = {"a.b", "a b", "*", ">", "h\x01"};
    for (size_t i = 0; i < sizeof(bad_domains) / sizeof(bad_domains[0]); i++) {
        base(&o);
        o.js_domain = bad_domains[i];
        expect_refused(&o, JSD_ERR_CONFIG, "JetStream domain");
    }
    const char *bad_prefixes[] = {"js.*", "js.>", "a..b", ".js", "js api", "js.\x7f"};
    for (size_t i = 0; i < sizeof(bad_prefixes) / sizeof(bad_prefixes[0]); i++) {
        base(&o);
        o.js_api_prefix = bad_prefixes[i];
        expect_refused(&o, JSD_ERR_CONFIG, "JetStream API prefix");
    }
    /* valid ones pass the checks and fail only at the (closed) port */
    const char *good[] = {"$JS.hub.API", "jsa.API.", "JS.acc-1.API"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        base(&o);
        o.js_api_prefix = good[i];
        expect_refused(&o, JSD_ERR_CONNECT, NULL);
    }
    base(&o);
    o.js_domain = "leaf_1-x";
    expect_refused(&o, JSD_ERR_CONNECT, NULL);
}

static void handshake_first_not_supported(void **state)
{
    (void)state;
    jsd_conn_opts o;
    char want[64];
    base(&o);
    o.servers = "tls://127.0.0.1:1";
    o.tls_handshake_first = 1;
    snprintf(want, sizeof(want), "not supported by nats.c %s", jsd_nats_client_version());
    expect_refused(&o, JSD_ERR_NOT_SUPPORTED, want);
    expect_refused(&o, JSD_ERR_NOT_SUPPORTED, "nats-server >= 2.10.4");
}

static void tls_files_are_checked(void **state)
{
    (void)state;
    jsd_conn_opts o;
    base(&o);
    o.tls_cert_file = "/nonexistent/client.pem";
    expect_refused(&o, JSD_ERR_CONFIG, "tls_key_file");

    base(&o);
    o.tls_ca_file = "/nonexistent/ca.pem";
    expect_refused(&o, JSD_ERR_CONFIG, "cannot read the TLS CA file \"/nonexistent/ca.pem\"");

    base(&o);
    o.creds_file = "/nonexistent/user.creds";
    expect_refused(&o, JSD_ERR_CONFIG, "cannot read the credentials file");

    base(&o);
    o.nkey_seed_file = "/nonexistent/user.nk";
    expect_refused(&o, JSD_ERR_CONFIG, "cannot read the NKey seed file");
}

/* The pair published in nats.c's own tests. */
#define KNOWN_SEED "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
#define KNOWN_PUB  "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"

static void nkey_public_key_is_derived_from_the_seed(void **state)
{
    (void)state;
    char pub[64], bad[] = KNOWN_SEED;
    ASSERT_OK(jsd__nkey_public_from_seed(KNOWN_SEED, strlen(KNOWN_SEED), pub, sizeof(pub)));
    ASSERT_STREQ(pub, KNOWN_PUB);
    /* a flipped character breaks the checksum */
    bad[20] = bad[20] == 'A' ? 'B' : 'A';
    ASSERT_STATUS(jsd__nkey_public_from_seed(bad, strlen(bad), pub, sizeof(pub)), JSD_ERR_CONFIG);
    /* an account seed ("SA...") is not a user seed */
    ASSERT_STATUS(jsd__nkey_public_from_seed("SAAB", 4, pub, sizeof(pub)), JSD_ERR_CONFIG);
}

static void nkey_seed_file_without_a_seed_is_refused(void **state)
{
    (void)state;
    char path[512];
    jsd_conn_opts o;
    FILE *f;
    snprintf(path, sizeof(path), "%s/bad.nk", jsd_test_dir());
    f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("-----BEGIN USER NKEY SEED-----\nnot a seed\n", f);
    fclose(f);
    base(&o);
    o.nkey_seed_file = path;
    expect_refused(&o, JSD_ERR_CONFIG, "holds no valid user seed");
}

/* Write text to the file name in the test's folder; its path, valid until
 * the next call. */
static const char *write_text(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", jsd_test_dir(), name);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    ASSERT_EQ(fclose(f), 0);
    return path;
}

#define CREDS_JWT "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiJVIn0.c2ln-_c2ln"

/* The user JWT of a creds file as nsc writes it (and with CRLF lines,
 * blank lines and trailing blanks); none in a file without a framed line. */
static void creds_jwt_is_the_framed_line(void **state)
{
    (void)state;
    char *jwt = NULL;
    ASSERT_OK(jsd__creds_jwt(write_text("nsc.creds", "-----BEGIN NATS USER JWT-----\n" CREDS_JWT
                                                     "\n------END NATS USER JWT------\n\n"
                                                     "************************* IMPORTANT "
                                                     "*************************\n"
                                                     "-----BEGIN USER NKEY SEED-----\n" KNOWN_SEED
                                                     "\n------END USER NKEY SEED------\n"),
                             &jwt));
    ASSERT_STREQ(jwt, CREDS_JWT);
    free(jwt);
    ASSERT_OK(jsd__creds_jwt(write_text("crlf.creds",
                                        "\r\n-----BEGIN NATS USER JWT-----\r\n\r\n" CREDS_JWT
                                        "  \r\n------END NATS USER JWT------\r\n"),
                             &jwt));
    ASSERT_STREQ(jwt, CREDS_JWT);
    free(jwt);
    ASSERT_STATUS(jsd__creds_jwt(write_text("seed-only.creds", "-----BEGIN USER NKEY SEED-----\n"
                                                               "------END USER NKEY SEED------\n"),
                                 &jwt),
                  JSD_ERR_CONFIG);
    ASSERT_TRUE(jwt == NULL);
    ASSERT_STATUS(jsd__creds_jwt(write_text("bare.creds", CREDS_JWT "\n"), &jwt), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd__creds_jwt("/nonexistent/user.creds", &jwt), JSD_ERR_CONFIG);
}

/* A creds file with a seed and no JWT is refused before the network. */
static void creds_file_without_a_jwt_is_refused(void **state)
{
    (void)state;
    jsd_conn_opts o;
    base(&o);
    o.creds_file = write_text("nojwt.creds", "-----BEGIN USER NKEY SEED-----\n" KNOWN_SEED
                                             "\n------END USER NKEY SEED------\n");
    expect_refused(&o, JSD_ERR_CONFIG, "holds no user JWT");
}

/* The nonce's signature verifies against the seed's public key, from a seed
 * file and a creds file alike; a nonce whose signature begins with a zero
 * byte is reported unsendable (about one in 256). */
static void nonce_signature_verifies_and_a_leading_zero_is_reported(void **state)
{
    (void)state;
    unsigned char sig[64], key32[32], type = 0, pk[32];
    size_t pklen = sizeof(pk);
    bool unsendable = true;
    int zeros = 0;
    char seed_file[512];
    jsd__strlcpy(seed_file, write_text("sign.nk", KNOWN_SEED "\n"), sizeof(seed_file));
    ASSERT_OK(jsd__nkey_decode_seed(KNOWN_SEED, strlen(KNOWN_SEED), &type, key32));
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, key32, 32);
    ASSERT_TRUE(k != NULL);
    ASSERT_EQ(EVP_PKEY_get_raw_public_key(k, pk, &pklen), 1);
    EVP_PKEY *pub = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pk, pklen);
    for (int i = 0; i < 2000; i++) {
        char nonce[32];
        snprintf(nonce, sizeof(nonce), "nonce-%d", i);
        ASSERT_OK(jsd__nkey_sign_nonce(seed_file, NULL, nonce, sig, &unsendable));
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        ASSERT_EQ(EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pub), 1);
        ASSERT_EQ(EVP_DigestVerify(ctx, sig, 64, (const unsigned char *)nonce, strlen(nonce)), 1);
        EVP_MD_CTX_free(ctx);
        ASSERT_EQ(unsendable, sig[0] == 0);
        zeros += unsendable;
    }
    ASSERT_TRUE(zeros > 0); /* 2000 nonces: about 8 */
    const char *creds = write_text("sign.creds", "-----BEGIN NATS USER JWT-----\n" CREDS_JWT
                                                 "\n------END NATS USER JWT------\n"
                                                 "-----BEGIN USER NKEY SEED-----\n" KNOWN_SEED
                                                 "\n------END USER NKEY SEED------\n");
    unsigned char sig2[64];
    ASSERT_OK(jsd__nkey_sign_nonce(creds, NULL, "nonce-0", sig2, &unsendable));
    ASSERT_OK(jsd__nkey_sign_nonce(seed_file, NULL, "nonce-0", sig, &unsendable));
    ASSERT_EQ(memcmp(sig, sig2, 64), 0);
    ASSERT_STATUS(
        jsd__nkey_sign_nonce(write_text("noseed.nk", "nothing\n"), NULL, "n", sig, &unsendable),
        JSD_ERR_CONFIG);
    EVP_PKEY_free(pub);
    EVP_PKEY_free(k);
}

/* A seed file whose key is not the one the connection announces (a seed
 * rotated under a running process) signs nothing, so no CONNECT goes out
 * that the server can only refuse; its own key signs as without one. */
static void a_seed_that_is_not_the_announced_key_signs_nothing(void **state)
{
    (void)state;
    unsigned char sig[64], plain[64];
    bool unsendable = true;
    char seed_file[512];
    jsd__strlcpy(seed_file, write_text("rotated.nk", KNOWN_SEED "\n"), sizeof(seed_file));
    ASSERT_OK(jsd__nkey_sign_nonce(seed_file, NULL, "nonce-1", plain, &unsendable));
    ASSERT_OK(jsd__nkey_sign_nonce(seed_file, KNOWN_PUB, "nonce-1", sig, &unsendable));
    ASSERT_EQ(memcmp(sig, plain, sizeof(sig)), 0);
    memset(sig, 0x5a, sizeof(sig));
    ASSERT_STATUS(jsd__nkey_sign_nonce(seed_file,
                                       "UBNQKSO2XKUVYFV3DDBDTJRSS4XKBMPUUGUIM6NZNAJOESYLU5E3GW5Y",
                                       "nonce-1", sig, &unsendable),
                  JSD_ERR_AUTH);
    for (size_t i = 0; i < sizeof(sig); i++)
        ASSERT_EQ(sig[i], 0x5a);
    /* an unreadable file is still a configuration error, key or no key */
    ASSERT_STATUS(jsd__nkey_sign_nonce(write_text("noseed2.nk", "nothing\n"), KNOWN_PUB, "n", sig,
                                       &unsendable),
                  JSD_ERR_CONFIG);
}

static void nats_errors_map_to_statuses(void **state)
{
    (void)state;
    jsd_error e;
    ASSERT_EQ(jsd__err_nats(NULL, NATS_OK, 0, "x"), JSD_OK);
    ASSERT_EQ(jsd__err_nats(&e, NATS_CONNECTION_AUTH_FAILED, 0, "connect"), JSD_ERR_AUTH);
    ASSERT_EQ(e.nats_status, NATS_CONNECTION_AUTH_FAILED);
    ASSERT_CONTAINS(e.msg, "connect");
    ASSERT_EQ(jsd__err_nats(&e, NATS_NOT_PERMITTED, 0, "x"), JSD_ERR_AUTH);
    ASSERT_EQ(jsd__err_nats(&e, NATS_SSL_ERROR, 0, "x"), JSD_ERR_TLS);
    ASSERT_EQ(jsd__err_nats(&e, NATS_SECURE_CONNECTION_WANTED, 0, "x"), JSD_ERR_TLS);
    ASSERT_EQ(jsd__err_nats(&e, NATS_TIMEOUT, 0, "x"), JSD_ERR_TIMEOUT);
    ASSERT_EQ(jsd__err_nats(&e, NATS_NO_SERVER, 0, "x"), JSD_ERR_CONNECT);
    ASSERT_EQ(jsd__err_nats(&e, NATS_NO_RESPONDERS, 0, "x"), JSD_ERR_NO_JETSTREAM);
    ASSERT_EQ(jsd__err_nats(&e, NATS_ERR, JSNotEnabledForAccountErr, "x"), JSD_ERR_NO_JETSTREAM);
    ASSERT_EQ(e.js_err_code, JSNotEnabledForAccountErr);
    ASSERT_CONTAINS(e.msg, "10039");
    ASSERT_EQ(jsd__err_nats(&e, NATS_NOT_FOUND, JSStreamNotFoundErr, "stream info"),
              JSD_ERR_NOT_FOUND);
    ASSERT_EQ(jsd__err_nats(&e, NATS_MAX_PAYLOAD, 0, "x"), JSD_ERR_LIMIT);
    ASSERT_EQ(jsd__err_nats(&e, NATS_ERR, JSStreamNameExistErr, "x"), JSD_ERR_EXISTS);
    ASSERT_EQ(jsd__err_nats(&e, NATS_ERR, JSStorageResourcesExceededErr, "x"), JSD_ERR_FULL);
    ASSERT_EQ(jsd__err_nats(&e, NATS_ERR, JSMaximumStreamsLimitErr, "x"), JSD_ERR_LIMIT);
    ASSERT_EQ(jsd__err_nats(&e, NATS_ERR, JSClusterNotAvailErr, "x"), JSD_ERR_BUSY);
    ASSERT_EQ(jsd__err_nats(&e, NATS_SLOW_CONSUMER, 0, "x"), JSD_ERR_NATS);
}

JSD_TEST_MAIN(cmocka_unit_test(defaults_are_documented_values), cmocka_unit_test(null_arguments),
              cmocka_unit_test(no_servers), cmocka_unit_test(bad_urls),
              cmocka_unit_test(too_many_urls), cmocka_unit_test(at_most_one_auth_method),
              cmocka_unit_test(ranges_are_checked), cmocka_unit_test(handshake_first_not_supported),
              cmocka_unit_test(js_domain_and_prefix_are_checked),
              cmocka_unit_test(tls_files_are_checked),
              cmocka_unit_test(nkey_public_key_is_derived_from_the_seed),
              cmocka_unit_test(nkey_seed_file_without_a_seed_is_refused),
              cmocka_unit_test(creds_jwt_is_the_framed_line),
              cmocka_unit_test(creds_file_without_a_jwt_is_refused),
              cmocka_unit_test(nonce_signature_verifies_and_a_leading_zero_is_reported),
              cmocka_unit_test(a_seed_that_is_not_the_announced_key_signs_nothing),
              cmocka_unit_test(nats_errors_map_to_statuses),
              cmocka_unit_test(star_password_and_the_pre_network_check))
