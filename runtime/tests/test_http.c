/* test_http.c: the curl-multi-on-libuv engine against the in-process server.
 * No timing assertions: every wait is "run the loop until N callbacks". */
#define _GNU_SOURCE
#include "check.h"
#include "http.h"
#include "server.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* Fault injection: the engine's next fail_add calls to curl_multi_add_handle
 * fail as if out of memory (this definition wins over libcurl's). */
static int fail_add;
CURLMcode curl_multi_add_handle(CURLM *m, CURL *e) {
  static CURLMcode (*real)(CURLM *, CURL *);
  if (fail_add > 0) { fail_add--; return CURLM_OUT_OF_MEMORY; }
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "curl_multi_add_handle");
  return real(m, e);
}

enum { M_ANSWER, M_ECHO, M_HANG, M_RESET, M_GARBAGE, M_DEFER, M_BIG, M_S500 };

static uv_loop_t *loop;
static cr_server *srv;
static int mode;
static char url[128];
static cr_request *held[64];
static int nheld, max_held;
static uv_timer_t defer_timer;

static void defer_flush(uv_timer_t *t) {
  (void)t;
  for (int i = 0; i < nheld; i++) {
    cr_request_respond(held[i], 200, NULL, 0, "d", 1);
    cr_request_release(held[i]);
  }
  nheld = 0;
}

static void on_request(cr_server *s, cr_request *r, void *ud) {
  (void)s; (void)ud;
  size_t n;
  const char *b;
  static char big[4096];
  switch (mode) {
  case M_ANSWER:
    cr_request_respond(r, 200, "X-Test: yes\r\n", 13, "hello", 5);
    break;
  case M_ECHO:
    b = cr_request_body(r, &n);
    cr_request_respond(r, 200, NULL, 0, b, n);
    break;
  case M_HANG: cr_request_hang(r); break;
  case M_RESET: cr_request_reset(r); break;
  case M_GARBAGE: cr_request_respond_raw(r, "garbage\r\n\r\n", 11); break;
  case M_S500: cr_request_respond(r, 500, NULL, 0, "oops", 4); break;
  case M_BIG:
    memset(big, 'x', sizeof big);
    cr_request_respond(r, 200, NULL, 0, big, sizeof big);
    break;
  case M_DEFER:
    /* Hold requests a moment so that concurrency at the server is visible. */
    cr_request_retain(r);
    held[nheld++] = r;
    if (nheld > max_held) max_held = nheld;
    uv_timer_start(&defer_timer, defer_flush, 5, 0);
    break;
  }
  cr_request_release(r);
}

typedef struct outcome { int done, err; long status; char body[256]; char head[512]; } outcome;
static int pending;

static void on_done(cr_http_result *r, void *ud) {
  outcome *o = ud;
  o->done++;
  o->err = r->error;
  o->status = r->status;
  if (r->error == 0) {
    snprintf(o->body, sizeof o->body, "%s", r->body);
    snprintf(o->head, sizeof o->head, "%s", r->headers);
  } else {
    snprintf(o->body, sizeof o->body, "%s", r->message);
  }
  cr_http_result_free(r);
  if (--pending == 0) uv_stop(loop);
}

static void run_until_done(void) {
  if (pending > 0) uv_run(loop, UV_RUN_DEFAULT);
}

static outcome one(cr_http *h, cr_http_req *rq) {
  outcome o = {0};
  pending = 1;
  int rc = cr_http_request(h, rq, on_done, &o, NULL);
  CHECK_EQ_INT(rc, 0);
  if (rc == 0) run_until_done();
  CHECK_EQ_INT(o.done, 1);
  return o;
}

static void test_basic(cr_http *h) {
  mode = M_ANSWER;
  cr_http_req rq = { .url = url, .timeout = 5 };
  outcome o = one(h, &rq);
  CHECK_EQ_INT(o.err, 0);
  CHECK_EQ_INT(o.status, 200);
  CHECK_STR(o.body, "hello");
  CHECK(strstr(o.head, "X-Test: yes") != NULL);

  mode = M_S500;
  o = one(h, &rq);
  CHECK_EQ_INT(o.err, 0);
  CHECK_EQ_INT(o.status, 500);
  CHECK_STR(o.body, "oops");
}

