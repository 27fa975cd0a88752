/*
 * bucket.c: token bucket core. See bucket.h for the contract.
 *
 * Costs: acquire/pop are O(1) plus O(log W) for waiters with a deadline (a
 * binary heap keyed by deadline, so the binding needs one timer for the head's
 * refill and every timeout together); set_capacity is O(W) only when it shrinks.
 */
#include "bucket.h"

#include <math.h>
#include <stdlib.h>

/* Refill is computed in floating point; a due time computed as
 * last + (n - tokens) / rate can land one ulp short of n. Granting within
 * EPS of n keeps a timer from re-arming forever for a 1e-16 token, at a cost
 * of at most EPS tokens over the bound. */
#define EPS 1e-9

/* ---- the in-process store ---- */

static void local_refill(cr_bucket_local *s, double now) {
  if (now > s->last) {
    s->tokens += (now - s->last) * s->rate;
    if (s->tokens > s->capacity) s->tokens = s->capacity;
    s->last = now;
  }
}

static int local_take(void *store, double n, double now, double *wait) {
  cr_bucket_local *s = store;
  local_refill(s, now);
  if (s->tokens + EPS >= n) {
    s->tokens -= n;
    if (s->tokens < 0) s->tokens = 0;
    return CR_BUCKET_OK;
  }
  if (wait) *wait = s->rate > 0 ? (n - s->tokens) / s->rate : INFINITY;
  return CR_BUCKET_EAGAIN;
}

static void local_give(void *store, double n, double now) {
  cr_bucket_local *s = store;
  local_refill(s, now);
  s->tokens += n;
  if (s->tokens > s->capacity) s->tokens = s->capacity;
}

static double local_tokens(void *store, double now) {
  cr_bucket_local *s = store;
  local_refill(s, now);
  return s->tokens;
}

/* Tokens earned before the change are earned at the old rate. */
static void local_set_rate(void *store, double rate, double now) {
  cr_bucket_local *s = store;
  local_refill(s, now);
  s->rate = rate;
}

/* Growing does not add tokens (that would be a burst nobody earned). */
static void local_set_capacity(void *store, double capacity, double now) {
  cr_bucket_local *s = store;
  local_refill(s, now);
  s->capacity = capacity;
  if (s->tokens > capacity) s->tokens = capacity;
}

const cr_bucket_store_ops cr_bucket_local_ops = {
  "local", local_take, local_give, local_tokens, local_set_rate, local_set_capacity
};

/* ---- deadline heap ---- */

static void heap_set(cr_bucket *b, size_t i, cr_bucket_waiter *w) {
  b->heap[i] = w;
  w->heap_index = i;
}

static void heap_up(cr_bucket *b, size_t i) {
  cr_bucket_waiter *w = b->heap[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (b->heap[p]->deadline <= w->deadline) break;
    heap_set(b, i, b->heap[p]);
    i = p;
  }
  heap_set(b, i, w);
}

static void heap_down(cr_bucket *b, size_t i) {
  cr_bucket_waiter *w = b->heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= b->heap_len) break;
    if (c + 1 < b->heap_len && b->heap[c + 1]->deadline < b->heap[c]->deadline) c++;
    if (w->deadline <= b->heap[c]->deadline) break;
    heap_set(b, i, b->heap[c]);
    i = c;
  }
  heap_set(b, i, w);
}

static int heap_push(cr_bucket *b, cr_bucket_waiter *w) {
  if (b->heap_len == b->heap_cap) {
    size_t cap = b->heap_cap ? b->heap_cap * 2 : 16;
    cr_bucket_waiter **h = realloc(b->heap, cap * sizeof *h);
    if (!h) return CR_BUCKET_ENOMEM;
    b->heap = h;
    b->heap_cap = cap;
  }
  heap_set(b, b->heap_len++, w);
  heap_up(b, b->heap_len - 1);
  return 0;
}

static void heap_remove(cr_bucket *b, cr_bucket_waiter *w) {
  size_t i = w->heap_index;
  cr_bucket_waiter *last = b->heap[--b->heap_len];
  if (i == b->heap_len) return;
  heap_set(b, i, last);
  heap_up(b, i);
  heap_down(b, last->heap_index);
}

