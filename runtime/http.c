/*
 * http.c: libcurl multi driven by libuv (see http.h).
 *
 * curl tells us which sockets to watch (socket callback -> one uv_poll_t per
 * socket, its context kept with curl_multi_assign) and when to call it back
 * (timer callback -> one uv_timer_t). After every curl_multi_socket_action we
 * drain curl_multi_info_read and complete finished calls, outside any curl
 * callback. Pitfalls measured on libuv 1.44 / curl 7.88 (STYLE.md):
 *  - a 0 ms timer re-armed in its own callback runs again in the same pass and
 *    starves I/O: clamp to 1 ms;
 *  - uv_poll_start re-registers with epoll on every call: only restart a poll
 *    when its event mask changes;
 *  - curl may hand us an fd that still has a live poll (no REMOVE seen): reuse
 *    the context found by fd instead of opening a second poll on it.
 */
#include "http.h"

#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SPARE_EASY_MAX 64
#define DEFAULT_MAX_CONNECTIONS 64
#define DEFAULT_MAX_BODY (16u << 20)

typedef struct buf { char *p; size_t len, cap; } buf;

typedef struct sock_ctx {
  uv_poll_t poll;
  cr_http *h;
  curl_socket_t fd;
  int events;                 /* uv events the poll is started with */
} sock_ctx;

struct cr_http_pool {
  cr_http *h;                 /* NULL once the engine is closed */
  int limit, active, queued;
  int released;
  int pumping;                /* pool_pump on the stack: a failed admission
                                 completes a call in it, which must not free p */
  cr_http_call *qhead, *qtail;
  cr_http_pool *prev, *next;  /* the engine's pools */
};

struct cr_http_call {
  cr_http *h;
  cr_http_pool *pool;
  CURL *easy;
  struct curl_slist *hdrs;
  curl_mime *mime;
  cr_http_cb cb;
  void *ud;
  buf body, head;
  int too_big;
  int in_multi;
  cr_http_call *prev, *next;  /* every unfinished call of the engine */
  cr_http_call *qnext;        /* the pool's FIFO while queued */
  char errbuf[CURL_ERROR_SIZE];
};

struct cr_http {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  int handles;                /* open libuv handles: the timer + polls */
  int closed;
  sock_ctx **socks;           /* by fd, for reuse */
  int nsocks;
  cr_http_call *calls;
  cr_http_pool defpool;
  cr_http_pool *pools;
  long limits;                /* sum of pool limits: the connection cache size */
  size_t max_body;
  CURL *spare[SPARE_EASY_MAX];
  int nspare;
  cr_http_stats st;
};

static void pool_pump(cr_http_pool *p);

const char *cr_http_errname(int err) {
  switch (err) {
  case CR_HTTP_OK: return "ok";
  case CR_HTTP_ETIMEOUT: return "timeout";
  case CR_HTTP_ECONNECT: return "connect";
  case CR_HTTP_ERESET: return "reset";
  case CR_HTTP_EPROTOCOL: return "protocol";
  case CR_HTTP_ETOOBIG: return "too_big";
  case CR_HTTP_ECLOSED: return "closed";
  case CR_HTTP_EINVAL: return "invalid";
  case CR_HTTP_ENOMEM: return "nomem";
  default: return "transport";
  }
}

/* ---- buffers ---------------------------------------------------------- */

static int buf_add(buf *b, const char *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
  b->p[b->len] = '\0';
  return 0;
}

static char *buf_take(buf *b, size_t *len) {
  char *p = b->p ? b->p : calloc(1, 1);
  *len = b->p ? b->len : 0;
  b->p = NULL;
  b->len = b->cap = 0;
  return p;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
  cr_http_call *c = ud;
  size_t len = sz * n;
  if (c->body.len + len > c->h->max_body) {
    c->too_big = 1;
    return 0;                 /* curl fails the transfer with CURLE_WRITE_ERROR */
  }
  return buf_add(&c->body, p, len) ? 0 : len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
  cr_http_call *c = ud;
  size_t len = sz * n;
  /* A new status line starts a new response (100 Continue, redirects): keep
   * only the final response's headers. */
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) c->head.len = 0;
  if (c->head.len + len > 256 * 1024) return 0;
  return buf_add(&c->head, p, len) ? 0 : len;
}

