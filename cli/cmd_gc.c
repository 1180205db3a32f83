/*
 * jsdurable gc — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_gc(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("gc", "not implemented yet");
    return CLI_UNAVAILABLE;
}
