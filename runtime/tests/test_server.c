/* test_server.c: the HTTP server primitive against a raw loopback socket client.
 * The server's loop runs in a second thread; the client is plain blocking
 * sockets (with a receive timeout as a safety net, never as synchronisation). */
#define _GNU_SOURCE  /* strcasestr */
#include "check.h"
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static uv_loop_t loop;
static uv_async_t stop_async;
static cr_server *srv, *srv_small;
static cr_request *held_later, *held_hang;
#define BIG_BODY (16 * 1024 * 1024)  /* more than loopback socket buffers hold */
static char *big_body;

/* The server side: what to answer is chosen by path. */
static void on_request(cr_server *s, cr_request *r, void *ud) {
  (void)s, (void)ud;
  size_t plen, qlen, blen, hlen;
  const char *path = cr_request_path(r, &plen);
  const char *q = cr_request_query(r, &qlen);
  const char *body = cr_request_body(r, &blen);
  char p[256];
  snprintf(p, sizeof p, "%.*s", (int)plen, path);
  if (strcmp(p, "/later") == 0) { held_later = r; return; }  /* keep our reference */
  if (strcmp(p, "/hang") == 0) { cr_request_hang(r); held_hang = r; return; }
  if (strcmp(p, "/reset") == 0) cr_request_reset(r);
  else if (strcmp(p, "/raw") == 0) cr_request_respond_raw(r, "garbage", 7);
  else if (strcmp(p, "/drip") == 0)
    cr_request_drip(r, 200, NULL, 0, "slow but complete", 17, 3, 1);
  else if (strcmp(p, "/big") == 0)
    CHECK_EQ_INT(cr_request_respond(r, 200, NULL, 0, big_body, BIG_BODY), 0);
  else {
    char out[8192];
    const char *x = cr_request_header_get(r, "x-test", &hlen);
    int n = snprintf(out, sizeof out, "%s %s q=%.*s x=%.*s body=%.*s", cr_request_method(r), p,
                     (int)(q ? qlen : 4), q ? q : "none", (int)(x ? hlen : 0), x ? x : "",
                     (int)blen, body);
    CHECK_EQ_INT(cr_request_respond(r, 200, "X-Path: yes\r\n", 13, out, (size_t)n), 0);
    CHECK_EQ_INT(cr_request_respond(r, 200, NULL, 0, "", 0), UV_EALREADY);
    if (strcmp(p, "/now") == 0 && held_later) {
      cr_request_respond(held_later, 200, NULL, 0, "later", 5);
      cr_request_release(held_later);
      held_later = NULL;
    }
  }
  cr_request_release(r);
}

static void on_stop(uv_async_t *a) {
  cr_server_stats st, sm;
  cr_server_get_stats(srv, &st);
  cr_server_get_stats(srv_small, &sm);
  CHECK_EQ_INT(st.bad_requests, 3);   /* 400, 413, 431 */
  CHECK_EQ_INT(st.requests, 223);    /* reset and hang are never answered, */
  CHECK_EQ_INT(st.responses, 224);   /* the three refusals are */
  CHECK_EQ_INT(sm.refused, 1);
  CHECK_EQ_INT(sm.idle_closed, 5);   /* four idle, one too slow */
  cr_server_close(srv);
  cr_server_close(srv_small);
  if (held_hang) {
    CHECK_EQ_INT(cr_request_respond(held_hang, 200, NULL, 0, "", 0), UV_EALREADY);
    cr_request_release(held_hang);
  }
  if (held_later) {
    CHECK_EQ_INT(cr_request_respond(held_later, 200, NULL, 0, "", 0), UV_ENOTCONN);
    cr_request_release(held_later);
  }
  uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg) {
  (void)arg;
  uv_run(&loop, UV_RUN_DEFAULT);
  return NULL;
}

/* ---- the client ---- */

typedef struct client { int fd; char buf[65536]; size_t len; } client;