/* ---- sockets and the timer -------------------------------------------- */

static void engine_free(cr_http *h) {
  free(h->socks);
  free(h);
}

static void handle_closed(cr_http *h) {
  if (--h->handles == 0 && h->closed) engine_free(h);
}

static void sock_closed(uv_handle_t *hd) {
  sock_ctx *s = hd->data;
  cr_http *h = s->h;
  free(s);
  handle_closed(h);
}

static void sock_close(cr_http *h, sock_ctx *s) {
  if (s->fd >= 0 && s->fd < h->nsocks && h->socks[s->fd] == s) h->socks[s->fd] = NULL;
  h->st.sockets--;
  uv_close((uv_handle_t *)&s->poll, sock_closed);
}

static void drain(cr_http *h);

static void on_poll(uv_poll_t *p, int status, int events) {
  sock_ctx *s = p->data;
  cr_http *h = s->h;
  int flags = 0, running;
  if (status < 0) {
    s->events = 0;            /* libuv stopped the poll */
    flags = CURL_CSELECT_ERR;
  } else {
    if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  }
  curl_multi_socket_action(h->multi, s->fd, flags, &running);
  drain(h);
}

static sock_ctx *sock_open(cr_http *h, curl_socket_t fd) {
  if (fd >= h->nsocks) {
    int n = h->nsocks ? h->nsocks : 64;
    while (n <= fd) n *= 2;
    sock_ctx **v = realloc(h->socks, (size_t)n * sizeof *v);
    if (!v) return NULL;
    memset(v + h->nsocks, 0, (size_t)(n - h->nsocks) * sizeof *v);
    h->socks = v;
    h->nsocks = n;
  }
  sock_ctx *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (uv_poll_init_socket(h->loop, &s->poll, fd) != 0) {
    free(s);
    return NULL;
  }
  s->poll.data = s;
  s->h = h;
  s->fd = fd;
  h->socks[fd] = s;
  h->handles++;
  h->st.sockets++;
  return s;
}

static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp) {
  cr_http *h = userp;
  sock_ctx *s = socketp;
  (void)e;
  if (!s && fd >= 0 && fd < h->nsocks) s = h->socks[fd];
  if (what == CURL_POLL_REMOVE) {
    if (s) sock_close(h, s);
    if (h->multi) curl_multi_assign(h->multi, fd, NULL);
    return 0;
  }
  if (!s && !(s = sock_open(h, fd))) return -1;
  if (s != socketp) curl_multi_assign(h->multi, fd, s);
  int ev = ((what & CURL_POLL_IN) ? UV_READABLE : 0) | ((what & CURL_POLL_OUT) ? UV_WRITABLE : 0);
  if (ev != s->events) {
    s->events = ev;
    if (ev) uv_poll_start(&s->poll, ev, on_poll);
    else uv_poll_stop(&s->poll);
  }
  return 0;
}

static void on_timer(uv_timer_t *t) {
  cr_http *h = t->data;
  int running;
  curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  drain(h);
}

static int on_curl_timer(CURLM *m, long ms, void *userp) {
  cr_http *h = userp;
  (void)m;
  if (ms < 0) uv_timer_stop(&h->timer);
  else uv_timer_start(&h->timer, on_timer, ms > 0 ? (uint64_t)ms : 1, 0);
  return 0;
}

/* ---- calls ------------------------------------------------------------ */

