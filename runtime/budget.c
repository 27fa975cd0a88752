/*
 * budget.c: rolling-window error-budget tracker; see budget.h for the contract.
 *
 * A window is a ring of n buckets, each tagged with its absolute bucket index
 * floor(t / res). The live buckets are [tail, head] with
 *   head = floor(now / res), tail = ceil((now - len) / res)
 * so a bucket starting at k*res counts while k*res >= now - len, which is the
 * seed's `t >= now - window` for aligned times. Sums of the live buckets are
 * kept beside the ring; moving `now` subtracts each bucket once as it leaves,
 * so a record costs O(1) and a jump over a long idle period costs at most n.
 */
#include "budget.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

#define RING_BUCKETS 1000      /* default resolution: window / 1000 */
#define MAX_RING (1u << 24)    /* 384 MiB per window: refuse above it */
#define DEFAULT_MAX_KEYS 64
#define MAX_BURN_PPB (1000000LL * CR_PPB)

typedef struct slot { int64_t idx; uint64_t ok, fail; } slot;

typedef struct win {
  double len, res;
  size_t n;
  slot *ring;
  slot *head_slot;      /* where events at the latest time go */
  uint64_t ok, fail;    /* sums over live buckets */
  int64_t head, tail;
  double fast_until;    /* before it, head and tail cannot move */
  int started;
} win;

typedef struct key {
  char *name;
  int64_t target;
  uint64_t expected;
  int status;           /* as of the last evaluation */
  unsigned firing;      /* alert bits as of the last evaluation */
  win *w;               /* b->nwin windows; w[0] is the budget window */
} key;

struct cr_budget {
  cr_budget_config cfg; /* alert names owned */
  size_t nwin;
  double win_len[1 + 2 * CR_BUDGET_MAX_ALERTS];
  double win_res[1 + 2 * CR_BUDGET_MAX_ALERTS];
  int alert_long[CR_BUDGET_MAX_ALERTS], alert_short[CR_BUDGET_MAX_ALERTS];
  double max_time;      /* |t| above it would overflow bucket indices */
  key **keys;
  size_t nkeys;
  key *last;            /* lookup cache: pipelines record one method in bursts */
  double now;
  cr_budget_transition *tr;
  size_t trcap;
};

/* --- time to bucket index ------------------------------------------------ */

/* Snap q to the nearest integer when it is within rounding error of it, so
 * that t = k*res computed in floating point (even accumulated by repeated
 * additions) lands in bucket k. Costs at most 1e-7 of a bucket of accuracy. */
static double snap_eps(double q) { return 1e-7 + fabs(q) * 1e-15; }
static int64_t idx_floor(double q) { return (int64_t)floor(q + snap_eps(q)); }
static int64_t idx_ceil(double q) { return (int64_t)ceil(q - snap_eps(q)); }
static size_t umod(int64_t i, size_t n) {
  int64_t r = i % (int64_t)n;
  return (size_t)(r < 0 ? r + (int64_t)n : r);
}

/* --- one window ---------------------------------------------------------- */

static int win_init(win *w, double len, double res) {
  w->len = len;
  w->res = res;
  w->n = (size_t)ceil(len / res - 1e-9) + 2; /* live range spans <= len/res + 1 */
  w->ring = calloc(w->n, sizeof *w->ring);
  if (!w->ring) return -ENOMEM;
  for (size_t i = 0; i < w->n; i++) w->ring[i].idx = INT64_MIN;
  w->fast_until = -INFINITY;
  return 0;
}

static void win_clear(win *w) {
  for (size_t i = 0; i < w->n; i++) w->ring[i].ok = w->ring[i].fail = 0;
  w->ok = w->fail = 0;
}

/* Buckets below lo leave the window: each is subtracted exactly once. */
static void win_expire(win *w, int64_t lo) {
  if ((uint64_t)(lo - w->tail) >= w->n) {
    win_clear(w);
  } else {
    for (int64_t i = w->tail; i < lo; i++) {
      slot *s = &w->ring[umod(i, w->n)];
      if (s->idx != i) continue;
      w->ok -= s->ok;
      w->fail -= s->fail;
      s->ok = s->fail = 0;
    }
  }
  w->tail = lo;
}

