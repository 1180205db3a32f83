/*
 * jsdurable dlq — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_dlq(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("dlq", "not implemented yet");
    return CLI_UNAVAILABLE;
}
