/*
 * lproc.c: child processes and terminals for Lua, without blocking the loop.
 *
 *   local r, err = captcha.exec{ "sh", "-c", "cat > alert.json", stdin = json, timeout = 10 }
 *   -- r = { status = 0, signal = 0, stdout = "...", stderr = "..." } or nil, err
 *   captcha.isatty(2) -> boolean
 *
 * io.popen would block the whole loop until the child exits; here the child
 * runs under uv_spawn with three pipes, and the calling task waits.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cr.h"

#define MAX_ARGS 64
#define MAX_OUTPUT (16u << 20) /* per stream; more is dropped, the child keeps running */

typedef struct { char *data; size_t len; } obuf;

typedef struct proc {
  cr_wait w;
  uv_process_t proc;
  uv_pipe_t in, out, err;
  uv_timer_t timer;
  uv_write_t wreq;
  char *input;
  obuf bufs[2];
  int open_handles;   /* the struct is freed when the last close callback ran */
  int exited, streams_done, timed_out, cancelled, spawn_error;
  int64_t status;
  int term_signal;
} proc;

static void proc_closed(uv_handle_t *h) {
  proc *p = h->data;
  if (--p->open_handles > 0) return;
  free(p->bufs[0].data);
  free(p->bufs[1].data);
  free(p->input);
  free(p);
}

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, proc_closed);
}

static void close_all(proc *p) {
  close_handle((uv_handle_t *)&p->in);
  close_handle((uv_handle_t *)&p->out);
  close_handle((uv_handle_t *)&p->err);
  close_handle((uv_handle_t *)&p->timer);
  close_handle((uv_handle_t *)&p->proc);
}

/* Done when the child has exited and its output ended, or, after the timeout,
 * as soon as it has exited: a grandchild holding the pipes (sh -c "x &") must
 * not outlive the caller's timeout. */
static void maybe_done(proc *p) {
  if (!p->exited || p->cancelled) return;
  if (p->streams_done == 2 || p->timed_out) {
    uv_timer_stop(&p->timer);
    cr_wake(&p->w);
  }
}

static void proc_exited(uv_process_t *h, int64_t status, int term_signal) {
  proc *p = h->data;
  p->exited = 1;
  p->status = status;
  p->term_signal = term_signal;
  maybe_done(p);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  (void)h;
  buf->base = malloc(hint);
  buf->len = buf->base ? hint : 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  proc *p = s->data;
  obuf *o = &p->bufs[s == (uv_stream_t *)&p->err];
  if (n > 0 && o->len + (size_t)n <= MAX_OUTPUT) {
    char *d = realloc(o->data, o->len + (size_t)n);
    if (d) {
      memcpy(d + o->len, buf->base, (size_t)n);
      o->data = d;
      o->len += (size_t)n;
    }
  }
  free(buf->base);
  if (n < 0) { /* EOF or error: this stream is finished */
    uv_read_stop(s);
    p->streams_done++;
    maybe_done(p);
  }
}

static void on_written(uv_write_t *req, int status) {
  (void)status; /* a child that does not read its input is its own business */
  proc *p = req->data;
  close_handle((uv_handle_t *)&p->in);
}

static void on_timeout(uv_timer_t *t) {
  proc *p = t->data;
  p->timed_out = 1;
  if (!p->exited) uv_process_kill(&p->proc, SIGKILL);
  maybe_done(p);
}

static int proc_deliver(lua_State *co, cr_wait *w) {
  proc *p = (proc *)w;
  int n;
  if (p->timed_out) {
    lua_pushnil(co);
    lua_pushliteral(co, "timeout");
    n = 2;
  } else {
    lua_createtable(co, 0, 4);
    lua_pushinteger(co, p->status);
    lua_setfield(co, -2, "status");
    lua_pushinteger(co, p->term_signal);
    lua_setfield(co, -2, "signal");
    lua_pushlstring(co, p->bufs[0].data ? p->bufs[0].data : "", p->bufs[0].len);
    lua_setfield(co, -2, "stdout");
    lua_pushlstring(co, p->bufs[1].data ? p->bufs[1].data : "", p->bufs[1].len);
    lua_setfield(co, -2, "stderr");
    n = 1;
  }
  close_all(p);
  return n;
}

