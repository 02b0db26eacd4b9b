/* test_draft_penalties.c: with penalties, the CPU drafter penalises its slots as the verify rows they meet
 * will be penalised (slot j counts the history and the drafts before it), so a draft proposes what a row
 * agreeing with the drafter's would choose. Checked on a tiny random pair: the drafted ids of a penalised
 * draft equal the argmax of the unpenalised draft's rows penalised by hand, slot after slot, and the
 * penalties (aimed at the unpenalised draft's own ids) change some of them. Output never depends on this
 * (test_speculative); acceptance does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/sampler.h"
#include "engine_internal.h"
#include "flashmap.h"
#include "test_util.h"

enum { K = 16, NP = 12 };

static int synth(char *target, char *drafter, size_t len) {
    const char *cli = getenv("FM_CLI");
    if (!cli) {
        fprintf(stderr, "FM_CLI is not set (run through ctest)\n");
        return -1;
    }
    snprintf(target, len, "%s/draftpen_target.gguf", fm_test_tmpdir());
    snprintf(drafter, len, "%s/draftpen_drafter", fm_test_tmpdir());
    char cmd[32768];
    snprintf(
        cmd, sizeof cmd,
        "'%s' synth target -o '%s' --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 128 "
        "--type q8_0 --tied --seed 21 >/dev/null 2>&1 && mkdir -p '%s' && '%s' synth drafter -m '%s' -o "
        "'%s/model.safetensors' --dim 64 --layers 2 --heads 4 --head-dim 16 --ffn 128 --target-layers 0,1 "
        "--seed 21 >/dev/null 2>&1",
        cli, target, drafter, cli, target, drafter);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    char target[4096], drafter[4096], err[FM_ERRBUF_SIZE];
    if (synth(target, drafter, sizeof target)) {
        CHECK_MSG(0, "could not synthesize the pair");
        return fm_test_report("test_draft_penalties");
    }
    fm_engine_params ep;
    fm_engine_params_init(&ep);
    ep.model_path = target, ep.drafter_path = drafter, ep.n_threads = 2, ep.n_ctx = 256;
    ep.device = FM_DEVICE_CPU;
    fm_engine *e = NULL;
    fm_session *s = NULL;
    if (fm_engine_load(&ep, &e, err, sizeof err) || fm_session_create(e, &s, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        fm_engine_free(e);
        return fm_test_report("test_draft_penalties");
    }
    const fm_decode_backend *b = &s->backend;
    const int V = b->vocab;
    int32_t prompt[NP], next = 0, raw[K], pen[K];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)((i * 37 + 5) % V);
    const fm_sampling greedy = {0};
    int rc = b->set_sampling(b->ctx, &greedy, err, sizeof err) ||
             b->eval(b->ctx, prompt, NP, 0, &next, err, sizeof err) ||
             b->commit_features(b->ctx, NP, 0, err, sizeof err) ||
             b->draft(b->ctx, next, NP, K, raw, err, sizeof err);
    CHECK_MSG(!rc, "%s", err);
    float *rows = malloc(sizeof(float) * (size_t)K * V);
    memcpy(rows, fm_drafter_last_logits(e->drafter), sizeof(float) * (size_t)K * V);

    /* The history: the prompt, then a "reply" made of the unpenalised draft's first ids, so that the
     * penalties fall on what the drafter would propose. */
    int32_t seq[NP + 4];
    memcpy(seq, prompt, sizeof prompt);
    for (int i = 0; i < 4; i++) seq[NP + i] = raw[i];
    fm_sampling ps = {0};
    ps.presence_penalty = 2, ps.repetition_penalty = 1.5f;
    rc = rc || b->set_sampling(b->ctx, &ps, err, sizeof err);
    if (!rc) b->set_history(b->ctx, seq, NP + 4, 4);
    rc = rc || b->draft(b->ctx, next, NP, K, pen, err, sizeof err);
    CHECK_MSG(!rc, "%s", err);

    int *counts = calloc((size_t)V, sizeof(int)), same = 0, moved = 0;
    fm_penalty *list = malloc(sizeof(fm_penalty) * (NP + 4 + K));
    for (int j = 0; j < K && !rc; j++) {
        float *row = rows + (size_t)j * V;
        fm_sample_penalize(row, &ps, seq, NP + 4, 4, pen, j, counts, list);
        same += fm_sample_row(row, V, &greedy, NP + j, NULL) == pen[j];
        moved += pen[j] != raw[j];
    }
    printf("penalised draft: %d of %d slots as defined, %d differ from the unpenalised draft\n", same, K,
           moved);
    CHECK_MSG(same == K, "%d of %d slots equal the hand-penalised argmax", same, K);
    CHECK_MSG(moved > 0, "the penalties changed no slot");
    b->set_history(b->ctx, NULL, 0, 0);
    free(rows), free(counts), free(list);
    fm_session_free(s);
    fm_engine_free(e);
    return fm_test_report("test_draft_penalties");
}
