/* test_budget.c: the error-budget core against the seed's formulas, with a fake
 * clock (times are plain arguments). */
#include "budget.h"
#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static cr_budget *make(double window, double target) {
  cr_budget_config c;
  cr_budget_config_default(&c);
  c.window = window;
  c.target_ppb = (int64_t)llround(target * CR_PPB);
  cr_budget *b = NULL;
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  return b;
}

static void fill(cr_budget *b, const char *key, int ok, int fail, double t) {
  CHECK_EQ_INT(cr_budget_record_n(b, key, (uint64_t)ok, (uint64_t)fail, t), 0);
}

static cr_budget_report rep(cr_budget *b, const char *key, double t) {
  cr_budget_report r;
  CHECK_EQ_INT(cr_budget_report_get(b, key, t, &r), 0);
  return r;
}

static const char *status_at(cr_budget *b, const char *key, double t) {
  return cr_budget_status_name(rep(b, key, t).status);
}

/* The seed's formulas on hand-computed cases (target 0.95). */
static void test_seed_numbers(void) {
  cr_budget *b = make(3600, 0.95);
  fill(b, NULL, 97, 3, 1); /* budget 5, remaining 2 = 40 % */
  cr_budget_report r = rep(b, NULL, 1);
  CHECK_STR(cr_budget_status_name(r.status), "warning");
  CHECK_NEAR(r.slo_target, 0.95, 1e-15);
  CHECK_NEAR(r.current_rate, 0.97, 1e-15);
  CHECK_EQ_INT(r.total_events, 100);
  CHECK_EQ_INT(r.successes, 97);
  CHECK_EQ_INT(r.failures, 3);
  CHECK_NEAR(r.budget_total, 5.0, 1e-12);
  CHECK_NEAR(r.budget_remaining, 2.0, 1e-12);
  CHECK_NEAR(r.budget_remaining_pct, 40.0, 1e-12);
  CHECK_NEAR(r.burn_rate, 0.6, 1e-12);
  CHECK_NEAR(r.window, 3600, 0);
  /* 2 failures left at 3 per hour */
  CHECK_NEAR(r.time_to_exhaustion, 2.0 * 3600 / 3, 1e-9);
  cr_budget_free(b);

  /* The article: 10,000 solves at 95 % is a budget of 500 failures. */
  b = make(86400, 0.95);
  fill(b, NULL, 9600, 400, 10);
  r = rep(b, NULL, 10);
  CHECK_NEAR(r.budget_total, 500, 1e-9);
  CHECK_NEAR(r.budget_remaining, 100, 1e-9);
  CHECK_NEAR(r.budget_remaining_pct, 20, 1e-12);
  CHECK_NEAR(r.burn_rate, 0.8, 1e-12);
  CHECK_STR(cr_budget_status_name(r.status), "warning");
  fill(b, NULL, 0, 100, 11); /* 500 of 500 used (10,100 events: 505 budget) */
  r = rep(b, NULL, 11);
  CHECK_NEAR(r.budget_total, 505, 1e-9);
  CHECK_NEAR(r.budget_remaining, 5, 1e-9);
  CHECK_STR(cr_budget_status_name(r.status), "critical");
  cr_budget_free(b);

  /* Empty: rate 1.0, burn 0, healthy; the seed's fraction is 1 with no budget. */
  b = make(60, 0.95);
  r = rep(b, NULL, 0);
  CHECK_NEAR(r.current_rate, 1.0, 0);
  CHECK_NEAR(r.burn_rate, 0, 0);
  CHECK_NEAR(r.budget_remaining_pct, 100, 0);
  CHECK_STR(cr_budget_status_name(r.status), "healthy");
  CHECK(isinf(r.time_to_exhaustion));
  cr_budget_free(b);

  /* Target 1.0: no budget; one failure exhausts, burn stays 0 as in the seed. */
  b = make(60, 1.0);
  fill(b, NULL, 5, 0, 0);
  CHECK_STR(status_at(b, NULL, 0), "healthy");
  fill(b, NULL, 0, 1, 0);
  r = rep(b, NULL, 0);
  CHECK_STR(cr_budget_status_name(r.status), "exhausted");
  CHECK_NEAR(r.burn_rate, 0, 0);
  CHECK_NEAR(r.budget_remaining_pct, 0, 0);
  cr_budget_free(b);
}

