/* test_dedup.c: dedup cache core with a fake clock: leader/waiters, TTLs per
 * state, lost locks, aborts, LRU eviction, sweep, stats; the key (SHA-256). */
#include "dedup.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>

/* Values are ints with a refcount, like the binding's registry refs. */
typedef struct { int refs, id; } val;
static int woken, released;
static cr_dedup_waiter *last_woken;

static void on_wake(void *ud, cr_dedup_waiter *w) {
  (void)ud;
  woken++;
  last_woken = w;
  if (w->value) ((val *)w->value)->refs++;
}
static void on_release(void *ud, void *v) {
  (void)ud;
  released++;
  ((val *)v)->refs--;
}

static cr_dedup make(int cache_errors, size_t max_entries) {
  cr_dedup d;
  cr_dedup_config c = {180, 60, 30, max_entries, cache_errors, on_wake, on_release, NULL};
  woken = released = 0;
  CHECK_EQ_INT(cr_dedup_init(&d, &c), 0);
  return d;
}

#define K(s) s, sizeof(s) - 1

static int begin(cr_dedup *d, const char *k, size_t n, double now, cr_dedup_waiter *w,
                 uint64_t *lock, void **v, int *is_err) {
  return cr_dedup_begin(d, k, n, now, w, lock, v, is_err);
}

static void test_leader_waiters_cache(void) {
  cr_dedup d = make(0, 0);
  cr_dedup_waiter w1 = {0}, w2 = {0};
  uint64_t lock = 0;
  void *v = NULL;
  int is_err = -1;
  val r = {1, 7};
  CHECK_EQ_INT(begin(&d, K("a"), 0, NULL, &lock, &v, &is_err), CR_DEDUP_LEAD);
  CHECK(lock != 0);
  CHECK_EQ_INT(begin(&d, K("a"), 1, &w1, &lock, &v, &is_err), CR_DEDUP_WAIT);
  CHECK_EQ_INT(begin(&d, K("a"), 2, &w2, &lock, &v, &is_err), CR_DEDUP_WAIT);
  CHECK_EQ_INT(d.waiting, 2);
  CHECK_EQ_INT(cr_dedup_finish(&d, K("a"), lock, 0, &r, 10), 1);
  r.refs++;                                     /* the cache kept it */
  CHECK_EQ_INT(woken, 2);
  CHECK(w1.value == &r && w1.status == 0 && w1.entry == NULL);
  CHECK(last_woken == &w2);                     /* FIFO */
  CHECK_EQ_INT(r.refs, 4);
  CHECK_EQ_INT(begin(&d, K("a"), 69.9, NULL, &lock, &v, &is_err), CR_DEDUP_HIT);
  CHECK(v == &r && is_err == 0);
  /* solved_ttl 60 from the finish at 10 */
  CHECK_NEAR(cr_dedup_next_expiry(&d), 70.0, 1e-12);
  CHECK_EQ_INT(begin(&d, K("a"), 70.0, NULL, &lock, &v, &is_err), CR_DEDUP_LEAD);
  CHECK_EQ_INT(released, 1);
  CHECK_EQ_INT(d.stats.total_requests, 5);
  CHECK_EQ_INT(d.stats.by_source[CR_DEDUP_LEAD], 2);
  CHECK_EQ_INT(d.stats.by_source[CR_DEDUP_HIT], 1);
  CHECK_EQ_INT(d.stats.by_source[CR_DEDUP_WAIT], 2);
  CHECK_NEAR(cr_dedup_savings_pct(&d), 60.0, 1e-12);
  CHECK_EQ_INT(d.stats.expired, 1);
  cr_dedup_close(&d);
  cr_dedup_close(&d);
}

/* Without cache_errors an error wakes the waiters and the next caller leads at
 * once (as in the seed); with it the error is served for error_ttl. */
