/*
 * dedup.h: request dedup cache (pure C, no Lua, no libuv).
 *
 * key -> entry, each in one state:
 *   SOLVING  a leader holds the lock (token) for solving_ttl; callers park on it
 *   SOLVED   the leader's value, reused for solved_ttl
 *   ERROR    the leader's error, reused for error_ttl (only with cache_errors;
 *            otherwise an error wakes the waiters and the next caller leads)
 *
 * Values are opaque (the Lua binding keeps a refcounted registry ref); the cache
 * holds one reference per stored value and calls `release` when it drops it.
 * Parked waiters are handed the leader's value through `wake` (the binding takes
 * its own reference there).
 *
 * Every TTL is fixed per state, so the entries of one state expire in the order
 * they entered it: three FIFO lists make the next expiry O(1) and a sweep
 * O(expired). Every call sweeps first, so an expired lock is never honoured; the
 * binding's timer only matters for waking waiters of a leader that went silent
 * and for giving memory back while idle. max_entries evicts the least recently
 * used finished entry; SOLVING entries are never evicted (each is a running
 * leader, so they are bounded by the caller's concurrency).
 *
 * Seam for shared backends (Redis SET NX + TTL, PostgreSQL advisory locks):
 * begin/finish/abort are the three operations a backend implements; the waiters
 * stay local to the process.
 */
#ifndef CR_DEDUP_H
#define CR_DEDUP_H

#include <stddef.h>
#include <stdint.h>

enum {
  CR_DEDUP_OK = 0,
  CR_DEDUP_EINVAL = -1,
  CR_DEDUP_ENOMEM = -2,
  CR_DEDUP_ESTALE = -3,     /* finish/abort by a leader that lost its lock */
  CR_DEDUP_ELOCK = -4,      /* waiter: the leader outlived solving_ttl */
  CR_DEDUP_EABORT = -5,     /* waiter: the leader was cancelled (or dropped) */
  CR_DEDUP_ECLOSED = -6     /* waiter: the cache was closed */
};

/* What cr_dedup_begin decided; also the stats' source breakdown. */
enum { CR_DEDUP_LEAD = 0, CR_DEDUP_HIT, CR_DEDUP_WAIT, CR_DEDUP_NSOURCES };
enum { CR_DEDUP_SOLVING = 0, CR_DEDUP_SOLVED, CR_DEDUP_ERROR, CR_DEDUP_NSTATES };

typedef struct cr_dedup_entry cr_dedup_entry;
typedef struct cr_dedup_waiter cr_dedup_waiter;

struct cr_dedup_waiter {
  cr_dedup_waiter *prev, *next;
  cr_dedup_entry *entry;     /* NULL once woken or removed */
  int status;                /* at wake: 0 value ok, 1 value is an error, or CR_DEDUP_E* */
  void *value;               /* at wake: the leader's value (borrowed during wake) */
  void *data;                /* the binding's */
};

typedef struct cr_dedup_link { cr_dedup_entry *prev, *next; } cr_dedup_link;

struct cr_dedup_entry {
  cr_dedup_entry *chain;           /* hash bucket */
  cr_dedup_link exp;               /* expiry list of its state */
  cr_dedup_link lru;               /* finished entries only */
  uint64_t hash, lock;             /* lock: the leader's token while SOLVING */
  double expires;
  int state;
  void *value;                     /* SOLVED/ERROR */
  cr_dedup_waiter *waiters, *waiters_tail;
  size_t keylen;
  char key[];
};

typedef struct cr_dedup_list { cr_dedup_entry *head, *tail; } cr_dedup_list;

typedef struct cr_dedup_config {
  double solving_ttl, solved_ttl, error_ttl;
  size_t max_entries;            /* 0: unbounded */
  int cache_errors;
  void (*wake)(void *ud, cr_dedup_waiter *w);  /* w->status/value set; w already unlinked */
  void (*release)(void *ud, void *value);
  void *ud;
} cr_dedup_config;

typedef struct cr_dedup_stats {
  uint64_t total_requests;
  uint64_t by_source[CR_DEDUP_NSOURCES];  /* api, dedup_cache, dedup_wait */
  uint64_t errors;                         /* leaders that finished with an error */
  uint64_t aborted;                        /* leaders that raised or were cancelled */
  uint64_t lock_expired;                   /* leaders that outlived solving_ttl */
  uint64_t stale_finishes;                 /* results of such leaders, not cached */
  uint64_t evicted, expired;
} cr_dedup_stats;