/* Float artifacts the seed gets wrong, and the `<` boundaries it gets right. */
static void test_exact_thresholds(void) {
  cr_budget *b = make(3600, 0.95);
  fill(b, NULL, 19, 1, 0); /* seed: 8.9e-16 left, "critical" */
  cr_budget_report r = rep(b, NULL, 0);
  CHECK_STR(cr_budget_status_name(r.status), "exhausted");
  CHECK_NEAR(r.budget_remaining, 0, 0);
  CHECK_NEAR(r.budget_remaining_pct, 0, 0);
  CHECK_NEAR(r.time_to_exhaustion, 0, 0);
  cr_budget_free(b);

  b = make(3600, 0.95);
  fill(b, NULL, 39, 1, 0); /* budget 2, 1 left: exactly 50 % is healthy */
  CHECK_STR(status_at(b, NULL, 0), "healthy");
  CHECK_NEAR(rep(b, NULL, 0).budget_remaining_pct, 50, 0);
  fill(b, NULL, 0, 0, 0);
  cr_budget_free(b);

  b = make(3600, 0.95);
  fill(b, NULL, 191, 9, 0); /* budget 10, 1 left: exactly 10 % is warning */
  CHECK_STR(status_at(b, NULL, 0), "warning");
  fill(b, NULL, 1, 0, 0); /* 201 events: 10.05 budget, 1.05 left = 10.4 % */
  CHECK_STR(status_at(b, NULL, 0), "warning");
  cr_budget_free(b);

  b = make(3600, 0.95);
  fill(b, NULL, 954, 46, 0); /* budget 50, 4 left: 8 % */
  CHECK_STR(status_at(b, NULL, 0), "critical");
  cr_budget_free(b);

  /* A hair of budget left is not none: 20 * (1 - 0.949999975) = 1.0000005. */
  b = make(3600, 0.949999975);
  fill(b, NULL, 19, 1, 0);
  CHECK_STR(status_at(b, NULL, 0), "critical");
  CHECK_NEAR(rep(b, NULL, 0).budget_remaining, 5e-7, 1e-15);
  cr_budget_free(b);

  /* 0.999 with 999 + 1: float says 1e-13 left; exact says exhausted. */
  b = make(3600, 0.999);
  fill(b, NULL, 999, 1, 0);
  CHECK_STR(status_at(b, NULL, 0), "exhausted");
  cr_budget_free(b);
}

/* Window sliding with no new events: the status recovers (the seed's never does). */
static void test_sliding_recovers(void) {
  cr_budget *b = make(100, 0.95); /* resolution 0.1 s */
  const cr_budget_transition *tr;
  fill(b, NULL, 0, 10, 0);
  fill(b, NULL, 100, 0, 50);
  CHECK_EQ_INT(cr_budget_evaluate(b, 60, &tr), 1);
  CHECK_EQ_INT(tr[0].alert, -1);
  CHECK_STR(cr_budget_status_name(tr[0].from), "healthy");
  CHECK_STR(cr_budget_status_name(tr[0].to), "exhausted");
  CHECK_EQ_INT(cr_budget_evaluate(b, 99, &tr), 0); /* once per transition */
  CHECK_EQ_INT(cr_budget_evaluate(b, 100, &tr), 0); /* t=0 >= 100-100 still counts */
  CHECK_EQ_INT(rep(b, NULL, 100).failures, 10);
  CHECK_EQ_INT(cr_budget_evaluate(b, 100.1, &tr), 1);
  CHECK_STR(tr[0].key, "*");
  CHECK_STR(cr_budget_status_name(tr[0].to), "healthy");
  CHECK_EQ_INT(rep(b, NULL, 100.1).total_events, 100);
  CHECK_EQ_INT(rep(b, NULL, 150).total_events, 100);
  CHECK_EQ_INT(rep(b, NULL, 150.1).total_events, 0);
  /* a long idle jump clears everything in one pass */
  fill(b, NULL, 3, 1, 151);
  CHECK_EQ_INT(rep(b, NULL, 1e6).total_events, 0);
  cr_budget_free(b);
}

