/* cli.h: the subcommands of the flashmap CLI, one file each (tools/cmd_*.c). Each returns the process
 * exit status: 0 on success, 1 for a runtime failure, 2 for a usage error. Errors are one line on stderr. */
#ifndef FM_TOOLS_CLI_H
#define FM_TOOLS_CLI_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_synth_drafter(int argc, char **argv); /* `synth drafter ...`, called by cmd_synth */
int cmd_pull(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