static int dial(client *c, int port) {
  memset(c, 0, sizeof *c);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct timeval tv = {10, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return connect(c->fd, (struct sockaddr *)&a, sizeof a);
}

static void send_all(client *c, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}
#define SEND(c, s) send_all(c, s, strlen(s))

static ssize_t fill(client *c) {
  if (c->len >= sizeof c->buf - 1) return -1;
  ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
  if (n > 0) c->len += (size_t)n;
  c->buf[c->len] = 0;
  return n;
}

/* One response: status, or -1 on EOF/error. Headers and body copied out. */
static int read_response(client *c, char *head, char *body, size_t cap) {
  char *end;
  while (!(end = strstr(c->buf, "\r\n\r\n")))
    if (fill(c) <= 0) return -1;
  size_t hl = (size_t)(end - c->buf) + 4;
  const char *cl = strcasestr(c->buf, "content-length:");
  size_t blen = cl && cl < end ? strtoul(cl + 15, NULL, 10) : 0;
  while (c->len < hl + blen)
    if (fill(c) <= 0) return -1;
  snprintf(head, cap, "%.*s", (int)hl, c->buf);
  snprintf(body, cap, "%.*s", (int)blen, c->buf + hl);
  int status = atoi(c->buf + 9);
  memmove(c->buf, c->buf + hl + blen, c->len - hl - blen);
  c->len -= hl + blen;
  c->buf[c->len] = 0;
  return status;
}

static int at_eof(client *c) {  /* 1 clean EOF, -errno on error */
  char b[256];
  ssize_t n;
  while ((n = recv(c->fd, b, sizeof b, 0)) > 0) {}
  return n == 0 ? 1 : -errno;
}

static char head[8192], body[8192];

static void test_keep_alive(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  for (int i = 0; i < 3; i++) {
    SEND(&c, "GET /a/b?x=1&y=%20z HTTP/1.1\r\nHost: t\r\nX-Test: Hello\r\n\r\n");
    CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
    CHECK_STR(body, "GET /a/b q=x=1&y=%20z x=Hello body=");
    CHECK(strstr(head, "X-Path: yes\r\n") != NULL);
    CHECK(strstr(head, "Content-Type: text/plain\r\n") != NULL);
    CHECK(strstr(head, "Connection: close") == NULL);
  }
  SEND(&c, "POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "POST /p q=none x= body=hello");
  SEND(&c, "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "POST /c q=none x= body=abcde");
  /* A request split into single bytes still parses. */
  const char *req = "GET /split HTTP/1.1\r\nX-Test: parts\r\n\r\n";
  for (const char *p = req; *p; p++) send_all(&c, p, 1);
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /split q=none x=parts body=");
  close(c.fd);
}

static void test_pipelined(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  /* /later is answered only when /now arrives, after /now's own answer: the
   * wire must still carry them in request order. */
  SEND(&c, "GET /first HTTP/1.1\r\n\r\nGET /later HTTP/1.1\r\n\r\nGET /now HTTP/1.1\r\n\r\n"
           "GET /last HTTP/1.1\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /first q=none x= body=");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "later");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /now q=none x= body=");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /last q=none x= body=");
  /* Many pipelined requests in one write (more than max_pipeline). */
  char big[200 * 40] = "";
  for (int i = 0; i < 200; i++) strcat(big, "GET /many HTTP/1.1\r\n\r\n");
  SEND(&c, big);
  int ok = 0;
  for (int i = 0; i < 200; i++) ok += read_response(&c, head, body, sizeof body) == 200;
  CHECK_EQ_INT(ok, 200);
  close(c.fd);
}

static void test_malformed(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /ok HTTP/1.1\r\n\r\nNOT A REQUEST\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 400);
  CHECK(strstr(head, "Connection: close") != NULL);
  CHECK_EQ_INT(at_eof(&c), 1);
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "POST /big HTTP/1.1\r\nContent-Length: 5000\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 413);
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  char hdr[4000];
  memset(hdr, 'a', sizeof hdr);
  hdr[sizeof hdr - 1] = 0;
  SEND(&c, "GET /h HTTP/1.1\r\nX-Big: ");
  SEND(&c, hdr);
  SEND(&c, "\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 431);
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /old HTTP/1.0\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK(strstr(head, "Connection: close") != NULL);
  CHECK_EQ_INT(at_eof(&c), 1);
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /old10ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK(strstr(head, "Connection: keep-alive") != NULL);
  SEND(&c, "GET /again HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_EQ_INT(at_eof(&c), 1);
  close(c.fd);
}

static void test_faults(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /reset HTTP/1.1\r\n\r\n");
  CHECK_EQ_INT(at_eof(&c), -ECONNRESET);
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /raw HTTP/1.1\r\n\r\n");
  while (fill(&c) > 0) {}
  CHECK_STR(c.buf, "garbage");
  close(c.fd);

  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /drip HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "slow but complete");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /after q=none x= body=");
  close(c.fd);

  /* A hung request: no answer; the connection is closed by the server's close. */
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /hang HTTP/1.1\r\n\r\n");
  close(c.fd);
}

/* A client that sends its request and half-closes (shutdown(SHUT_WR), as
 * HTTP/1.0 tools do) gets the whole answer, even one the socket cannot take
 * at once, and then a clean EOF. */
static void test_half_close_mid_write(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "GET /big HTTP/1.1\r\n\r\n");
  shutdown(c.fd, SHUT_WR);
  size_t total = 0;
  ssize_t n;
  char *b = malloc(65536);
  while ((n = recv(c.fd, b, 65536, 0)) > 0) total += (size_t)n;
  CHECK_EQ_INT(n, 0);  /* clean EOF, no reset */
  free(b);
  size_t head_len = strlen("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 16777216\r\n\r\n");
  CHECK_EQ_INT(total, head_len + BIG_BODY);
  close(c.fd);
}

/* HEAD: the answer's headers say the body's length, but no body follows, or
 * the next answer on the connection would be read as that body. */
