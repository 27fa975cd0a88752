/*
 * http.h: the HTTP client engine, libcurl's multi interface driven by libuv.
 *
 * One engine per runtime (per loop). It never runs Lua: a finished request is
 * handed to a C callback, which owns the result.
 *
 *   cr_http *h = cr_http_new(loop, NULL);
 *   cr_http_req rq = { .url = "http://127.0.0.1:8080/res.php?action=get", .timeout = 10 };
 *   cr_http_call *c;
 *   int rc = cr_http_request(h, &rq, on_done, ud, &c);   // 0 or a CR_HTTP_E* code
 *   ...
 *   static void on_done(cr_http_result *res, void *ud) {
 *     if (res->error == 0) use(res->status, res->body, res->body_len);
 *     cr_http_result_free(res);
 *   }
 *   cr_http_cancel(c);     // before completion only: no callback after it
 *   cr_http_close(h);      // pending calls complete with CR_HTTP_ECLOSED
 *
 * Connection limits come in pools: a pool admits at most max_connections
 * requests at once and queues the rest FIFO (O(1) per request; curl's own
 * pending list is not used). The engine keeps curl's connection cache at least
 * as large as the sum of its pools' limits, so keep-alive connections are reused
 * instead of being closed and reopened (STYLE.md: 275 connections for 20
 * concurrent solves with curl's default cache). A queued request's timeout
 * starts when it is admitted.
 *
 * Everything in a cr_http_req is copied by cr_http_request: the caller may free
 * it as soon as the call returns.
 */
#ifndef CR_HTTP_H
#define CR_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct cr_http cr_http;
typedef struct cr_http_call cr_http_call;
typedef struct cr_http_pool cr_http_pool;

enum {
  CR_HTTP_OK = 0,
  CR_HTTP_ETIMEOUT = -1,   /* connect or total timeout */
  CR_HTTP_ECONNECT = -2,   /* refused, unreachable, name not resolved */
  CR_HTTP_ERESET = -3,     /* connection reset or closed before a full answer */
  CR_HTTP_EPROTOCOL = -4,  /* not HTTP (garbage), bad chunking, ... */
  CR_HTTP_ETOOBIG = -5,    /* body larger than the engine's max_body */
  CR_HTTP_ECLOSED = -6,    /* the engine was closed */
  CR_HTTP_EINVAL = -7,     /* bad request description (URL, method) */
  CR_HTTP_ENOMEM = -8,
  CR_HTTP_ETRANSPORT = -9  /* any other transport failure (TLS, ...) */
};
/* "timeout", "connect", "reset", "protocol", "too_big", "closed", "invalid",
 * "nomem", "transport" ("ok" for 0). */
const char *cr_http_errname(int err);

/* A form field (x-www-form-urlencoded) or a multipart part. */
typedef struct cr_http_field {
  const char *name;
  const char *value;          /* bytes; for a file part, the path to read */
  size_t value_len;
  int is_file;                /* multipart only: value is a path (curl_mime_filedata) */
  const char *filename;       /* multipart only, optional */
  const char *content_type;   /* multipart only, optional */
} cr_http_field;

typedef struct cr_http_req {
  const char *method;          /* NULL: POST when a body is given, else GET */
  const char *url;
  const char *const *headers;  /* "Name: value" lines */
  int nheaders;
  const char *body;            /* raw body; JSON is encoded by the caller */
  size_t body_len;
  int has_body;                /* body given (it may be empty) */
  const cr_http_field *form;   /* urlencoded body (curl_easy_escape) */
  int nform;
  const cr_http_field *parts;  /* multipart/form-data (curl_mime) */
  int nparts;
  double timeout;              /* whole request, seconds; <= 0: none */
  double connect_timeout;      /* seconds; <= 0: 10 */
  cr_http_pool *pool;          /* NULL: the engine's default pool */
} cr_http_req;

typedef struct cr_http_result {
  int error;                   /* CR_HTTP_OK or a CR_HTTP_E* code */
  char message[256];           /* why, when error != 0 */
  long status;                 /* HTTP status when error == 0 */
  char *headers;               /* raw header lines of the final response, NUL-terminated */
  size_t headers_len;
  char *body;                  /* NUL-terminated (not counted in body_len) */
  size_t body_len;
} cr_http_result;

/* Called once per request that was not cancelled, from the loop (never inside a
 * curl callback). The callee owns res. It may start new requests. */
typedef void (*cr_http_cb)(cr_http_result *res, void *ud);
void cr_http_result_free(cr_http_result *res);

typedef struct cr_http_opts {
  int max_connections;         /* the default pool's limit (default 64) */
  size_t max_body;             /* response body limit in bytes (default 16 MiB) */
} cr_http_opts;

cr_http *cr_http_new(uv_loop_t *loop, const cr_http_opts *o);
/* Completes every pending call with CR_HTTP_ECLOSED, cleans curl up and closes
 * the libuv handles; memory goes in the close callbacks (run the loop). */
void cr_http_close(cr_http *h);

/* On an error code, cb is never called; on 0, cb is called later from the
 * loop, never before cr_http_request returns. */
int cr_http_request(cr_http *h, const cr_http_req *req, cr_http_cb cb, void *ud,
                    cr_http_call **out);
/* Removes the request synchronously (closing its connection if it was mid-way);
 * its callback is never called. Only valid before the callback ran. */
void cr_http_cancel(cr_http_call *c);

/* A pool with its own connection limit. Freed once released and idle. */
cr_http_pool *cr_http_pool_new(cr_http *h, int max_connections);
void cr_http_pool_release(cr_http_pool *p);

typedef struct cr_http_stats {
  uint64_t requests;           /* started */
  uint64_t completed;          /* callback called (any outcome) */
  uint64_t failed;             /* completed with error != 0 */
  uint64_t cancelled;
  uint64_t connects;           /* new connections curl opened (keep-alive check) */
  int active, queued;          /* now */
  int sockets;                 /* polls open now */
  int async_dns;               /* curl resolves names off the loop thread */
} cr_http_stats;
void cr_http_get_stats(const cr_http *h, cr_http_stats *st);

/* The Lua binding (lhttp.c): sets captcha.http.request/pool/escape/stats in
 * the captcha table at the top of the stack (get-or-create captcha.http). */
struct lua_State;
void cr_register_http(struct lua_State *L);

#endif