static void test_bodies(cr_http *h) {
  mode = M_ECHO;
  cr_http_field form[] = { { .name = "key", .value = "a b&c", .value_len = 5 },
                           { .name = "method", .value = "post", .value_len = 4 } };
  cr_http_req rq = { .url = url, .form = form, .nform = 2, .timeout = 5 };
  outcome o = one(h, &rq);
  CHECK_STR(o.body, "key=a%20b%26c&method=post");

  const char *hdrs[] = { "Content-Type: application/json" };
  cr_http_req rj = { .url = url, .body = "{\"a\":1}", .body_len = 7, .has_body = 1,
                     .headers = hdrs, .nheaders = 1, .timeout = 5 };
  o = one(h, &rj);
  CHECK_STR(o.body, "{\"a\":1}");

  cr_http_field parts[] = { { .name = "method", .value = "post", .value_len = 4 },
                            { .name = "file", .value = "PNGDATA", .value_len = 7,
                              .filename = "c.png", .content_type = "image/png" } };
  cr_http_req rm = { .url = url, .parts = parts, .nparts = 2, .timeout = 5 };
  o = one(h, &rm);
  CHECK(strstr(o.body, "name=\"method\"") != NULL);
  CHECK(strstr(o.body, "filename=\"c.png\"") != NULL);
  CHECK(strstr(o.body, "PNGDATA") != NULL);

  cr_http_field bad[] = { { .name = "file", .value = "/nonexistent/x.png", .is_file = 1 } };
  cr_http_req rb = { .url = url, .parts = bad, .nparts = 1 };
  outcome ob = {0};
  int rc = cr_http_request(h, &rb, on_done, &ob, NULL);
  if (rc == 0) { pending = 1; run_until_done(); CHECK(ob.err != 0); }
  else CHECK_EQ_INT(rc, CR_HTTP_EINVAL);

  cr_http_req rs = { .url = "file:///etc/passwd" };
  CHECK_EQ_INT(cr_http_request(h, &rs, on_done, &ob, NULL), CR_HTTP_EINVAL);
  cr_http_req rmeth = { .url = url, .method = "GE T" };
  CHECK_EQ_INT(cr_http_request(h, &rmeth, on_done, &ob, NULL), CR_HTTP_EINVAL);
}

static void test_faults(cr_http *h) {
  cr_http_req rq = { .url = url, .timeout = 0.2 };
  mode = M_HANG;
  outcome o = one(h, &rq);
  CHECK_EQ_INT(o.err, CR_HTTP_ETIMEOUT);
  mode = M_RESET;
  o = one(h, &rq);
  CHECK_EQ_INT(o.err, CR_HTTP_ERESET);
  mode = M_GARBAGE;
  o = one(h, &rq);
  CHECK_EQ_INT(o.err, CR_HTTP_EPROTOCOL);
  mode = M_BIG;
  o = one(h, &rq);
  CHECK_EQ_INT(o.err, CR_HTTP_ETOOBIG);   /* the engine's max_body is 1 KiB */
}

static void test_refused(cr_http *h) {
  cr_server *s2;
  cr_server_opts so = cr_server_defaults();
  CHECK_EQ_INT(cr_server_start(loop, &so, on_request, NULL, &s2), 0);
  char u[128];
  snprintf(u, sizeof u, "http://127.0.0.1:%d/", cr_server_port(s2));
  cr_server_close(s2);
  uv_run(loop, UV_RUN_NOWAIT);
  cr_http_req rq = { .url = u, .timeout = 5 };
  outcome o = one(h, &rq);
  CHECK_EQ_INT(o.err, CR_HTTP_ECONNECT);
}

static void test_pool_and_keepalive(cr_http *h) {
  cr_http_pool *p = cr_http_pool_new(h, 3);
  CHECK(p != NULL);
  cr_http_stats before, after;
  cr_http_get_stats(h, &before);
  mode = M_DEFER;
  max_held = 0;
  static outcome os[40];
  memset(os, 0, sizeof os);
  pending = 40;
  cr_http_req rq = { .url = url, .timeout = 5, .pool = p };
  for (int i = 0; i < 40; i++) CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &os[i], NULL), 0);
  run_until_done();
  int ok = 0;
  for (int i = 0; i < 40; i++) ok += os[i].done == 1 && os[i].err == 0 && strcmp(os[i].body, "d") == 0;
  CHECK_EQ_INT(ok, 40);
  CHECK(max_held <= 3);
  CHECK(max_held >= 2);
  cr_http_get_stats(h, &after);
  /* keep-alive: at most one new connection per admitted slot */
  CHECK(after.connects - before.connects <= 3);
  cr_http_pool_release(p);
}

