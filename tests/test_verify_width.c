/* test_verify_width.c: the adaptive verify width's estimates and choices (decode/verify_width.h), against
 * values worked out by hand and against a brute-force optimum. */
#include <math.h>

#include "decode/verify_width.h"
#include "test_util.h"

/* Feeds n rounds that verified K drafts and accepted `acc`, each costing draft + verify ms. */
static void rounds(fm_width_model *m, int n, int K, int acc, double draft, double verify) {
    for (int i = 0; i < n; i++) fm_width_observe_round(m, K, acc, draft, verify);
}

static void test_estimates(void) {
    fm_width_model m;
    fm_width_reset(&m);
    /* No data: every slot has the prior rate, tokens(K) = 1 + r + r^2 + ... */
    const double r = fm_width_slot_rate(&m, 1);
    CHECK(r > 0 && r < 1);
    CHECK_NEAR(fm_width_expected_tokens(&m, 3), 1 + r + r * r + r * r * r, 1e-12);
    CHECK(isnan(fm_width_cost_ms(&m, 8)));

    /* Many rounds accepting all 7 of 7. Counts decay by 0.9 a round, so after 200 rounds each slot holds
     * n = 10 observations and the estimate is (passed + rate of the slot before) / (n + 1): slot 1 is
     * (10 + prior) / 11, each next slot closer to 1; slot 8 and later (never compared) keep slot 7's rate. */
    rounds(&m, 200, 7, 7, 10, 50);
    double want = r, tokens = 1, all = 1;
    for (int i = 1; i <= 7; i++) {
        want = (10 + want) / 11;
        all *= want;
        tokens += all;
        CHECK_NEAR(fm_width_slot_rate(&m, i), want, 1e-6);
    }
    CHECK(fm_width_slot_rate(&m, 12) == fm_width_slot_rate(&m, 7));
    CHECK_NEAR(fm_width_expected_tokens(&m, 7), tokens, 1e-5);
    CHECK(tokens > 7.7 && tokens < 8);

    /* Rounds accepting exactly 2 of 7: slots 1-2 pass, slot 3 fails (10 observations, none passed), so
     * tokens(K) barely grows past K = 2. */
    fm_width_reset(&m);
    rounds(&m, 200, 7, 2, 10, 50);
    const double r1 = (10 + r) / 11, r2 = (10 + r1) / 11, r3 = r2 / 11;
    CHECK_NEAR(fm_width_slot_rate(&m, 2), r2, 1e-6);
    CHECK_NEAR(fm_width_slot_rate(&m, 3), r3, 1e-6);
    CHECK_NEAR(fm_width_expected_tokens(&m, 1), 1 + r1, 1e-5);
    CHECK_NEAR(fm_width_expected_tokens(&m, 2), 1 + r1 + r1 * r2, 1e-5);
    CHECK(fm_width_expected_tokens(&m, 7) < 1 + r1 + r1 * r2 + 0.1);

    /* Costs: timed at T = 8 (50 ms) and T = 17 (95 ms) -> 5 ms per row between and beyond them; a step. */
    rounds(&m, 1, 16, 2, 10, 95);
    CHECK_NEAR(fm_width_cost_ms(&m, 8), 50, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 12), 70, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 4), 30, 1e-9);
    fm_width_observe_step(&m, 20);
    CHECK_NEAR(fm_width_cost_ms(&m, 1), 20, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 4), 20 + 3 * 30.0 / 7, 1e-9);
    /* A noisy pair where a larger block timed cheaper never extrapolates to cheaper still. */
    fm_width_reset(&m);
    fm_width_observe_round(&m, 7, 0, 10, 50);
    fm_width_observe_round(&m, 3, 0, 10, 60);
    CHECK(fm_width_cost_ms(&m, 12) >= 50);

    /* Draft costs: none timed -> NaN; one K -> that value for every K; two K's -> their line (a fit through
     * two points is the line, and the running averages of points on it stay on it). */
    fm_width_reset(&m);
    CHECK(isnan(fm_width_draft_ms(&m, 5)));
    fm_width_observe_round(&m, 7, 0, 40, 50);
    CHECK_NEAR(fm_width_draft_ms(&m, 1), 40, 1e-9);
    CHECK_NEAR(fm_width_draft_ms(&m, 16), 40, 1e-9);
    fm_width_observe_round(&m, 3, 0, 32, 30);
    CHECK_NEAR(fm_width_draft_ms(&m, 5), 36, 1e-9);
    CHECK_NEAR(fm_width_draft_ms(&m, 11), 48, 1e-9);
    CHECK_NEAR(fm_width_draft_ms(&m, 1), 28, 1e-9);
    /* A draft time that included catch-up work (draft_ms < 0) is not recorded. */
    fm_width_observe_round(&m, 5, 0, -1, 40);
    CHECK_NEAR(fm_width_draft_ms(&m, 5), 36, 1e-9);
    /* One slow first draft (a GPU graph being captured) at K = 7, then flat 1.5 ms drafts at K = 16: after a
     * few rounds K = 7 no longer looks dear (it did when each K kept its own last time). */
    fm_width_reset(&m);
    fm_width_observe_round(&m, 7, 7, 50, 3.4);
    rounds(&m, 10, 16, 8, 1.5, 5.7);
    CHECK_MSG(fm_width_draft_ms(&m, 7) < 2 && fm_width_draft_ms(&m, 7) <= fm_width_draft_ms(&m, 16) + 1e-9,
              "draft(7) %g ms, draft(16) %g ms", fm_width_draft_ms(&m, 7), fm_width_draft_ms(&m, 16));
    /* The same slow draft at the larger width, then rounds at K = 3 only: the slope it suggests fades with
     * the rounds (no width is locked out for good: the GPU bench stayed at K = 3 for 28 rounds). */
    fm_width_reset(&m);
    fm_width_observe_round(&m, 7, 7, 50, 3.4);
    rounds(&m, 3, 3, 3, 4, 3.3);
    CHECK_MSG(fm_width_draft_ms(&m, 7) > 10, "right after: draft(7) %g ms", fm_width_draft_ms(&m, 7));
    rounds(&m, 12, 3, 3, 4, 3.3);
    CHECK_MSG(fm_width_draft_ms(&m, 7) < 5, "after 15 rounds at K = 3: draft(7) %g ms",
              fm_width_draft_ms(&m, 7));
}

