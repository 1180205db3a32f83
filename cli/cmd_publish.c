/*
 * jsdurable publish — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_publish(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("publish", "not implemented yet");
    return CLI_UNAVAILABLE;
}