/* Move the window so that it ends at now. Times before the latest one leave it
 * unchanged (head and tail never move back). The fast path is one compare: the
 * slow path computes the exact indices and is taken near every boundary. */
static void win_advance(win *w, double now) {
  if (now < w->fast_until) return;
  int64_t hi = idx_floor(now / w->res), lo = idx_ceil((now - w->len) / w->res);
  if (!w->started) {
    w->started = 1;
    w->head = hi;
    w->tail = lo;
  } else {
    if (lo > w->tail) win_expire(w, lo);
    if (hi > w->head) w->head = hi;
  }
  slot *s = &w->ring[umod(w->head, w->n)];
  if (s->idx != w->head) { /* a stale slot: its counts were zeroed on expiry */
    s->idx = w->head;
    s->ok = s->fail = 0;
  }
  w->head_slot = s;
  double guard = w->res * 1e-6 + fabs(now) * 1e-12;
  w->fast_until = fmin((double)(w->head + 1) * w->res, (double)w->tail * w->res + w->len) - guard;
}

/* Add at an explicit time (imports: any order). Dropped if it left the window. */
static void win_add_at(win *w, double t, uint64_t ok, uint64_t fail) {
  win_advance(w, t);
  int64_t k = idx_floor(t / w->res);
  if (k < w->tail || k > w->head) return;
  slot *s = &w->ring[umod(k, w->n)];
  if (s->idx != k) {
    s->idx = k;
    s->ok = s->fail = 0;
  }
  s->ok += ok;
  s->fail += fail;
  w->ok += ok;
  w->fail += fail;
}

/* --- exact status arithmetic --------------------------------------------- */

/* Saturating 128-bit product: operands here are < 2^64 * 2^60; saturation only
 * matters for absurd counts and then errs on "above threshold". */
static u128 mul(u128 a, u128 b) {
  u128 r;
  return __builtin_mul_overflow(a, b, &r) ? ~(u128)0 : r;
}

typedef struct exact {
  uint64_t n, f;
  u128 B;   /* budget_total * 1e9 */
  u128 R;   /* budget_remaining * 1e9 */
  u128 Bn;  /* total * (1 - target) * 1e9: the burn rate's denominator */
} exact;

static exact exact_of(const key *k, uint64_t n, uint64_t f) {
  exact e = {.n = n, .f = f};
  u128 allow = (u128)(CR_PPB - k->target);
  e.Bn = (u128)n * allow;
  e.B = k->expected ? (u128)k->expected * allow : e.Bn;
  u128 F = (u128)f * CR_PPB;
  e.R = e.B > F ? e.B - F : 0;
  return e;
}

/* remaining fraction < p / 1e9; the seed's fraction is 1 or 0 with no budget */
static int frac_below(const exact *e, int64_t p) {
  if (e->B == 0) return (u128)(e->f ? 0 : CR_PPB) < (u128)p;
  return mul(e->R, CR_PPB) < mul((u128)p, e->B);
}

static int exhausted(const exact *e) { return e->B == 0 ? e->f > 0 : e->R == 0; }

/* burn rate > p / 1e9, i.e. f / (n (1 - target)) > p / 1e9 */
static int burn_above(const exact *e, int64_t p) {
  if (e->Bn == 0) return 0; /* the seed's burn rate is 0 then */
  return mul(mul(e->f, CR_PPB), CR_PPB) > mul((u128)p, e->Bn);
}

static int status_of(const cr_budget *b, const key *k) {
  const exact e = exact_of(k, k->w[0].ok + k->w[0].fail, k->w[0].fail);
  if (b->cfg.min_events && e.n < b->cfg.min_events) return CR_BUDGET_HEALTHY;
  if (exhausted(&e)) return CR_BUDGET_EXHAUSTED;
  if (frac_below(&e, b->cfg.critical_ppb)) return CR_BUDGET_CRITICAL;
  if (frac_below(&e, b->cfg.warning_ppb)) return CR_BUDGET_WARNING;
  return CR_BUDGET_HEALTHY;
}

