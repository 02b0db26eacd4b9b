/* test_drafter.c: the FlashMap drafter against fixtures from the authors' own code (scripts/
 * make_drafter_fixtures.py runs the `flashmap` package), and its loading errors.
 * Each fixture names the `flashmap synth` arguments of a tiny target + drafter pair; the test synthesizes
 * them again (checking the sha256 the fixture recorded, so a changed synthesizer is reported as such), feeds
 * the fixture's feature rows, drafts, and compares: drafts exactly (a near-tie slot may take either of the
 * reference's top two), head outputs within the fixture's tolerance. The Q8_0 copy is checked also
 * pre-packed (fm_drafter_pack_q8_0): the same drafts and head outputs bit for bit. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/cpu_features.h"
#include "drafter/flashmap_drafter.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "test_util.h"

static const char *cli(void) {
    return getenv("FM_CLI");
}

/* snprintf for paths and commands; a truncated one fails the test instead of running half a command. */
__attribute__((format(printf, 3, 4))) static void fmt(char *buf, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int k = vsnprintf(buf, n, f, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n) {
        fprintf(stderr, "test_drafter: path or command too long\n");
        exit(1);
    }
}

static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    if (rc) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Joins a JSON array of strings into one shell argument string (the args are plain tokens). */
static void join_args(const cJSON *arr, char *out, size_t cap) {
    out[0] = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e; e = e->next) {
        strncat(out, " ", cap - strlen(out) - 1);
        strncat(out, e->valuestring, cap - strlen(out) - 1);
    }
}

/* Synthesizes the fixture's pair into dir; 0 when both files match the recorded sha256. */
static int synth_pair(const cJSON *fx, const char *dir) {
    char args[1024], cmd[8192], hex[65], path[4096];
    join_args(cJSON_GetObjectItem(fx, "target_args"), args, sizeof args);
    fmt(cmd, sizeof cmd, "'%s' synth target -o '%s/target.gguf' -q%s", cli(), dir, args);
    if (run_cmd(cmd)) return -1;
    join_args(cJSON_GetObjectItem(fx, "drafter_args"), args, sizeof args);
    fmt(cmd, sizeof cmd, "'%s' synth drafter -m '%s/target.gguf' -o '%s/model.safetensors'%s 2>/dev/null",
        cli(), dir, dir, args);
    if (run_cmd(cmd)) return -1;
    int rc = 0;
    const char *files[2] = {"target.gguf", "model.safetensors"},
               *keys[2] = {"target_sha256", "drafter_sha256"};
    for (int i = 0; i < 2; i++) {
        fmt(path, sizeof path, "%s/%s", dir, files[i]);
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(fx, keys[i]));
        if (fm_test_sha256_file(path, hex) || !want || strcmp(hex, want)) {
            fprintf(stderr,
                    "%s: synthesized %s differs from the fixture's (sha256 %s, fixture %s): the synthesizer "
                    "changed; "
                    "regenerate with scripts/make_drafter_fixtures.py\n",
                    dir, files[i], hex, want ? want : "?");
            rc = -1;
        }
    }
    return rc;
}

/* Q8_0 drafts (quantize != 0) are no longer the reference's bit for bit: they must agree on most slots and
 * keep the head outputs within a few percent (relative L2) of the reference's: each matmul adds about
 * 0.5-1 % of rounding noise (int8 weights and activations), over ~20 matmuls in sequence (measured: up to
 * 6 % on these tiny random models; a wrong block layout gives ~100 %). */
enum { Q8_MIN_AGREE_PERCENT = 75 };
static const double Q8_HEAD_REL_TOL = 0.10;

