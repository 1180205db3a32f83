/*
 * What the files of the store's front share (store.c: opening, errors,
 * stats and retention; tx.c: the application's transaction, emit, inbox and
 * poison; outbox.c: the relay's operations and the failure policy). The back
 * ends never include it. Not used outside src/store/.
 */
#ifndef JSD_STORE_FRONT_H
#define JSD_STORE_FRONT_H

#include "store/backend.h"

/* JSD_ERR_INVALID, recorded on s, when a transaction is open: what names
 * the operation for the message. */
jsd_status jsd__store_need_idle(jsd_store *s, const char *what);

/* A PostgreSQL schema name the store takes: 1..63 of [A-Za-z0-9_], not
 * starting with a digit. */
bool jsd__pg_schema_name_valid(const char *s);

#endif