static int window_burn_above(const key *k, const win *w, int64_t p) {
  const exact e = exact_of(k, w->ok + w->fail, w->fail);
  return burn_above(&e, p);
}

static int alert_fires(const cr_budget *b, const key *k, size_t i) {
  const cr_budget_alert_config *a = &b->cfg.alerts[i];
  if (b->cfg.min_events && k->w[0].ok + k->w[0].fail < b->cfg.min_events) return 0;
  if (b->alert_long[i] >= 0)
    return window_burn_above(k, &k->w[b->alert_long[i]], a->burn_ppb) &&
           window_burn_above(k, &k->w[b->alert_short[i]], a->burn_ppb);
  const exact e = exact_of(k, k->w[0].ok + k->w[0].fail, k->w[0].fail);
  return (a->burn_ppb > 0 && burn_above(&e, a->burn_ppb)) ||
         (a->consumed_ppb > 0 && frac_below(&e, CR_PPB - a->consumed_ppb));
}

static unsigned alerts_of(const cr_budget *b, const key *k) {
  unsigned bits = 0;
  for (size_t i = 0; i < b->cfg.nalerts; i++)
    if (alert_fires(b, k, i)) bits |= 1u << i;
  return bits;
}

/* --- config --------------------------------------------------------------- */

void cr_budget_config_default(cr_budget_config *c) {
  memset(c, 0, sizeof *c);
  c->window = 86400;
  c->target_ppb = 950000000;
  c->warning_ppb = 500000000;
  c->critical_ppb = 100000000;
}

static int ppb_ok(int64_t p) { return p >= 0 && p <= CR_PPB; }
static int len_ok(double s) { return isfinite(s) && s > 0; }

static int alert_check(const cr_budget_alert_config *a) {
  if (a->burn_ppb < 0 || a->burn_ppb > MAX_BURN_PPB || !ppb_ok(a->consumed_ppb)) return -EINVAL;
  if (a->long_window == 0 && a->short_window == 0) return 0; /* the simple rule */
  return len_ok(a->long_window) && len_ok(a->short_window) ? 0 : -EINVAL;
}

static int config_check(const cr_budget_config *c) {
  if (!len_ok(c->window) || !isfinite(c->resolution) || c->resolution < 0 ||
      c->resolution > c->window || c->nalerts > CR_BUDGET_MAX_ALERTS)
    return -EINVAL;
  double res = c->resolution > 0 ? c->resolution : c->window / RING_BUCKETS;
  if (c->window / res > MAX_RING) return -EINVAL;
  if (!ppb_ok(c->target_ppb) || !ppb_ok(c->warning_ppb) || !ppb_ok(c->critical_ppb))
    return -EINVAL;
  for (size_t i = 0; i < c->nalerts; i++)
    if (alert_check(&c->alerts[i]) < 0) return -EINVAL;
  return 0;
}

/* Window layout shared by all keys: 0 the budget window, then the long and
 * short windows of each multiwindow alert. */
static void layout(cr_budget *b) {
  b->nwin = 1;
  b->win_len[0] = b->cfg.window;
  b->win_res[0] = b->cfg.resolution > 0 ? b->cfg.resolution : b->cfg.window / RING_BUCKETS;
  double min_res = b->win_res[0];
  for (size_t i = 0; i < b->cfg.nalerts; i++) {
    const cr_budget_alert_config *a = &b->cfg.alerts[i];
    b->alert_long[i] = b->alert_short[i] = -1;
    if (a->long_window == 0) continue;
    b->alert_long[i] = (int)b->nwin;
    b->alert_short[i] = (int)b->nwin + 1;
    b->win_len[b->nwin] = a->long_window;
    b->win_res[b->nwin++] = a->long_window / RING_BUCKETS;
    b->win_len[b->nwin] = a->short_window;
    b->win_res[b->nwin++] = a->short_window / RING_BUCKETS;
    min_res = fmin(min_res, a->short_window / RING_BUCKETS);
    min_res = fmin(min_res, a->long_window / RING_BUCKETS);
  }
  b->max_time = min_res * 4e15; /* keeps indices far from int64 limits */
}

