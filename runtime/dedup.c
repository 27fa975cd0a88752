/*
 * dedup.c: request dedup cache core. See dedup.h for the contract.
 *
 * Costs: begin/finish/abort are O(1) expected (chained hash table, doubled at
 * load 1, FNV-1a over the key) plus the sweep, which is O(entries expired):
 * expiry lists are FIFO because each state has one TTL.
 */
#include "dedup.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static uint64_t hash_key(const char *k, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
  return h;
}

/* ---- intrusive lists (expiry per state, LRU) ---- */

#define LINK(e, off) ((cr_dedup_link *)((char *)(e) + (off)))
#define EXP offsetof(cr_dedup_entry, exp)
#define LRU offsetof(cr_dedup_entry, lru)

static void list_append(cr_dedup_list *l, cr_dedup_entry *e, size_t off) {
  LINK(e, off)->prev = l->tail;
  LINK(e, off)->next = NULL;
  if (l->tail) LINK(l->tail, off)->next = e; else l->head = e;
  l->tail = e;
}

static void list_unlink(cr_dedup_list *l, cr_dedup_entry *e, size_t off) {
  cr_dedup_link *k = LINK(e, off);
  if (k->prev) LINK(k->prev, off)->next = k->next; else l->head = k->next;
  if (k->next) LINK(k->next, off)->prev = k->prev; else l->tail = k->prev;
  k->prev = k->next = NULL;
}

/* ---- hash table ---- */

static cr_dedup_entry **slot(cr_dedup *d, uint64_t h, const char *key, size_t n) {
  cr_dedup_entry **p = &d->buckets[h & (d->nbuckets - 1)];
  for (; *p; p = &(*p)->chain)
    if ((*p)->hash == h && (*p)->keylen == n && memcmp((*p)->key, key, n) == 0) break;
  return p;
}

static int grow(cr_dedup *d) {
  size_t nb = d->nbuckets * 2;
  cr_dedup_entry **b = calloc(nb, sizeof *b);
  if (!b) return CR_DEDUP_ENOMEM;
  for (size_t i = 0; i < d->nbuckets; i++) {
    cr_dedup_entry *e = d->buckets[i], *next;
    for (; e; e = next) {
      next = e->chain;
      e->chain = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
    }
  }
  free(d->buckets);
  d->buckets = b;
  d->nbuckets = nb;
  return 0;
}

/* ---- waiters ---- */

static void waiter_unlink(cr_dedup *d, cr_dedup_waiter *w) {
  cr_dedup_entry *e = w->entry;
  if (w->prev) w->prev->next = w->next; else e->waiters = w->next;
  if (w->next) w->next->prev = w->prev; else e->waiters_tail = w->prev;
  w->prev = w->next = NULL;
  w->entry = NULL;
  d->waiting--;
}

static void wake_all(cr_dedup *d, cr_dedup_entry *e, int status, void *value) {
  while (e->waiters) {
    cr_dedup_waiter *w = e->waiters;
    waiter_unlink(d, w);
    w->status = status;
    w->value = value;
    if (d->cfg.wake) d->cfg.wake(d->cfg.ud, w);
  }
}

/* ---- entries ---- */

static double ttl(const cr_dedup *d, int state) {
  return state == CR_DEDUP_SOLVING ? d->cfg.solving_ttl
       : state == CR_DEDUP_SOLVED ? d->cfg.solved_ttl : d->cfg.error_ttl;
}

static void set_state(cr_dedup *d, cr_dedup_entry *e, int state, double now) {
  list_unlink(&d->exp[e->state], e, EXP);
  e->state = state;
  e->expires = now + ttl(d, state);
  list_append(&d->exp[state], e, EXP);
  if (state != CR_DEDUP_SOLVING) {
    list_append(&d->lru, e, LRU);
    d->finished++;
  }
}

/* Unlinks e everywhere and frees it; waiters must have been woken. */
static void drop(cr_dedup *d, cr_dedup_entry *e) {
  cr_dedup_entry **p = slot(d, e->hash, e->key, e->keylen);
  *p = e->chain;
  list_unlink(&d->exp[e->state], e, EXP);
  if (e->state != CR_DEDUP_SOLVING) {
    list_unlink(&d->lru, e, LRU);
    d->finished--;
  }
  if (e->value && d->cfg.release) d->cfg.release(d->cfg.ud, e->value);
  d->count--;
  free(e);
}

static cr_dedup_entry *create(cr_dedup *d, uint64_t h, const char *key, size_t n, double now) {
  if (d->count >= d->nbuckets && grow(d) != 0) return NULL;
  cr_dedup_entry *e = calloc(1, sizeof *e + n + 1);
  if (!e) return NULL;
  e->hash = h;
  e->keylen = n;
  memcpy(e->key, key, n);
  e->lock = ++d->next_lock;
  e->state = CR_DEDUP_SOLVING;
  e->expires = now + ttl(d, CR_DEDUP_SOLVING);
  list_append(&d->exp[CR_DEDUP_SOLVING], e, EXP);
  cr_dedup_entry **b = &d->buckets[h & (d->nbuckets - 1)];
  e->chain = *b;
  *b = e;
  d->count++;
  return e;
}