/* Memory is fixed by the configuration, not by the number of events. */
static void test_bounded_memory(void) {
  cr_budget *b = make(60, 0.95);
  fill(b, "turnstile", 1, 0, 0);
  size_t before = cr_budget_memory(b);
  double t = 0;
  int errs = 0;
  for (int i = 0; i < 1000000; i++, t += 0.0007) errs += cr_budget_record(b, "turnstile", i % 50 != 0, t) != 0;
  CHECK_EQ_INT(errs, 0);
  CHECK_EQ_INT(cr_budget_memory(b), before);
  cr_budget_report r = rep(b, "turnstile", t);
  CHECK(r.total_events <= 60 / 0.0007 + 2000);
  CHECK(r.total_events >= 60 / 0.0007 - 2000);
  cr_budget_free(b);
}

/* Naive reference: scan all events, count those with t >= now - window. */
static void test_matches_scan(void) {
  enum { N = 20000 };
  static double ts[N];
  static int oks[N];
  cr_budget *b = make(10, 0.9); /* resolution 0.01 */
  srand(7);
  long tick = 0;
  int bad = 0;
  for (int i = 0; i < N; i++) {
    tick += rand() % 5; /* aligned to the resolution, with repeats */
    double t = tick * 0.01;
    ts[i] = t;
    oks[i] = rand() % 7 != 0;
    CHECK_EQ_INT(cr_budget_record(b, NULL, oks[i], t), 0);
    if (i % 97) continue;
    tick += rand() % 300;
    double now = tick * 0.01;
    uint64_t n = 0, f = 0;
    for (int j = 0; j <= i; j++)
      if (ts[j] >= now - 10 - 1e-9) n++, f += !oks[j];
    cr_budget_report r = rep(b, NULL, now);
    bad += r.total_events != n || r.failures != f;
  }
  CHECK_EQ_INT(bad, 0);
  cr_budget_free(b);
}

static void test_per_key(void) {
  cr_budget *b = make(3600, 0.95);
  CHECK_EQ_INT(cr_budget_key_config(b, "turnstile", 980000000, 0), 0);
  fill(b, "turnstile", 97, 3, 0); /* 0.98: budget 2, 3 failures */
  fill(b, "base64", 97, 3, 0);    /* 0.95: budget 5 */
  CHECK_STR(status_at(b, "turnstile", 0), "exhausted");
  CHECK_STR(status_at(b, "base64", 0), "warning");
  cr_budget_report all = rep(b, "*", 0);
  CHECK_EQ_INT(all.total_events, 200);
  CHECK_EQ_INT(all.failures, 6);
  CHECK_NEAR(all.slo_target, 0.95, 1e-15);
  CHECK_NEAR(rep(b, "turnstile", 0).slo_target, 0.98, 1e-15);
  CHECK_EQ_INT(cr_budget_nkeys(b), 3);
  CHECK_STR(cr_budget_key(b, 0), "*");
  cr_budget_report r;
  CHECK_EQ_INT(cr_budget_report_get(b, "recaptcha", 0, &r), -ENOENT);
  CHECK_EQ_INT(r.total_events, 0);
  CHECK_STR(cr_budget_status_name(r.status), "healthy");
  CHECK_EQ_INT(cr_budget_nkeys(b), 3); /* reading does not create keys */
  const cr_budget_transition *tr;
  CHECK_EQ_INT(cr_budget_evaluate(b, 1, &tr), 3); /* "*" has 4 of 10 left */
  CHECK_STR(tr[0].key, "*");
  CHECK_STR(cr_budget_status_name(tr[0].to), "warning");
  CHECK_STR(tr[1].key, "turnstile");
  CHECK_STR(cr_budget_status_name(tr[1].to), "exhausted");
  CHECK_STR(tr[2].key, "base64");
  CHECK_EQ_INT(cr_budget_evaluate(b, 2, &tr), 0);
  cr_budget_free(b);

  /* max_keys bounds memory against unbounded key spaces */
  cr_budget_config c;
  cr_budget_config_default(&c);
  c.max_keys = 3;
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  fill(b, "a", 1, 0, 0);
  fill(b, "b", 1, 0, 0);
  CHECK_EQ_INT(cr_budget_record(b, "c", 1, 0), -ENOSPC);
  CHECK_EQ_INT(cr_budget_record(b, "", 1, 0), -EINVAL);
  cr_budget_free(b);
}

