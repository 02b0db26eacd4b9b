/* bench_machine.c: see bench_machine.h. Missing /proc files leave "unknown" fields, never an error. */
#include "bench_machine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

/* Whether the space-separated flag list holds exactly `flag`. */
static int has_flag(const char *flags, const char *flag) {
    const size_t n = strlen(flag);
    for (const char *p = flags; (p = strstr(p, flag)) != NULL; p += n) {
        const int starts = p == flags || p[-1] == ' ' || p[-1] == '\t';
        const int ends = p[n] == 0 || p[n] == ' ' || p[n] == '\n';
        if (starts && ends) return 1;
    }
    return 0;
}

void bench_machine_describe(char *out, size_t outlen) {
    char model[256] = "unknown CPU", flags[4096] = "", line[4096];
    int cpus = 0, cores = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (!colon) continue;
            const char *val = colon + 1 + (colon[1] == ' ');
            if (!strncmp(line, "processor", 9)) cpus++;
            if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown CPU")) {
                snprintf(model, sizeof model, "%s", val);
                model[strcspn(model, "\n")] = 0;
            }
            if (!strncmp(line, "cpu cores", 9) && cores == 0) cores = atoi(val);
            if (!strncmp(line, "flags", 5) && flags[0] == 0) snprintf(flags, sizeof flags, "%s", val);
        }
        fclose(f);
    }
    if (cpus == 0) cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double mem_gib = 0;
    f = fopen("/proc/meminfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "MemTotal:", 9)) mem_gib = atof(line + 9) / (1024.0 * 1024.0);
        fclose(f);
    }
    struct utsname u;
    const int have_uname = uname(&u) == 0;
    static const char *const wanted[] = {"avx2",    "fma",      "f16c",        "avx_vnni",
                                         "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"};
    char isa[256] = "";
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        const size_t used = strlen(isa);
        snprintf(isa + used, sizeof isa - used, "%s%s %s", i ? ", " : "", wanted[i],
                 has_flag(flags, wanted[i]) ? "yes" : "no");
    }
    snprintf(out, outlen, "%s, %d logical CPUs (%d cores per socket), %s; %.1f GiB RAM; %s %s", model, cpus,
             cores, isa, mem_gib, have_uname ? u.sysname : "unknown OS", have_uname ? u.release : "");
}
