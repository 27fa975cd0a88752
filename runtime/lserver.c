/*
 * lserver.c: captcha.http.serve{...}, the Lua face of server.c.
 *
 *   local srv = captcha.http.serve{ port = 0, handler = function(req)
 *     return 200, { ["Content-Type"] = "application/json" }, '{"ok":true}'
 *   end }
 *   print(srv.url) ; srv:close()
 *
 * Throughput: the C server queues complete requests; ONE accept-loop task per
 * server takes them. Its `_next` returns at once while the queue is not empty
 * and yields only when it is, so a burst of N requests costs one wake and one
 * resume, not N. A handler that returns a status answers at once; one that
 * returns nothing answers later with req:respond (typically from a task it
 * spawned), or never (req:hang()).
 *
 * Request fields are computed on first access (query, headers and form become
 * tables cached in the userdata's user values): a res.php poll that reads only
 * req.query never pays for a headers table.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cr.h"
#include "server.h"

#define SERVER_MT "captcha.http.server"
#define REQUEST_MT "captcha.http.request"

typedef struct lsrv {
  cr_server *s;          /* NULL once closed */
  cr_runtime *rt;
  cr_resource res;
  cr_wait wait;
  int waiting;
  cr_request **q;        /* ring of requests not yet taken by the accept loop */
  size_t qhead, qlen, qcap;
  int port;
  char host[64];
} lsrv;

typedef struct lreq { cr_request *r; } lreq;

/* ---- the queue (C side, no Lua) ---- */

static int q_push(lsrv *ls, cr_request *r) {
  if (ls->qlen == ls->qcap) {
    size_t cap = ls->qcap ? ls->qcap * 2 : 256;
    cr_request **q = malloc(cap * sizeof *q);
    if (!q) return -1;
    for (size_t i = 0; i < ls->qlen; i++) q[i] = ls->q[(ls->qhead + i) % ls->qcap];
    free(ls->q);
    ls->q = q, ls->qcap = cap, ls->qhead = 0;
  }
  ls->q[(ls->qhead + ls->qlen++) % ls->qcap] = r;
  return 0;
}

static cr_request *q_pop(lsrv *ls) {
  if (!ls->qlen) return NULL;
  cr_request *r = ls->q[ls->qhead];
  ls->qhead = (ls->qhead + 1) % ls->qcap;
  ls->qlen--;
  return r;
}

static void on_request(cr_server *s, cr_request *r, void *ud) {
  (void)s;
  lsrv *ls = ud;
  if (q_push(ls, r) != 0) {
    cr_request_respond(r, 503, NULL, 0, "out of memory", 13);
    cr_request_release(r);
    return;
  }
  if (ls->waiting) {
    ls->waiting = 0;
    cr_wake(&ls->wait);
  }
}

static void server_close(lsrv *ls) {
  if (!ls->s) return;
  cr_server_close(ls->s);
  ls->s = NULL;
  cr_request *r;
  while ((r = q_pop(ls))) cr_request_release(r);
  if (ls->waiting) {  /* the accept loop gets nil and ends */
    ls->waiting = 0;
    cr_wake(&ls->wait);
  }
}

static void resource_close(cr_resource *res) {
  lsrv *ls = (lsrv *)((char *)res - offsetof(lsrv, res));
  server_close(ls);
}

/* ---- requests ---- */

static void push_request(lua_State *L, cr_request *r) {
  lreq *u = lua_newuserdatauv(L, sizeof *u, 3);  /* query, headers, form */
  u->r = r;
  luaL_setmetatable(L, REQUEST_MT);
}

static lreq *check_req(lua_State *L) {
  lreq *u = luaL_checkudata(L, 1, REQUEST_MT);
  return u;
}

