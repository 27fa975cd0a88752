/*
 * server.c: HTTP/1.1 server on libuv TCP with http_parser (see server.h).
 *
 * Costs: one read buffer per server (reads are parsed synchronously, so the
 * buffer is free again when read_cb returns); one allocation per request,
 * which holds its bytes (url, headers, body) and header index inline until
 * they outgrow REQ_INLINE / REQ_HDRS (a large POST then costs one more). An
 * answer is formatted on the stack and, when nothing is queued before it on
 * its connection (the keep-alive case: one request in flight), written at
 * once with uv_try_write: no allocation at all. Only an answer that must wait
 * for earlier ones, or that the socket cannot take whole, is copied to the
 * heap (and then written with uv_write). With the mock provider at 64
 * keep-alive connections this took a request from 4 mallocs to 1.
 */
#include "server.h"

#include <curl/curl.h>
#include <http_parser.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define READ_BUF (64 * 1024)
#define REQ_INLINE 512   /* request bytes kept inside the request struct */
#define REQ_HDRS 12      /* headers indexed inside the request struct */
#define ANSWER_STACK 4096 /* answers up to this size are formatted on the stack */

typedef struct conn conn;

typedef struct hdr { size_t no, nl, vo, vl; } hdr;

enum { CB_NONE, CB_URL, CB_FIELD, CB_VALUE, CB_BODY };

struct cr_request {
  conn *conn;            /* NULL once the connection is gone */
  cr_request *next;      /* the connection's FIFO */
  int refs;
  unsigned answered : 1, hung : 1, keep_alive : 1, close_after : 1, http10 : 1;
  unsigned char method;
  char *resp;            /* answer waiting for earlier ones, then written */
  size_t resp_len, resp_off;
  size_t drip_chunk;
  uint64_t drip_ms;
  char *buf;             /* url, header names and values, body: ibuf or malloc'd */
  size_t len, cap;
  size_t url_off, url_len, path_off, path_len, query_off, query_len, body_off, body_len;
  int has_query;
  hdr *hdrs;             /* ihdrs or malloc'd */
  int nh, hcap, last_cb;
  /* not zeroed by req_new: */
  hdr ihdrs[REQ_HDRS];
  char ibuf[REQ_INLINE];
};

struct conn {
  uv_tcp_t tcp;          /* first: the handle's address is the conn's */
  cr_server *srv;
  conn *prev, *next;
  http_parser parser;
  cr_request *cur;       /* being parsed */
  cr_request *head, *tail;
  int npending, writes, handles;
  unsigned reading : 1, closing : 1, close_after_write : 1, eof : 1, stop_parsing : 1;
  int err_status;        /* set by a parser callback that refuses a request */
  size_t header_bytes;
  uint64_t last_active;  /* uv_now, ms */
  uint64_t msg_started;  /* uv_now when the request being parsed began */
  uv_timer_t *drip;      /* allocated on first slow answer */
};

struct cr_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  uv_timer_t sweep;
  cr_server_opts o;
  cr_server_request_cb cb;
  void *ud;
  conn *conns;
  int nconns, handles, closing;
  cr_server_stats st;
  char rbuf[READ_BUF];
};

typedef struct wreq { uv_write_t w; char *buf; } wreq;

static http_parser_settings settings;

cr_server_opts cr_server_defaults(void) {
  cr_server_opts o = {"127.0.0.1", 0, 1024, 64 * 1024, 8 * 1024 * 1024, 10000, 64, 60.0, 0};
  return o;
}

/* ---- requests ---- */

static cr_request *req_new(conn *c) {
  cr_request *r = malloc(sizeof *r);
  if (!r) return NULL;
  memset(r, 0, offsetof(cr_request, ihdrs));
  r->conn = c;
  r->refs = 1;
  r->buf = r->ibuf;
  r->cap = REQ_INLINE;
  r->hdrs = r->ihdrs;
  r->hcap = REQ_HDRS;
  return r;
}