static void test_head(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "HEAD /h HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n");
  char *end;
  while (!(end = strstr(c.buf, "\r\n\r\n")) && fill(&c) > 0) {}
  CHECK(end != NULL);
  if (!end) { close(c.fd); return; }
  CHECK(strncmp(c.buf, "HTTP/1.1 200 ", 13) == 0);
  size_t hl = (size_t)(end - c.buf) + 4;
  while (c.len < hl + 9 && fill(&c) > 0) {}
  CHECK(strncmp(c.buf + hl, "HTTP/1.1 ", 9) == 0);
  memmove(c.buf, c.buf + hl, c.len - hl + 1);
  c.len -= hl;
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "GET /next q=none x= body=");
  close(c.fd);
}

/* Expect: 100-continue gets the interim answer before the body is sent. */
static void test_continue(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  SEND(&c, "POST /up HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n");
  while (c.len < 25 && fill(&c) > 0) {}
  CHECK(strncmp(c.buf, "HTTP/1.1 100 Continue\r\n\r\n", 25) == 0);
  memmove(c.buf, c.buf + 25, c.len >= 25 ? c.len - 25 + 1 : 1);
  c.len = c.len >= 25 ? c.len - 25 : 0;
  SEND(&c, "hello");
  CHECK_EQ_INT(read_response(&c, head, body, sizeof body), 200);
  CHECK_STR(body, "POST /up q=none x= body=hello");
  close(c.fd);
}

/* A client that trickles a request in (each byte resets the idle timer) is
 * cut once the request took longer than request_timeout (here 0.2 s). */
static void test_slow_request(int port) {
  client c;
  CHECK_EQ_INT(dial(&c, port), 0);
  const char *req = "GET /slow HTTP/1.1\r\nX-Test: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  size_t sent = 0, n = strlen(req);
  char b;
  for (; sent < n; sent++) {
    if (send(c.fd, req + sent, 1, MSG_NOSIGNAL) != 1) break;
    usleep(40 * 1000); /* the client's pace, not synchronisation */
    ssize_t r = recv(c.fd, &b, 1, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;
  }
  CHECK(sent < n);   /* cut before the trickle ended (about 2.5 s) */
  close(c.fd);
}

static void test_limits(int port) {
  client c[5];
  for (int i = 0; i < 4; i++) {
    CHECK_EQ_INT(dial(&c[i], port), 0);
    SEND(&c[i], "GET /x HTTP/1.1\r\n\r\n");  /* answered means accepted */
    CHECK_EQ_INT(read_response(&c[i], head, body, sizeof body), 200);
  }
  CHECK_EQ_INT(dial(&c[4], port), 0);
  CHECK_EQ_INT(at_eof(&c[4]), 1);  /* over max_connections: closed at once */
  close(c[4].fd);
  /* Idle connections are closed by the server (idle_timeout 0.2 s). */
  for (int i = 0; i < 4; i++) {
    CHECK_EQ_INT(at_eof(&c[i]), 1);
    close(c[i].fd);
  }
}

static void test_url_decode(void) {
  size_t n;
  char *s = cr_url_decode("a+b%20c%2Bd%3D", 14, &n);
  CHECK_STR(s, "a b c+d=");
  CHECK_EQ_INT(n, 8);
  free(s);
  s = cr_url_decode("%00x", 4, &n);
  CHECK_EQ_INT(n, 2);
  free(s);
}

int main(void) {
  test_url_decode();
  big_body = malloc(BIG_BODY);
  memset(big_body, 'b', BIG_BODY);
  uv_loop_init(&loop);
  cr_server_opts o = cr_server_defaults();
  o.max_body = 4096;
  o.max_header = 2048;
  CHECK_EQ_INT(cr_server_start(&loop, &o, on_request, NULL, &srv), 0);
  cr_server_opts small = cr_server_defaults();
  small.max_connections = 4;
  small.idle_timeout = 0.2;
  CHECK_EQ_INT(cr_server_start(&loop, &small, on_request, NULL, &srv_small), 0);
  cr_server_opts bad = cr_server_defaults();
  bad.host = "not-an-ip";
  cr_server *none;
  CHECK_EQ_INT(cr_server_start(&loop, &bad, on_request, NULL, &none), UV_EINVAL);
  bad.host = "127.0.0.1";
  bad.port = cr_server_port(srv);
  CHECK_EQ_INT(cr_server_start(&loop, &bad, on_request, NULL, &none), UV_EADDRINUSE);
  uv_async_init(&loop, &stop_async, on_stop);
  int port = cr_server_port(srv), port_small = cr_server_port(srv_small);
  CHECK(port > 0 && port_small > 0);

  pthread_t th;
  pthread_create(&th, NULL, loop_thread, NULL);
  test_keep_alive(port);
  test_pipelined(port);
  test_malformed(port);
  test_faults(port);
  test_half_close_mid_write(port);
  test_head(port);
  test_continue(port);
  test_limits(port_small);
  test_slow_request(port_small);
  uv_async_send(&stop_async);
  pthread_join(th, NULL);

  CHECK_EQ_INT(uv_loop_close(&loop), 0);  /* every handle closed */
  free(big_body);
  return CHECK_DONE();
}