/* Only finished entries are evicted: a SOLVING one is a running leader. */
static void evict(cr_dedup *d) {
  while (d->cfg.max_entries && d->count >= d->cfg.max_entries && d->lru.head) {
    drop(d, d->lru.head);
    d->stats.evicted++;
  }
}

/* ---- public ---- */

int cr_dedup_init(cr_dedup *d, const cr_dedup_config *cfg) {
  if (!(cfg->solving_ttl > 0) || !(cfg->solved_ttl >= 0) || !(cfg->error_ttl >= 0))
    return CR_DEDUP_EINVAL;
  *d = (cr_dedup){0};
  d->cfg = *cfg;
  d->nbuckets = 64;
  d->buckets = calloc(d->nbuckets, sizeof *d->buckets);
  return d->buckets ? 0 : CR_DEDUP_ENOMEM;
}

void cr_dedup_close(cr_dedup *d) {
  if (d->closed) return;
  d->closed = 1;
  for (int s = 0; s < CR_DEDUP_NSTATES; s++)
    while (d->exp[s].head) {
      cr_dedup_entry *e = d->exp[s].head;
      wake_all(d, e, CR_DEDUP_ECLOSED, NULL);
      drop(d, e);
    }
  free(d->buckets);
  d->buckets = NULL;
  d->nbuckets = 0;
}

size_t cr_dedup_sweep(cr_dedup *d, double now) {
  size_t n = 0;
  for (int s = 0; s < CR_DEDUP_NSTATES; s++)
    while (d->exp[s].head && d->exp[s].head->expires <= now) {
      cr_dedup_entry *e = d->exp[s].head;
      if (s == CR_DEDUP_SOLVING) {
        d->stats.lock_expired++;
        wake_all(d, e, CR_DEDUP_ELOCK, NULL);
      } else {
        d->stats.expired++;
      }
      drop(d, e);
      n++;
    }
  return n;
}

double cr_dedup_next_expiry(const cr_dedup *d) {
  double t = INFINITY;
  for (int s = 0; s < CR_DEDUP_NSTATES; s++)
    if (d->exp[s].head && d->exp[s].head->expires < t) t = d->exp[s].head->expires;
  return t;
}

static int hit(cr_dedup *d, cr_dedup_entry *e, void **value, int *is_error) {
  list_unlink(&d->lru, e, LRU);
  list_append(&d->lru, e, LRU);
  *value = e->value;
  *is_error = e->state == CR_DEDUP_ERROR;
  return CR_DEDUP_HIT;
}

static void park(cr_dedup *d, cr_dedup_entry *e, cr_dedup_waiter *w) {
  w->entry = e;
  w->next = NULL;
  w->prev = e->waiters_tail;
  if (e->waiters_tail) e->waiters_tail->next = w; else e->waiters = w;
  e->waiters_tail = w;
  d->waiting++;
}

int cr_dedup_begin(cr_dedup *d, const char *key, size_t keylen, double now,
                   cr_dedup_waiter *w, uint64_t *lock, void **value, int *is_error) {
  if (d->closed) return CR_DEDUP_ECLOSED;
  cr_dedup_sweep(d, now);
  uint64_t h = hash_key(key, keylen);
  cr_dedup_entry *e = *slot(d, h, key, keylen);
  int src;
  if (!e) {
    evict(d);
    if (!(e = create(d, h, key, keylen, now))) return CR_DEDUP_ENOMEM;
    *lock = e->lock;
    src = CR_DEDUP_LEAD;
  } else if (e->state == CR_DEDUP_SOLVING) {
    park(d, e, w);
    src = CR_DEDUP_WAIT;
  } else {
    src = hit(d, e, value, is_error);
  }
  d->stats.total_requests++;
  d->stats.by_source[src]++;
  return src;
}

static cr_dedup_entry *locked(cr_dedup *d, const char *key, size_t keylen, uint64_t lock) {
  if (d->closed) return NULL;
  cr_dedup_entry *e = *slot(d, hash_key(key, keylen), key, keylen);
  return (e && e->state == CR_DEDUP_SOLVING && e->lock == lock) ? e : NULL;
}

int cr_dedup_finish(cr_dedup *d, const char *key, size_t keylen, uint64_t lock,
                    int is_error, void *value, double now) {
  if (!d->closed) cr_dedup_sweep(d, now);
  cr_dedup_entry *e = locked(d, key, keylen, lock);
  if (!e) {
    d->stats.stale_finishes++;
    return CR_DEDUP_ESTALE;
  }
  if (is_error) d->stats.errors++;
  wake_all(d, e, is_error ? 1 : 0, value);
  if (is_error && !d->cfg.cache_errors) {
    drop(d, e);
    return 0;
  }
  e->value = value;
  set_state(d, e, is_error ? CR_DEDUP_ERROR : CR_DEDUP_SOLVED, now);
  return 1;
}

