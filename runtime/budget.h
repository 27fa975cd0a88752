/*
 * budget.h: rolling-window error-budget tracker (seeds/error-budget.txt).
 *
 * Pure C, no Lua: the caller passes the time (double seconds, any clock that
 * only moves forward) and gets 0, a positive "ignored" code or a negative errno.
 *
 * Each window is a ring of time buckets (default resolution window/1000), with
 * running sums, so record and report are O(1) (amortised: a bucket is expired
 * once) and memory is fixed at creation: keys * windows * ring * 24 bytes.
 * With event times aligned to the resolution, every report equals the seed's
 * scan of every event: an event at t counts while t >= now - window.
 *
 * Status thresholds are decided in exact arithmetic: target, warning, critical
 * and burn thresholds are integers in parts per 10^9 (CR_PPB) and compared with
 * unsigned __int128 products, so 19 successes + 1 failure at 0.95 is
 * "exhausted" (the seed's float says critical) and exactly 50 % left is healthy.
 *
 * Keys: "*" (the aggregate) always exists; recording under a key also records
 * under "*". Each key has its own target and optional expected_events.
 */
#ifndef CR_BUDGET_H
#define CR_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#define CR_PPB 1000000000LL
#define CR_BUDGET_ALL "*"
#define CR_BUDGET_IGNORED 1 /* cr_budget_record: older than the window */
#define CR_BUDGET_MAX_ALERTS 8
#define CR_BUDGET_MAX_KEY 255

enum { CR_BUDGET_HEALTHY = 0, CR_BUDGET_WARNING, CR_BUDGET_CRITICAL, CR_BUDGET_EXHAUSTED };

typedef struct cr_budget cr_budget;

typedef struct cr_budget_alert_config {
  const char *name;     /* copied */
  double long_window;   /* seconds; 0 with short_window 0: the simple rule */
  double short_window;  /* on the main window (seed FAQ)                    */
  int64_t burn_ppb;     /* fire when burn > burn_ppb/1e9 (<= 0: off in simple rule) */
  int64_t consumed_ppb; /* simple rule only: or consumed > consumed_ppb/1e9 (<= 0: off) */
} cr_budget_alert_config;

typedef struct cr_budget_config {
  double window;            /* seconds, > 0 */
  double resolution;        /* seconds; 0: window / 1000 */
  int64_t target_ppb;       /* default SLO target of every key, 0..1e9 */
  int64_t warning_ppb;      /* status warning when remaining < warning */
  int64_t critical_ppb;     /* status critical when remaining < critical */
  uint64_t min_events;      /* 0 off: below it a key makes no judgement (healthy) */
  size_t max_keys;          /* including "*"; 0: 64 */
  size_t nalerts;
  cr_budget_alert_config alerts[CR_BUDGET_MAX_ALERTS];
} cr_budget_config;

/* Fill the seed's defaults: 0.95, 24 h, warning 0.50, critical 0.10, and no
 * alerts (the binding adds the FAQ rule). */
void cr_budget_config_default(cr_budget_config *c);

/* Returns 0, -EINVAL (bad config) or -ENOMEM. */
int cr_budget_new(const cr_budget_config *c, cr_budget **out);
void cr_budget_free(cr_budget *b);

/* Per-key SLO: target and expected_events (0: relative budget, the seed's).
 * Creates the key. -EINVAL, -ENOSPC (max_keys), -ENOMEM. */
int cr_budget_key_config(cr_budget *b, const char *key, int64_t target_ppb, uint64_t expected);

/* Record one event at `now` under key (NULL or "*": the aggregate only).
 * 0 counted; CR_BUDGET_IGNORED when now is older than the window (relative to
 * the latest time seen); -ERANGE when time went backwards inside the window;
 * -ENOSPC, -ENOMEM, -EINVAL for a new key. Keys are created on first use with
 * the default target. */
int cr_budget_record(cr_budget *b, const char *key, int ok, double now);
/* The same for n events at once (replays, imports). */
int cr_budget_record_n(cr_budget *b, const char *key, uint64_t ok, uint64_t fail, double now);

typedef struct cr_budget_report {
  const char *key;
  int status;                  /* CR_BUDGET_* as of now (min_events applied) */
  double slo_target;
  double current_rate;         /* successes / total, 1.0 when empty */
  uint64_t total_events, successes, failures;
  double budget_total;         /* total * (1 - target), or expected * (1 - target) */
  double budget_remaining;     /* max(0, budget_total - failures) */
  double budget_remaining_pct; /* remaining fraction * 100 */
  double burn_rate;            /* failures / (total * (1 - target)), 0 when empty */
  double window;
  double time_to_exhaustion;   /* budget_remaining / (failures / window); 0 when
                                  exhausted, INFINITY with no failures */
  int min_events_met;
  uint64_t expected_events;
  unsigned alerts_firing;      /* bit i: alert i fired at the last evaluation */
} cr_budget_report;

/* Advance to now and fill *r. -ERANGE when now < latest time; -ENOENT for a
 * key never seen, with *r filled as an empty tracker's report. */
int cr_budget_report_get(cr_budget *b, const char *key, double now, cr_budget_report *r);

/* Transitions found by cr_budget_evaluate. Status transitions have alert -1;
 * alert transitions have alert >= 0 and from/to 0 (cleared) or 1 (firing). */
typedef struct cr_budget_transition {
  const char *key;
  int alert;
  int from, to;
} cr_budget_transition;

/* Advance every key to now and compare status and alerts with the last
 * evaluation. Returns the number of transitions (>= 0; *out points into the
 * tracker, valid until the next call) or -ERANGE. O(keys * alerts). */
int cr_budget_evaluate(cr_budget *b, double now, const cr_budget_transition **out);

/* The smallest bucket width of any window: how often the status can change
 * when time passes with no events (the binding's timer period). */
double cr_budget_tick(const cr_budget *b);
/* Latest time seen (-INFINITY before the first event). */
double cr_budget_now(const cr_budget *b);

size_t cr_budget_nkeys(const cr_budget *b);
const char *cr_budget_key(const cr_budget *b, size_t i); /* 0 is "*" */
const cr_budget_config *cr_budget_get_config(const cr_budget *b);
const char *cr_budget_status_name(int status);
int cr_budget_status_parse(const char *name); /* -1 if unknown */

/* Persistence: every live bucket of every distinct window length, in time
 * order per window. The callback returns 0 to go on or nonzero to stop (that
 * value is returned). cr_budget_import adds such a bucket back into every
 * window of that length under key (creating it), at bucket start time t;
 * buckets that left the window are dropped. */
typedef int (*cr_budget_bucket_fn)(void *ud, const char *key, double window, double t,
                                   uint64_t ok, uint64_t fail);
int cr_budget_export(cr_budget *b, cr_budget_bucket_fn fn, void *ud);
int cr_budget_import(cr_budget *b, const char *key, double window, double t, uint64_t ok,
                     uint64_t fail);

/* Bytes held by the tracker (fixed per key): the bounded-memory check. */
size_t cr_budget_memory(const cr_budget *b);

#endif