static void key_free(key *k, size_t nwin) {
  if (!k) return;
  if (k->w)
    for (size_t j = 0; j < nwin; j++) free(k->w[j].ring);
  free(k->w);
  free(k->name);
  free(k);
}

static key *key_new(const cr_budget *b, const char *name) {
  key *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->name = strdup(name);
  k->w = calloc(b->nwin, sizeof *k->w);
  k->target = b->cfg.target_ppb;
  if (!k->name || !k->w) goto fail;
  for (size_t j = 0; j < b->nwin; j++)
    if (win_init(&k->w[j], b->win_len[j], b->win_res[j]) < 0) goto fail;
  return k;
fail:
  key_free(k, b->nwin);
  return NULL;
}

int cr_budget_new(const cr_budget_config *c, cr_budget **out) {
  *out = NULL;
  if (config_check(c) < 0) return -EINVAL;
  cr_budget *b = calloc(1, sizeof *b);
  if (!b) return -ENOMEM;
  b->cfg = *c;
  if (!b->cfg.max_keys) b->cfg.max_keys = DEFAULT_MAX_KEYS;
  b->now = -INFINITY;
  for (size_t i = 0; i < c->nalerts; i++) b->cfg.alerts[i].name = NULL;
  for (size_t i = 0; i < c->nalerts; i++)
    if (!(b->cfg.alerts[i].name = strdup(c->alerts[i].name ? c->alerts[i].name : "")))
      goto fail;
  layout(b);
  b->keys = calloc(b->cfg.max_keys, sizeof *b->keys);
  b->tr = calloc(b->cfg.max_keys * (1 + b->cfg.nalerts), sizeof *b->tr);
  if (!b->keys || !b->tr || !(b->keys[0] = key_new(b, CR_BUDGET_ALL))) goto fail;
  b->nkeys = 1;
  *out = b;
  return 0;
fail:
  cr_budget_free(b);
  return -ENOMEM;
}

void cr_budget_free(cr_budget *b) {
  if (!b) return;
  for (size_t i = 0; i < b->nkeys; i++) key_free(b->keys[i], b->nwin);
  for (size_t i = 0; i < b->cfg.nalerts; i++) free((char *)b->cfg.alerts[i].name);
  free(b->keys);
  free(b->tr);
  free(b);
}

/* --- keys ------------------------------------------------------------------ */

/* Linear search: a pipeline has a handful of CAPTCHA types (max_keys bounds it),
 * and the cache makes a burst of one type a single strcmp. */
static key *key_find(cr_budget *b, const char *name) {
  if (b->last && strcmp(b->last->name, name) == 0) return b->last;
  for (size_t i = 0; i < b->nkeys; i++)
    if (strcmp(b->keys[i]->name, name) == 0) return b->last = b->keys[i];
  return NULL;
}

static int key_get(cr_budget *b, const char *name, key **out) {
  if (!name || !*name || strlen(name) > CR_BUDGET_MAX_KEY) return -EINVAL;
  if ((*out = key_find(b, name))) return 0;
  if (b->nkeys == b->cfg.max_keys) return -ENOSPC;
  key *k = key_new(b, name);
  if (!k) return -ENOMEM;
  if (isfinite(b->now)) /* start the new key's windows at the tracker's time */
    for (size_t j = 0; j < b->nwin; j++) win_advance(&k->w[j], b->now);
  b->keys[b->nkeys++] = b->last = *out = k;
  return 0;
}

int cr_budget_key_config(cr_budget *b, const char *name, int64_t target_ppb, uint64_t expected) {
  if (!ppb_ok(target_ppb)) return -EINVAL;
  key *k;
  int rc = key_get(b, name, &k);
  if (rc < 0) return rc;
  k->target = target_ppb;
  k->expected = expected;
  return 0;
}

size_t cr_budget_nkeys(const cr_budget *b) { return b->nkeys; }
const char *cr_budget_key(const cr_budget *b, size_t i) {
  return i < b->nkeys ? b->keys[i]->name : NULL;
}
const cr_budget_config *cr_budget_get_config(const cr_budget *b) { return &b->cfg; }
double cr_budget_now(const cr_budget *b) { return b->now; }