static void test_errors(void) {
  cr_dedup d = make(0, 0);
  cr_dedup_waiter w = {0};
  uint64_t lock = 0;
  void *v;
  int e;
  val err = {1, 1};
  begin(&d, K("k"), 0, NULL, &lock, &v, &e);
  begin(&d, K("k"), 0, &w, &lock, &v, &e);
  CHECK_EQ_INT(cr_dedup_finish(&d, K("k"), lock, 1, &err, 5), 0);   /* not kept */
  CHECK(w.status == 1 && w.value == &err);
  CHECK_EQ_INT(d.count, 0);
  CHECK_EQ_INT(begin(&d, K("k"), 5, NULL, &lock, &v, &e), CR_DEDUP_LEAD);
  CHECK_EQ_INT(d.stats.errors, 1);
  cr_dedup_close(&d);

  d = make(1, 0);
  begin(&d, K("k"), 0, NULL, &lock, &v, &e);
  CHECK_EQ_INT(cr_dedup_finish(&d, K("k"), lock, 1, &err, 5), 1);
  CHECK_EQ_INT(begin(&d, K("k"), 34.9, NULL, &lock, &v, &e), CR_DEDUP_HIT);
  CHECK(v == &err && e == 1);
  CHECK_EQ_INT(begin(&d, K("k"), 35, NULL, &lock, &v, &e), CR_DEDUP_LEAD);  /* error_ttl 30 */
  cr_dedup_close(&d);
}

/* A leader that outlives solving_ttl loses the lock: its waiters wake with
 * ELOCK (never a hang), the next caller leads, and the old leader's late result
 * is not cached. */
static void test_lock_expiry(void) {
  cr_dedup d = make(0, 0);
  cr_dedup_waiter w = {0};
  uint64_t old = 0, lock = 0;
  void *v;
  int e;
  val late = {1, 2};
  begin(&d, K("k"), 0, NULL, &old, &v, &e);
  begin(&d, K("k"), 100, &w, &lock, &v, &e);
  CHECK_NEAR(cr_dedup_next_expiry(&d), 180.0, 1e-12);
  CHECK_EQ_INT(cr_dedup_sweep(&d, 179.9), 0);
  CHECK_EQ_INT(cr_dedup_sweep(&d, 180.0), 1);
  CHECK_EQ_INT(w.status, CR_DEDUP_ELOCK);
  CHECK(w.entry == NULL && w.value == NULL);
  CHECK_EQ_INT(begin(&d, K("k"), 181, NULL, &lock, &v, &e), CR_DEDUP_LEAD);
  CHECK(lock != old);
  CHECK_EQ_INT(cr_dedup_finish(&d, K("k"), old, 0, &late, 182), CR_DEDUP_ESTALE);
  CHECK_EQ_INT(cr_dedup_abort(&d, K("k"), old, 182), CR_DEDUP_ESTALE);
  CHECK_EQ_INT(late.refs, 1);
  CHECK_EQ_INT(d.stats.lock_expired, 1);
  CHECK_EQ_INT(d.stats.stale_finishes, 1);
  /* the lazy path: begin itself drops an expired lock */
  CHECK_EQ_INT(begin(&d, K("k"), 361, NULL, &old, &v, &e), CR_DEDUP_LEAD);
  cr_dedup_close(&d);
}

static void test_abort_and_remove(void) {
  cr_dedup d = make(0, 0);
  cr_dedup_waiter w1 = {0}, w2 = {0};
  uint64_t lock = 0, l2;
  void *v;
  int e;
  begin(&d, K("k"), 0, NULL, &lock, &v, &e);
  begin(&d, K("k"), 0, &w1, &l2, &v, &e);
  begin(&d, K("k"), 0, &w2, &l2, &v, &e);
  cr_dedup_remove(&d, &w1);                    /* w1's task was cancelled */
  cr_dedup_remove(&d, &w1);
  CHECK_EQ_INT(d.waiting, 1);
  CHECK_EQ_INT(cr_dedup_abort(&d, K("k"), lock, 1), 0);
  CHECK_EQ_INT(woken, 1);
  CHECK_EQ_INT(w2.status, CR_DEDUP_EABORT);
  CHECK_EQ_INT(d.count, 0);
  CHECK_EQ_INT(begin(&d, K("k"), 1, NULL, &lock, &v, &e), CR_DEDUP_LEAD);
  /* close wakes waiters too */
  begin(&d, K("k"), 1, &w1, &l2, &v, &e);
  cr_dedup_close(&d);
  CHECK_EQ_INT(w1.status, CR_DEDUP_ECLOSED);
  CHECK_EQ_INT(d.waiting, 0);
  CHECK_EQ_INT(begin(&d, K("k"), 1, &w1, &l2, &v, &e), CR_DEDUP_ECLOSED);
}

/* max_entries evicts the least recently used finished entry; a hit refreshes;
 * running leaders are never evicted. */
