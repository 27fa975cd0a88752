/*
 * budget_bench.c: error-budget core figures (not a test; prints numbers).
 *
 *   record throughput (one key, and a per-type key that also feeds "*")
 *   report time with 1k, 100k and 1M events inside a 24 h window
 *
 * The events are the ones bench/peers/budget_scan.py generates: event i of N at
 * t = i * 86400 / N, a failure when i % 20 == 0. Build and run with
 * bench/budget.sh (or: cc -O2 -Iruntime bench/budget_bench.c runtime/budget.c -lm).
 */
#include "budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WINDOW 86400.0

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static cr_budget *make(void) {
  cr_budget_config c;
  cr_budget_config_default(&c);
  c.window = WINDOW;
  cr_budget *b = NULL;
  if (cr_budget_new(&c, &b) < 0) exit(1);
  return b;
}

/* The n events span three windows of simulated time, so the ring turns over
 * and buckets expire at their real rate during the run. */
static void bench_record(const char *key, long n) {
  cr_budget *b = make();
  int errs = 0;
  double t0 = wall();
  for (long i = 0; i < n; i++) errs |= cr_budget_record(b, key, i % 20 != 0, (double)i * 3 * WINDOW / n);
  double dt = wall() - t0;
  cr_budget_report r;
  cr_budget_report_get(b, key, 3 * WINDOW, &r);
  printf("record key=%s n=%ld seconds=%.3f per_second=%.0f ns_per_record=%.2f (in window %llu, errors %d)\n",
         key ? key : "*", n, dt, n / dt, dt * 1e9 / n, (unsigned long long)r.total_events, errs);
  cr_budget_free(b);
}

/* N events in the window, then reports at times that slide the window by one
 * bucket each (the worst steady case: every report expires a bucket). */
static void bench_report(long n, long reps) {
  cr_budget *b = make();
  for (long i = 0; i < n; i++) cr_budget_record(b, NULL, i % 20 != 0, (double)i * WINDOW / n);
  cr_budget_report r;
  cr_budget_report_get(b, NULL, WINDOW, &r); /* the same report as the peer's check line */
  printf("check events=%ld at=window status=%s slo_target=0.95 current_rate=%.4f total_events=%llu "
         "successes=%llu failures=%llu budget_total=%.1f budget_remaining=%.1f "
         "budget_remaining_pct=%.1f burn_rate=%.2f\n", n, cr_budget_status_name(r.status),
         r.current_rate, (unsigned long long)r.total_events, (unsigned long long)r.successes,
         (unsigned long long)r.failures, r.budget_total, r.budget_remaining,
         r.budget_remaining_pct, r.burn_rate);
  volatile double sink = 0;
  double now = WINDOW, t0 = wall();
  for (long i = 0; i < reps; i++) {
    cr_budget_report_get(b, NULL, now + (double)i * 86.4 / reps, &r);
    sink += r.burn_rate;
  }
  double dt = wall() - t0;
  printf("report events=%ld reps=%ld ns_per_report=%.1f status=%s total=%llu\n", n, reps,
         dt * 1e9 / reps, cr_budget_status_name(r.status), (unsigned long long)r.total_events);
  (void)sink;
  cr_budget_free(b);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000000;
  bench_record(NULL, n);
  bench_record("turnstile", n);
  bench_report(1000, 1000000);
  bench_report(100000, 1000000);
  bench_report(1000000, 1000000);
  return 0;
}