static void req_free(cr_request *r) {
  if (r->buf != r->ibuf) free(r->buf);
  if (r->hdrs != r->ihdrs) free(r->hdrs);
  free(r->resp);
  free(r);
}

void cr_request_retain(cr_request *r) { r->refs++; }

void cr_request_release(cr_request *r) {
  if (--r->refs == 0) req_free(r);
}

/* Room for `cap` bytes; the inline buffer moves to the heap when outgrown. */
static int req_reserve(cr_request *r, size_t cap) {
  if (cap <= r->cap) return 0;
  char *b;
  if (r->buf == r->ibuf) {
    if (!(b = malloc(cap))) return -1;
    memcpy(b, r->ibuf, r->len);
  } else if (!(b = realloc(r->buf, cap))) {
    return -1;
  }
  r->buf = b;
  r->cap = cap;
  return 0;
}

static int req_append(cr_request *r, const char *at, size_t n) {
  if (r->len + n > r->cap) {
    size_t cap = r->cap;
    while (cap < r->len + n) cap *= 2;
    if (req_reserve(r, cap)) return -1;
  }
  memcpy(r->buf + r->len, at, n);
  r->len += n;
  return 0;
}

const char *cr_request_method(const cr_request *r) {
  return http_method_str((enum http_method)r->method);
}
const char *cr_request_path(const cr_request *r, size_t *len) {
  *len = r->path_len;
  return r->buf + r->path_off;
}
const char *cr_request_query(const cr_request *r, size_t *len) {
  *len = r->query_len;
  return r->has_query ? r->buf + r->query_off : NULL;
}
const char *cr_request_body(const cr_request *r, size_t *len) {
  *len = r->body_len;
  return r->buf + r->body_off;
}
int cr_request_header_count(const cr_request *r) { return r->nh; }
void cr_request_header(const cr_request *r, int i, const char **name, size_t *nlen,
                       const char **value, size_t *vlen) {
  const hdr *h = &r->hdrs[i];
  *name = r->buf + h->no, *nlen = h->nl, *value = r->buf + h->vo, *vlen = h->vl;
}
const char *cr_request_header_get(const cr_request *r, const char *name, size_t *vlen) {
  size_t n = strlen(name);
  for (int i = 0; i < r->nh; i++) {
    const hdr *h = &r->hdrs[i];
    if (h->nl == n && memcmp(r->buf + h->no, name, n) == 0) {
      *vlen = h->vl;
      return r->buf + h->vo;
    }
  }
  return NULL;
}
int cr_request_pending(const cr_request *r) { return r->conn && !r->answered; }

/* ---- connections ---- */

static void server_maybe_free(cr_server *s) {
  if (s->closing && s->handles == 0) free(s);
}

static void conn_handle_closed(uv_handle_t *h) {
  conn *c = h->data;
  if (--c->handles > 0) return;
  cr_server *s = c->srv;
  free(c->drip);
  free(c);
  s->handles--;
  server_maybe_free(s);
}

static void conn_close(conn *c, int reset) {
  if (c->closing) return;
  c->closing = 1;
  cr_server *s = c->srv;
  uv_read_stop((uv_stream_t *)&c->tcp);
  for (cr_request *r = c->head, *n; r; r = n) {
    n = r->next;
    r->conn = NULL;
    r->next = NULL;
    cr_request_release(r);
  }
  c->head = c->tail = NULL;
  if (c->cur) cr_request_release(c->cur);
  c->cur = NULL;
  if (c->prev) c->prev->next = c->next; else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->nconns--;
  s->st.open_connections = s->nconns;
  c->handles = 1;
  if (c->drip) {
    c->handles++;
    uv_close((uv_handle_t *)c->drip, conn_handle_closed);
  }
  /* RST makes the client see ECONNRESET instead of a clean EOF: that is the
   * fault the mock wants to inject. It fails only with a pending shutdown. */
  if (!reset || uv_tcp_close_reset(&c->tcp, conn_handle_closed) != 0)
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
}