/* Decode a=1&b=2 into a new table (the last of repeated keys wins, as PHP does). */
static void push_form(lua_State *L, const char *s, size_t len) {
  lua_createtable(L, 0, 8);
  const char *end = s + len;
  while (s < end) {
    const char *amp = memchr(s, '&', (size_t)(end - s));
    if (!amp) amp = end;
    const char *eq = memchr(s, '=', (size_t)(amp - s));
    const char *kend = eq ? eq : amp;
    if (kend > s && !memchr(s, '%', (size_t)(amp - s)) && !memchr(s, '+', (size_t)(amp - s))) {
      /* nothing to decode (the usual case): no allocation at all */
      lua_pushlstring(L, s, (size_t)(kend - s));
      if (eq) lua_pushlstring(L, eq + 1, (size_t)(amp - eq - 1));
      else lua_pushliteral(L, "");
      lua_rawset(L, -3);
    } else if (kend > s) {
      size_t kl, vl;
      char *k = cr_url_decode(s, (size_t)(kend - s), &kl);
      char *v = eq ? cr_url_decode(eq + 1, (size_t)(amp - eq - 1), &vl) : NULL;
      if (k && (v || !eq)) {
        lua_pushlstring(L, k, kl);
        lua_pushlstring(L, v ? v : "", v ? vl : 0);
        lua_rawset(L, -3);
      }
      free(k);
      free(v);
    }
    s = amp + 1;
  }
}

static void push_headers(lua_State *L, cr_request *r) {
  int n = cr_request_header_count(r);
  lua_createtable(L, 0, n);
  for (int i = 0; i < n; i++) {
    const char *k, *v;
    size_t kl, vl;
    cr_request_header(r, i, &k, &kl, &v, &vl);
    lua_pushlstring(L, k, kl);
    lua_pushlstring(L, v, vl);
    lua_rawset(L, -3);
  }
}

static int is_form(cr_request *r) {
  size_t n;
  const char *ct = cr_request_header_get(r, "content-type", &n);
  static const char want[] = "application/x-www-form-urlencoded";
  return ct && n >= sizeof want - 1 && strncasecmp(ct, want, sizeof want - 1) == 0;
}

/* A cached table field: user value `slot`, built by `build` on first access. */
static int cached(lua_State *L, int slot, void (*build)(lua_State *, cr_request *), cr_request *r) {
  if (lua_getiuservalue(L, 1, slot) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  build(L, r);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, 1, slot);
  return 1;
}

static void build_query(lua_State *L, cr_request *r) {
  size_t n;
  const char *q = cr_request_query(r, &n);
  push_form(L, q ? q : "", q ? n : 0);
}

static void build_form(lua_State *L, cr_request *r) {
  size_t n;
  const char *b = cr_request_body(r, &n);
  if (is_form(r)) push_form(L, b, n);
  else lua_pushboolean(L, 0);  /* cached "no form" */
}

static int req_index(lua_State *L) {
  lreq *u = check_req(L);
  const char *k = luaL_checkstring(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;  /* a method */
  size_t n;
  const char *s;
  switch (k[0]) {
  case 'm': if (strcmp(k, "method") == 0) { lua_pushstring(L, cr_request_method(u->r)); return 1; } break;
  case 'p': if (strcmp(k, "path") == 0) { s = cr_request_path(u->r, &n); lua_pushlstring(L, s, n); return 1; } break;
  case 'b': if (strcmp(k, "body") == 0) { s = cr_request_body(u->r, &n); lua_pushlstring(L, s, n); return 1; } break;
  case 'q': if (strcmp(k, "query") == 0) return cached(L, 1, build_query, u->r); break;
  case 'h': if (strcmp(k, "headers") == 0) return cached(L, 2, push_headers, u->r); break;
  case 'f':
    if (strcmp(k, "form") == 0) {
      cached(L, 3, build_form, u->r);
      if (lua_isboolean(L, -1)) lua_pushnil(L);
      return 1;
    }
    break;
  }
  lua_pushnil(L);
  return 1;
}

/* A NUL or any of `set` in s[0..n): strpbrk would stop at a NUL and let a
 * CR LF after it through (header injection). */
static int has_any(const char *s, size_t n, const char *set) {
  if (memchr(s, 0, n)) return 1;
  for (; *set; set++)
    if (memchr(s, *set, n)) return 1;
  return 0;
}

/* Format a {name = value} table as "Name: value\r\n" lines. Two passes (check
 * and measure, then copy) so that a bad header raises before anything is
 * allocated outside Lua's control. The block goes to `small` (room for
 * `cap`: the usual one or two headers, no allocation) or else to a GC-owned
 * userdata left on the stack. */
static const char *header_block(lua_State *L, int idx, char *small, size_t cap, size_t *len) {
  size_t total = 0;
  for (int pass = 0; pass < 2; pass++) {
    char *out = !pass ? NULL : total <= cap ? small : lua_newuserdatauv(L, total ? total : 1, 0);
    size_t off = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      size_t kl, vl;
      const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &kl) : NULL;
      int vok = lua_type(L, -1) == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER;
      const char *v = vok ? lua_tolstring(L, -1, &vl) : NULL;  /* a number turns into a string */
      if (!k || !v || has_any(k, kl, "\r\n:") || has_any(v, vl, "\r\n"))
        luaL_argerror(L, idx, "headers must map names to values (no NUL, CR, LF, or ':' in names)");
      if (pass) {
        memcpy(out + off, k, kl), off += kl;
        memcpy(out + off, ": ", 2), off += 2;
        memcpy(out + off, v, vl), off += vl;
        memcpy(out + off, "\r\n", 2), off += 2;
      } else {
        total += kl + vl + 4;
      }
      lua_pop(L, 1);
    }
    if (pass) { *len = total; return out; }
  }
  return NULL;
}

