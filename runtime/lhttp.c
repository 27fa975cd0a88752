/*
 * lhttp.c: captcha.http.request and friends, on the engine of http.c.
 *
 *   local r, err, kind = captcha.http.request{ url = "http://127.0.0.1:8080/x",
 *     method = "POST", headers = { ["X-A"] = "1" }, form = { a = "b" },
 *     timeout = 10, connect_timeout = 2 }
 *   -- r = { status = 200, headers = { ["content-type"] = ... }, body = "..." }
 *   -- err: message; kind: "timeout", "connect", "reset", "protocol", ...
 *
 * One engine per runtime, created on first use, held by a userdata anchored in
 * the registry and registered as a cr_resource so shutdown closes curl and its
 * handles. A request yields the calling task (the await idiom of cr.h); the
 * engine's completion callback only stores the result and wakes the task, and
 * cancelling the task removes the easy handle synchronously.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <curl/curl.h>
#include <openssl/evp.h>

#include "cr.h"
#include "http.h"

#define ENGINE_MT "captcha.http.engine"
#define POOL_MT "captcha.http.pool"
#define RESPONSE_MT "captcha.http.response"

static const char engine_key = 'h';

typedef struct engine_ref {
  cr_resource res;
  cr_runtime *rt;
  cr_http *h;                 /* NULL once closed */
} engine_ref;

typedef struct pool_ref { cr_http_pool *p; } pool_ref;

typedef struct lreq {
  cr_wait w;
  cr_http_call *call;         /* NULL once the engine called back */
  cr_http_result *res;
} lreq;

/* ---- the engine ------------------------------------------------------- */

static void engine_close(cr_resource *r) {
  engine_ref *e = (engine_ref *)r;
  if (!e->h) return;
  cr_http *h = e->h;
  e->h = NULL;
  cr_http_close(h);
}

static int engine_gc(lua_State *L) {
  engine_ref *e = luaL_checkudata(L, 1, ENGINE_MT);
  if (e->h) {
    cr_resource_remove(e->rt, &e->res);
    engine_close(&e->res);
  }
  return 0;
}

/* The runtime's engine, created on first use; NULL while shutting down. */
static cr_http *engine_get(lua_State *L) {
  cr_runtime *rt = cr_rt_get(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &engine_key);
  engine_ref *e = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (e && e->h) return e->h;
  if (cr_rt_closing(rt)) return NULL;
  e = lua_newuserdatauv(L, sizeof *e, 0);
  memset(e, 0, sizeof *e);
  luaL_setmetatable(L, ENGINE_MT);
  e->h = cr_http_new(cr_rt_loop(rt), NULL);
  if (!e->h) luaL_error(L, "cannot start the HTTP engine (curl init failed)");
  e->rt = rt;
  e->res.close = engine_close;
  cr_resource_add(rt, &e->res);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &engine_key);
  return e->h;
}

/* ---- parsing the request table ---------------------------------------- */

/* Strings made here (headers, numbers as text, JSON) live in this anchor table
 * until the request is handed to curl, which copies everything. */
typedef struct parse_ctx {
  lua_State *L;
  int anchor;
  int nanchor;
} parse_ctx;

static const char *anchor_str(parse_ctx *c, int idx, size_t *len) {
  lua_State *L = c->L;
  lua_pushvalue(L, idx);
  const char *s = lua_tolstring(L, -1, len);
  lua_rawseti(L, c->anchor, ++c->nanchor);
  return s;
}

static const char *field_str(parse_ctx *c, const char *opt, int idx, size_t *len) {
  int t = lua_type(c->L, idx);
  if (t != LUA_TSTRING && t != LUA_TNUMBER)
    luaL_error(c->L, "bad argument #1 to 'request' (%s values must be strings or numbers, got %s)",
               opt, luaL_typename(c->L, idx));
  return anchor_str(c, idx, len);
}

static void check_header_text(lua_State *L, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
      luaL_argerror(L, 1, "headers must not contain CR, LF or NUL");
}

/* headers = { Name = "value", ... }: becomes "Name: value" lines. */
static const char **parse_headers(parse_ctx *c, int *n, int want_json) {
  lua_State *L = c->L;
  int count = 0, has_ct = 0;
  if (lua_getfield(L, 1, "headers") != LUA_TNIL) {
    luaL_argexpected(L, lua_istable(L, -1), 1, "headers as a table");
    for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) count++;
  }
  const char **v = lua_newuserdatauv(L, sizeof *v * (size_t)(count + 1), 0);
  lua_rawseti(L, c->anchor, ++c->nanchor);
  int i = 0;
  if (count) {
    for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) {
      if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, 1, "header names must be strings");
      size_t nl, vl;
      const char *name = lua_tolstring(L, -2, &nl);
      const char *val = field_str(c, "header", -1, &vl);
      check_header_text(L, name, nl);
      check_header_text(L, val, vl);
      if (strcasecmp(name, "content-type") == 0) has_ct = 1;
      lua_pushfstring(L, "%s: %s", name, val);
      v[i++] = anchor_str(c, -1, NULL);
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  if (want_json && !has_ct) v[i++] = "Content-Type: application/json";
  *n = i;
  return v;
}