static void write_cb(uv_write_t *w, int status) {
  wreq *wr = (wreq *)w;
  conn *c = w->data;
  free(wr->buf);
  free(wr);
  c->writes--;
  if (c->closing) return;
  if (status < 0) conn_close(c, 0);
  else if ((c->close_after_write || (c->eof && !c->head)) && c->writes == 0) conn_close(c, 0);
}

/* Write `len` bytes at `data`. `owned` is NULL (the bytes are borrowed: what
 * the socket does not take at once is copied) or the malloc'd block holding
 * them, which this takes over. uv_try_write refuses (EAGAIN) while earlier
 * writes are queued, so the order on the wire is the order of calls. May
 * close the connection (check c->closing after). */
static void conn_send(conn *c, const char *data, size_t len, char *owned) {
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
  int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  if (n == (int)len) { free(owned); return; }
  if (n < 0 && n != UV_EAGAIN) { free(owned); conn_close(c, 0); return; }
  if (n < 0) n = 0;
  size_t rest = len - (size_t)n;
  char *buf = owned;
  if (!buf && (buf = malloc(rest))) memcpy(buf, data + n, rest), n = 0;
  wreq *wr = buf ? malloc(sizeof *wr) : NULL;
  if (!wr) { free(buf); conn_close(c, 0); return; }
  wr->buf = buf;
  wr->w.data = c;
  b = uv_buf_init(buf + n, (unsigned)rest);
  if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, write_cb) != 0) {
    free(buf);
    free(wr);
    conn_close(c, 0);
    return;
  }
  c->writes++;
}

static void conn_write(conn *c, char *buf, size_t len) { conn_send(c, buf, len, buf); }

static void conn_resume_reading(conn *c);
static void drip_start(conn *c, cr_request *r);

/* Drop the answered head of the FIFO; says whether the connection ends with it. */
static int conn_pop(conn *c) {
  cr_request *r = c->head;
  int close_after = r->close_after || !r->keep_alive;
  c->head = r->next;
  if (!c->head) c->tail = NULL;
  r->next = NULL;
  r->conn = NULL;
  c->npending--;
  c->srv->st.responses++;
  cr_request_release(r);
  if (close_after) {
    c->close_after_write = 1;
    c->stop_parsing = 1;
  }
  return close_after;
}

/* Write every answer at the head of the FIFO that is ready, in order. */
static void conn_flush(conn *c) {
  while (!c->closing && c->head && c->head->resp) {
    cr_request *r = c->head;
    if (r->drip_chunk) { drip_start(c, r); return; }
    char *buf = r->resp;
    size_t len = r->resp_len;
    r->resp = NULL;
    if (len) conn_write(c, buf, len); else free(buf);
    if (c->closing) return;  /* the write failed: the FIFO is gone */
    if (conn_pop(c)) break;
  }
  if (c->closing) return;
  if (c->close_after_write || (c->eof && !c->head)) {
    if (c->writes == 0) conn_close(c, 0);
    return;
  }
  c->last_active = uv_now(c->srv->loop);
  if (!c->reading && !c->stop_parsing && c->npending < c->srv->o.max_pipeline)
    conn_resume_reading(c);
}

/* A slow answer: one piece per tick. The timer is the connection's, started
 * with a non-zero delay (a 0 ms timer re-armed from a timer callback would run
 * in the same loop pass, see STYLE.md). */
static void drip_tick(uv_timer_t *t) {
  conn *c = t->data;
  cr_request *r = c->head;
  if (c->closing || !r || !r->resp) { uv_timer_stop(t); return; }
  size_t n = r->resp_len - r->resp_off;
  if (n > r->drip_chunk) n = r->drip_chunk;
  char *piece = malloc(n ? n : 1);
  if (!piece) { conn_close(c, 0); return; }
  memcpy(piece, r->resp + r->resp_off, n);
  r->resp_off += n;
  conn_write(c, piece, n);
  if (c->closing || r->resp_off < r->resp_len) return;
  uv_timer_stop(t);
  free(r->resp);
  r->resp = NULL;
  conn_pop(c);
  conn_flush(c);
}

