/* cli_engine.h: the options shared by the commands that load an engine and decode (generate, chat, serve,
 * bench): the model and drafter, threads, context size, device, the drafter's weights, --mmap, and the
 * decoding switches --no-spec / --verify / --no-fallback. One parser, one resolution of the cached default
 * models, one translation into fm_engine_params, so the commands cannot drift apart. Help texts stay with
 * the commands (their defaults and wording differ). Also what they report of a generation's speed. */
#ifndef FM_TOOLS_CLI_ENGINE_H
#define FM_TOOLS_CLI_ENGINE_H

#include "flashmap.h"

typedef struct {
    const char *model, *drafter; /* NULL: not given */
    int threads, n_ctx;          /* 0: the engine's default */
    int device;                  /* fm_device */
    int draft_weights;           /* fm_draft_weights */
    int keep_mmap;
    int spec, verify,
        fallback;         /* speculative decoding on (default), verify width (0: adaptive), fallback on */
    fm_sampling sampling; /* --temp, --top-k, --top-p, --min-p, --seed (greedy by default) */
    int seed_given, sampling_given;          /* --seed; any of --temp --top-k --top-p --min-p */
    int repeat_off;                          /* --repeat-last-n 0 (llama.cpp's "disabled") */
    char model_buf[4096], drafter_buf[4096]; /* the cached defaults, when resolved */
} cli_engine_opts;

/* Options a command does not take: bench runs on the CPU, sizes its own context and decodes greedily. */
enum { CLI_ENGINE_NO_DEVICE = 1u, CLI_ENGINE_NO_CTX = 2u, CLI_ENGINE_NO_SAMPLING = 4u };

/* The sampling options' help, the same in every command that takes them. */
#define CLI_SAMPLING_HELP                                                                                    \
    "  --temp T          sample at temperature T (default 0: greedy); Qwen3 suggests 0.6 (thinking) or\n"    \
    "                    0.7, with --top-p 0.95 / 0.8 and --top-k 20. Speculative output stays exactly\n"    \
    "                    plain output: same seed, same text\n"                                               \
    "  --top-k N         keep the N most likely tokens (default 0: all)\n"                                   \
    "  --top-p P         keep the most likely tokens up to probability P (default 1: all)\n"                 \
    "  --min-p P         drop tokens less likely than P x the most likely one (default 0: off)\n"            \
    "  --seed N          sampling seed (default: a random one, printed with the stats)\n"                    \
    "  --presence-penalty P, --frequency-penalty P\n"                                                        \
    "                    OpenAI's penalties over the tokens generated so far, greedy or sampled: a token\n"  \
    "                    loses P once it has appeared / P per appearance ([-2, 2], default 0)\n"             \
    "  --repeat-penalty P  Hugging Face's / vLLM's repetition penalty over the prompt and the tokens so "    \
    "far:\n"                                                                                                 \
    "                    a token that appeared has its logit divided by P when positive, multiplied by P\n"  \
    "                    otherwise ((0, 10], default 1: off; llama.cpp and Ollama users know 1.1)\n"         \
    "  --repeat-last-n N only the last N tokens count for --repeat-penalty (as in llama.cpp: -1 all of\n"    \
    "                    them, the default here; 0 turns the penalty off)\n"

/* A seed for a sampled generation that was given none (from the OS's random source). */
uint64_t cli_random_seed(void);
/* Adds "sampling": {temperature, top_k, top_p, min_p, seed, and the penalties that are on} (floats in their
 * shortest form, the seed as digits), when sampled or penalised (nothing when plainly greedy), to a JSON
 * object: `generate --json` stats and the server's "flashmap" object. */
struct cJSON;
void cli_json_add_sampling(struct cJSON *obj, const fm_sampling *sp);

void cli_engine_opts_init(cli_engine_opts *o);
/* If argv[*i] is one of the shared options (and not excluded by flags), consumes it and its value (advancing
 * *i) and returns 1; returns 0 when it is not one; -1 after printing "flashmap CMD: ..." for a bad value. */
int cli_engine_opt(const char *cmd, int argc, char **argv, int *i, unsigned flags, cli_engine_opts *o);
/* Without -m: the cached pinned target, and its pinned drafter unless --no-spec or -d says otherwise.
 * 0, or -1 after printing why (nothing cached yet: `flashmap pull`). */
int cli_engine_resolve_defaults(const char *cmd, cli_engine_opts *o);
/* The engine parameters for these options (the drafter only when speculative decoding is on). */
void cli_engine_params(const cli_engine_opts *o, fm_engine_params *ep);
/* Prints the engine's device note (a GPU present but not used, and why) to stderr, when it has one. */
void cli_print_device_note(const char *cmd, const fm_engine *e);

/* Prompt tokens per second of prefill, and new tokens per second of decoding (the first new token comes from
 * the prefill, so it is not counted); 0 when nothing was timed. */
double cli_prefill_tok_s(const fm_generate_stats *st);
double cli_decode_tok_s(const fm_generate_stats *st);
/* The timing and speculation fields of a generation, under the names `generate --json` and the server's
 * "flashmap" object share: prefill_s, decode_s, prefill_tok_s, decode_tok_s, rounds, accepted,
 * mean_accepted, plain_steps, draft_s, verify_s. */
struct cJSON;
void cli_json_add_decode_stats(struct cJSON *obj, const fm_generate_stats *st);

#endif