static void test_cancel(cr_http *h) {
  mode = M_HANG;
  outcome o = {0};
  cr_http_call *c;
  cr_http_req rq = { .url = url, .timeout = 5 };
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o, &c), 0);
  uv_run(loop, UV_RUN_NOWAIT);   /* let it connect and send */
  uv_run(loop, UV_RUN_NOWAIT);
  cr_http_cancel(c);
  cr_http_stats st;
  cr_http_get_stats(h, &st);
  CHECK_EQ_INT(st.active + st.queued, 0);
  CHECK_EQ_INT(o.done, 0);

  /* A queued call (pool full) is cancelled too. */
  cr_http_pool *p = cr_http_pool_new(h, 1);
  outcome o1 = {0}, o2 = {0};
  cr_http_call *c1, *c2;
  rq.pool = p;
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o1, &c1), 0);
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o2, &c2), 0);
  cr_http_get_stats(h, &st);
  CHECK_EQ_INT(st.queued, 1);
  cr_http_cancel(c2);
  cr_http_cancel(c1);
  cr_http_pool_release(p);
  CHECK_EQ_INT(o1.done + o2.done, 0);
}

/* curl_multi_add_handle failing: the request fails at once (no callback from
 * inside cr_http_request, no dangling *out), and a queued call that fails to be
 * admitted completes from the loop without touching its freed pool. */
static void test_admit_failure(cr_http *h) {
  mode = M_ANSWER;
  outcome o = {0};
  cr_http_call *c = NULL;
  cr_http_req rq = { .url = url, .timeout = 5 };
  fail_add = 1;
  int rc = cr_http_request(h, &rq, on_done, &o, &c);
  fail_add = 0;
  CHECK_EQ_INT(o.done, 0);                 /* never called back from inside the call */
  if (rc == 0 && o.done == 0) { pending = 1; run_until_done(); CHECK_EQ_INT(o.err, CR_HTTP_ENOMEM); }
  else { CHECK_EQ_INT(rc, CR_HTTP_ENOMEM); CHECK(c == NULL); }

  cr_http_pool *p = cr_http_pool_new(h, 1);
  outcome o1 = {0}, o2 = {0};
  rq.pool = p;
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o1, NULL), 0);
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o2, NULL), 0);   /* queued */
  cr_http_pool_release(p);                 /* freed once idle */
  fail_add = 1;                            /* the queued call's admission fails */
  pending = 2;
  run_until_done();
  fail_add = 0;
  CHECK_EQ_INT(o1.done, 1);
  CHECK_EQ_INT(o1.err, 0);
  CHECK_EQ_INT(o2.done, 1);
  CHECK_EQ_INT(o2.err, CR_HTTP_ENOMEM);
  cr_http_stats st;
  cr_http_get_stats(h, &st);
  CHECK_EQ_INT(st.active + st.queued, 0);
}

static void test_close_pending(cr_http *h) {
  mode = M_HANG;
  outcome o = {0};
  cr_http_req rq = { .url = url, .timeout = 5 };
  pending = 1;
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o, NULL), 0);
  uv_run(loop, UV_RUN_NOWAIT);
  cr_http_close(h);
  CHECK_EQ_INT(o.done, 1);
  CHECK_EQ_INT(o.err, CR_HTTP_ECLOSED);
  CHECK_EQ_INT(cr_http_request(h, &rq, on_done, &o, NULL), CR_HTTP_ECLOSED);
}

int main(void) {
  loop = uv_default_loop();
  uv_timer_init(loop, &defer_timer);
  cr_server_opts so = cr_server_defaults();
  CHECK_EQ_INT(cr_server_start(loop, &so, on_request, NULL, &srv), 0);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/x?y=1", cr_server_port(srv));
  cr_http_opts ho = { .max_connections = 8, .max_body = 1024 };
  cr_http *h = cr_http_new(loop, &ho);
  CHECK(h != NULL);
  test_basic(h);
  test_bodies(h);
  test_faults(h);
  test_refused(h);
  test_pool_and_keepalive(h);
  test_cancel(h);
  test_admit_failure(h);
  test_close_pending(h);
  cr_server_close(srv);
  uv_close((uv_handle_t *)&defer_timer, NULL);
  while (uv_run(loop, UV_RUN_DEFAULT)) {}   /* close callbacks free the engine */
  CHECK_EQ_INT(uv_loop_close(loop), 0);
  return CHECK_DONE();
}