/* form = { name = value } (urlencoded) */
static cr_http_field *parse_form(parse_ctx *c, int *n) {
  lua_State *L = c->L;
  *n = 0;
  if (lua_getfield(L, 1, "form") == LUA_TNIL) { lua_pop(L, 1); return NULL; }
  luaL_argexpected(L, lua_istable(L, -1), 1, "form as a table");
  int count = 0;
  for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) count++;
  cr_http_field *f = lua_newuserdatauv(L, sizeof *f * (size_t)(count ? count : 1), 0);
  lua_rawseti(L, c->anchor, ++c->nanchor);
  memset(f, 0, sizeof *f * (size_t)(count ? count : 1));
  for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) {
    if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, 1, "form names must be strings");
    f[*n].name = lua_tostring(L, -2);
    f[*n].value = field_str(c, "form", -1, &f[*n].value_len);
    (*n)++;
  }
  lua_pop(L, 1);
  return f;
}

/* multipart = { {name=, data= | file=, filename=, type=}, ... } */
static cr_http_field *parse_multipart(parse_ctx *c, int *n) {
  lua_State *L = c->L;
  *n = 0;
  if (lua_getfield(L, 1, "multipart") == LUA_TNIL) { lua_pop(L, 1); return NULL; }
  luaL_argexpected(L, lua_istable(L, -1), 1, "multipart as an array of parts");
  int count = (int)lua_rawlen(L, -1);
  cr_http_field *f = lua_newuserdatauv(L, sizeof *f * (size_t)(count ? count : 1), 0);
  lua_rawseti(L, c->anchor, ++c->nanchor);
  memset(f, 0, sizeof *f * (size_t)(count ? count : 1));
  for (int i = 1; i <= count; i++, (*n)++) {
    lua_rawgeti(L, -1, i);
    luaL_argexpected(L, lua_istable(L, -1), 1, "multipart parts as tables");
    int part = lua_gettop(L);
    cr_http_field *p = &f[i - 1];
    if (lua_getfield(L, part, "name") != LUA_TSTRING) luaL_argerror(L, 1, "multipart part needs a name");
    p->name = anchor_str(c, -1, NULL);
    if (lua_getfield(L, part, "file") == LUA_TSTRING) {
      p->value = anchor_str(c, -1, &p->value_len);
      p->is_file = 1;
    } else if (lua_getfield(L, part, "data") != LUA_TNIL) {
      p->value = field_str(c, "multipart data", -1, &p->value_len);
    } else {
      luaL_argerror(L, 1, "multipart part needs data or file");
    }
    if (lua_getfield(L, part, "filename") == LUA_TSTRING) p->filename = anchor_str(c, -1, NULL);
    if (lua_getfield(L, part, "type") == LUA_TSTRING) p->content_type = anchor_str(c, -1, NULL);
    lua_settop(L, part - 1);
  }
  lua_pop(L, 1);
  return f;
}

static void parse_body(parse_ctx *c, cr_http_req *rq, int *json) {
  lua_State *L = c->L;
  int kinds = 0;
  *json = 0;
  if (lua_getfield(L, 1, "body") != LUA_TNIL) {
    rq->body = field_str(c, "body", -1, &rq->body_len);
    rq->has_body = 1;
    kinds++;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "json") != LUA_TNIL) {
    luaL_Buffer b;
    char err[128];
    int v = lua_gettop(L);
    luaL_buffinit(L, &b);
    if (cr_json_encode(L, v, &b, err, sizeof err) != 0)
      luaL_error(L, "bad argument #1 to 'request' (json: %s)", err);
    luaL_pushresult(&b);
    rq->body = anchor_str(c, -1, &rq->body_len);
    rq->has_body = 1;
    lua_pop(L, 1);
    *json = 1;
    kinds++;
  }
  lua_pop(L, 1);
  rq->form = parse_form(c, &rq->nform);
  rq->parts = parse_multipart(c, &rq->nparts);
  kinds += rq->form != NULL;
  kinds += rq->parts != NULL;
  if (kinds > 1) luaL_argerror(L, 1, "give only one of body, json, form, multipart");
}

