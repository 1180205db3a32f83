/*
 * The rows the store's front (store.c) and its back ends (sqlite.c,
 * postgres.c) hand each other, and the helpers on them that rows.c holds: an
 * effect row to insert, a claimed row as a back end reads it, the update the
 * front decided for a failed effect, the headers
 * column codec, the store handle's error recorder and the store id a new
 * schema records. A back end includes this and backend.h and nothing of the
 * front. Not used outside src/store/.
 */
#ifndef JSD_STORE_ROWS_H
#define JSD_STORE_ROWS_H

#include "store/store.h"

/* A validated, encoded effect ready for insertion. */
typedef struct jsd__row {
    const char *owner;
    const char *effect_id;
    const char *subject;
    const unsigned char *headers; /* encoded (jsd__headers_encode); NULL when none */
    size_t headers_len;
    const void *payload;
    size_t len;
    const char *order_key; /* NULL when unordered */
    char msg_id[JSD_MSG_ID_MAX];
    int64_t created_at;
    int64_t not_before;
} jsd__row;

/* One claimed effect as a back end reads it from its result: views into the
 * columns (lengths without NULs), valid only until jsd__batch_add copies them.
 * headers is the encoded column, or the headers_json column's text (told
 * apart by the first byte: see rows.c). */
typedef struct jsd__claimed_row {
    int64_t row_id;
    const char *owner; /* NULL when none */
    size_t owner_len;
    const char *effect_id;
    size_t id_len;
    const char *msg_id;
    size_t msg_id_len;
    const char *subject;
    size_t subject_len;
    const unsigned char *headers;
    size_t headers_len;
    const unsigned char *payload;
    size_t len;
    int attempts;
    const char *order_key; /* NULL when unordered */
    size_t order_key_len;
    int64_t created_at;
    int64_t not_before;
    bool maybe_published;
    int64_t first_attempt_at; /* 0 when NULL */
} jsd__claimed_row;

/* What the front decided for one failed publication, for the back end to
 * write into its row (still leased to the token) together with the release
 * of the lease. */
typedef struct jsd__failure_update {
    int64_t row_id;
    int attempts;                         /* the new count */
    char error[JSD__ERROR_TEXT_MAX + 1];  /* last_error */
    int64_t next_attempt_at;              /* now when dead-lettered */
    int64_t first_attempt_at;             /* kept unless one is recorded; 0: none */
    bool dead;                            /* dead-lettered now: */
    int64_t dead_at;                      /*   dead_lettered_at */
    char reason[JSD__ERROR_TEXT_MAX + 1]; /*   dead_reason */
} jsd__failure_update;

/* Record an error on the store (and return s). */
jsd_status jsd__store_err(jsd_store *st, jsd_status s, const char *fmt, ...) JSD_PRINTF(3, 4);

/* The store id a new schema records (migration 2): 32 random hex digits. */
jsd_status jsd__store_new_id(jsd_store *s, char out[33]);

/* Encode validated headers for the headers column (size first). */
size_t jsd__headers_encoded_size(const jsd_header *h, size_t n);
void jsd__headers_encode(const jsd_header *h, size_t n, unsigned char *out);
/* Decode the headers column into an array allocated inside mem (a buffer the
 * caller sized with jsd__headers_decoded_size). false when malformed. */
size_t jsd__headers_decoded_size(const unsigned char *enc, size_t len, size_t *n_headers);
bool jsd__headers_decode(const unsigned char *enc, size_t len, jsd_header *out, char *strings);

/* The effect rules (rules.c), shared by emit (tx.c) and claim (rows.c).
 * text_ok: valid UTF-8 without control characters. */
bool jsd__effect_text_ok(const char *s, size_t n);
jsd_status jsd__effect_check_ident(const char *what, const char *v, bool required, jsd_error *err);
/* Header i: the name and value rules of jsd_tx_emit (include/jsdurable/store.h). */
jsd_status jsd__effect_check_header(const char *name, const char *value, size_t i, jsd_error *err);
/* The headers_json column (a JSON object of string values, len bytes of
 * text) checked against the header rules and encoded as the headers column
 * is (*enc allocated, NULL for an empty object). */
jsd_status jsd__headers_from_json(const unsigned char *text, size_t len, unsigned char **enc,
                                  size_t *enc_len, jsd_error *err);

/* Whether next continues the run of receipts that starts at first and
 * ends at prev (sqlite.c run_end, postgres.c pg_receipts): the next row id
 * and the next stream seq, with first's stream, duplicate flag and
 * publication time. One statement then records the whole run. */
bool jsd__receipt_continues(const jsd__receipt *first, const jsd__receipt *prev,
                            const jsd__receipt *next);

/* Append one claimed effect to a batch, copying every field into storage the
 * batch owns. A row whose headers or msg_id column cannot be used is added
 * with its defect set (see jsd__claimed). */
jsd_status jsd__batch_add(jsd__effect_batch *b, const jsd__claimed_row *r);
/* Sort a batch by row_id (RETURNING gives no order). */
void jsd__batch_sort(jsd__effect_batch *b);

#endif
