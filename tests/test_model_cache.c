/* test_model_cache.c: the cache library without a network: sha256 against the FIPS 180-4 example vectors,
 * the cache folder precedence, paths and URLs, name validation, and fm_cache_resolve_default on
 * hand-made cache folders (sparse files of the pinned sizes, with and without valid markers). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/model_cache.h"
#include "io/sha256.h"
#include "test_util.h"

static void sha_hex_of(const void *data, size_t n, char hex[65]) {
    fm_sha256 s;
    uint8_t d[32];
    fm_sha256_init(&s);
    fm_sha256_update(&s, data, n);
    fm_sha256_final(&s, d);
    fm_sha256_hex(d, hex);
}

static void test_sha256_vectors(void) {
    char hex[65];
    sha_hex_of("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    sha_hex_of("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex_of(m448, strlen(m448), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    /* One million 'a', fed in uneven pieces to exercise the partial-block path. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    fm_sha256 s;
    uint8_t d[32];
    fm_sha256_init(&s);
    size_t off = 0, step = 1;
    while (off < 1000000) {
        size_t n = step < 1000000 - off ? step : 1000000 - off;
        fm_sha256_update(&s, a + off, n);
        off += n;
        step = step * 3 % 997 + 1;
    }
    fm_sha256_final(&s, d);
    fm_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    free(a);
}

static void test_cache_dir(void) {
    char dir[4096], err[FM_ERROR_LEN];
    setenv("FLASHMAP_CACHE", "/x/fm", 1);
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    setenv("HOME", "/x/home", 1);
    CHECK(fm_cache_dir(dir, sizeof dir, err, sizeof err) == 0 && !strcmp(dir, "/x/fm"));
    unsetenv("FLASHMAP_CACHE");
    CHECK(fm_cache_dir(dir, sizeof dir, err, sizeof err) == 0 && !strcmp(dir, "/x/xdg/flashmap"));
    setenv("XDG_CACHE_HOME", "", 1);
    CHECK(fm_cache_dir(dir, sizeof dir, err, sizeof err) == 0 && !strcmp(dir, "/x/home/.cache/flashmap"));
    unsetenv("HOME");
    unsetenv("XDG_CACHE_HOME");
    CHECK(fm_cache_dir(dir, sizeof dir, err, sizeof err) == -1 && strstr(err, "FLASHMAP_CACHE"));
}

static void test_paths_and_urls(void) {
    char out[4200], err[FM_ERROR_LEN];
    fm_cache_source s = {"Qwen/Qwen3-4B-GGUF", "abc123", "sub/w.gguf", -1, NULL};
    CHECK(fm_cache_file_path("/c", &s, out, sizeof out, err, sizeof err) == 0);
    CHECK(!strcmp(out, "/c/Qwen--Qwen3-4B-GGUF/abc123/sub/w.gguf"));
    unsetenv("HF_ENDPOINT");
    CHECK(fm_cache_url(&s, out, sizeof out, err, sizeof err) == 0);
    CHECK(!strcmp(out, "https://huggingface.co/Qwen/Qwen3-4B-GGUF/resolve/abc123/sub/w.gguf"));
    setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
    CHECK(fm_cache_url(&s, out, sizeof out, err, sizeof err) == 0);
    CHECK(!strcmp(out, "http://127.0.0.1:9/Qwen/Qwen3-4B-GGUF/resolve/abc123/sub/w.gguf"));
    unsetenv("HF_ENDPOINT");
    const char *bad_repos[] = {"noslash", "a/b/c", "../x", "a/..", "a b/c", "/a", "a/"};
    for (size_t i = 0; i < sizeof bad_repos / sizeof *bad_repos; i++) {
        fm_cache_source b = {bad_repos[i], "main", "f", -1, NULL};
        CHECK_MSG(fm_cache_file_path("/c", &b, out, sizeof out, err, sizeof err) == -1, "repo %s",
                  bad_repos[i]);
    }
    const char *bad_files[] = {"", "../f", "a/../f", "/abs", "a//b", "sp ace", "a/"};
    for (size_t i = 0; i < sizeof bad_files / sizeof *bad_files; i++) {
        fm_cache_source b = {"o/n", "main", bad_files[i], -1, NULL};
        CHECK_MSG(fm_cache_file_path("/c", &b, out, sizeof out, err, sizeof err) == -1, "file %s",
                  bad_files[i]);
    }
    fm_cache_source br = {"o/n", "refs/pr/1", "f", -1, NULL};
    CHECK(fm_cache_file_path("/c", &br, out, sizeof out, err, sizeof err) == -1 && strstr(err, "revision"));
    fm_cache_source bs = {"o/n", "main", "f", -1, "abc"};
    CHECK(fm_cache_file_path("/c", &bs, out, sizeof out, err, sizeof err) == -1 && strstr(err, "sha256"));
}

static void test_default_pins(void) {
    const fm_cache_source *t, *d;
    CHECK(fm_cache_default_sources(FM_CACHE_TARGET, &t) == 1);
    CHECK(!strcmp(t[0].repo, "Qwen/Qwen3-4B-GGUF") && !strcmp(t[0].file, "Qwen3-4B-Q8_0.gguf"));
    CHECK(strlen(t[0].revision) == 40 && t[0].size == 4280404704LL && t[0].sha256 &&
          strlen(t[0].sha256) == 64);
    CHECK(fm_cache_default_sources(FM_CACHE_DRAFTER, &d) == 2);
    CHECK(!strcmp(d[0].repo, "j-shen/FlashMap-Qwen3-4B") && !strcmp(d[0].file, "model.safetensors"));
    CHECK(!strcmp(d[0].revision, "4e8d6a39a84ad108c5b60cb59072eb3f968c98cd") && d[0].size == 949897866LL);
    CHECK(!strcmp(d[1].file, "config.json") && d[1].size == -1 && !strcmp(d[1].revision, d[0].revision));
}

/* Creates a file of `size` bytes (sparse) with parent folders. */
static void make_sparse(const char *path, long long size) {
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    CHECK(system(cmd) == 0);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, size) == 0);
    close(fd);
}

