/*
 * server.h: a small HTTP/1.1 server on libuv TCP, parsing with Debian's
 * http_parser. It never runs Lua: complete requests are handed to a C callback,
 * and whoever holds a request answers it later with cr_request_respond.
 *
 *   cr_server_opts o = cr_server_defaults();
 *   o.port = 0;                                 // ephemeral
 *   cr_server *s;
 *   int rc = cr_server_start(loop, &o, on_request, ud, &s);
 *   ...
 *   static void on_request(cr_server *s, cr_request *req, void *ud) {
 *     cr_request_respond(req, 200, "Content-Type: text/plain\r\n", 26, "hi", 2);
 *     cr_request_release(req);                  // the callback got one reference
 *   }
 *   ...
 *   cr_server_close(s);                         // no callback after this returns
 *
 * Keep-alive and pipelining: a connection keeps its requests in arrival order and
 * writes the answers in that order, whatever order they are given in. A request
 * that is never answered ("hang") holds back the ones behind it on the same
 * connection, like a real stuck server. Malformed requests get 400, oversized
 * ones 413/431, and the connection is closed after the answer.
 *
 * Memory: a request is reference counted (its connection + its holder), so a
 * holder may keep it after the connection is gone; answering it then returns
 * UV_ENOTCONN. Server and connection memory is freed in libuv close callbacks.
 */
#ifndef CR_SERVER_H
#define CR_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct cr_server cr_server;
typedef struct cr_request cr_request;

typedef void (*cr_server_request_cb)(cr_server *s, cr_request *req, void *ud);

typedef struct cr_server_opts {
  const char *host;        /* "127.0.0.1" by default */
  int port;                /* 0: ephemeral */
  int backlog;             /* listen(2) backlog */
  size_t max_header;       /* request line + headers, bytes (431 above) */
  size_t max_body;         /* body bytes (413 above) */
  int max_connections;     /* more are accepted and closed at once */
  int max_pipeline;        /* unanswered requests per connection before reading pauses */
  double idle_timeout;     /* seconds without traffic and without pending requests */
  double request_timeout;  /* seconds to receive one whole request, however it
                              trickles in (slow clients); 0: idle_timeout */
} cr_server_opts;

cr_server_opts cr_server_defaults(void);

/* 0 or a negative libuv error code (UV_EADDRINUSE, UV_EINVAL for a bad host...). */
int cr_server_start(uv_loop_t *loop, const cr_server_opts *o, cr_server_request_cb cb,
                    void *ud, cr_server **out);
int cr_server_port(const cr_server *s);
/* Stop listening and close every connection (pending requests stay valid for
 * their holders but can no longer be answered). The callback is never called
 * again; memory goes in the close callbacks. Idempotent per server. */
void cr_server_close(cr_server *s);

typedef struct cr_server_stats {
  uint64_t accepted, refused, requests, responses, bad_requests, idle_closed;
  int open_connections;
} cr_server_stats;
void cr_server_get_stats(const cr_server *s, cr_server_stats *st);

/* Request accessors; strings are not NUL-terminated unless said. */
const char *cr_request_method(const cr_request *r);          /* "GET", NUL-terminated */
const char *cr_request_path(const cr_request *r, size_t *len);
const char *cr_request_query(const cr_request *r, size_t *len); /* without '?', NULL if none */
const char *cr_request_body(const cr_request *r, size_t *len);
int cr_request_header_count(const cr_request *r);
/* i-th header; the name is lower-case. */
void cr_request_header(const cr_request *r, int i, const char **name, size_t *nlen,
                       const char **value, size_t *vlen);
/* First header of that lower-case name, or NULL. */
const char *cr_request_header_get(const cr_request *r, const char *name, size_t *vlen);
/* Peer still connected and the request not yet answered. */
int cr_request_pending(const cr_request *r);

/* Answer: `headers` is zero or more preformatted "Name: value\r\n" lines (the
 * server adds Content-Length, Connection and, when missing, Content-Type). Returns
 * 0, UV_EALREADY if answered before, UV_ENOTCONN if the connection is gone. */
int cr_request_respond(cr_request *r, int status, const char *headers, size_t hlen,
                       const char *body, size_t blen);
/* Like respond, but the bytes go out `chunk` at a time every `interval_ms`
 * (a slow server). */
int cr_request_drip(cr_request *r, int status, const char *headers, size_t hlen,
                    const char *body, size_t blen, size_t chunk, uint64_t interval_ms);
/* Write raw bytes as the answer (garbage, half responses); the connection is
 * closed after them. */
int cr_request_respond_raw(cr_request *r, const char *bytes, size_t len);
/* Close the connection abruptly (TCP RST). */
int cr_request_reset(cr_request *r);
/* Never answer: the connection stays open until the peer closes it. */
void cr_request_hang(cr_request *r);
void cr_request_retain(cr_request *r);
void cr_request_release(cr_request *r);

/* Decode one application/x-www-form-urlencoded component ('+' is a space) into
 * a malloc'd NUL-terminated string; *outlen gets its length. NULL on OOM. */
char *cr_url_decode(const char *s, size_t len, size_t *outlen);

/* Lua binding (lserver.c): sets captcha.http.serve and captcha.http.decode_form
 * in the `captcha` table at the top of the stack (get-or-create `http`). */
struct lua_State;
void cr_register_server(struct lua_State *L);

#endif