double cr_budget_tick(const cr_budget *b) {
  double t = b->win_res[0];
  for (size_t j = 1; j < b->nwin; j++) t = fmin(t, b->win_res[j]);
  return t;
}

size_t cr_budget_memory(const cr_budget *b) {
  size_t per_key = sizeof(key) + b->nwin * sizeof(win);
  for (size_t j = 0; j < b->nwin; j++) per_key += ((size_t)ceil(b->win_len[j] / b->win_res[j] - 1e-9) + 2) * sizeof(slot);
  return sizeof *b + b->cfg.max_keys * (sizeof(key *) + (1 + b->cfg.nalerts) * sizeof(cr_budget_transition)) +
         b->nkeys * per_key;
}

/* --- record, report, evaluate ---------------------------------------------- */

static int time_check(const cr_budget *b, double now) {
  if (!isfinite(now) || fabs(now) > b->max_time) return -EINVAL;
  return now < b->now ? -ERANGE : 0;
}

static void key_add(cr_budget *b, key *k, double now, uint64_t ok, uint64_t fail) {
  for (size_t j = 0; j < b->nwin; j++) {
    win *w = &k->w[j];
    win_advance(w, now); /* now >= every earlier time: it falls in head */
    w->head_slot->ok += ok;
    w->head_slot->fail += fail;
    w->ok += ok;
    w->fail += fail;
  }
}

int cr_budget_record_n(cr_budget *b, const char *name, uint64_t ok, uint64_t fail, double now) {
  int rc = time_check(b, now);
  if (rc == -ERANGE && now < b->now - b->cfg.window) return CR_BUDGET_IGNORED;
  if (rc < 0) return rc;
  key *k = NULL;
  if (name && strcmp(name, CR_BUDGET_ALL) != 0 && (rc = key_get(b, name, &k)) < 0) return rc;
  b->now = now;
  key_add(b, b->keys[0], now, ok, fail);
  if (k) key_add(b, k, now, ok, fail);
  return 0;
}

int cr_budget_record(cr_budget *b, const char *name, int ok, double now) {
  return cr_budget_record_n(b, name, ok ? 1 : 0, ok ? 0 : 1, now);
}

static void key_advance(cr_budget *b, key *k, double now) {
  for (size_t j = 0; j < b->nwin; j++) win_advance(&k->w[j], now);
}

static void report_fill(const cr_budget *b, const key *k, cr_budget_report *r) {
  const win *w = &k->w[0];
  const exact e = exact_of(k, w->ok + w->fail, w->fail);
  memset(r, 0, sizeof *r);
  r->key = k->name;
  r->status = status_of(b, k);
  r->slo_target = (double)k->target / CR_PPB;
  r->total_events = e.n;
  r->successes = w->ok;
  r->failures = w->fail;
  r->current_rate = e.n ? (double)w->ok / (double)e.n : 1.0;
  r->budget_total = (double)e.B / CR_PPB;
  r->budget_remaining = (double)e.R / CR_PPB;
  if (e.B == 0) r->budget_remaining_pct = e.f ? 0 : 100;
  else r->budget_remaining_pct = (double)mul(e.R, 100) / (double)e.B;
  r->burn_rate = e.Bn ? (double)mul(e.f, CR_PPB) / (double)e.Bn : 0;
  r->window = w->len;
  if (exhausted(&e)) r->time_to_exhaustion = 0;
  else if (!e.f) r->time_to_exhaustion = INFINITY;
  else r->time_to_exhaustion = r->budget_remaining * w->len / (double)e.f;
  r->min_events_met = !b->cfg.min_events || e.n >= b->cfg.min_events;
  r->expected_events = k->expected;
  r->alerts_firing = alerts_of(b, k);
}