static int map_error(cr_http_call *c, CURLcode rc) {
  switch (rc) {
  case CURLE_OK: return CR_HTTP_OK;
  case CURLE_OPERATION_TIMEDOUT: return CR_HTTP_ETIMEOUT;
  case CURLE_COULDNT_CONNECT: case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY: return CR_HTTP_ECONNECT;
  case CURLE_RECV_ERROR: case CURLE_SEND_ERROR: case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE: return CR_HTTP_ERESET;
  case CURLE_UNSUPPORTED_PROTOCOL: case CURLE_WEIRD_SERVER_REPLY:
  case CURLE_BAD_CONTENT_ENCODING: return CR_HTTP_EPROTOCOL;
  case CURLE_WRITE_ERROR: return c->too_big ? CR_HTTP_ETOOBIG : CR_HTTP_ETRANSPORT;
  case CURLE_OUT_OF_MEMORY: return CR_HTTP_ENOMEM;
  case CURLE_READ_ERROR: return CR_HTTP_EINVAL;   /* a multipart file went away */
  default: return CR_HTTP_ETRANSPORT;
  }
}

static void easy_release(cr_http *h, CURL *e) {
  if (h->nspare < SPARE_EASY_MAX && !h->closed) {
    /* A reset handle keeps its buffers and DNS cache: cheaper than a new one. */
    curl_easy_reset(e);
    h->spare[h->nspare++] = e;
  } else {
    curl_easy_cleanup(e);
  }
}

static void pool_maybe_free(cr_http_pool *p) {
  if (!p->released || p->active || p->queued || p->pumping) return;
  if (p->h) {
    cr_http *h = p->h;
    if (p->prev) p->prev->next = p->next; else h->pools = p->next;
    if (p->next) p->next->prev = p->prev;
    h->limits -= p->limit;
  }
  free(p);
}

static void queue_remove(cr_http_pool *p, cr_http_call *c) {
  cr_http_call **pp = &p->qhead, *prev = NULL;
  while (*pp && *pp != c) { prev = *pp; pp = &(*pp)->qnext; }
  if (!*pp) return;
  *pp = c->qnext;
  if (p->qtail == c) p->qtail = prev;
  p->queued--;
}

/* Take c out of the engine (multi, lists, pool) and free it. */
static void call_free(cr_http_call *c, int was_queued) {
  cr_http *h = c->h;
  cr_http_pool *p = c->pool;
  if (c->in_multi) curl_multi_remove_handle(h->multi, c->easy);
  if (was_queued) queue_remove(p, c);
  else p->active--;
  if (c->prev) c->prev->next = c->next; else h->calls = c->next;
  if (c->next) c->next->prev = c->prev;
  curl_slist_free_all(c->hdrs);
  curl_mime_free(c->mime);
  easy_release(h, c->easy);
  free(c->body.p);
  free(c->head.p);
  free(c);
}

/* Out of memory for a result itself: this static one tells the caller. */
static cr_http_result oom_result = { .error = CR_HTTP_ENOMEM, .message = "out of memory" };

static cr_http_result *result_new(int err, const char *msg) {
  cr_http_result *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->error = err;
  if (msg) snprintf(r->message, sizeof r->message, "%s", msg);
  return r;
}

/* Complete c: build the result, free the call, admit the next queued call of
 * its pool, then hand the result over. */
static void call_finish(cr_http_call *c, int err, const char *msg, int was_queued) {
  cr_http *h = c->h;
  cr_http_pool *p = c->pool;
  cr_http_cb cb = c->cb;
  void *ud = c->ud;
  cr_http_result *r = result_new(err, msg);
  if (r && err == CR_HTTP_OK) {
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &r->status);
    r->body = buf_take(&c->body, &r->body_len);
    r->headers = buf_take(&c->head, &r->headers_len);
  }
  if (!was_queued) {
    long nc = 0;
    curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &nc);
    h->st.connects += (uint64_t)nc;
  }
  call_free(c, was_queued);
  h->st.completed++;
  if (err) h->st.failed++;
  if (!h->closed) pool_pump(p);
  pool_maybe_free(p);
  cb(r ? r : &oom_result, ud);
}

