/*
 * lreader.c: read lines from a pipe or terminal without blocking the loop.
 *
 *   local r = captcha.reader(0)          -- standard input
 *   for line in r:lines() do ... end     -- each line waits only this task
 *   -- several tasks may read at once: each gets whole lines, in arrival order
 *   r:close()
 *
 * io.read on a pipe whose writer is slow would stop every task of the process;
 * here the descriptor is a libuv stream and the reading task waits for a line.
 * A regular file cannot be a libuv stream: for one, captcha.reader returns nil
 * and the caller reads it with io.lines (a local file read does not stall).
 *
 * Memory: the unread buffer; reading stops while more than READ_AHEAD bytes,
 * a whole line among them, wait for a reader, so a fast producer cannot fill
 * the heap (beyond its longest line).
 */
#include <stdlib.h>
#include <string.h>

#include "cr.h"

#define READER_MT "captcha.reader"
#define READ_AHEAD (1u << 20)

typedef struct lreader lreader;

typedef struct rwait {
  cr_wait w;
  lreader *r;
  struct rwait *next;
} rwait;

struct lreader {
  uv_stream_t *s;   /* NULL once closed; freed in its close callback */
  cr_runtime *rt;
  cr_resource res;
  char *buf;
  size_t len, cap;
  int eof, err, reading;
  rwait *head, *tail; /* tasks waiting for a line, served in order, one line each */
};

static void stream_closed(uv_handle_t *h) { free(h); }

static void reader_close(lreader *r) {
  if (!r->s) return;
  r->s->data = NULL;
  uv_close((uv_handle_t *)r->s, stream_closed);
  r->s = NULL;
  r->eof = 1;
  if (r->head) cr_wake(&r->head->w); /* each waiter in turn gets nil */
}

static void res_close(cr_resource *res) {
  reader_close((lreader *)((char *)res - offsetof(lreader, res)));
}

static int has_line(lreader *r) { return r->len && memchr(r->buf, '\n', r->len) != NULL; }

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);

/* The first waiter gets the next line once there is one (or the end); while
 * it waits for bytes, the stream reads. */
static void serve_head(lreader *r) {
  if (!r->head) return;
  if (has_line(r) || r->eof || !r->s) { cr_wake(&r->head->w); return; }
  if (!r->reading) {
    int rc = uv_read_start(r->s, on_alloc, on_read);
    if (rc == 0) r->reading = 1;
    else { r->eof = 1; r->err = rc; cr_wake(&r->head->w); }
  }
}

static void unlink_waiter(lreader *r, rwait *x) {
  rwait **p = &r->head, *prev = NULL;
  while (*p && *p != x) { prev = *p; p = &(*p)->next; }
  if (!*p) return;
  *p = x->next;
  if (r->tail == x) r->tail = prev;
  x->next = NULL;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  lreader *r = h->data;
  if (r->cap - r->len < hint) {
    size_t cap = r->cap ? r->cap : 65536;
    while (cap - r->len < hint) cap *= 2;
    char *nb = realloc(r->buf, cap);
    if (!nb) { b->base = NULL; b->len = 0; return; }
    r->buf = nb;
    r->cap = cap;
  }
  b->base = r->buf + r->len;
  b->len = r->cap - r->len;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  (void)b;
  lreader *r = s->data;
  if (!r) return;
  if (n > 0) r->len += (size_t)n;
  else if (n == UV_EOF) r->eof = 1;
  else if (n < 0) { r->eof = 1; r->err = (int)n; }
  /* Stop only with a whole line buffered: a longer line than READ_AHEAD must
   * keep coming, or its waiter would wait for ever. */
  if (r->eof || (r->len > READ_AHEAD && has_line(r))) { uv_read_stop(s); r->reading = 0; }
  if (r->head && (r->eof || has_line(r))) cr_wake(&r->head->w);
}

/* Push the next line (without its newline), the last unterminated piece at
 * EOF, or nil at the end. */
static int push_line(lua_State *L, lreader *r) {
  char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
  size_t take, skip;
  if (nl) { take = (size_t)(nl - r->buf); skip = take + 1; }
  else if (r->eof && r->len) { take = skip = r->len; }
  else {
    lua_pushnil(L);
    if (r->err) { lua_pushstring(L, uv_strerror(r->err)); return 2; }
    return 1;
  }
  if (take && r->buf[take - 1] == '\r') lua_pushlstring(L, r->buf, take - 1);
  else lua_pushlstring(L, r->buf, take);
  memmove(r->buf, r->buf + skip, r->len - skip);
  r->len -= skip;
  return 1;
}

