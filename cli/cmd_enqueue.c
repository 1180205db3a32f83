/*
 * jsdurable enqueue — placeholder until its issue lands.
 */
#include "cli.h"

int cmd_enqueue(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_err("enqueue", "not implemented yet");
    return CLI_UNAVAILABLE;
}