static void drip_start(conn *c, cr_request *r) {
  if (!c->drip) {
    c->drip = malloc(sizeof *c->drip);
    if (!c->drip) { conn_close(c, 0); return; }
    uv_timer_init(c->srv->loop, c->drip);
    c->drip->data = c;
  }
  if (!uv_is_active((uv_handle_t *)c->drip))
    uv_timer_start(c->drip, drip_tick, r->drip_ms ? r->drip_ms : 1, r->drip_ms ? r->drip_ms : 1);
}

/* ---- answers ---- */

static int has_header(const char *h, size_t hlen, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i + n <= hlen;) {
    if (strncasecmp(h + i, name, n) == 0 && h[i + n] == ':') return 1;
    const char *nl = memchr(h + i, '\n', hlen - i);
    if (!nl) break;
    i = (size_t)(nl - h) + 1;
  }
  return 0;
}

static int req_check(cr_request *r) {
  if (r->answered) return UV_EALREADY;
  if (!r->conn || r->conn->closing) return UV_ENOTCONN;
  return 0;
}

static int req_set_answer(cr_request *r, char *buf, size_t len) {
  r->answered = 1;
  r->resp = buf;
  r->resp_len = len;
  r->resp_off = 0;
  conn_flush(r->conn);
  return 0;
}

#define PUT(p, s, n) (memcpy((p), (s), (n)), (p) += (n))
#define PUTS(p, lit) PUT(p, lit, sizeof lit - 1)

/* Status line to body into `buf` (room for `cap`, or NULL: a new malloc'd
 * block). Returns the block, NULL on OOM; *len gets the length. printf-free:
 * snprintf was the largest C cost of a small answer after the syscalls. */
static char *build_answer(cr_request *r, int status, const char *headers, size_t hlen,
                          const char *body, size_t blen, char *buf, size_t cap, size_t *len) {
  const char *reason = http_status_str((enum http_status)status);
  if (!reason || strcmp(reason, "<unknown>") == 0) reason = "Unknown";
  size_t rlen = strlen(reason);
  int close = r->close_after || !r->keep_alive;
  int ctype = !has_header(headers, hlen, "content-type");
  char num[24], *np = num + sizeof num;
  size_t v = blen;
  do *--np = (char)('0' + v % 10); while ((v /= 10) != 0);
  size_t nlen = (size_t)(num + sizeof num - np);
  size_t need = 160 + rlen + hlen + blen;
  if (!buf || need > cap) buf = malloc(need);
  if (!buf) return NULL;
  char *p = buf;
  PUTS(p, "HTTP/1.1 ");
  *p++ = (char)('0' + status / 100), *p++ = (char)('0' + status / 10 % 10), *p++ = (char)('0' + status % 10);
  *p++ = ' ';
  PUT(p, reason, rlen);
  PUTS(p, "\r\n");
  PUT(p, headers, hlen);
  if (ctype) PUTS(p, "Content-Type: text/plain\r\n");
  PUTS(p, "Content-Length: ");
  PUT(p, np, nlen);
  PUTS(p, "\r\n");
  if (close) PUTS(p, "Connection: close\r\n");
  else if (r->http10) PUTS(p, "Connection: keep-alive\r\n");
  PUTS(p, "\r\n");
  if (r->method != HTTP_HEAD) PUT(p, body, blen);  /* HEAD: the length only */
  *len = (size_t)(p - buf);
  return buf;
}

int cr_request_respond(cr_request *r, int status, const char *headers, size_t hlen,
                       const char *body, size_t blen) {
  return cr_request_drip(r, status, headers, hlen, body, blen, 0, 0);
}