static void check_fixture(const char *fixture_path, fm_pool *pool, int quantize) {
    char *text = fm_test_read_file(fixture_path, NULL);
    CHECK_MSG(text != NULL, "cannot read %s", fixture_path);
    if (!text) return;
    cJSON *fx = cJSON_Parse(text);
    free(text);
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fx, "name"));
    CHECK_MSG(fx && name, "%s: not a fixture", fixture_path);
    if (!fx || !name) return;
    char dir[1024], tpath[4096], err[FM_ERROR_LEN] = "";
    fmt(dir, sizeof dir, "%s/drafter_%s", fm_test_tmpdir(), name);
    fmt(tpath, sizeof tpath, "mkdir -p '%s'", dir);
    run_cmd(tpath);
    int synth_ok = synth_pair(fx, dir) == 0;
    CHECK_MSG(synth_ok, "%s: synthesized files differ from the fixture's", name);

    qwen3_model *target = NULL;
    fm_drafter *d = NULL;
    fmt(tpath, sizeof tpath, "%s/target.gguf", dir);
    int rc = qwen3_model_load(tpath, &target, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", name, err);
    if (!rc) rc = fm_drafter_load(dir, target, NULL, 64, &d, err, sizeof err);
    if (!rc && quantize) {
        rc = fm_drafter_quantize_q8_0(d, pool, err, sizeof err);
        CHECK(rc || fm_drafter_matrix_type(d) == FM_DTYPE_Q8_0);
    }
    /* The same Q8_0 drafter with its draft matrices pre-packed for the CPU kernel (where this CPU's kernel
     * for the block's batches packs): every draft and head output equal bit for bit. */
    fm_drafter *dp = NULL;
    if (!rc && quantize) {
        rc = fm_drafter_load(dir, target, NULL, 64, &dp, err, sizeof err);
        if (!rc) rc = fm_drafter_quantize_q8_0(dp, pool, err, sizeof err);
        if (!rc) rc = fm_drafter_pack_q8_0(dp, pool, err, sizeof err);
        if (!rc && fm_cpu_isa_best() == FM_ISA_AVX2 && fm_drafter_block(dp) >= 9)
            CHECK_MSG(fm_drafter_packed_bytes(dp) > 0, "%s: the AVX2 level packed nothing", name);
        printf("%s q8_0: %zu bytes pre-packed\n", name, rc ? (size_t)0 : fm_drafter_packed_bytes(dp));
    }
    CHECK_MSG(rc == 0, "%s: %s", name, err);
    if (rc || !synth_ok) goto done;
    int slots = 0, agree = 0;

    /* Shape and settings as the fixture (config.json) says. */
    int n_ids;
    const int *ids = fm_drafter_target_layers(d, &n_ids);
    const cJSON *want_ids = cJSON_GetObjectItem(fx, "target_layer_ids");
    CHECK(n_ids == cJSON_GetArraySize(want_ids));
    for (int i = 0; i < n_ids && i < cJSON_GetArraySize(want_ids); i++)
        CHECK(ids[i] == cJSON_GetArrayItem(want_ids, i)->valueint);
    int K = fm_drafter_block(d), H = fm_drafter_hp(d)->target_dim, F = fm_drafter_hp(d)->feat_width;
    CHECK(K == cJSON_GetObjectItem(fx, "block")->valueint);
    CHECK(F == cJSON_GetObjectItem(fx, "feature_width")->valueint);

    const cJSON *fj = cJSON_GetObjectItem(fx, "features");
    int n_feat = cJSON_GetArraySize(fj);
    float *feats = malloc(sizeof(float) * (size_t)n_feat);
    int i = 0;
    for (const cJSON *e = fj->child; e; e = e->next) feats[i++] = (float)e->valuedouble;
    int used = 0, round = 0;
    for (const cJSON *r = cJSON_GetObjectItem(fx, "rounds")->child; r; r = r->next, round++) {
        int n = cJSON_GetObjectItem(r, "new_rows")->valueint,
            anchor = cJSON_GetObjectItem(r, "anchor")->valueint;
        CHECK(fm_drafter_extend_context(d, pool, feats + (size_t)used * F, n, used, err, sizeof err) == 0);
        used += n;
        CHECK(used == cJSON_GetObjectItem(r, "pos")->valueint && fm_drafter_length(d) == used);
        int32_t out[FM_DRAFTER_MAX_BLOCK];
        CHECK_MSG(fm_drafter_draft(d, pool, anchor, used, K, out, err, sizeof err) == 0, "%s", err);
        const cJSON *dr = cJSON_GetObjectItem(r, "drafts"), *nt = cJSON_GetObjectItem(r, "near_tie"),
                    *t2 = cJSON_GetObjectItem(r, "top2");
        int exact = 0, ties = 0;
        for (int k = 0; k < K; k++) {
            int want = cJSON_GetArrayItem(dr, k)->valueint;
            slots++;
            agree += out[k] == want;
            if (quantize) continue;
            if (cJSON_IsTrue(cJSON_GetArrayItem(nt, k))) {
                const cJSON *two = cJSON_GetArrayItem(t2, k);
                ties++;
                CHECK_MSG(out[k] == cJSON_GetArrayItem(two, 0)->valueint ||
                              out[k] == cJSON_GetArrayItem(two, 1)->valueint,
                          "%s round %d slot %d (near-tie): drafted %d, reference top two %d, %d", name, round,
                          k, out[k], cJSON_GetArrayItem(two, 0)->valueint,
                          cJSON_GetArrayItem(two, 1)->valueint);
            } else {
                exact++;
                CHECK_MSG(out[k] == want, "%s round %d slot %d: drafted %d, reference %d", name, round, k,
                          out[k], want);
            }
        }
        if (dp) {
            int32_t outp[FM_DRAFTER_MAX_BLOCK];
            CHECK(fm_drafter_extend_context(dp, pool, feats + (size_t)(used - n) * F, n, used - n, err,
                                            sizeof err) == 0);
            CHECK_MSG(fm_drafter_draft(dp, pool, anchor, used, K, outp, err, sizeof err) == 0, "%s", err);
            CHECK_MSG(memcmp(outp, out, sizeof(int32_t) * (size_t)K) == 0 &&
                          memcmp(fm_drafter_last_head(dp), fm_drafter_last_head(d),
                                 sizeof(float) * (size_t)K * (size_t)H) == 0,
                      "%s round %d: the pre-packed drafter's draft differs from the unpacked one's", name,
                      round);
        }
        const float *head = fm_drafter_last_head(d);
        const cJSON *hj = cJSON_GetObjectItem(r, "head");
        double tol = cJSON_GetObjectItem(r, "head_tol")->valuedouble, worst = 0, d2 = 0, r2 = 0;
        CHECK(cJSON_GetArraySize(hj) == K * H);
        i = 0;
        for (const cJSON *e = hj->child; e && i < K * H; e = e->next, i++) {
            double diff = fabs(head[i] - e->valuedouble);
            if (diff > worst) worst = diff;
            d2 += diff * diff;
            r2 += e->valuedouble * e->valuedouble;
        }
        if (quantize) { /* relative L2 error of the whole block instead of the max difference */
            worst = sqrt(d2 / (r2 > 0 ? r2 : 1));
            tol = Q8_HEAD_REL_TOL;
        }
        CHECK_MSG(worst <= tol, "%s round %d: head outputs differ by up to %g (tolerance %g)", name, round,
                  worst, tol);
        printf("%s%s round %d: %d slots exact, %d near-ties, head max |diff| %.3g (tol %.3g)\n", name,
               quantize ? " q8_0" : "", round, exact, ties, worst, tol);
        /* Asking for fewer slots skips their head, never changes the ones computed. */
        const int n_part = 1 + round % K;
        int32_t part[FM_DRAFTER_MAX_BLOCK];
        CHECK_MSG(fm_drafter_draft(d, pool, anchor, used, n_part, part, err, sizeof err) == 0, "%s", err);
        CHECK_MSG(memcmp(part, out, sizeof(int32_t) * (size_t)n_part) == 0,
                  "%s round %d: a draft of %d slots differs from the full draft's first %d", name, round,
                  n_part, n_part);
    }
    if (quantize) {
        printf("%s q8_0: %d of %d drafts equal the reference's\n", name, agree, slots);
        CHECK_MSG(agree * 100 >= Q8_MIN_AGREE_PERCENT * slots, "%s q8_0: only %d of %d drafts agree", name,
                  agree, slots);
    }
    free(feats);
done:
    fm_drafter_free(dp);
    fm_drafter_free(d);
    qwen3_model_free(target);
    cJSON_Delete(fx);
}