/* ---- queue ---- */

static void queue_unlink(cr_bucket *b, cr_bucket_waiter *w) {
  if (w->prev) w->prev->next = w->next; else b->head = w->next;
  if (w->next) w->next->prev = w->prev; else b->tail = w->prev;
  w->prev = w->next = NULL;
  if (isfinite(w->deadline)) heap_remove(b, w);
  b->waiting--;
}

static void finish(cr_bucket_waiter *w, int status) {
  w->state = CR_BW_DONE;
  w->status = status;
}

/* Resolved off the head (closed, too big): handed out first by cr_bucket_pop. */
static void move_to_done(cr_bucket *b, cr_bucket_waiter *w, int status) {
  queue_unlink(b, w);
  finish(w, status);
  if (b->done_tail) b->done_tail->next = w; else b->done = w;
  b->done_tail = w;
}

static void count_grant(cr_bucket *b, double n, double waited) {
  b->stats.granted++;
  b->stats.granted_tokens += n;
  if (waited > 0) {
    b->stats.waited++;
    b->stats.total_wait += waited;
    if (waited > b->stats.max_wait) b->stats.max_wait = waited;
  }
}

/* ---- public ---- */

int cr_bucket_init(cr_bucket *b, double capacity, double rate, size_t max_waiters, double now) {
  if (!(capacity > 0) || !isfinite(capacity) || !(rate >= 0) || !isfinite(rate))
    return CR_BUCKET_EINVAL;
  *b = (cr_bucket){0};
  b->local = (cr_bucket_local){capacity, rate, capacity, now};
  b->ops = &cr_bucket_local_ops;
  b->store = &b->local;
  b->capacity = capacity;
  b->rate = rate;
  b->max_waiters = max_waiters;
  return 0;
}

void cr_bucket_free(cr_bucket *b) {
  free(b->heap);
  b->heap = NULL;
  b->heap_len = b->heap_cap = 0;
}

static int check_n(cr_bucket *b, double n) {
  return (n > 0 && n <= b->capacity) ? 0 : CR_BUCKET_EINVAL;
}

int cr_bucket_try_acquire(cr_bucket *b, double n, double now) {
  if (b->closed) return CR_BUCKET_ECLOSED;
  if (check_n(b, n)) return CR_BUCKET_EINVAL;
  if (b->paused || b->head || b->ops->take(b->store, n, now, NULL) != 0) {
    b->stats.rejected++;
    return CR_BUCKET_EAGAIN;
  }
  count_grant(b, n, 0);
  return 0;
}

static int enqueue(cr_bucket *b, cr_bucket_waiter *w) {
  if (isfinite(w->deadline) && heap_push(b, w) != 0) return CR_BUCKET_ENOMEM;
  w->state = CR_BW_QUEUED;
  w->next = NULL;
  w->prev = b->tail;
  if (b->tail) b->tail->next = w; else b->head = w;
  b->tail = w;
  b->waiting++;
  return 0;
}

int cr_bucket_acquire(cr_bucket *b, cr_bucket_waiter *w, double n, double deadline, double now) {
  if (b->closed) return CR_BUCKET_ECLOSED;
  if (check_n(b, n) || isnan(deadline)) return CR_BUCKET_EINVAL;
  w->n = n;
  w->enqueued = now;
  w->deadline = deadline;
  w->prev = w->next = NULL;
  if (!b->paused && !b->head && b->ops->take(b->store, n, now, NULL) == 0) {
    finish(w, 0);
    count_grant(b, n, 0);
    return 0;
  }
  if (deadline <= now) {            /* timeout 0 means "do not wait" */
    finish(w, CR_BUCKET_ETIMEDOUT);
    b->stats.rejected++;
    b->stats.timeouts++;
    return 0;
  }
  if (b->max_waiters && b->waiting >= b->max_waiters) {
    b->stats.rejected++;
    b->stats.queue_full++;
    return CR_BUCKET_EFULL;
  }
  return enqueue(b, w);
}