typedef struct cr_dedup {
  cr_dedup_config cfg;
  cr_dedup_entry **buckets;
  size_t nbuckets, count, waiting;
  cr_dedup_list exp[CR_DEDUP_NSTATES];
  cr_dedup_list lru;                       /* head: least recently used */
  size_t finished;                         /* entries on the lru list */
  uint64_t next_lock;
  int closed;
  cr_dedup_stats stats;
} cr_dedup;

int cr_dedup_init(cr_dedup *d, const cr_dedup_config *cfg);
/* Wakes every waiter with CR_DEDUP_ECLOSED, releases every value, frees entries.
 * Idempotent. */
void cr_dedup_close(cr_dedup *d);

/* One request for key at now. Returns the source (CR_DEDUP_LEAD, HIT, WAIT) or a
 * negative error.
 *   LEAD: *lock is the caller's token for cr_dedup_finish/abort.
 *   HIT:  *value is the cached value (borrowed: take a reference before any
 *         other call), *is_error tells a cached error (cache_errors) from a result.
 *   WAIT: w is parked; `wake` resolves it later (or cr_dedup_remove). */
int cr_dedup_begin(cr_dedup *d, const char *key, size_t keylen, double now,
                   cr_dedup_waiter *w, uint64_t *lock, void **value, int *is_error);
/* The leader's outcome: waiters wake with (is_error, value); a success is cached
 * for solved_ttl, an error for error_ttl if cache_errors, else the entry goes.
 * The cache takes a reference to value only if it keeps it (it then calls
 * release later). Returns 1 if the value was kept, 0 if not, CR_DEDUP_ESTALE if
 * this lock was lost (nothing changes). */
int cr_dedup_finish(cr_dedup *d, const char *key, size_t keylen, uint64_t lock,
                    int is_error, void *value, double now);
/* The leader was cancelled or dropped (a raise is an error result, through
 * cr_dedup_finish): waiters wake with CR_DEDUP_EABORT; the entry goes so the
 * next caller leads. */
int cr_dedup_abort(cr_dedup *d, const char *key, size_t keylen, uint64_t lock, double now);
/* A parked waiter's task was cancelled. */
void cr_dedup_remove(cr_dedup *d, cr_dedup_waiter *w);
/* Drop every entry whose TTL has passed (waiters of a lost lock wake with
 * CR_DEDUP_ELOCK). Returns the number dropped. */
size_t cr_dedup_sweep(cr_dedup *d, double now);
/* Absolute time of the next expiry; INFINITY when empty. */
double cr_dedup_next_expiry(const cr_dedup *d);
/* savings_pct = 100 * (hits + waits) / total (0 when total is 0). */
double cr_dedup_savings_pct(const cr_dedup *d);
const char *cr_dedup_source_name(int source);
const char *cr_dedup_strerror(int err);

/* The dedup key: SHA-256 (libcrypto EVP) over a canonical serialization,
 * "cr-dedup-v1" then one length-prefixed "name=value" record per field. The
 * caller feeds fields in a fixed (sorted) order; bytes fields (an image) enter
 * as the hex SHA-256 of the bytes, so a 600 kB image costs one extra pass.
 * Returns 0 or CR_DEDUP_ENOMEM; _end writes 64 hex digits and a NUL. */
typedef struct cr_dedup_key { void *md; int failed; } cr_dedup_key;
int cr_dedup_key_begin(cr_dedup_key *k);
void cr_dedup_key_field(cr_dedup_key *k, const char *name, const char *value, size_t len);
void cr_dedup_key_bytes(cr_dedup_key *k, const char *name, const void *bytes, size_t len);
int cr_dedup_key_end(cr_dedup_key *k, char hex[65]);   /* also frees; call exactly once */
/* SHA-256 of bytes as 64 hex digits and a NUL. Returns 0 or CR_DEDUP_ENOMEM. */
int cr_sha256_hex(const void *bytes, size_t len, char hex[65]);
/* Decode base64 (whitespace allowed) into out (at least 3*len/4+3 bytes).
 * Returns the decoded length or CR_DEDUP_EINVAL. */
long cr_base64_decode(const char *in, size_t len, unsigned char *out);

#endif