static int push_rc(lua_State *L, int rc) {
  if (rc == 0) { lua_pushboolean(L, 1); return 1; }
  lua_pushnil(L);
  lua_pushstring(L, rc == UV_EALREADY ? "request already answered"
                  : rc == UV_ENOTCONN ? "connection closed" : uv_strerror(rc));
  return 2;
}

/* req:respond(status, headers, body) / req:drip(status, headers, body, chunk, interval) */
static int respond(lua_State *L, int drip) {
  lreq *u = check_req(L);
  int status = (int)luaL_checkinteger(L, 2);
  luaL_argcheck(L, status >= 100 && status <= 999, 2, "HTTP status expected (100..999)");
  size_t blen = 0;
  const char *body = luaL_optlstring(L, 4, "", &blen);
  size_t chunk = 0;
  uint64_t ms = 0;
  if (drip) {
    lua_Integer c = luaL_optinteger(L, 5, 1);
    double iv = luaL_optnumber(L, 6, 0.01);
    luaL_argcheck(L, c >= 1, 5, "chunk size must be >= 1");
    luaL_argcheck(L, iv >= 0.001 && iv <= 3600, 6, "interval must be 0.001..3600 seconds");
    chunk = (size_t)c, ms = (uint64_t)(iv * 1000);
  }
  const char *h = "";
  size_t hlen = 0;
  char small[512];
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    h = header_block(L, 3, small, sizeof small, &hlen);
  }
  return push_rc(L, cr_request_drip(u->r, status, h, hlen, body, blen, chunk, ms));
}

static int lcr_request_respond(lua_State *L) { return respond(L, 0); }
static int lcr_request_drip(lua_State *L) { return respond(L, 1); }