static void drain(cr_http *h) {
  CURLMsg *m;
  int left;
  while (h->multi && (m = curl_multi_info_read(h->multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    CURLcode rc = m->data.result;
    char *priv = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
    cr_http_call *c = (cr_http_call *)priv;
    int err = map_error(c, rc);
    char msg[CURL_ERROR_SIZE + 64];
    if (err == CR_HTTP_ETOOBIG)
      snprintf(msg, sizeof msg, "response body larger than %zu bytes", h->max_body);
    else
      snprintf(msg, sizeof msg, "%s", c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
    call_finish(c, err, err ? msg : NULL, 0);
  }
}

/* Admits queued calls; its callers then call pool_maybe_free. */
static void pool_pump(cr_http_pool *p) {
  p->pumping++;
  while (p->h && p->active < p->limit && p->qhead) {
    cr_http_call *c = p->qhead;
    p->qhead = c->qnext;
    if (!p->qhead) p->qtail = NULL;
    p->queued--;
    p->active++;
    if (curl_multi_add_handle(p->h->multi, c->easy) != CURLM_OK) {
      call_finish(c, CR_HTTP_ENOMEM, "curl_multi_add_handle failed", 0);
      continue;
    }
    c->in_multi = 1;
  }
  p->pumping--;
}

/* ---- building a request ----------------------------------------------- */

static int has_scheme(const char *url) {
  return strncasecmp(url, "http://", 7) == 0 || strncasecmp(url, "https://", 8) == 0;
}

static int set_form(cr_http_call *c, const cr_http_req *rq) {
  buf b = {0};
  int rc = 0;
  for (int i = 0; i < rq->nform && rc == 0; i++) {
    const cr_http_field *f = &rq->form[i];
    char *n = curl_easy_escape(c->easy, f->name, 0);
    char *v = curl_easy_escape(c->easy, f->value ? f->value : "", (int)f->value_len);
    if (!n || !v || (i && buf_add(&b, "&", 1)) || buf_add(&b, n, strlen(n)) ||
        buf_add(&b, "=", 1) || buf_add(&b, v, strlen(v)))
      rc = CR_HTTP_ENOMEM;
    curl_free(n);
    curl_free(v);
  }
  if (rc == 0) {
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b.len);
    if (curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, b.p ? b.p : "") != CURLE_OK)
      rc = CR_HTTP_ENOMEM;
  }
  free(b.p);
  return rc;
}

static int set_parts(cr_http_call *c, const cr_http_req *rq) {
  c->mime = curl_mime_init(c->easy);
  if (!c->mime) return CR_HTTP_ENOMEM;
  for (int i = 0; i < rq->nparts; i++) {
    const cr_http_field *f = &rq->parts[i];
    curl_mimepart *part = curl_mime_addpart(c->mime);
    if (!part || curl_mime_name(part, f->name) != CURLE_OK) return CR_HTTP_ENOMEM;
    CURLcode rc = f->is_file ? curl_mime_filedata(part, f->value)
                             : curl_mime_data(part, f->value ? f->value : "", f->value_len);
    if (rc != CURLE_OK) return f->is_file ? CR_HTTP_EINVAL : CR_HTTP_ENOMEM;
    if (f->filename && curl_mime_filename(part, f->filename) != CURLE_OK) return CR_HTTP_ENOMEM;
    if (f->content_type && curl_mime_type(part, f->content_type) != CURLE_OK)
      return CR_HTTP_ENOMEM;
  }
  return curl_easy_setopt(c->easy, CURLOPT_MIMEPOST, c->mime) == CURLE_OK ? 0 : CR_HTTP_ENOMEM;
}

static int set_body(cr_http_call *c, const cr_http_req *rq) {
  if (rq->nparts > 0) return set_parts(c, rq);
  if (rq->nform > 0) return set_form(c, rq);
  if (rq->has_body || rq->body) {
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
    return curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, rq->body ? rq->body : "") == CURLE_OK
               ? 0 : CR_HTTP_ENOMEM;
  }
  return 0;
}