int cr_request_drip(cr_request *r, int status, const char *headers, size_t hlen,
                    const char *body, size_t blen, size_t chunk, uint64_t interval_ms) {
  int rc = req_check(r);
  if (rc) return rc;
  if (status < 100 || status > 999) return UV_EINVAL;
  char stack[ANSWER_STACK];
  size_t len;
  char *buf = build_answer(r, status, headers ? headers : "", headers ? hlen : 0,
                           body ? body : "", body ? blen : 0, stack, sizeof stack, &len);
  if (!buf) return UV_ENOMEM;
  conn *c = r->conn;
  if (!chunk && c->head == r) {
    /* First in line: straight to the socket. */
    r->answered = 1;
    conn_send(c, buf, len, buf == stack ? NULL : buf);
    if (c->closing) return 0;
    conn_pop(c);
    conn_flush(c);
    return 0;
  }
  if (buf == stack) {
    if (!(buf = malloc(len))) return UV_ENOMEM;
    memcpy(buf, stack, len);
  }
  r->drip_chunk = chunk;
  r->drip_ms = interval_ms;
  return req_set_answer(r, buf, len);
}

int cr_request_respond_raw(cr_request *r, const char *bytes, size_t len) {
  int rc = req_check(r);
  if (rc) return rc;
  char *buf = malloc(len ? len : 1);
  if (!buf) return UV_ENOMEM;
  memcpy(buf, bytes, len);
  r->close_after = 1;
  return req_set_answer(r, buf, len);
}

int cr_request_reset(cr_request *r) {
  int rc = req_check(r);
  if (rc) return rc;
  r->answered = 1;
  conn_close(r->conn, 1);
  return 0;
}

void cr_request_hang(cr_request *r) {
  r->hung = 1;
  r->answered = 1;
}

/* ---- parsing ---- */

#define CONN(p) ((conn *)(p)->data)

static int refuse(conn *c, int status) {
  c->err_status = status;
  return 1;
}

static int on_message_begin(http_parser *p) {
  conn *c = CONN(p);
  c->cur = req_new(c);
  c->header_bytes = 0;
  c->msg_started = uv_now(c->srv->loop);
  return c->cur ? 0 : refuse(c, 500);
}

static int add_piece(http_parser *p, int kind, const char *at, size_t n) {
  conn *c = CONN(p);
  cr_request *r = c->cur;
  if (kind != CB_BODY && (c->header_bytes += n) > c->srv->o.max_header) return refuse(c, 431);
  if (kind == CB_BODY && r->len - r->body_off + n > c->srv->o.max_body) return refuse(c, 413);
  if (r->last_cb != kind) {
    if (kind == CB_FIELD) {
      if (r->nh == r->hcap) {
        int cap = r->hcap * 2;
        hdr *h = r->hdrs == r->ihdrs ? malloc((size_t)cap * sizeof *h)
                                     : realloc(r->hdrs, (size_t)cap * sizeof *h);
        if (!h) return refuse(c, 500);
        if (r->hdrs == r->ihdrs) memcpy(h, r->ihdrs, sizeof r->ihdrs);
        r->hdrs = h;
        r->hcap = cap;
      }
      r->hdrs[r->nh++] = (hdr){r->len, 0, r->len, 0};
    } else if (kind == CB_VALUE) {
      r->hdrs[r->nh - 1].vo = r->len;
    } else if (kind == CB_URL) {
      r->url_off = r->len;
    } else {
      r->body_off = r->len;
    }
    r->last_cb = kind;
  }
  if (req_append(r, at, n)) return refuse(c, 500);
  if (kind == CB_FIELD) r->hdrs[r->nh - 1].nl += n;
  else if (kind == CB_VALUE) r->hdrs[r->nh - 1].vl += n;
  else if (kind == CB_URL) r->url_len += n;
  else r->body_len += n;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) { return add_piece(p, CB_URL, at, n); }