static void test_lru(void) {
  cr_dedup d = make(0, 3);
  val vals[8];
  uint64_t lock;
  void *v;
  int e;
  char key[2] = "a";
  for (int i = 0; i < 3; i++) {
    key[0] = (char)('a' + i);
    vals[i] = (val){1, i};
    begin(&d, key, 1, i, NULL, &lock, &v, &e);
    cr_dedup_finish(&d, key, 1, lock, 0, &vals[i], i);
  }
  CHECK_EQ_INT(begin(&d, K("a"), 3, NULL, &lock, &v, &e), CR_DEDUP_HIT);  /* a is fresh */
  CHECK_EQ_INT(begin(&d, K("d"), 4, NULL, &lock, &v, &e), CR_DEDUP_LEAD); /* evicts b */
  CHECK_EQ_INT(d.stats.evicted, 1);
  CHECK_EQ_INT(vals[1].refs, 0);
  CHECK_EQ_INT(begin(&d, K("c"), 5, NULL, &lock, &v, &e), CR_DEDUP_HIT);
  CHECK_EQ_INT(begin(&d, K("a"), 5, NULL, &lock, &v, &e), CR_DEDUP_HIT);
  CHECK_EQ_INT(begin(&d, K("e"), 6, NULL, &lock, &v, &e), CR_DEDUP_LEAD); /* evicts c */
  CHECK_EQ_INT(begin(&d, K("f"), 6, NULL, &lock, &v, &e), CR_DEDUP_LEAD); /* evicts a */
  CHECK_EQ_INT(begin(&d, K("g"), 6, NULL, &lock, &v, &e), CR_DEDUP_LEAD); /* only leaders left */
  CHECK_EQ_INT(d.count, 4);
  CHECK_EQ_INT(d.stats.evicted, 3);
  cr_dedup_close(&d);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(vals[i].refs, 0);
}

/* Many keys: the table grows, sweeps free everything, nothing leaks (ASan). */
static void test_many_keys(void) {
  cr_dedup d = make(0, 0);
  static val vals[5000];
  char key[32];
  uint64_t lock;
  void *v;
  int e;
  for (int i = 0; i < 5000; i++) {
    int n = snprintf(key, sizeof key, "key-%d", i);
    vals[i] = (val){1, i};
    CHECK(begin(&d, key, (size_t)n, i * 0.01, NULL, &lock, &v, &e) == CR_DEDUP_LEAD);
    if (i % 2) cr_dedup_finish(&d, key, (size_t)n, lock, 0, &vals[i], i * 0.01);
  }
  CHECK_EQ_INT(d.count, 5000);
  CHECK(d.nbuckets >= 4096);
  CHECK_EQ_INT(cr_dedup_sweep(&d, 1000), 5000);
  CHECK_EQ_INT(d.count, 0);
  CHECK_EQ_INT(released, 2500);
  CHECK(isinf(cr_dedup_next_expiry(&d)));
  cr_dedup_close(&d);
}

static void test_key(void) {
  char hex[65], a[65], b[65];
  CHECK_EQ_INT(cr_sha256_hex("abc", 3, hex), 0);
  CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  cr_dedup_key k;
  cr_dedup_key_begin(&k);
  cr_dedup_key_field(&k, "method", "turnstile", 9);
  cr_dedup_key_field(&k, "pageurl", "https://x/", 10);
  CHECK_EQ_INT(cr_dedup_key_end(&k, a), 0);
  CHECK_EQ_INT(strlen(a), 64);
  /* the length prefixes keep "ab"+"c" apart from "a"+"bc" */
  cr_dedup_key_begin(&k);
  cr_dedup_key_field(&k, "method", "turnstil", 8);
  cr_dedup_key_field(&k, "epageurl", "https://x/", 10);
  cr_dedup_key_end(&k, b);
  CHECK(strcmp(a, b) != 0);
  cr_dedup_key_begin(&k);
  cr_dedup_key_field(&k, "method", "turnstile", 9);
  cr_dedup_key_field(&k, "pageurl", "https://x/", 10);
  cr_dedup_key_end(&k, b);
  CHECK_STR(a, b);
  /* base64 with line breaks decodes to the same bytes */
  unsigned char out[64];
  CHECK_EQ_INT(cr_base64_decode("aGVsbG8g\nd29ybGQ=", 17, out), 11);
  CHECK(memcmp(out, "hello world", 11) == 0);
  CHECK_EQ_INT(cr_base64_decode("!!!!", 4, out), CR_DEDUP_EINVAL);
}

int main(void) {
  test_leader_waiters_cache();
  test_errors();
  test_lock_expiry();
  test_abort_and_remove();
  test_lru();
  test_many_keys();
  test_key();
  return CHECK_DONE();
}