static int set_method(cr_http_call *c, const cr_http_req *rq, int has_body) {
  const char *m = rq->method;
  if (!m) return 0;           /* curl's choice: POST with a body, else GET */
  if (strcmp(m, "GET") == 0 && !has_body) return 0;
  if (strcmp(m, "POST") == 0) {
    if (!has_body) {          /* an empty POST */
      curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
      curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, "");
    }
    return 0;
  }
  if (strcmp(m, "HEAD") == 0) return curl_easy_setopt(c->easy, CURLOPT_NOBODY, 1L) ? CR_HTTP_EINVAL : 0;
  for (const char *p = m; *p; p++)   /* a token: no spaces or control bytes */
    if (*p <= ' ' || *p >= 127) return CR_HTTP_EINVAL;
  return curl_easy_setopt(c->easy, CURLOPT_CUSTOMREQUEST, m) ? CR_HTTP_ENOMEM : 0;
}

static int set_headers(cr_http_call *c, const cr_http_req *rq) {
  for (int i = 0; i < rq->nheaders; i++) {
    struct curl_slist *l = curl_slist_append(c->hdrs, rq->headers[i]);
    if (!l) return CR_HTTP_ENOMEM;
    c->hdrs = l;
  }
  /* curl waits up to 1 s for "100 Continue" before sending a body > 1 KiB:
   * a full second per image upload unless disabled. */
  struct curl_slist *l = curl_slist_append(c->hdrs, "Expect:");
  if (!l) return CR_HTTP_ENOMEM;
  c->hdrs = l;
  return curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, c->hdrs) ? CR_HTTP_ENOMEM : 0;
}

static long ms(double s) { return (long)(s * 1000.0 + 0.5); }

static int configure(cr_http_call *c, const cr_http_req *rq) {
  CURL *e = c->easy;
  int has_body = rq->nparts > 0 || rq->nform > 0 || rq->has_body || rq->body;
  curl_easy_setopt(e, CURLOPT_PRIVATE, c);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->errbuf);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, rq->connect_timeout > 0 ? ms(rq->connect_timeout) : 10000L);
  if (rq->timeout > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, ms(rq->timeout) > 0 ? ms(rq->timeout) : 1L);
  if (curl_easy_setopt(e, CURLOPT_URL, rq->url) != CURLE_OK) return CR_HTTP_ENOMEM;
  int rc = set_headers(c, rq);
  if (!rc) rc = set_body(c, rq);
  if (!rc) rc = set_method(c, rq, has_body);
  return rc;
}

int cr_http_request(cr_http *h, const cr_http_req *rq, cr_http_cb cb, void *ud,
                    cr_http_call **out) {
  if (out) *out = NULL;
  if (h->closed) return CR_HTTP_ECLOSED;
  if (!rq->url || !has_scheme(rq->url) || !cb) return CR_HTTP_EINVAL;
  cr_http_call *c = calloc(1, sizeof *c);
  if (!c) return CR_HTTP_ENOMEM;
  c->h = h;
  c->pool = rq->pool ? rq->pool : &h->defpool;
  c->cb = cb;
  c->ud = ud;
  c->easy = h->nspare ? h->spare[--h->nspare] : curl_easy_init();
  int rc = c->easy ? configure(c, rq) : CR_HTTP_ENOMEM;
  /* Admitted here rather than by pool_pump, so that a failure is returned: the
   * callback is never called from inside this function. */
  cr_http_pool *p = c->pool;
  int admit = !p->qhead && p->active < p->limit;
  if (!rc && admit && curl_multi_add_handle(h->multi, c->easy) != CURLM_OK) rc = CR_HTTP_ENOMEM;
  if (rc) {
    curl_slist_free_all(c->hdrs);
    curl_mime_free(c->mime);
    if (c->easy) easy_release(h, c->easy);
    free(c);
    return rc;
  }
  c->next = h->calls;
  if (h->calls) h->calls->prev = c;
  h->calls = c;
  if (admit) {
    c->in_multi = 1;
    p->active++;
  } else {
    if (p->qtail) p->qtail->qnext = c; else p->qhead = c;
    p->qtail = c;
    p->queued++;
  }
  h->st.requests++;
  if (out) *out = c;
  return 0;
}