/* The choice equals the brute-force argmax of tokens(K) / (draft + cost(K + 1)). */
static void test_choice(void) {
    fm_width_model m;
    fm_width_reset(&m);
    CHECK(fm_width_choose(&m, 16, 7) == 7);   /* nothing timed: the caller's rule */
    fm_width_observe_round(&m, 7, 3, 10, 50); /* T = 8 timed ... */
    CHECK(fm_width_choose(&m, 16, 7) == 3);   /* ... so explore a second size: half the width */
    CHECK(fm_width_choose(&m, 16, 16) == 16); /* the rule's own size is still untimed */
    fm_width_observe_round(&m, 3, 3, 10, 30); /* T = 4 timed */
    int k = fm_width_choose(&m, 16, 7), best = 1;
    double best_rate = 0;
    for (int K = 1; K <= 16; K++) {
        double rate =
            fm_width_expected_tokens(&m, K) / (fm_width_draft_ms(&m, K) + fm_width_cost_ms(&m, K + 1));
        if (rate > best_rate) best_rate = rate, best = K;
    }
    CHECK(k == best);

    /* A GPU-like cost (verify nearly free) with high acceptance: the whole block. */
    fm_width_reset(&m);
    rounds(&m, 50, 16, 16, 4, 5.0);
    rounds(&m, 1, 7, 7, 4, 4.5);
    CHECK(fm_width_choose(&m, 16, 7) == 16);
    /* A CPU-like cost (each row as dear as a step) with low acceptance: one draft. */
    fm_width_reset(&m);
    rounds(&m, 50, 7, 0, 100, 800);
    rounds(&m, 1, 3, 0, 100, 400);
    CHECK(fm_width_choose(&m, 16, 7) == 1);
    /* Drafts that get dearer per slot (a CPU drafter's lm_head) pull the choice below the one with a flat
     * draft cost; acceptance, verify costs and the 64 rounds at 16 drafts are the same in both. */
    fm_width_model flat, steep;
    fm_width_reset(&flat);
    for (int i = 0; i < 64; i++) fm_width_observe_round(&flat, 16, i % 16, 60, 500); /* accepts 0..15 */
    steep = flat;
    rounds(&flat, 1, 3, 3, 60, 200);
    rounds(&steep, 1, 3, 3, 20, 200); /* 3 drafts: 20 ms instead of 60 */
    const int k_flat = fm_width_choose(&flat, 16, 7), k_steep = fm_width_choose(&steep, 16, 7);
    CHECK_MSG(k_steep < k_flat, "a steeper draft cost chose %d drafts, a flat one %d", k_steep, k_flat);
    /* k_max bounds the answer. */
    fm_width_reset(&m);
    rounds(&m, 50, 16, 16, 4, 5.0);
    rounds(&m, 1, 7, 7, 4, 4.5);
    CHECK(fm_width_choose(&m, 5, 7) == 5);
}