static cr_bucket_waiter *pop_done(cr_bucket *b) {
  cr_bucket_waiter *w = b->done;
  b->done = w->next;
  if (!b->done) b->done_tail = NULL;
  w->next = NULL;
  return w;
}

cr_bucket_waiter *cr_bucket_pop(cr_bucket *b, double now) {
  if (b->done) return pop_done(b);
  cr_bucket_waiter *w = b->head;
  if (w && !b->paused && b->ops->take(b->store, w->n, now, NULL) == 0) {
    queue_unlink(b, w);
    finish(w, 0);
    count_grant(b, w->n, now - w->enqueued);
    return w;
  }
  /* The head is served before its own deadline check: a grant due at the
   * deadline wins over the timeout. */
  if (b->heap_len && b->heap[0]->deadline <= now) {
    w = b->heap[0];
    queue_unlink(b, w);
    finish(w, CR_BUCKET_ETIMEDOUT);
    b->stats.rejected++;
    b->stats.timeouts++;
    return w;
  }
  return NULL;
}

double cr_bucket_next_event(cr_bucket *b, double now) {
  if (b->done) return now;
  double due = b->heap_len ? b->heap[0]->deadline : INFINITY;
  if (b->head && !b->paused) {
    double have = b->ops->tokens(b->store, now);
    double need = b->head->n - have;
    double t = need <= EPS ? now : (b->rate > 0 ? now + need / b->rate : INFINITY);
    if (t < due) due = t;
  }
  return due;
}

void cr_bucket_remove(cr_bucket *b, cr_bucket_waiter *w) {
  if (w->state != CR_BW_QUEUED) return;
  queue_unlink(b, w);
  finish(w, CR_BUCKET_ECLOSED);
  b->stats.cancelled++;
}

void cr_bucket_refund(cr_bucket *b, double n, double now) {
  if (n > 0) b->ops->give(b->store, n, now);
  if (b->stats.granted) b->stats.granted--;
  b->stats.granted_tokens -= n;
}

int cr_bucket_set_rate(cr_bucket *b, double rate, double now) {
  if (!(rate >= 0) || !isfinite(rate)) return CR_BUCKET_EINVAL;
  b->ops->set_rate(b->store, rate, now);
  b->rate = rate;
  return 0;
}

int cr_bucket_set_capacity(cr_bucket *b, double capacity, double now) {
  if (!(capacity > 0) || !isfinite(capacity)) return CR_BUCKET_EINVAL;
  b->ops->set_capacity(b->store, capacity, now);
  if (capacity < b->capacity) {     /* O(W), only on a shrink */
    cr_bucket_waiter *w = b->head, *next;
    for (; w; w = next) {
      next = w->next;
      if (w->n > capacity) move_to_done(b, w, CR_BUCKET_ETOOBIG);
    }
  }
  b->capacity = capacity;
  return 0;
}

void cr_bucket_pause(cr_bucket *b) { b->paused = 1; }
void cr_bucket_resume(cr_bucket *b) { b->paused = 0; }

void cr_bucket_close(cr_bucket *b) {
  b->closed = 1;
  while (b->head) move_to_done(b, b->head, CR_BUCKET_ECLOSED);
}

double cr_bucket_tokens(cr_bucket *b, double now) {
  return b->ops->tokens(b->store, now);
}

const char *cr_bucket_strerror(int err) {
  switch (err) {
  case CR_BUCKET_OK: return "ok";
  case CR_BUCKET_EINVAL: return "invalid argument";
  case CR_BUCKET_EAGAIN: return "not enough tokens";
  case CR_BUCKET_EFULL: return "queue full";
  case CR_BUCKET_ETIMEDOUT: return "timeout";
  case CR_BUCKET_ECLOSED: return "closed";
  case CR_BUCKET_ETOOBIG: return "exceeds capacity";
  case CR_BUCKET_ENOMEM: return "out of memory";
  case CR_BUCKET_EINPROGRESS: return "in progress";
  default: return "unknown error";
  }
}