void cr_http_cancel(cr_http_call *c) {
  cr_http *h = c->h;
  cr_http_pool *p = c->pool;
  call_free(c, !c->in_multi);
  h->st.cancelled++;
  if (!h->closed) pool_pump(p);
  pool_maybe_free(p);
}

/* ---- pools ------------------------------------------------------------ */

static void cache_resize(cr_http *h) {
  /* Never shrink: connections beyond the cache are closed at once. */
  long n = h->limits > 16 ? h->limits : 16;
  curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, n);
}

cr_http_pool *cr_http_pool_new(cr_http *h, int max_connections) {
  if (h->closed) return NULL;
  cr_http_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->h = h;
  p->limit = max_connections > 0 ? max_connections : DEFAULT_MAX_CONNECTIONS;
  p->next = h->pools;
  if (h->pools) h->pools->prev = p;
  h->pools = p;
  h->limits += p->limit;
  cache_resize(h);
  return p;
}

void cr_http_pool_release(cr_http_pool *p) {
  p->released = 1;
  pool_maybe_free(p);
}

/* ---- the engine ------------------------------------------------------- */

cr_http *cr_http_new(uv_loop_t *loop, const cr_http_opts *o) {
  static int global_done;
  if (!global_done) {
    /* Not thread-safe, like curl_global_init itself: the runtime is one thread. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return NULL;
    global_done = 1;
    /* CURLOPT_NOSIGNAL (required: curl must not use alarm() in our loop) also
     * stops curl from ignoring SIGPIPE around its writes, and a TLS write to a
     * peer that closed kills the process by default. Ignore it unless the
     * host installed a handler of its own. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  }
  cr_http *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->loop = loop;
  h->multi = curl_multi_init();
  if (!h->multi || uv_timer_init(loop, &h->timer) != 0) {
    if (h->multi) curl_multi_cleanup(h->multi);
    free(h);
    return NULL;
  }
  h->timer.data = h;          /* upstream multi-uv.c forgets this (curl #19462) */
  h->handles = 1;
  h->max_body = o && o->max_body ? o->max_body : DEFAULT_MAX_BODY;
  h->defpool.h = h;
  h->defpool.limit = o && o->max_connections > 0 ? o->max_connections : DEFAULT_MAX_CONNECTIONS;
  h->limits = h->defpool.limit;
  curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
  curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
  curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
  cache_resize(h);
  return h;
}

static void timer_closed(uv_handle_t *hd) { handle_closed(hd->data); }

void cr_http_close(cr_http *h) {
  if (h->closed) return;
  h->closed = 1;
  while (h->calls) {
    cr_http_call *c = h->calls;
    call_finish(c, CR_HTTP_ECLOSED, "http engine closed", !c->in_multi);
  }
  for (cr_http_pool *p = h->pools, *n; p; p = n) {
    n = p->next;
    p->h = NULL;              /* its holder frees it on release */
    if (p->released) free(p);
  }
  h->pools = NULL;
  while (h->nspare) curl_easy_cleanup(h->spare[--h->nspare]);
  /* Closing the cached connections calls on_socket(REMOVE), which closes polls
   * (and must not call curl_multi_assign on a multi being destroyed). */
  CURLM *m = h->multi;
  h->multi = NULL;
  curl_multi_cleanup(m);
  for (int fd = 0; fd < h->nsocks; fd++)
    if (h->socks[fd]) sock_close(h, h->socks[fd]);
  uv_close((uv_handle_t *)&h->timer, timer_closed);
}

void cr_http_result_free(cr_http_result *r) {
  if (!r || r == &oom_result) return;
  free(r->body);
  free(r->headers);
  free(r);
}

void cr_http_get_stats(const cr_http *h, cr_http_stats *st) {
  *st = h->st;
  st->async_dns = (curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_ASYNCHDNS) != 0;
  st->active = 0;
  st->queued = 0;
  for (const cr_http_call *c = h->calls; c; c = c->next) {
    if (c->in_multi) st->active++;
    else st->queued++;
  }
}