/* A row granule (a GPU's 8-row tiles): sizes of one class cost alike; an untimed class lies on the line
 * between its neighbours' facing sizes, so a 16-row block (two tiles) is tried between 8 and 17 rows. */
static void test_granule(void) {
    fm_width_model m;
    fm_width_reset(&m);
    CHECK(m.granule == 1);
    fm_width_set_granule(&m, 8);
    CHECK(m.granule == 8);
    fm_width_observe_step(&m, 20);           /* T = 1 */
    fm_width_observe_round(&m, 7, 3, 4, 25); /* T = 8 */
    /* One class timed: the sizes' line reaches past it (so that larger blocks get explored). */
    CHECK_NEAR(fm_width_cost_ms(&m, 4), 20 + 3 * 5.0 / 7, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 16), 25 + 8 * 5.0 / 7, 1e-9);
    fm_width_observe_round(&m, 16, 3, 4, 40); /* T = 17, class 2 */
    CHECK_NEAR(fm_width_cost_ms(&m, 17), 40, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 9), 32.5, 1e-9); /* class 1: halfway between 8's 25 and 17's 40 */
    CHECK_NEAR(fm_width_cost_ms(&m, 16), 32.5, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 4), 20 + 3 * 5.0 / 7, 1e-9); /* within class 0: between 1 and 8 */
    fm_width_model one = m;
    fm_width_set_granule(&one, 1); /* the same timings without classes: the line through 8 and 17 */
    CHECK_NEAR(fm_width_cost_ms(&one, 16), 25 + 8 * 15.0 / 9, 1e-9);
    fm_width_observe_round(&m, 15, 3, 4, 30); /* T = 16 timed: class 1 flat at its one timed size */
    CHECK_NEAR(fm_width_cost_ms(&m, 9), 30, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&m, 12), 30, 1e-9);
    /* Two timed sizes of a class on one side of T: their line, also below them (a GPU's verify(2) is a
     * little cheaper than its verify(4) and verify(8); flat, a loop at acceptance 0 never left 7 drafts). */
    fm_width_model low;
    fm_width_reset(&low);
    fm_width_set_granule(&low, 8);
    fm_width_observe_round(&low, 3, 0, 4, 22); /* T = 4 */
    fm_width_observe_round(&low, 7, 0, 4, 26); /* T = 8 */
    CHECK_NEAR(fm_width_cost_ms(&low, 2), 20, 1e-9);
    CHECK_NEAR(fm_width_cost_ms(&low, 6), 24, 1e-9);

    /* The choice: acceptance up to 15 of 16 (so slot 16 adds almost nothing), verify blocks costing 25 ms
     * up to 8 rows, 30 up to 16 and 40 at 17. With the granule, 15 drafts (16 rows); without, the line
     * through 8 and 17 hides that size's price. Each equals the brute-force optimum of its own model. */
    fm_width_model g8;
    fm_width_reset(&g8);
    for (int i = 0; i < 64; i++) fm_width_observe_round(&g8, 16, 8 + i % 8, 4, 40); /* accepts 8..15 */
    fm_width_observe_round(&g8, 7, 7, 4, 25);
    fm_width_observe_step(&g8, 20);
    fm_width_model g1 = g8;
    fm_width_set_granule(&g8, 8);
    const fm_width_model *models[2] = {&g8, &g1};
    int chosen[2];
    for (int i = 0; i < 2; i++) {
        chosen[i] = fm_width_choose(models[i], 16, 7);
        int best = 1;
        double best_rate = 0;
        for (int K = 1; K <= 16; K++) {
            const double rate = fm_width_expected_tokens(models[i], K) /
                                (fm_width_draft_ms(models[i], K) + fm_width_cost_ms(models[i], K + 1));
            if (rate > best_rate) best_rate = rate, best = K;
        }
        CHECK_MSG(chosen[i] == best, "model %d chose %d, its optimum is %d", i, chosen[i], best);
    }
    CHECK_MSG(chosen[0] == 15, "with the granule: %d drafts", chosen[0]);
    CHECK_MSG(chosen[1] != 15, "without it: %d drafts", chosen[1]);
    fm_width_observe_round(&g8, 15, 15, 4, 30); /* once 16 rows are timed at their price, 15 stays */
    CHECK(fm_width_choose(&g8, 16, 7) == 15);
}

int main(void) {
    test_estimates();
    test_choice();
    test_granule();
    return fm_test_report("test_verify_width");
}
