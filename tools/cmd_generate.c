/* Placeholder until this subcommand lands; it refuses clearly instead of pretending to work. */
#include <stdio.h>

#include "cli.h"

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "flashmap: 'generate' is not implemented yet\n");
    return 2;
}