/* A key never recorded: what an empty tracker with the default target says. */
static void report_empty(const cr_budget *b, const char *name, cr_budget_report *r) {
  memset(r, 0, sizeof *r);
  r->key = name;
  r->slo_target = (double)b->cfg.target_ppb / CR_PPB;
  r->current_rate = 1.0;
  r->budget_remaining_pct = 100;
  r->window = b->cfg.window;
  r->time_to_exhaustion = INFINITY;
  r->min_events_met = !b->cfg.min_events;
}

int cr_budget_report_get(cr_budget *b, const char *name, double now, cr_budget_report *r) {
  int rc = time_check(b, now);
  if (rc < 0) return rc;
  key *k = key_find(b, name ? name : CR_BUDGET_ALL);
  if (!k) {
    report_empty(b, name, r);
    return -ENOENT;
  }
  b->now = now;
  key_advance(b, k, now);
  report_fill(b, k, r);
  return 0;
}

int cr_budget_evaluate(cr_budget *b, double now, const cr_budget_transition **out) {
  int rc = time_check(b, now);
  if (rc < 0) return rc;
  b->now = now;
  size_t n = 0;
  for (size_t i = 0; i < b->nkeys; i++) {
    key *k = b->keys[i];
    key_advance(b, k, now);
    int st = status_of(b, k);
    if (st != k->status)
      b->tr[n++] = (cr_budget_transition){.key = k->name, .alert = -1, .from = k->status, .to = st};
    k->status = st;
    unsigned bits = alerts_of(b, k), changed = bits ^ k->firing;
    for (size_t a = 0; a < b->cfg.nalerts; a++)
      if (changed & (1u << a))
        b->tr[n++] = (cr_budget_transition){.key = k->name, .alert = (int)a,
                                            .from = !(bits >> a & 1), .to = bits >> a & 1};
    k->firing = bits;
  }
  *out = b->tr;
  return (int)n;
}

/* --- names ---------------------------------------------------------------------- */

static const char *const status_names[] = {"healthy", "warning", "critical", "exhausted"};

const char *cr_budget_status_name(int s) {
  return s >= 0 && s <= CR_BUDGET_EXHAUSTED ? status_names[s] : "unknown";
}

int cr_budget_status_parse(const char *name) {
  for (int s = 0; s <= CR_BUDGET_EXHAUSTED; s++)
    if (strcmp(name, status_names[s]) == 0) return s;
  return -1;
}

/* --- persistence ------------------------------------------------------------------ */

/* Windows of equal length hold the same events: export the first only. */
static int first_of_len(const cr_budget *b, size_t j) {
  for (size_t i = 0; i < j; i++)
    if (b->win_len[i] == b->win_len[j]) return 0;
  return 1;
}

static int win_export(const win *w, const char *name, cr_budget_bucket_fn fn, void *ud) {
  if (!w->started) return 0;
  for (int64_t i = w->tail; i <= w->head; i++) {
    const slot *s = &w->ring[umod(i, w->n)];
    if (s->idx != i || (!s->ok && !s->fail)) continue;
    int rc = fn(ud, name, w->len, (double)i * w->res, s->ok, s->fail);
    if (rc) return rc;
  }
  return 0;
}

int cr_budget_export(cr_budget *b, cr_budget_bucket_fn fn, void *ud) {
  for (size_t i = 0; i < b->nkeys; i++) {
    key *k = b->keys[i];
    if (isfinite(b->now)) key_advance(b, k, b->now);
    for (size_t j = 0; j < b->nwin; j++) {
      if (!first_of_len(b, j)) continue;
      int rc = win_export(&k->w[j], k->name, fn, ud);
      if (rc) return rc;
    }
  }
  return 0;
}

int cr_budget_import(cr_budget *b, const char *name, double window, double t, uint64_t ok,
                     uint64_t fail) {
  if (!isfinite(t) || fabs(t) > b->max_time || !len_ok(window)) return -EINVAL;
  key *k;
  int rc = key_get(b, name, &k);
  if (rc < 0) return rc;
  for (size_t j = 0; j < b->nwin; j++)
    if (fabs(b->win_len[j] - window) <= 1e-9 * window) win_add_at(&k->w[j], t, ok, fail);
  if (t > b->now) b->now = t;
  return 0;
}