static void write_marker(const char *path, const fm_cache_source *s, long long size, const char *sha) {
    char m[4300];
    snprintf(m, sizeof m, "%s.complete", path);
    FILE *f = fopen(m, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "flashmap-cache-marker 1\nrepo %s\nfile %s\nrevision %s\ncommit -\nsize %lld\nsha256 %s\n",
            s->repo, s->file, s->revision, size, sha ? sha : "-");
    fclose(f);
}

static void test_resolve_default(void) {
    char cache[1100], path[4200], err[FM_ERROR_LEN], cmd[1300];
    snprintf(cache, sizeof cache, "%s/model-cache-%d", fm_test_tmpdir(), (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    CHECK(system(cmd) == 0);
    setenv("FLASHMAP_CACHE", cache, 1);
    const fm_cache_source *t, *d;
    fm_cache_default_sources(FM_CACHE_TARGET, &t);
    fm_cache_default_sources(FM_CACHE_DRAFTER, &d);
    char tfile[4200], dfile[4200], cfile[4200];
    CHECK(fm_cache_file_path(cache, &t[0], tfile, sizeof tfile, err, sizeof err) == 0);
    CHECK(fm_cache_file_path(cache, &d[0], dfile, sizeof dfile, err, sizeof err) == 0);
    CHECK(fm_cache_file_path(cache, &d[1], cfile, sizeof cfile, err, sizeof err) == 0);

    /* Empty cache: a clear error that says to run flashmap pull. */
    CHECK(fm_cache_resolve_default(FM_CACHE_TARGET, path, sizeof path, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "flashmap pull --target") && strstr(err, "-m FILE"), "%s", err);
    CHECK(fm_cache_resolve_default(FM_CACHE_DRAFTER, path, sizeof path, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "flashmap pull --drafter"), "%s", err);

    /* A partial download is never complete, even at full size. */
    char partial[4300];
    snprintf(partial, sizeof partial, "%s.partial", tfile);
    make_sparse(partial, 4280404704LL);
    CHECK(fm_cache_resolve_default(FM_CACHE_TARGET, path, sizeof path, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "partly downloaded") && strstr(err, "resume"), "%s", err);
    unlink(partial);

    /* The final name without a marker is not complete either. */
    make_sparse(tfile, 4280404704LL);
    CHECK(!fm_cache_is_complete(tfile, &t[0]));
    CHECK(fm_cache_resolve_default(FM_CACHE_TARGET, path, sizeof path, err, sizeof err) == -1);
    /* A marker for another revision, a wrong size, or an unverified pinned sha256: still not complete. */
    fm_cache_source other = t[0];
    other.revision = "main";
    write_marker(tfile, &other, 4280404704LL, t[0].sha256);
    CHECK(!fm_cache_is_complete(tfile, &t[0]));
    write_marker(tfile, &t[0], 4280404703LL, t[0].sha256);
    CHECK(!fm_cache_is_complete(tfile, &t[0]));
    write_marker(tfile, &t[0], 4280404704LL, NULL);
    CHECK(!fm_cache_is_complete(tfile, &t[0]));
    /* A valid marker: resolves to the .gguf file. */
    write_marker(tfile, &t[0], 4280404704LL, t[0].sha256);
    CHECK(fm_cache_is_complete(tfile, &t[0]));
    CHECK(fm_cache_resolve_default(FM_CACHE_TARGET, path, sizeof path, err, sizeof err) == 0);
    CHECK_MSG(!strcmp(path, tfile), "%s vs %s", path, tfile);
    /* The file shrinking after marking (truncated copy) is caught by the size check. */
    make_sparse(tfile, 1000);
    CHECK(fm_cache_resolve_default(FM_CACHE_TARGET, path, sizeof path, err, sizeof err) == -1);

    /* Drafter: both files must be complete; the answer is their folder. */
    make_sparse(dfile, 949897866LL);
    write_marker(dfile, &d[0], 949897866LL, NULL);
    CHECK(fm_cache_resolve_default(FM_CACHE_DRAFTER, path, sizeof path, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "config.json"), "%s", err);
    make_sparse(cfile, 321);
    write_marker(cfile, &d[1], 321, NULL);
    CHECK(fm_cache_resolve_default(FM_CACHE_DRAFTER, path, sizeof path, err, sizeof err) == 0);
    char folder[4200];
    snprintf(folder, sizeof folder, "%s", dfile);
    *strrchr(folder, '/') = '\0';
    CHECK_MSG(!strcmp(path, folder), "%s vs %s", path, folder);
    CHECK(system(cmd) == 0);
    unsetenv("FLASHMAP_CACHE");
}

int main(void) {
    test_sha256_vectors();
    test_cache_dir();
    test_paths_and_urls();
    test_default_pins();
    test_resolve_default();
    return fm_test_report("test_model_cache");
}