static cr_budget *make_alerts(void) {
  cr_budget_config c;
  cr_budget_config_default(&c);
  c.window = 86400;
  c.target_ppb = 990000000;
  c.nalerts = 2;
  c.alerts[0] = (cr_budget_alert_config){.name = "page", .long_window = 3600,
                                         .short_window = 300, .burn_ppb = 14400000000LL};
  c.alerts[1] = (cr_budget_alert_config){.name = "faq", .burn_ppb = 2 * CR_PPB,
                                         .consumed_ppb = 800000000};
  cr_budget *b = NULL;
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  return b;
}

/* SRE workbook: fire when both windows burn faster than 14.4; clear once. */
static void test_burn_alerts(void) {
  cr_budget *b = make_alerts();
  const cr_budget_transition *tr;
  double t = 0;
  for (; t < 3600; t += 1) fill(b, NULL, 100 - ((int)t & 1), (int)t & 1, t); /* burn 0.5 */
  CHECK_EQ_INT(cr_budget_evaluate(b, t, &tr), 0); /* 50 % left: healthy */
  /* 5 minutes at 20 % errors: short burn 20, long (55*1 + 5*20)/60 = 2.6 */
  for (int i = 0; i < 300; i++, t += 1) fill(b, NULL, 80, 20, t);
  cr_budget_report r = rep(b, NULL, t);
  CHECK_EQ_INT(r.alerts_firing & 1, 0);
  /* keep going: the long window crosses 14.4 when (60-m)*0.5 + 20 m > 864, m > 42.8 min */
  int fired_at = -1;
  for (int m = 5; m < 60 && fired_at < 0; m++) {
    for (int i = 0; i < 60; i++, t += 1) fill(b, NULL, 80, 20, t);
    int n = cr_budget_evaluate(b, t, &tr);
    for (int i = 0; i < n; i++)
      if (tr[i].alert == 0 && tr[i].to == 1) fired_at = m + 1;
  }
  CHECK_EQ_INT(fired_at, 43);
  CHECK_EQ_INT(cr_budget_evaluate(b, t, &tr), 0); /* fires once */
  /* recovery: the short window clears first, after s clean seconds with
   * 20 (300 - s) / 300 <= 14.4, s >= 84 */
  int cleared = -1;
  for (int s = 0; s < 600 && cleared < 0; s++, t += 1) {
    fill(b, NULL, 100, 0, t);
    int n = cr_budget_evaluate(b, t, &tr);
    for (int i = 0; i < n; i++)
      if (tr[i].alert == 0 && tr[i].to == 0) cleared = s;
  }
  CHECK(cleared >= 83 && cleared <= 85);
  cr_budget_free(b);
}