static int rw_deliver(lua_State *co, cr_wait *w) {
  rwait *x = (rwait *)w;
  lreader *r = x->r;
  unlink_waiter(r, x);
  free(x);
  int n = push_line(co, r);
  serve_head(r);
  return n;
}

/* A cancelled waiter leaves the queue; a line meant for it goes to the next. */
static void rw_cancel(cr_wait *w) {
  rwait *x = (rwait *)w;
  lreader *r = x->r;
  unlink_waiter(r, x);
  free(x);
  serve_head(r);
}

static int lcr_reader_line(lua_State *L) {
  lreader *r = luaL_checkudata(L, 1, READER_MT);
  if (!r->head && (has_line(r) || r->eof || !r->s)) return push_line(L, r);
  rwait *x = calloc(1, sizeof *x);
  if (!x) return luaL_error(L, "out of memory");
  if (!cr_can_wait(L)) free(x);
  cr_wait_begin(L, &x->w, rw_deliver, rw_cancel);
  x->r = r;
  if (r->tail) r->tail->next = x; else r->head = x;
  r->tail = x;
  serve_head(r);
  return cr_yield(L);
}

static int lines_iter(lua_State *L) {
  lua_settop(L, 0);
  lua_pushvalue(L, lua_upvalueindex(1));
  return lcr_reader_line(L);
}

/* r:lines() -> iterator for a generic for */
static int lcr_reader_lines(lua_State *L) {
  luaL_checkudata(L, 1, READER_MT);
  lua_settop(L, 1);
  lua_pushcclosure(L, lines_iter, 1);
  return 1;
}

static int lcr_reader_close(lua_State *L) {
  lreader *r = luaL_checkudata(L, 1, READER_MT);
  if (r->rt) cr_resource_remove(r->rt, &r->res);
  reader_close(r);
  return 0;
}

static int lcr_reader_gc(lua_State *L) {
  lcr_reader_close(L);
  lreader *r = luaL_checkudata(L, 1, READER_MT);
  free(r->buf);
  r->buf = NULL;
  return 0;
}

/* captcha.reader(fd) -> reader, or nil, reason when fd is not a pipe or a
 * terminal (a regular file: read it with io.lines). */
static int lcr_reader_new(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  luaL_argcheck(L, fd >= 0 && fd < 65536, 1, "file descriptor expected");
  cr_runtime *rt = cr_rt_get(L);
  uv_handle_type type = uv_guess_handle((uv_file)fd);
  if (type != UV_NAMED_PIPE && type != UV_TTY) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a pipe or a terminal");
    return 2;
  }
  lreader *r = lua_newuserdatauv(L, sizeof *r, 0);
  memset(r, 0, sizeof *r);
  luaL_setmetatable(L, READER_MT);
  uv_loop_t *loop = cr_rt_loop(rt);
  int rc;
  if (type == UV_TTY) {
    uv_tty_t *t = malloc(sizeof *t);
    if (!t) return luaL_error(L, "out of memory");
    rc = uv_tty_init(loop, t, (uv_file)fd, 1);
    if (rc != 0) { /* not initialised: nothing to close */
      free(t);
      lua_pushnil(L);
      lua_pushstring(L, uv_strerror(rc));
      return 2;
    }
    r->s = (uv_stream_t *)t;
  } else {
    uv_pipe_t *p = malloc(sizeof *p);
    if (!p) return luaL_error(L, "out of memory");
    uv_pipe_init(loop, p, 0);
    rc = uv_pipe_open(p, (uv_file)fd);
    r->s = (uv_stream_t *)p;
  }
  r->s->data = r;
  r->rt = rt;
  r->res.close = res_close;
  cr_resource_add(rt, &r->res);
  if (rc != 0) { /* e.g. UV_EEXIST: the loop already reads this descriptor */
    cr_resource_remove(rt, &r->res);
    reader_close(r);
    lua_pushnil(L);
    lua_pushstring(L, uv_strerror(rc));
    return 2;
  }
  return 1;
}

void cr_register_reader(lua_State *L) {
  static const luaL_Reg m[] = {
      {"line", lcr_reader_line}, {"lines", lcr_reader_lines}, {"close", lcr_reader_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, READER_MT)) {
    luaL_newlib(L, m);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, lcr_reader_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, lcr_reader_close);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, lcr_reader_new);
  lua_setfield(L, -2, "reader");
}
