/*
 * Running as a service: the signals and the systemd notifications shared by
 * the daemons (`relay`, `consume`). cli_service_start, called before any
 * thread exists, blocks SIGTERM, SIGINT and SIGHUP in every thread and starts
 * one service thread that takes them with sigtimedwait; the main thread keeps
 * running the relay or the consumer undisturbed.
 *
 *   SIGTERM/SIGINT  before cli_service_ready: the process dies by the signal
 *                   (nothing is running yet). After it: STOPPING=1, the stop
 *                   function (jsd_relay_stop, jsd_consumer_begin_drain), and a
 *                   deadline, JSD_STOP_TIMEOUT_MS (default 5000): a stop still
 *                   unfinished then (NATS or the store not answering) ends
 *                   with _exit(75), which is as safe as a SIGKILL (leases
 *                   expire, unacknowledged deliveries come again).
 *   SIGHUP          never stops the process: reopens the log file when
 *                   stderr is one (after logrotate), and says at info what it
 *                   did about credential files.
 *   sd_notify       READY=1 at cli_service_ready, STOPPING=1 at the stop,
 *                   WATCHDOG=1 every WATCHDOG_USEC/2 while the service thread
 *                   runs (libsystemd; no-ops without NOTIFY_SOCKET).
 */
#ifndef JSD_CLI_SERVICE_H
#define JSD_CLI_SERVICE_H

#include "cli.h"

/* Before any thread is created (before the store, NATS or the metrics server
 * are opened). cmd names the command in log lines; conn (may be NULL) tells
 * SIGHUP which credentials are in use. 0, or an exit code after a message. */
int cli_service_start(const char *cmd, const cli_conn *conn);
/* Serving: from now on a stop signal calls stop(arg) once, from the service
 * thread (it must be thread-safe). Sends READY=1. */
void cli_service_ready(void (*stop)(void *arg), void *arg);
/* The run returned: STOPPING=1 unless already sent. The stop deadline, if a
 * signal armed it, keeps running through the clean-up that follows. */
void cli_service_stopping(void);

#endif
