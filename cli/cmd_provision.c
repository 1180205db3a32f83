/*
 * jsdurable provision — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_provision(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("provision", "not implemented yet");
    return CLI_UNAVAILABLE;
}