/* The FAQ rule: burn > 2.0 or more than 80 % consumed. */
static void test_faq_alert(void) {
  cr_budget *b = make_alerts(); /* target 0.99 */
  const cr_budget_transition *tr;
  fill(b, NULL, 1000, 0, 0);
  CHECK_EQ_INT(cr_budget_evaluate(b, 0, &tr), 0);
  fill(b, NULL, 0, 8, 1); /* 1008 events: budget 10.08, 8 used = 79.4 % */
  CHECK_EQ_INT(cr_budget_evaluate(b, 1, &tr), 1); /* "*" warning (20.6 % left) */
  CHECK_EQ_INT(tr[0].alert, -1);
  fill(b, NULL, 0, 1, 2); /* 9 of 10.09: 89 % consumed */
  int n = cr_budget_evaluate(b, 2, &tr);
  int faq = 0;
  for (int i = 0; i < n; i++) faq += tr[i].alert == 1 && tr[i].to == 1;
  CHECK_EQ_INT(faq, 1);
  cr_budget_free(b);
}

/* Replay with explicit timestamps; backwards time is an error. */
static void test_timestamps(void) {
  cr_budget *b = make(100, 0.95); /* resolution 0.1: epoch seconds are aligned */
  double t0 = 1700000000; /* epoch seconds replay */
  fill(b, NULL, 10, 0, t0);
  fill(b, NULL, 10, 1, t0 + 30);
  CHECK_EQ_INT(cr_budget_record(b, NULL, 1, t0 + 29), -ERANGE);
  CHECK_EQ_INT(cr_budget_record(b, NULL, 1, t0 - 71), CR_BUDGET_IGNORED);
  CHECK_EQ_INT(rep(b, NULL, t0 + 30).total_events, 21);
  cr_budget_report r;
  CHECK_EQ_INT(cr_budget_report_get(b, NULL, t0, &r), -ERANGE);
  CHECK_EQ_INT(rep(b, NULL, t0 + 100).total_events, 21);
  CHECK_EQ_INT(rep(b, NULL, t0 + 100.1).total_events, 11);
  CHECK_EQ_INT(cr_budget_record(b, NULL, 1, NAN), -EINVAL);
  CHECK_EQ_INT(cr_budget_record(b, NULL, 1, INFINITY), -EINVAL);
  const cr_budget_transition *tr;
  CHECK_EQ_INT(cr_budget_evaluate(b, t0, &tr), -ERANGE);
  cr_budget_free(b);
}

static void test_min_and_expected(void) {
  cr_budget_config c;
  cr_budget_config_default(&c);
  c.min_events = 20;
  cr_budget *b;
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  fill(b, NULL, 0, 1, 0); /* one early failure: the seed says exhausted */
  cr_budget_report r = rep(b, NULL, 0);
  CHECK_STR(cr_budget_status_name(r.status), "healthy");
  CHECK_EQ_INT(r.min_events_met, 0);
  CHECK_NEAR(r.budget_remaining_pct, 0, 0); /* the figures stay the seed's */
  fill(b, NULL, 19, 0, 0);
  r = rep(b, NULL, 0);
  CHECK_EQ_INT(r.min_events_met, 1);
  CHECK_STR(cr_budget_status_name(r.status), "exhausted");
  cr_budget_free(b);

  /* expected_events: 10,000 a day at 95 % is 500 failures, however few so far */
  cr_budget_config_default(&c);
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  CHECK_EQ_INT(cr_budget_key_config(b, "*", 950000000, 10000), 0);
  fill(b, NULL, 0, 1, 0);
  r = rep(b, NULL, 0);
  CHECK_NEAR(r.budget_total, 500, 1e-9);
  CHECK_NEAR(r.budget_remaining, 499, 1e-9);
  CHECK_NEAR(r.burn_rate, 20, 1e-12); /* the seed's burn: 1 / (1 * 0.05) */
  CHECK_STR(cr_budget_status_name(r.status), "healthy");
  fill(b, NULL, 0, 450, 1);
  CHECK_STR(status_at(b, NULL, 1), "critical"); /* 49 of 500 left */
  cr_budget_free(b);
}

struct exp_buf { int n; char key[8][16]; double win[8], t[8]; uint64_t ok[8], fail[8]; };