static int on_field(http_parser *p, const char *at, size_t n) { return add_piece(p, CB_FIELD, at, n); }
static int on_value(http_parser *p, const char *at, size_t n) { return add_piece(p, CB_VALUE, at, n); }
static int on_body(http_parser *p, const char *at, size_t n) { return add_piece(p, CB_BODY, at, n); }

/* An HTTP/1.1 request with a body and "Expect: 100-continue" (names are
 * lower-cased by now; the value is compared without case). */
static int expects_continue(http_parser *p, cr_request *r) {
  if (p->http_major != 1 || p->http_minor < 1) return 0;
  if (!((p->flags & F_CONTENTLENGTH) && p->content_length > 0) && !(p->flags & F_CHUNKED)) return 0;
  for (int i = 0; i < r->nh; i++) {
    const hdr *h = &r->hdrs[i];
    if (h->nl == 6 && memcmp(r->buf + h->no, "expect", 6) == 0 && h->vl == 12 &&
        strncasecmp(r->buf + h->vo, "100-continue", 12) == 0)
      return 1;
  }
  return 0;
}

static int on_headers_complete(http_parser *p) {
  conn *c = CONN(p);
  cr_request *r = c->cur;
  for (int i = 0; i < r->nh; i++)
    for (size_t k = 0; k < r->hdrs[i].nl; k++) {
      char *ch = r->buf + r->hdrs[i].no + k;
      if (*ch >= 'A' && *ch <= 'Z') *ch = (char)(*ch + 32);
    }
  /* Returning 1 here would mean "no body", not an error: refuse with -1. */
  if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->srv->o.max_body) return -refuse(c, 413);
  if (expects_continue(p, r) && !c->head) {
    /* the client holds the body back until told (curl -F waits 1 s); only
     * when no earlier answer is owed, so the interim reply cannot overtake it */
    conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL);
    if (c->closing) return -1;
  }
  /* Reserve the body in one go when its length is announced. */
  if ((p->flags & F_CONTENTLENGTH) && req_reserve(r, r->len + p->content_length))
    return -refuse(c, 500);
  r->body_off = r->len;
  return 0;
}