int cr_dedup_abort(cr_dedup *d, const char *key, size_t keylen, uint64_t lock, double now) {
  if (!d->closed) cr_dedup_sweep(d, now);
  cr_dedup_entry *e = locked(d, key, keylen, lock);
  if (!e) return CR_DEDUP_ESTALE;
  d->stats.aborted++;
  wake_all(d, e, CR_DEDUP_EABORT, NULL);
  drop(d, e);
  return 0;
}

void cr_dedup_remove(cr_dedup *d, cr_dedup_waiter *w) {
  if (w->entry) waiter_unlink(d, w);
}

double cr_dedup_savings_pct(const cr_dedup *d) {
  uint64_t t = d->stats.total_requests;
  uint64_t saved = d->stats.by_source[CR_DEDUP_HIT] + d->stats.by_source[CR_DEDUP_WAIT];
  return t ? 100.0 * (double)saved / (double)t : 0.0;
}

const char *cr_dedup_source_name(int source) {
  static const char *names[] = {"api", "dedup_cache", "dedup_wait"};
  return source >= 0 && source < CR_DEDUP_NSOURCES ? names[source] : "?";
}

const char *cr_dedup_strerror(int err) {
  switch (err) {
  case CR_DEDUP_OK: return "ok";
  case CR_DEDUP_EINVAL: return "invalid argument";
  case CR_DEDUP_ENOMEM: return "out of memory";
  case CR_DEDUP_ESTALE: return "dedup lock lost";
  case CR_DEDUP_ELOCK: return "dedup leader timed out";
  case CR_DEDUP_EABORT: return "dedup leader cancelled";
  case CR_DEDUP_ECLOSED: return "closed";
  default: return "unknown error";
  }
}

/* ---- the key (libcrypto) ---- */


static void to_hex(const unsigned char *d, unsigned n, char *hex) {
  static const char digits[] = "0123456789abcdef";
  for (unsigned i = 0; i < n; i++) {
    hex[2 * i] = digits[d[i] >> 4];
    hex[2 * i + 1] = digits[d[i] & 15];
  }
  hex[2 * n] = '\0';
}

int cr_sha256_hex(const void *bytes, size_t len, char hex[65]) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (!EVP_Digest(bytes, len, d, &n, EVP_sha256(), NULL)) return CR_DEDUP_ENOMEM;
  to_hex(d, n, hex);
  return 0;
}

static void key_update(cr_dedup_key *k, const void *p, size_t n) {
  if (!k->failed && !EVP_DigestUpdate(k->md, p, n)) k->failed = 1;
}

int cr_dedup_key_begin(cr_dedup_key *k) {
  k->failed = 0;
  k->md = EVP_MD_CTX_new();
  if (!k->md || !EVP_DigestInit_ex(k->md, EVP_sha256(), NULL)) k->failed = 1;
  key_update(k, "cr-dedup-v1", 11);
  return k->failed ? CR_DEDUP_ENOMEM : 0;
}

/* Length prefixes make the serialization unambiguous whatever the values hold. */
void cr_dedup_key_field(cr_dedup_key *k, const char *name, const char *value, size_t len) {
  char hdr[64];
  size_t nl = strlen(name);
  int h = snprintf(hdr, sizeof hdr, ";%zu:", nl);
  key_update(k, hdr, (size_t)h);
  key_update(k, name, nl);
  h = snprintf(hdr, sizeof hdr, "=%zu:", len);
  key_update(k, hdr, (size_t)h);
  key_update(k, value, len);
}

void cr_dedup_key_bytes(cr_dedup_key *k, const char *name, const void *bytes, size_t len) {
  char hex[65];
  if (cr_sha256_hex(bytes, len, hex) != 0) { k->failed = 1; return; }
  cr_dedup_key_field(k, name, hex, 64);
}

int cr_dedup_key_end(cr_dedup_key *k, char hex[65]) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (!k->failed && !EVP_DigestFinal_ex(k->md, d, &n)) k->failed = 1;
  EVP_MD_CTX_free(k->md);
  k->md = NULL;
  if (k->failed) return CR_DEDUP_ENOMEM;
  to_hex(d, n, hex);
  return 0;
}

long cr_base64_decode(const char *in, size_t len, unsigned char *out) {
  EVP_ENCODE_CTX *c = EVP_ENCODE_CTX_new();
  int n1 = 0, n2 = 0, ok;
  if (!c) return CR_DEDUP_EINVAL;
  EVP_DecodeInit(c);
  ok = len <= INT32_MAX && EVP_DecodeUpdate(c, out, &n1, (const unsigned char *)in, (int)len) >= 0
       && EVP_DecodeFinal(c, out + n1, &n2) >= 0;
  EVP_ENCODE_CTX_free(c);
  return ok ? (long)n1 + n2 : CR_DEDUP_EINVAL;
}