static int lcr_request_raw(lua_State *L) {
  lreq *u = check_req(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  return push_rc(L, cr_request_respond_raw(u->r, s, n));
}

static int lcr_request_reset(lua_State *L) { return push_rc(L, cr_request_reset(check_req(L)->r)); }

static int lcr_request_hang(lua_State *L) {
  cr_request_hang(check_req(L)->r);
  return 0;
}

static int lcr_request_pending(lua_State *L) {
  lua_pushboolean(L, cr_request_pending(check_req(L)->r));
  return 1;
}

static int lcr_request_gc(lua_State *L) {
  lreq *u = luaL_checkudata(L, 1, REQUEST_MT);
  if (u->r) cr_request_release(u->r);
  u->r = NULL;
  return 0;
}

/* ---- the server object ---- */

static lsrv *check_srv(lua_State *L) { return luaL_checkudata(L, 1, SERVER_MT); }

static int next_deliver(lua_State *co, cr_wait *w) {
  lsrv *ls = (lsrv *)((char *)w - offsetof(lsrv, wait));
  cr_request *r = q_pop(ls);
  if (r) push_request(co, r);
  else lua_pushnil(co);
  return 1;
}

static void next_cancel(cr_wait *w) {
  lsrv *ls = (lsrv *)((char *)w - offsetof(lsrv, wait));
  ls->waiting = 0;
}

/* srv:_next(): the accept loop's source; nil once the server is closed. */
static int lcr_server_next(lua_State *L) {
  lsrv *ls = check_srv(L);
  cr_request *r = q_pop(ls);
  if (r) { push_request(L, r); return 1; }
  if (!ls->s) { lua_pushnil(L); return 1; }
  cr_wait_begin(L, &ls->wait, next_deliver, next_cancel);
  ls->waiting = 1;
  return cr_yield(L);
}

static int lcr_server_close(lua_State *L) {
  lsrv *ls = check_srv(L);
  if (ls->s) cr_resource_remove(ls->rt, &ls->res);
  server_close(ls);
  return 0;
}

static int lcr_server_gc(lua_State *L) {
  lcr_server_close(L);
  lsrv *ls = check_srv(L);
  free(ls->q);
  ls->q = NULL;
  ls->qcap = 0;
  return 0;
}

static int lcr_server_stats(lua_State *L) {
  lsrv *ls = check_srv(L);
  if (!ls->s) return luaL_error(L, "attempt to use a closed server");
  cr_server_stats st;
  cr_server_get_stats(ls->s, &st);
  lua_createtable(L, 0, 8);
#define F(name) (lua_pushinteger(L, (lua_Integer)st.name), lua_setfield(L, -2, #name))
  F(accepted); F(refused); F(requests); F(responses); F(bad_requests); F(idle_closed);
  F(open_connections);
#undef F
  lua_pushinteger(L, (lua_Integer)ls->qlen);
  lua_setfield(L, -2, "queued");
  return 1;
}

static int lcr_server_index(lua_State *L) {
  lsrv *ls = check_srv(L);
  const char *k = luaL_checkstring(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  if (strcmp(k, "port") == 0) lua_pushinteger(L, ls->port);
  else if (strcmp(k, "host") == 0) lua_pushstring(L, ls->host);
  else if (strcmp(k, "url") == 0)
    lua_pushfstring(L, strchr(ls->host, ':') ? "http://[%s]:%d" : "http://%s:%d", ls->host, ls->port);
  else if (strcmp(k, "closed") == 0) lua_pushboolean(L, ls->s == NULL);
  else lua_pushnil(L);
  return 1;
}

static int lcr_server_tostring(lua_State *L) {
  lsrv *ls = check_srv(L);
  lua_pushfstring(L, "captcha.http.server (%s:%d%s)", ls->host, ls->port, ls->s ? "" : ", closed");
  return 1;
}

/* The accept loop, run as one task per server. A handler error answers 500
 * and is logged with its traceback; the loop goes on. The handler's answer
 * is given inside the same protected call: respond raises on a bad status or
 * headers, and outside it that error would end the loop and leave the server
 * accepting requests that nobody takes. */
static const char accept_loop[] =
    "local srv, handler, nextreq, respond, msgh, logerr = ...\n"
    "local function serve(req)\n"
    "  local status, headers, body = handler(req)\n"
    "  if status then respond(req, status, headers, body) end\n"
    "end\n"
    "while true do\n"
    "  local req = nextreq(srv)\n"
    "  if req == nil then return end\n"
    "  local ok, err = xpcall(serve, msgh, req)\n"
    "  if not ok then\n"
    "    logerr(err)\n"
    "    respond(req, 500, nil, 'internal server error')\n"
    "  end\n"
    "end\n";

static int msgh(lua_State *L) {
  const char *m = lua_tostring(L, 1);
  luaL_traceback(L, L, m ? m : "(error object is not a string)", 1);
  return 1;
}

static int logerr(lua_State *L) {
  cr_logf(CR_LOG_ERROR, "http handler failed: %s", luaL_optstring(L, 1, "?"));
  return 0;
}

static double opt_number(lua_State *L, const char *k, double d, double lo, double hi) {
  lua_getfield(L, 1, k);
  if (lua_isnil(L, -1)) { lua_pop(L, 1); return d; }
  int ok;
  double v = lua_tonumberx(L, -1, &ok);
  lua_pop(L, 1);
  if (!ok || v < lo || v > hi)
    luaL_argerror(L, 1, lua_pushfstring(L, "'%s' must be a number in %f..%f", k, lo, hi));
  return v;
}

/* captcha.http.serve{host=, port=, handler=, max_body=, max_header=,
 * max_connections=, idle_timeout=, request_timeout=} -> server | nil, err */
static int lcr_http_serve(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  cr_runtime *rt = cr_rt_get(L);
  if (cr_rt_closing(rt)) return luaL_error(L, "runtime is shutting down");
  cr_server_opts o = cr_server_defaults();
  lua_getfield(L, 1, "handler");
  if (!lua_isfunction(L, -1)) luaL_argerror(L, 1, "'handler' must be a function");
  if (lua_getfield(L, 1, "host") != LUA_TNIL && lua_type(L, -1) != LUA_TSTRING)
    luaL_argerror(L, 1, "'host' must be an IP address string");
  o.host = lua_isnil(L, -1) ? "127.0.0.1" : lua_tostring(L, -1);
  if (!o.host || strlen(o.host) >= 64) luaL_argerror(L, 1, "'host' must be an IP address string");
  o.port = (int)opt_number(L, "port", 0, 0, 65535);
  o.max_body = (size_t)opt_number(L, "max_body", (double)o.max_body, 0, 1 << 30);
  o.max_header = (size_t)opt_number(L, "max_header", (double)o.max_header, 256, 1 << 24);
  o.max_connections = (int)opt_number(L, "max_connections", o.max_connections, 1, 1 << 20);
  o.idle_timeout = opt_number(L, "idle_timeout", o.idle_timeout, 0.001, 1e6);
  o.request_timeout = opt_number(L, "request_timeout", o.idle_timeout, 0.001, 1e6);

  /* Closed state first (liolib's rule): a failure below leaves a harmless object. */
  lsrv *ls = lua_newuserdatauv(L, sizeof *ls, 0);
  memset(ls, 0, sizeof *ls);
  ls->rt = rt;
  ls->res.close = resource_close;
  luaL_setmetatable(L, SERVER_MT);
  strcpy(ls->host, o.host);
  int rc = cr_server_start(cr_rt_loop(rt), &o, on_request, ls, &ls->s);
  if (rc != 0) {
    ls->s = NULL;
    lua_pushnil(L);
    lua_pushfstring(L, "cannot listen on %s:%d: %s", o.host, o.port, uv_strerror(rc));
    return 2;
  }
  ls->port = cr_server_port(ls->s);
  cr_resource_add(rt, &ls->res);

  int srv = lua_gettop(L);
  if (luaL_loadbuffer(L, accept_loop, sizeof accept_loop - 1, "=captcha.http.serve") != LUA_OK)
    return lua_error(L);
  lua_pushvalue(L, srv);
  lua_pushvalue(L, srv - 2);  /* handler */
  lua_pushcfunction(L, lcr_server_next);
  lua_pushcfunction(L, lcr_request_respond);
  lua_pushcfunction(L, msgh);
  lua_pushcfunction(L, logerr);
  cr_spawn_hook(L, 6, "http accept loop");
  lua_settop(L, srv);
  return 1;
}

static int lcr_http_decode_form(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  push_form(L, s, n);
  return 1;
}

static void new_class(lua_State *L, const char *name, const luaL_Reg *methods,
                      lua_CFunction index, lua_CFunction gc) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_pushcclosure(L, index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}

void cr_register_server(lua_State *L) {
  static const luaL_Reg req_m[] = {
      {"respond", lcr_request_respond}, {"drip", lcr_request_drip}, {"raw", lcr_request_raw},
      {"reset", lcr_request_reset},     {"hang", lcr_request_hang}, {"pending", lcr_request_pending},
      {NULL, NULL}};
  static const luaL_Reg srv_m[] = {
      {"close", lcr_server_close}, {"stats", lcr_server_stats}, {"_next", lcr_server_next}, {NULL, NULL}};
  new_class(L, REQUEST_MT, req_m, req_index, lcr_request_gc);
  new_class(L, SERVER_MT, srv_m, lcr_server_index, lcr_server_gc);
  luaL_getmetatable(L, SERVER_MT);
  lua_pushcfunction(L, lcr_server_gc);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, lcr_server_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  if (lua_getfield(L, -1, "http") != LUA_TTABLE) {  /* shared with captcha.http.request */
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "http");
  }
  lua_pushcfunction(L, lcr_http_serve);
  lua_setfield(L, -2, "serve");
  lua_pushcfunction(L, lcr_http_decode_form);
  lua_setfield(L, -2, "decode_form");
  lua_pop(L, 1);
}