/* A copy of src without tensor `drop`, into dir/model.safetensors (no config.json). */
static int copy_without(const char *src, const char *drop, const char *dir) {
    char err[FM_ERROR_LEN], path[4096];
    st_file *f = st_open(src, err, sizeof err);
    if (!f) return -1;
    st_writer *w = st_writer_create();
    int rc = 0;
    for (int64_t i = 0; i < st_n_tensors(f) && !rc; i++) {
        const st_tensor *t = st_tensor_at(f, i);
        if (strcmp(t->name, drop))
            rc = st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, err, sizeof err);
    }
    fmt(path, sizeof path, "mkdir -p '%s'", dir);
    if (!rc) rc = run_cmd(path);
    fmt(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc) rc = st_writer_write(w, path, err, sizeof err);
    st_writer_free(w);
    st_close(f);
    return rc;
}

static void expect_load_error(const char *what, const char *path, const qwen3_model *t,
                              const fm_drafter_overrides *ov, const char *needle) {
    char err[FM_ERROR_LEN] = "";
    fm_drafter *d = NULL;
    int rc = fm_drafter_load(path, t, ov, 64, &d, err, sizeof err);
    CHECK_MSG(rc != 0 && d == NULL, "%s: loaded", what);
    CHECK_MSG(strstr(err, needle) != NULL, "%s: error '%s' lacks '%s'", what, err, needle);
    fm_drafter_free(d);
}

