/*
 * conn — placeholder until the connection profile lands.
 */
#include <string.h>

#include "jsd_int.h"

void jsd_conn_opts_init(jsd_conn_opts *o)
{
    memset(o, 0, sizeof(*o));
}

jsd_status jsd_conn_open(jsd_conn **out, const jsd_conn_opts *o, jsd_error *err)
{
    (void)o;
    *out = NULL;
    return jsd__err(err, JSD_ERR_NOT_SUPPORTED, "connections are not implemented yet");
}