static void proc_cancel(cr_wait *w) {
  proc *p = (proc *)w;
  p->cancelled = 1;
  if (!p->exited) uv_process_kill(&p->proc, SIGKILL);
  close_all(p);
}

static int l_exec(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int argc = (int)lua_rawlen(L, 1);
  luaL_argcheck(L, argc >= 1 && argc < MAX_ARGS, 1, "expected a list of 1..63 strings: program and arguments");
  char *args[MAX_ARGS];
  luaL_checkstack(L, argc + 4, "too many arguments");
  for (int i = 0; i < argc; i++) {
    lua_rawgeti(L, 1, i + 1);
    /* kept on the stack: a number converted here is anchored only there */
    args[i] = (char *)luaL_checkstring(L, -1);
  }
  args[argc] = NULL;
  lua_getfield(L, 1, "stdin");
  size_t inlen = 0;
  const char *in = luaL_optlstring(L, -1, NULL, &inlen);
  lua_getfield(L, 1, "timeout");
  double timeout = luaL_optnumber(L, -1, 0);
  luaL_argcheck(L, timeout >= 0, 1, "timeout must be >= 0 seconds");
  if (!cr_can_wait(L)) return luaL_error(L, "captcha.exec must be called from a task");

  uv_loop_t *loop = cr_rt_loop(cr_rt_get(L));
  proc *p = calloc(1, sizeof *p);
  if (!p) return luaL_error(L, "out of memory");
  if (in && !(p->input = malloc(inlen ? inlen : 1))) { free(p); return luaL_error(L, "out of memory"); }
  if (in) memcpy(p->input, in, inlen);
  uv_pipe_init(loop, &p->in, 0);
  uv_pipe_init(loop, &p->out, 0);
  uv_pipe_init(loop, &p->err, 0);
  uv_timer_init(loop, &p->timer);
  p->in.data = p->out.data = p->err.data = p->timer.data = p->proc.data = p->wreq.data = p;
  p->open_handles = 5;

  uv_stdio_container_t stdio[3] = {
      {.flags = UV_CREATE_PIPE | UV_READABLE_PIPE, .data.stream = (uv_stream_t *)&p->in},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&p->out},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&p->err}};
  uv_process_options_t o = {.exit_cb = proc_exited, .file = args[0], .args = args,
                            .stdio_count = 3, .stdio = stdio};
  int rc = uv_spawn(loop, &p->proc, &o);
  if (rc != 0) {
    /* the process handle is initialised even on failure and must be closed too */
    close_all(p);
    lua_pushnil(L);
    lua_pushfstring(L, "cannot run %s: %s", args[0], uv_strerror(rc));
    return 2;
  }
  uv_read_start((uv_stream_t *)&p->out, on_alloc, on_read);
  uv_read_start((uv_stream_t *)&p->err, on_alloc, on_read);
  if (p->input && inlen) {
    uv_buf_t b = uv_buf_init(p->input, (unsigned)inlen);
    uv_write(&p->wreq, (uv_stream_t *)&p->in, &b, 1, on_written);
  } else {
    close_handle((uv_handle_t *)&p->in);
  }
  if (timeout > 0) uv_timer_start(&p->timer, on_timeout, (uint64_t)(timeout * 1000 + 0.5), 0);
  cr_wait_begin(L, &p->w, proc_deliver, proc_cancel);
  return cr_yield(L);
}

static int l_isatty(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  lua_pushboolean(L, fd >= 0 && fd <= 1024 && isatty((int)fd));
  return 1;
}

void cr_register_proc(lua_State *L) {
  lua_pushcfunction(L, l_exec);
  lua_setfield(L, -2, "exec");
  lua_pushcfunction(L, l_isatty);
  lua_setfield(L, -2, "isatty");
}
