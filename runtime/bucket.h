/*
 * bucket.h: token bucket with a FIFO wait queue (pure C, no Lua, no libuv).
 *
 * Time is passed in (double seconds, monotonic). Refill is continuous:
 * tokens = min(capacity, tokens + elapsed * rate). Only the head of the wait
 * queue may take tokens, so a large request at the head is never starved by
 * small ones behind it, and two waiters can never take the same token (the
 * seed's JS version does). Invariant (test_bucket.c checks it): in any window
 * [t, t+T], granted tokens <= capacity + integral of rate over the window,
 * hence <= capacity + max_rate * T.
 *
 * The caller owns waiter memory. The usual loop in a binding:
 *
 *   cr_bucket_acquire(b, w, n, deadline, now);     // w->status says granted or queued
 *   ... later, on the one timer of the bucket:
 *   while ((w = cr_bucket_pop(b, now)))             // granted or timed out, FIFO
 *       resolve(w);                                 // w->status: 0 or CR_BUCKET_E*
 *   due = cr_bucket_next_event(b, now);             // re-arm the timer (INFINITY: stop)
 *
 * Seam for a shared (Redis) backend: the token store is reached only through
 * cr_bucket_store_ops, and only for the head waiter (or an empty-queue try), which
 * is what one atomic server-side "refill and take n, else tell me the wait" script
 * does. The queue, deadlines and stats stay local to the process. An asynchronous
 * store would answer `take` with CR_BUCKET_EINPROGRESS and complete later; only the
 * in-process store exists today.
 */
#ifndef CR_BUCKET_H
#define CR_BUCKET_H

#include <stddef.h>
#include <stdint.h>

enum {
  CR_BUCKET_OK = 0,
  CR_BUCKET_EINVAL = -1,      /* bad argument (n <= 0, n > capacity, rate < 0, ...) */
  CR_BUCKET_EAGAIN = -2,      /* try_acquire: not enough tokens, queue not empty, or paused */
  CR_BUCKET_EFULL = -3,       /* wait queue at max_waiters */
  CR_BUCKET_ETIMEDOUT = -4,   /* waiter's deadline passed */
  CR_BUCKET_ECLOSED = -5,     /* bucket closed while waiting */
  CR_BUCKET_ETOOBIG = -6,     /* capacity shrank below a queued request */
  CR_BUCKET_ENOMEM = -7,
  CR_BUCKET_EINPROGRESS = -8  /* reserved for asynchronous stores */
};

enum { CR_BW_IDLE = 0, CR_BW_QUEUED, CR_BW_DONE };

typedef struct cr_bucket_waiter cr_bucket_waiter;
struct cr_bucket_waiter {
  cr_bucket_waiter *prev, *next; /* FIFO queue links */
  double n;                      /* tokens requested */
  double enqueued;               /* time of cr_bucket_acquire */
  double deadline;               /* absolute; INFINITY: no timeout */
  size_t heap_index;             /* position in the deadline heap (timed waiters) */
  int state;                     /* CR_BW_* */
  int status;                    /* when DONE: 0 granted or CR_BUCKET_E* */
  void *data;                    /* the binding's */
};

/* The token store. `take` refills to `now` and takes n tokens, returning 0, or
 * returns CR_BUCKET_EAGAIN and sets *wait to the seconds until n would be
 * available at the current rate (INFINITY if never). */
typedef struct cr_bucket_store_ops {
  const char *name;
  int (*take)(void *store, double n, double now, double *wait);
  void (*give)(void *store, double n, double now);        /* refund, capped */
  double (*tokens)(void *store, double now);
  void (*set_rate)(void *store, double rate, double now);
  void (*set_capacity)(void *store, double capacity, double now);
} cr_bucket_store_ops;

/* The in-process store. */
typedef struct cr_bucket_local {
  double capacity, rate, tokens, last;
} cr_bucket_local;
extern const cr_bucket_store_ops cr_bucket_local_ops;

typedef struct cr_bucket_stats {
  uint64_t granted;        /* successful acquisitions (immediate or after a wait) */
  double granted_tokens;
  uint64_t rejected;       /* try_acquire refusals, queue full, timeouts */
  uint64_t timeouts;
  uint64_t queue_full;
  uint64_t cancelled;      /* waiters removed by their owner (task cancelled) */
  uint64_t waited;         /* grants that had to wait */
  double total_wait, max_wait;
} cr_bucket_stats;

typedef struct cr_bucket {
  const cr_bucket_store_ops *ops;
  void *store;
  cr_bucket_local local;          /* the store when ops == &cr_bucket_local_ops */
  double capacity, rate;          /* mirrors of the store's, for validation and reads */
  cr_bucket_waiter *head, *tail;
  cr_bucket_waiter *done, *done_tail; /* resolved off the head (closed, too big): pop drains it */
  size_t waiting, max_waiters;    /* max_waiters 0: unbounded */
  cr_bucket_waiter **heap;        /* min-heap of timed waiters by deadline */
  size_t heap_len, heap_cap;
  int paused, closed;
  cr_bucket_stats stats;
} cr_bucket;

/* Starts full. capacity > 0, rate >= 0 (0: only the burst). */
int cr_bucket_init(cr_bucket *b, double capacity, double rate, size_t max_waiters, double now);
/* Frees the heap; waiters still queued are left untouched (call cr_bucket_close first). */
void cr_bucket_free(cr_bucket *b);

/* Take n tokens now or fail with CR_BUCKET_EAGAIN. Never jumps the queue. */
int cr_bucket_try_acquire(cr_bucket *b, double n, double now);
/* Take n tokens now (w->state = CR_BW_DONE, status 0) or queue w (CR_BW_QUEUED).
 * deadline is absolute (INFINITY: none; <= now: no wait, times out at once).
 * Returns 0, CR_BUCKET_EINVAL, CR_BUCKET_EFULL, CR_BUCKET_ECLOSED or ENOMEM. */
int cr_bucket_acquire(cr_bucket *b, cr_bucket_waiter *w, double n, double deadline, double now);
/* Next waiter resolved at `now` (granted FIFO at the head, or timed out), removed
 * from the queue with state DONE; NULL when there is none. */
cr_bucket_waiter *cr_bucket_pop(cr_bucket *b, double now);
/* Absolute time of the next event (head grantable or a deadline); INFINITY if none. */
double cr_bucket_next_event(cr_bucket *b, double now);
/* Remove a queued waiter (its task was cancelled). */
void cr_bucket_remove(cr_bucket *b, cr_bucket_waiter *w);
/* Give back tokens of a grant that was never used (grant raced a cancel). */
void cr_bucket_refund(cr_bucket *b, double n, double now);

int cr_bucket_set_rate(cr_bucket *b, double rate, double now);
/* Shrinking clamps the tokens; queued waiters asking more than the new capacity
 * resolve with CR_BUCKET_ETOOBIG through cr_bucket_pop. */
int cr_bucket_set_capacity(cr_bucket *b, double capacity, double now);
void cr_bucket_pause(cr_bucket *b);
void cr_bucket_resume(cr_bucket *b);
/* Every queued waiter resolves with CR_BUCKET_ECLOSED through cr_bucket_pop;
 * later acquisitions fail with CR_BUCKET_ECLOSED. */
void cr_bucket_close(cr_bucket *b);

double cr_bucket_tokens(cr_bucket *b, double now);
const char *cr_bucket_strerror(int err);

#endif
