/*
 * jsdurable consume — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_consume(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("consume", "not implemented yet");
    return CLI_UNAVAILABLE;
}
