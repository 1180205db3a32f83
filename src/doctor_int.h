/*
 * doctor_int — what the doctor's files share: the report (a growing list of
 * results, its strings owned; doctor_report.c), and the checks that live
 * apart from src/doctor.c because they need other libraries or the store's insides:
 * the server's fsync policy over HTTP (src/doctor_server.c, libcurl) and the
 * store's durability and schema (src/store/doctor.c).
 */
#ifndef JSD_DOCTOR_INT_H
#define JSD_DOCTOR_INT_H

#include "jsd_int.h"
#include "jsdurable/doctor.h"

struct jsd_doctor_report {
    jsd_doctor_result *r;
    size_t n, cap;
    bool nomem; /* a result could not be added */
};

/* Add one result (strings copied). On allocation failure the report is
 * marked (jsd_doctor_run then returns JSD_ERR_NOMEM). */
void jsd__doctor_add(jsd_doctor_report *rep, const char *check, jsd_doctor_kind kind,
                     const char *subject, jsd_doctor_level level, const char *message,
                     const char *fix);

/* What the server's /varz says of its fsync policy. */
typedef enum jsd__doctor_fsync {
    JSD__FSYNC_UNKNOWN, /* not read, or not reported (2.9) */
    JSD__FSYNC_ALWAYS,  /* sync_interval: always */
    JSD__FSYNC_LAZY,    /* every sync_interval (2 minutes by default) */
} jsd__doctor_fsync;

/* src/doctor_server.c: GET monitor_url/varz and judge the server's fsync
 * policy (check "server.fsync"); returns what it found. */
jsd__doctor_fsync jsd__doctor_check_server(jsd_doctor_report *rep, const char *monitor_url,
                                           int timeout_ms);

/* src/doctor_server.c: the server's version against the releases known to
 * lose JetStream data (check "server.version"); version NULL: unknown. */
void jsd__doctor_check_version(jsd_doctor_report *rep, const char *version);

/* src/store/doctor.c: the store's durability settings and schema version
 * (checks "store.*"). */
void jsd__doctor_check_store(jsd_doctor_report *rep, jsd_store *store);
/* The largest payload the store accepts (its payload_max). */
size_t jsd__doctor_store_payload_max(const jsd_store *store);
/* Up to max distinct subjects of the store's unpublished, not dead-lettered
 * effects, each allocated (free each and the array with jsd__free). */
jsd_status jsd__doctor_outbox_subjects(jsd_store *store, size_t max, char ***out, size_t *n,
                                       jsd_error *err);

#endif