static int collect(void *ud, const char *key, double window, double t, uint64_t ok, uint64_t fail) {
  struct exp_buf *e = ud;
  if (e->n == 8) return 1;
  snprintf(e->key[e->n], sizeof e->key[0], "%s", key);
  e->win[e->n] = window;
  e->t[e->n] = t;
  e->ok[e->n] = ok;
  e->fail[e->n++] = fail;
  return 0;
}

static void test_export_import(void) {
  cr_budget *b = make(60, 0.95);
  fill(b, "x", 5, 1, 10);
  fill(b, "x", 7, 2, 40.05);
  struct exp_buf e = {0};
  CHECK_EQ_INT(cr_budget_export(b, collect, &e), 0);
  CHECK_EQ_INT(e.n, 4); /* two buckets for "*" and for "x" */
  CHECK_STR(e.key[0], "*");
  CHECK_NEAR(e.t[1], 40.02, 1e-9); /* bucket start (resolution 0.06) */
  cr_budget_free(b);

  /* restore 30 s later in the same clock: the bucket at 10 is still in */
  b = make(60, 0.95);
  for (int i = 0; i < e.n; i++)
    CHECK_EQ_INT(cr_budget_import(b, e.key[i], e.win[i], e.t[i], e.ok[i], e.fail[i]), 0);
  cr_budget_report r = rep(b, "x", 69);
  CHECK_EQ_INT(r.total_events, 15);
  CHECK_EQ_INT(r.failures, 3);
  CHECK_EQ_INT(rep(b, "*", 69).total_events, 15);
  CHECK_EQ_INT(rep(b, "x", 70.02).total_events, 9); /* the older one left */
  cr_budget_free(b);

  /* restore much later: everything left the window */
  b = make(60, 0.95);
  CHECK_EQ_INT(cr_budget_record(b, NULL, 1, 200), 0);
  for (int i = 0; i < e.n; i++)
    CHECK_EQ_INT(cr_budget_import(b, e.key[i], e.win[i], e.t[i], e.ok[i], e.fail[i]), 0);
  CHECK_EQ_INT(rep(b, "x", 200).total_events, 0);
  CHECK_EQ_INT(rep(b, "*", 200).total_events, 1);
  cr_budget_free(b);
}

static void test_config(void) {
  cr_budget_config c;
  cr_budget *b = NULL;
  cr_budget_config_default(&c);
  c.window = 0;
  CHECK_EQ_INT(cr_budget_new(&c, &b), -EINVAL);
  cr_budget_config_default(&c);
  c.target_ppb = CR_PPB + 1;
  CHECK_EQ_INT(cr_budget_new(&c, &b), -EINVAL);
  cr_budget_config_default(&c);
  c.resolution = 1e-9; /* 8.6e13 buckets: refused, memory stays bounded */
  CHECK_EQ_INT(cr_budget_new(&c, &b), -EINVAL);
  cr_budget_config_default(&c);
  c.nalerts = 1;
  c.alerts[0] = (cr_budget_alert_config){.name = "x", .long_window = 3600, .burn_ppb = CR_PPB};
  CHECK_EQ_INT(cr_budget_new(&c, &b), -EINVAL); /* short window missing */
  CHECK(b == NULL);
  CHECK_EQ_INT(cr_budget_status_parse("critical"), CR_BUDGET_CRITICAL);
  CHECK_EQ_INT(cr_budget_status_parse("nope"), -1);
  cr_budget_config_default(&c);
  CHECK_EQ_INT(cr_budget_new(&c, &b), 0);
  CHECK_NEAR(cr_budget_tick(b), 86.4, 1e-12);
  cr_budget_free(b);
}

int main(void) {
  test_seed_numbers();
  test_exact_thresholds();
  test_sliding_recovers();
  test_bounded_memory();
  test_matches_scan();
  test_per_key();
  test_burn_alerts();
  test_faq_alert();
  test_timestamps();
  test_min_and_expected();
  test_export_import();
  test_config();
  return CHECK_DONE();
}
