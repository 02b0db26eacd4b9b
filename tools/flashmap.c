/* flashmap: the command-line tool. Dispatches to one subcommand per file (tools/cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "generate text from a prompt (speculative with -d DRAFTER)"},
    {"chat", cmd_chat, "interactive chat that keeps the conversation and its KV cache"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"synth", cmd_synth, "write random-weight models (target GGUF or drafter safetensors)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (completions and chat, streaming)"},
    {"pull", cmd_pull, "download the default pinned models into the cache"},
    {"bench", cmd_bench, "measure step, verify, draft, prefill and end-to-end speed"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: flashmap COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nRun `flashmap COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("flashmap 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "flashmap: unknown command '%s' (try flashmap --help)\n", argv[1]);
    return 2;
}