static int split_url(cr_request *r, int is_connect) {
  struct http_parser_url u;
  http_parser_url_init(&u);
  if (r->url_len == 0 || r->url_len > 65535 ||
      http_parser_parse_url(r->buf + r->url_off, r->url_len, is_connect, &u) != 0)
    return -1;
  if (u.field_set & (1 << UF_PATH)) {
    r->path_off = r->url_off + u.field_data[UF_PATH].off;
    r->path_len = u.field_data[UF_PATH].len;
  } else {
    r->path_off = r->url_off, r->path_len = 0;
  }
  if (u.field_set & (1 << UF_QUERY)) {
    r->has_query = 1;
    r->query_off = r->url_off + u.field_data[UF_QUERY].off;
    r->query_len = u.field_data[UF_QUERY].len;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  conn *c = CONN(p);
  cr_server *s = c->srv;
  cr_request *r = c->cur;
  c->cur = NULL;
  r->method = (unsigned char)p->method;
  r->keep_alive = http_should_keep_alive(p) ? 1 : 0;
  r->http10 = p->http_major == 1 && p->http_minor == 0;
  if (split_url(r, p->method == HTTP_CONNECT) != 0) {
    cr_request_release(r);
    return refuse(c, 400);
  }
  if (c->tail) c->tail->next = r; else c->head = r;
  c->tail = r;
  c->npending++;
  s->st.requests++;
  if (!r->keep_alive) c->stop_parsing = 1;
  cr_request_retain(r);  /* the callback's reference */
  s->cb(s, r, s->ud);
  return (c->closing || c->stop_parsing || s->closing) ? 1 : 0;
}

static void settings_init(void) {
  if (settings.on_message_complete) return;
  http_parser_settings_init(&settings);
  settings.on_message_begin = on_message_begin;
  settings.on_url = on_url;
  settings.on_header_field = on_field;
  settings.on_header_value = on_value;
  settings.on_headers_complete = on_headers_complete;
  settings.on_body = on_body;
  settings.on_message_complete = on_message_complete;
}

/* A refused request is answered in its turn, after the ones before it. */
static void conn_refuse(conn *c, int status) {
  cr_server *s = c->srv;
  if (c->cur) cr_request_release(c->cur);
  c->cur = NULL;
  s->st.bad_requests++;
  c->stop_parsing = 1;
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->reading = 0;
  cr_request *r = req_new(c);
  if (!r) { conn_close(c, 0); return; }
  r->close_after = 1;
  if (c->tail) c->tail->next = r; else c->head = r;
  c->tail = r;
  c->npending++;
  const char *msg = http_status_str((enum http_status)status);
  if (cr_request_respond(r, status, NULL, 0, msg, strlen(msg)) != 0) conn_close(c, 0);
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  (void)hint;
  conn *c = h->data;
  *b = uv_buf_init(c->srv->rbuf, READ_BUF);
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  conn *c = st->data;
  if (nread == 0) return;
  if (nread < 0) {
    /* A peer that half-closes after pipelining still gets its answers, the
     * ones still being written too, unless one of them hangs: then nobody
     * would ever close this connection. */
    int hung = 0;
    for (cr_request *r = c->head; r; r = r->next) hung |= r->hung;
    if (nread != UV_EOF || hung || (!c->head && !c->writes)) { conn_close(c, 0); return; }
    c->eof = 1;
    uv_read_stop(st);
    c->reading = 0;
    return;
  }
  c->last_active = uv_now(c->srv->loop);
  if (c->stop_parsing) return;
  size_t n = http_parser_execute(&c->parser, &settings, b->base, (size_t)nread);
  if (c->closing || c->srv->closing) return;
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (c->err_status) conn_refuse(c, c->err_status);
  else if (e == HPE_HEADER_OVERFLOW) conn_refuse(c, 431);
  else if (e != HPE_OK && !c->stop_parsing) conn_refuse(c, 400);
  else if (n != (size_t)nread && !c->stop_parsing) conn_refuse(c, 400);
  else if (c->stop_parsing || c->npending >= c->srv->o.max_pipeline) {
    uv_read_stop(st);
    c->reading = 0;
  }
}

static void conn_resume_reading(conn *c) {
  if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0) c->reading = 1;
  else conn_close(c, 0);
}

static void refused_closed(uv_handle_t *h) {
  cr_server *s = h->data;
  free(h);
  s->handles--;
  server_maybe_free(s);
}

static void on_connection(uv_stream_t *l, int status) {
  cr_server *s = l->data;
  if (status < 0 || s->closing) return;
  if (s->nconns >= s->o.max_connections) {
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t) return;
    uv_tcp_init(s->loop, t);
    t->data = s;
    s->handles++;
    if (uv_accept(l, (uv_stream_t *)t) == 0) s->st.refused++;
    uv_close((uv_handle_t *)t, refused_closed);
    return;
  }
  conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_tcp_init(s->loop, &c->tcp);
  c->tcp.data = c;
  s->handles++;
  c->handles = 1;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->nconns++;
  s->st.open_connections = s->nconns;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) { conn_close(c, 0); return; }
  s->st.accepted++;
  uv_tcp_nodelay(&c->tcp, 1);
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  c->last_active = uv_now(s->loop);
  conn_resume_reading(c);
}

/* One timer per server instead of one per connection: a connection idles out
 * between idle_timeout and 1.25 * idle_timeout, and a request that trickles in
 * (a byte now and then keeps a connection "active") is cut after
 * request_timeout. O(connections) per tick. */
