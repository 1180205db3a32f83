/*
 * jsdurable relay — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_relay(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("relay", "not implemented yet");
    return CLI_UNAVAILABLE;
}
