/*
 * jsdurable status — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_status(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("status", "not implemented yet");
    return CLI_UNAVAILABLE;
}