static void sweep_cb(uv_timer_t *t) {
  cr_server *s = t->data;
  uint64_t now = uv_now(s->loop), idle = (uint64_t)(s->o.idle_timeout * 1000);
  uint64_t slow = (uint64_t)(s->o.request_timeout * 1000);
  for (conn *c = s->conns, *n; c; c = n) {
    n = c->next;
    int idle_out = c->npending == 0 && c->writes == 0 && now - c->last_active >= idle;
    int too_slow = c->cur && now - c->msg_started >= slow;
    if (idle_out || too_slow) {
      s->st.idle_closed++;
      conn_close(c, 0);
    }
  }
}

static void server_handle_closed(uv_handle_t *h) {
  cr_server *s = h->data;
  s->handles--;
  server_maybe_free(s);
}

int cr_server_start(uv_loop_t *loop, const cr_server_opts *o, cr_server_request_cb cb,
                    void *ud, cr_server **out) {
  struct sockaddr_storage addr;
  const char *host = o->host ? o->host : "127.0.0.1";
  if (o->port < 0 || o->port > 65535) return UV_EINVAL;
  if (uv_ip4_addr(host, o->port, (struct sockaddr_in *)&addr) != 0 &&
      uv_ip6_addr(host, o->port, (struct sockaddr_in6 *)&addr) != 0)
    return UV_EINVAL;
  settings_init();
  cr_server *s = calloc(1, sizeof *s);
  if (!s) return UV_ENOMEM;
  s->loop = loop, s->o = *o, s->cb = cb, s->ud = ud;
  if (s->o.max_pipeline < 1) s->o.max_pipeline = 1;
  if (s->o.idle_timeout <= 0) s->o.idle_timeout = 60;
  if (s->o.request_timeout <= 0) s->o.request_timeout = s->o.idle_timeout;
  uv_tcp_init(loop, &s->listener);
  s->listener.data = s;
  s->handles = 1;
  int rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, o->backlog > 0 ? o->backlog : 1024, on_connection);
  if (rc != 0) {
    s->closing = 1;
    uv_close((uv_handle_t *)&s->listener, server_handle_closed);
    return rc;
  }
  uv_timer_init(loop, &s->sweep);
  s->sweep.data = s;
  s->handles++;
  uint64_t every = (uint64_t)(s->o.idle_timeout * 250);
  uv_timer_start(&s->sweep, sweep_cb, every ? every : 1, every ? every : 1);
  uv_unref((uv_handle_t *)&s->sweep);
  *out = s;
  return 0;
}

int cr_server_port(const cr_server *s) {
  struct sockaddr_storage a;
  int len = sizeof a;
  if (uv_tcp_getsockname((uv_tcp_t *)&s->listener, (struct sockaddr *)&a, &len) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
  return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

void cr_server_close(cr_server *s) {
  if (s->closing) return;
  s->closing = 1;
  while (s->conns) conn_close(s->conns, 0);
  uv_close((uv_handle_t *)&s->listener, server_handle_closed);
  uv_close((uv_handle_t *)&s->sweep, server_handle_closed);
}

void cr_server_get_stats(const cr_server *s, cr_server_stats *st) { *st = s->st; }

char *cr_url_decode(const char *s, size_t len, size_t *outlen) {
  char small[256] = "", *tmp = len < sizeof small ? small : malloc(len + 1);
  if (!tmp) return NULL;
  for (size_t i = 0; i < len; i++) tmp[i] = s[i] == '+' ? ' ' : s[i];
  int n = 0;
  /* The handle argument is ignored since curl 7.82. */
  char *d = curl_easy_unescape(NULL, tmp, (int)len, &n);
  if (tmp != small) free(tmp);
  if (!d) return NULL;
  char *out = malloc((size_t)n + 1);
  if (out) {
    memcpy(out, d, (size_t)n);
    out[n] = 0;
    *outlen = (size_t)n;
  }
  curl_free(d);
  return out;
}