static void test_errors(fm_pool *pool) {
    char dir[1024], cmd[16384], path[4096], err[FM_ERROR_LEN];
    const char *tmp = fm_test_tmpdir();
    fmt(dir, sizeof dir, "%s/drafter_err", tmp);
    /* A target (6 layers, dim 64, untied) and a drafter for it; a second target of dim 32. */
    fmt(cmd, sizeof cmd,
        "mkdir -p '%s/ok' '%s/cfg' && '%s' synth target -o '%s/t64.gguf' -q --layers 6 --dim 64 --heads 4 "
        "--kv-heads 2 --ffn 64 --seed 3 && '%s' synth target -o '%s/t32.gguf' -q --layers 6 --dim 32 "
        "--heads 2 --kv-heads 1 --ffn 64 --seed 4 && '%s' synth drafter -m '%s/t64.gguf' -o "
        "'%s/ok/model.safetensors' --dim 32 --layers 1 --heads 2 --captures 2 --ffn 32 --cond 16 "
        "--time-dim 16 2>/dev/null",
        dir, dir, cli(), dir, cli(), dir, cli(), dir, dir);
    if (run_cmd(cmd)) {
        CHECK_MSG(0, "cannot synthesize the error-test models");
        return;
    }
    qwen3_model *t64 = NULL, *t32 = NULL;
    fmt(path, sizeof path, "%s/t64.gguf", dir);
    CHECK(qwen3_model_load(path, &t64, err, sizeof err) == 0);
    fmt(path, sizeof path, "%s/t32.gguf", dir);
    CHECK(qwen3_model_load(path, &t32, err, sizeof err) == 0);
    if (!t64 || !t32) goto done;
    fmt(path, sizeof path, "%s/ok", dir);

    /* It loads, the file path works as well as the folder, and the default ids are the spread rule's. */
    fm_drafter *d = NULL;
    fmt(cmd, sizeof cmd, "%s/ok/model.safetensors", dir);
    CHECK_MSG(fm_drafter_load(cmd, t64, NULL, 8, &d, err, sizeof err) == 0, "%s", err);
    if (d) {
        int n;
        const int *ids = fm_drafter_target_layers(d, &n);
        CHECK(n == 2 && ids[0] == 1 && ids[1] == 3);
        /* Context and draft argument errors. */
        float feats[3 * 128] = {0};
        int32_t out[FM_DRAFTER_MAX_BLOCK];
        CHECK(fm_drafter_extend_context(d, pool, feats, 2, 1, err, sizeof err) != 0 && strstr(err, "gaps"));
        CHECK(fm_drafter_extend_context(d, pool, feats, 3, 0, err, sizeof err) == 0);
        CHECK(fm_drafter_extend_context(d, pool, feats, 3, 6, err, sizeof err) != 0); /* past max_ctx 8 */
        CHECK(fm_drafter_draft(d, pool, 1, 4, 4, out, err, sizeof err) != 0 && strstr(err, "position 4"));
        CHECK(fm_drafter_draft(d, pool, t64->hp.vocab, 3, 4, out, err, sizeof err) != 0 &&
              strstr(err, "vocabulary"));
        CHECK(fm_drafter_draft(d, pool, 5, 3, 0, out, err, sizeof err) != 0 && strstr(err, "asked for"));
        CHECK(fm_drafter_draft(d, pool, 5, 3, fm_drafter_block(d) + 1, out, err, sizeof err) != 0);
        CHECK(fm_drafter_draft(d, pool, 5, 3, fm_drafter_block(d), out, err, sizeof err) == 0);
        fm_drafter_reset(d);
        CHECK(fm_drafter_length(d) == 0);
        fm_drafter_free(d);
    }
    /* Mismatched target. */
    expect_load_error("target of another dim", path, t32, NULL, "target of dim 64");
    /* Bad layer ids and counts from the caller. */
    fm_drafter_overrides ov = {.n_target_layers = 2, .target_layers = {1, 6}};
    expect_load_error("layer id 6 of 6", path, t64, &ov, "target layer id 6");
    ov = (fm_drafter_overrides){.n_target_layers = 3, .target_layers = {1, 2, 3}};
    expect_load_error("3 ids for 2 captures", path, t64, &ov, "3 target layers given");
    ov = (fm_drafter_overrides){.block = FM_DRAFTER_MAX_BLOCK + 1};
    expect_load_error("block too large", path, t64, &ov, "block");
    /* config.json with a wrong vocabulary and with a wrong number of layer ids. */
    fmt(cmd, sizeof cmd,
        "cp '%s/ok/model.safetensors' '%s/cfg/' && sed 's/\"vocab_size\":[^,]*/\"vocab_size\": 7/' "
        "'%s/ok/config.json' > '%s/cfg/config.json'",
        dir, dir, dir, dir);
    if (!run_cmd(cmd)) {
        fmt(path, sizeof path, "%s/cfg", dir);
        expect_load_error("config vocab", path, t64, NULL, "vocab_size is 7");
    }
    fmt(cmd, sizeof cmd,
        "sed 's/\"target_layer_ids\":[^]]*]/\"target_layer_ids\": [1]/' '%s/ok/config.json' > "
        "'%s/cfg/config.json'",
        dir, dir);
    if (!run_cmd(cmd)) expect_load_error("config ids", path, t64, NULL, "target_layer_ids has 1 layers");
    /* Missing tensors. */
    const char *drops[3] = {"head.weight", "layers.0.cross_attn.k_norm.weight", "time_embed.linear_2.weight"};
    for (int i = 0; i < 3; i++) {
        fmt(cmd, sizeof cmd, "%s/ok/model.safetensors", dir);
        fmt(path, sizeof path, "%s/miss%d", dir, i);
        CHECK(copy_without(cmd, drops[i], path) == 0);
        char needle[128];
        fmt(needle, sizeof needle, "missing tensor '%s'", drops[i]);
        expect_load_error("missing tensor", path, t64, NULL, needle);
    }
    expect_load_error("no file", "/nonexistent/drafter", t64, NULL, "/nonexistent/drafter: cannot open");
    /* synth for a target too shallow for the default layers: it fails, writes nothing and names the flag */
    fmt(cmd, sizeof cmd,
        "'%s' synth target -o '%s/t2.gguf' -q --layers 2 --dim 32 --heads 2 --kv-heads 1 --ffn 64 "
        "--seed 5 && ! '%s' synth drafter -m '%s/t2.gguf' -o '%s/t2d.safetensors' --dim 32 --layers 1 "
        "--heads 2 --captures 2 --ffn 32 2>'%s/t2d.err' && grep -q -- '--target-layers' '%s/t2d.err' && "
        "[ ! -e '%s/t2d.safetensors' ]",
        cli(), dir, cli(), dir, dir, dir, dir, dir);
    CHECK_MSG(run_cmd(cmd) == 0,
              "synth drafter with no default layers: no clear error naming --target-layers");
done:
    qwen3_model_free(t64);
    qwen3_model_free(t32);
}

int main(void) {
    if (!cli() || !getenv("FM_SOURCE_DIR")) {
        fprintf(stderr, "test_drafter: FM_CLI and FM_SOURCE_DIR must be set (ctest sets them)\n");
        return 1;
    }
    fm_pool *pool = fm_pool_create(2);
    const char *names[] = {"f32_untied_bf16", "q8_tied_f16", "bf16_tied_f32_block8"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1200];
        fmt(path, sizeof path, "%s/tests/fixtures/drafter/%s.json", getenv("FM_SOURCE_DIR"), names[i]);
        check_fixture(path, pool, 0);
        check_fixture(path, pool, 1);
    }
    test_errors(pool);
    fm_pool_free(pool);
    return fm_test_report("test_drafter");
}