static double opt_seconds(lua_State *L, const char *name, double def) {
  double v = def;
  if (lua_getfield(L, 1, name) != LUA_TNIL) {
    if (!lua_isnumber(L, -1)) luaL_error(L, "bad argument #1 to 'request' (%s must be a number of seconds)", name);
    v = lua_tonumber(L, -1);
    if (!(v > 0)) luaL_error(L, "bad argument #1 to 'request' (%s must be > 0)", name);
  }
  lua_pop(L, 1);
  return v;
}

static void parse_request(parse_ctx *c, cr_http_req *rq) {
  lua_State *L = c->L;
  int json;
  if (lua_getfield(L, 1, "url") != LUA_TSTRING) luaL_argerror(L, 1, "url (a string) is required");
  rq->url = anchor_str(c, -1, NULL);
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "method") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 1, "method must be a string");
    size_t n;
    const char *m = lua_tolstring(L, -1, &n);
    luaL_Buffer b;                                    /* upper-case it: "post" works */
    char *u = luaL_buffinitsize(L, &b, n);
    for (size_t i = 0; i < n; i++) u[i] = (char)(m[i] >= 'a' && m[i] <= 'z' ? m[i] - 32 : m[i]);
    luaL_pushresultsize(&b, n);
    rq->method = anchor_str(c, -1, NULL);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  parse_body(c, rq, &json);
  rq->headers = parse_headers(c, &rq->nheaders, json);
  rq->timeout = opt_seconds(L, "timeout", 30);
  rq->connect_timeout = opt_seconds(L, "connect_timeout", 10);
  if (lua_getfield(L, 1, "pool") != LUA_TNIL) {
    pool_ref *p = luaL_testudata(L, -1, POOL_MT);
    if (!p || !p->p) luaL_argerror(L, 1, "pool must be an open captcha.http.pool");
    rq->pool = p->p;
  }
  lua_pop(L, 1);
}

/* ---- results ---------------------------------------------------------- */

static int push_error(lua_State *L, int err, const char *msg) {
  lua_pushfstring(L, "http %s: %s", cr_http_errname(err), msg);
  cr_push_redacted(L, -1);
  lua_remove(L, -2);
  lua_pushnil(L);
  lua_insert(L, -2);
  lua_pushstring(L, cr_http_errname(err));
  return 3;
}

/* "Name: value" lines -> { name = value } with lower-case names; repeated
 * headers are joined with ", " (RFC 9110 list syntax). */
static void push_headers(lua_State *L, const char *h, size_t len) {
  lua_newtable(L);
  const char *end = h + len;
  while (h < end) {
    const char *eol = memchr(h, '\n', (size_t)(end - h));
    if (!eol) eol = end;
    const char *colon = memchr(h, ':', (size_t)(eol - h));
    if (colon && memcmp(h, "HTTP/", 5) != 0) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (const char *p = h; p < colon; p++) luaL_addchar(&b, (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p));
      luaL_pushresult(&b);
      const char *v = colon + 1, *ve = eol;
      while (v < ve && (*v == ' ' || *v == '\t')) v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
      lua_pushvalue(L, -1);
      if (lua_rawget(L, -3) == LUA_TSTRING) {
        lua_pushliteral(L, ", ");
        lua_pushlstring(L, v, (size_t)(ve - v));
        lua_concat(L, 3);
      } else {
        lua_pop(L, 1);
        lua_pushlstring(L, v, (size_t)(ve - v));
      }
      lua_rawset(L, -3);
    }
    h = eol + 1;
  }
}

static int push_response(lua_State *L, cr_http_result *r) {
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  push_headers(L, r->headers, r->headers_len);
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, r->body, r->body_len);
  lua_setfield(L, -2, "body");
  luaL_setmetatable(L, RESPONSE_MT);
  return 1;
}

static int req_deliver(lua_State *co, cr_wait *w) {
  lreq *q = (lreq *)w;
  cr_http_result *r = q->res;
  int n = r->error ? push_error(co, r->error, r->message) : push_response(co, r);
  cr_http_result_free(r);
  free(q);
  return n;
}

static void req_cancel(cr_wait *w) {
  lreq *q = (lreq *)w;
  if (q->call) cr_http_cancel(q->call);
  cr_http_result_free(q->res);
  free(q);
}

static void req_done(cr_http_result *r, void *ud) {
  lreq *q = ud;
  q->call = NULL;
  q->res = r;
  cr_wake(&q->w);
}

/* ---- Lua API ---------------------------------------------------------- */

