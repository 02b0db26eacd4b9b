/* cli_common.h: option parsing helpers shared by the subcommands. */
#ifndef FM_TOOLS_CLI_COMMON_H
#define FM_TOOLS_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Parses a whole decimal integer in [lo, hi]; prints "flashmap CMD: OPT expects ..." and returns -1
 * otherwise. */
int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" -> malloc'd ids; -1 with a message on bad input. */
int cli_parse_id_list(const char *cmd, const char *opt, const char *s, int32_t **ids, int *n);
/* Whole file into a malloc'd NUL-terminated buffer; -1 with a message naming the file. */
int cli_read_file(const char *cmd, const char *path, char **data, size_t *len);
/* Adds "name": "<text>" to a cJSON object for n bytes of UTF-8 text that may hold NUL bytes (cJSON's own
 * strings stop at the first NUL); 0, or -1 when out of memory. */
struct cJSON;
int cli_json_add_text(struct cJSON *obj, const char *name, const char *text, size_t n);
/* The value of option argv[*i] (advancing *i), or NULL with a message when it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

#endif