static int lcr_http_request(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!cr_can_wait(L))
    return luaL_error(L, "captcha.http.request must be called from a task (captcha.run / captcha.spawn)");
  lua_settop(L, 1);
  lua_newtable(L);
  parse_ctx c = { L, 2, 0 };
  cr_http_req rq;
  memset(&rq, 0, sizeof rq);
  parse_request(&c, &rq);
  cr_http *h = engine_get(L);
  if (!h) return push_error(L, CR_HTTP_ECLOSED, "the runtime is shutting down");
  lreq *q = calloc(1, sizeof *q);
  if (!q) return luaL_error(L, "out of memory");
  int rc = cr_http_request(h, &rq, req_done, q, &q->call);
  if (rc) {
    free(q);
    return push_error(L, rc, rc == CR_HTTP_EINVAL ? "bad request (url must be http(s)://, method a token, files readable)"
                                                  : "cannot start the request");
  }
  cr_wait_begin(L, &q->w, req_deliver, req_cancel);
  return cr_yield(L);
}

/* response:json() -> decoded body, or nil, err */
static int lcr_response_json(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "body");
  size_t len;
  const char *s = lua_tolstring(L, -1, &len);
  char err[96];
  if (!s || cr_json_decode(L, s, len, err, sizeof err) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "response is not JSON (%s)", s ? err : "no body");
    return 2;
  }
  return 1;
}

/* captcha.http.pool(max_connections) -> a pool to pass as request{pool=}. */
static int lcr_pool_new(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 1 && n <= 100000, 1, "max_connections must be 1..100000");
  pool_ref *p = lua_newuserdatauv(L, sizeof *p, 0);
  p->p = NULL;
  luaL_setmetatable(L, POOL_MT);
  cr_http *h = engine_get(L);
  if (!h || !(p->p = cr_http_pool_new(h, (int)n))) return luaL_error(L, "cannot create an HTTP pool");
  return 1;
}

static int lcr_pool_close(lua_State *L) {
  pool_ref *p = luaL_checkudata(L, 1, POOL_MT);
  if (p->p) cr_http_pool_release(p->p);
  p->p = NULL;
  return 0;
}

/* captcha.http.escape(s) -> percent-encoded s (curl_easy_escape) */
static int lcr_http_escape(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_argcheck(L, n < 0x7fffffff, 1, "string too long");
  char *e = curl_easy_escape(NULL, s, (int)n);
  if (!e) return luaL_error(L, "out of memory");
  lua_pushstring(L, e);
  curl_free(e);
  return 1;
}

/* captcha.http.base64(bytes) -> standard base64 (in.php method=base64 bodies) */
static int lcr_http_base64(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_argcheck(L, n < 0x40000000, 1, "string too long");
  luaL_Buffer b;
  unsigned char *out = (unsigned char *)luaL_buffinitsize(L, &b, 4 * ((n + 2) / 3) + 1);
  int len = EVP_EncodeBlock(out, (const unsigned char *)s, (int)n);
  luaL_pushresultsize(&b, (size_t)len);
  return 1;
}

static int lcr_http_stats(lua_State *L) {
  cr_http *h = engine_get(L);
  cr_http_stats st;
  memset(&st, 0, sizeof st);
  if (h) cr_http_get_stats(h, &st);
  lua_createtable(L, 0, 9);
#define F(name) (lua_pushinteger(L, (lua_Integer)st.name), lua_setfield(L, -2, #name))
  F(requests); F(completed); F(failed); F(cancelled); F(connects);
  F(active); F(queued); F(sockets);
#undef F
  lua_pushboolean(L, st.async_dns);
  lua_setfield(L, -2, "async_dns");
  return 1;
}

static void metatables(lua_State *L) {
  if (luaL_newmetatable(L, ENGINE_MT)) {
    lua_pushcfunction(L, engine_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, POOL_MT)) {
    lua_pushcfunction(L, lcr_pool_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, lcr_pool_close);
    lua_setfield(L, -2, "__close");
    lua_newtable(L);
    lua_pushcfunction(L, lcr_pool_close);
    lua_setfield(L, -2, "close");
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, RESPONSE_MT)) {
    lua_newtable(L);
    lua_pushcfunction(L, lcr_response_json);
    lua_setfield(L, -2, "json");
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

/* Sets captcha.http.{request,pool,escape,base64,stats}; captcha.http is shared with
 * the server binding, so it is fetched or created, never replaced. */
void cr_register_http(lua_State *L) {
  metatables(L);
  if (lua_getfield(L, -1, "http") != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "http");
  }
  static const luaL_Reg f[] = {
      {"request", lcr_http_request}, {"pool", lcr_pool_new},
      {"escape", lcr_http_escape}, {"base64", lcr_http_base64},
      {"stats", lcr_http_stats}, {NULL, NULL}};
  luaL_setfuncs(L, f, 0);
  lua_pop(L, 1);
}
