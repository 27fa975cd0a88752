/*
 * sched.c: tasks (coroutines) on the loop, the ready queue, waits and wakes.
 *
 * A task is a C struct pinned by the scheduler until it finishes and by its
 * Lua handle until that is collected; neither side frees it alone (refs). A
 * waiting task is resumed only from the runner, a uv_idle_t callback, never
 * from the libuv/curl callback that woke it: the callback only queues it. The
 * runner takes the queue as it stands, so a task woken while it runs waits for
 * the next loop iteration and I/O is never starved.
 *
 * Cost: a spawn is one lua_newthread (or a reused finished thread from a small
 * pool, about 3x cheaper) plus a malloc; a wake is O(1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

#define TASK_MT "captcha.task"
#define POOL_MAX 64

enum { T_READY, T_RUNNING, T_WAITING, T_DONE };
enum { K_NORMAL, K_MAIN, K_HOOK };

typedef struct join_wait {
  cr_wait w;
  cr_task *target;
  int flagged;   /* captcha.run inside a task: push ok first */
  struct join_wait *prev, *next;
} join_wait;

struct cr_task {
  cr_runtime *rt;
  lua_State *co;
  int co_ref;
  int state;
  int kind;
  int started;
  int woken;           /* cr_wake came while it was still running */
  int nargs;           /* arguments waiting on co's stack for the first resume */
  uint64_t gen;
  cr_wait *wait;       /* the wait in progress, deliver or cancel not yet called */
  cr_task *next_ready;
  cr_task *prev, *next;/* rt->tasks while unfinished */
  int refs;
  /* outcome */
  int ok, cancelled, observed, reported;
  int res_ref;         /* ok: table {n = N, ...}; failed: the error value */
  char *traceback;     /* failed: message with traceback */
  char *what;          /* hooks: what the hook is for */
  join_wait *joiners;
  cr_task *next_unobserved;
};

typedef struct { cr_task *t; } task_handle;


/* Thread -> task map in the registry. Not LUA_EXTRASPACE: stock lua.c never
 * initialises it, so threads made before the module loaded carry garbage. */
static const char tasks_key = 't';

static cr_task *task_of(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tasks_key);
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return NULL; }
  lua_pushthread(L);
  lua_rawget(L, -2);
  cr_task *t = lua_touserdata(L, -1);
  lua_pop(L, 2);
  return t;
}

/* Map (t != NULL) or unmap the thread whose registry ref is co_ref. */
static void set_task(lua_State *S, int co_ref, cr_task *t) {
  lua_rawgetp(S, LUA_REGISTRYINDEX, &tasks_key);
  lua_rawgeti(S, LUA_REGISTRYINDEX, co_ref);
  if (t) lua_pushlightuserdata(S, t); else lua_pushnil(S);
  lua_rawset(S, -3);
  lua_pop(S, 1);
}

/* Not inlined: callers hold a guard reference around code that may drop
 * another one, and gcc's -Wuse-after-free cannot see that refs stays > 0. */
__attribute__((noinline)) static void task_release(cr_task *t) {
  if (--t->refs > 0) return;
  /* the registry outlives every finalizer, so this is safe even in lua_close */
  if (t->res_ref != LUA_NOREF) {
    luaL_unref(t->rt->L, LUA_REGISTRYINDEX, t->res_ref);
    t->rt->result_refs--;
  }
  free(t->traceback);
  free(t->what);
  free(t);
}

/* ---- ready queue ---- */

static void runner_cb(uv_idle_t *h);

static void enqueue(cr_task *t) {
  cr_runtime *rt = t->rt;
  t->state = T_READY;
  t->next_ready = NULL;
  if (rt->ready_tail) rt->ready_tail->next_ready = t;
  else rt->ready_head = t;
  rt->ready_tail = t;
  if (!uv_is_active((uv_handle_t *)&rt->runner)) uv_idle_start(&rt->runner, runner_cb);
}

/* Remove t from the ready queue or from the runner's current pass (a task
 * cancelled by another task of the same pass). O(queue length): cancels are rare. */
static void dequeue(cr_task *t) {
  cr_runtime *rt = t->rt;
  cr_task **p = &rt->pass_head;
  while (*p && *p != t) p = &(*p)->next_ready;
  if (*p) { *p = t->next_ready; t->next_ready = NULL; return; }
  cr_task *prev = NULL;
  p = &rt->ready_head;
  while (*p && *p != t) { prev = *p; p = &(*p)->next_ready; }
  if (!*p) return;
  *p = t->next_ready;
  if (rt->ready_tail == t) rt->ready_tail = prev;
  t->next_ready = NULL;
}

void cr_wake(cr_wait *w) {
  cr_task *t = w->task;
  if (!t || t->wait != w || t->gen != w->gen) return;
  if (t->state == T_WAITING) enqueue(t);
  else if (t->state == T_RUNNING) t->woken = 1; /* before it yielded: see resume_task */
}

int cr_can_wait(lua_State *L) {
  cr_task *t = task_of(L);
  return t && t->co == L && t->state == T_RUNNING && lua_isyieldable(L);
}

void cr_wait_begin(lua_State *L, cr_wait *w, cr_deliver_fn deliver, cr_cancel_fn cancel) {
  if (!cr_can_wait(L))
    luaL_error(L, "attempt to wait outside a task (use captcha.spawn or captcha.run; "
                  "plain coroutines and metamethods cannot wait)");
  cr_task *t = task_of(L);
  if (t->wait) {
    /* a wait that began but never yielded (its C function raised and a pcall
     * caught the error): it is over, release it */
    cr_wait *old = t->wait;
    t->wait = NULL;
    old->cancel(old);
  }
  w->task = t;
  w->gen = ++t->gen;
  w->deliver = deliver;
  w->cancel = cancel;
  t->wait = w;
  t->woken = 0;
}

int cr_yield(lua_State *L) { return lua_yield(L, 0); }

/* ---- finishing ---- */

static void report_error(cr_task *t, const char *prefix) {
  if (t->reported) return;
  t->reported = 1;
  cr_logf(CR_LOG_ERROR, "%s%s", prefix, t->traceback ? t->traceback : "(no message)");
}

static void thread_recycle(cr_runtime *rt, cr_task *t, int reset) {
  lua_State *L = rt->L, *co = t->co;
  if (reset) {
#if LUA_VERSION_RELEASE_NUM >= 50406
    lua_closethread(co, L);
#elif LUA_VERSION_RELEASE_NUM >= 50405
    lua_resetthread(co, L);
#else
    lua_resetthread(co);
#endif
  }
  lua_settop(co, 0); /* a reset leaves the error object behind */
  set_task(L, t->co_ref, NULL);
  if (rt->pool_n < POOL_MAX && !rt->closing) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, rt->pool_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->co_ref);
    lua_rawseti(L, -2, ++rt->pool_n);
    lua_pop(L, 1);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->co_ref);
  t->co_ref = LUA_NOREF;
  t->co = NULL;
}

static char *error_traceback(lua_State *L, lua_State *co) {
  int top = lua_gettop(L);
  const char *msg;
  lua_pushvalue(co, -1);
  lua_xmove(co, L, 1);
  if (lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
  else if (luaL_callmeta(L, -1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
  else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, top + 1));
  luaL_traceback(L, co, msg, 0);
  char *s = strdup(lua_tostring(L, -1));
  lua_settop(L, top);
  return s;
}

static void unlink_task(cr_task *t) {
  cr_runtime *rt = t->rt;
  if (t->prev) t->prev->next = t->next; else rt->tasks = t->next;
  if (t->next) t->next->prev = t->prev;
  t->prev = t->next = NULL;
  rt->live--;
  if (rt->live == 0 && rt->driving) uv_stop(&rt->loop);
}

static void wake_joiners(cr_task *t) {
  for (join_wait *j = t->joiners; j; j = j->next) cr_wake(&j->w);
}

static void cancel_others(cr_runtime *rt, cr_task *keep);

/* The task's coroutine ended: st is LUA_OK with nres results on co, or an error. */
static void finish(cr_task *t, int st, int nres) {
  cr_runtime *rt = t->rt;
  lua_State *L = rt->L, *co = t->co;
  if (t->wait) { cr_wait *w = t->wait; t->wait = NULL; w->cancel(w); }
  if (t->state == T_READY) dequeue(t);
  t->state = T_DONE;
  unlink_task(t);
  if (st == LUA_OK && nres == 0) {
    t->ok = 1; /* nothing to keep: most tasks return nothing */
    thread_recycle(rt, t, 0);
  } else if (st == LUA_OK) {
    t->ok = 1;
    luaL_checkstack(L, nres + 2, "too many results");
    lua_createtable(L, nres, 1);
    lua_xmove(co, L, nres);
    for (int i = nres; i >= 1; i--) lua_rawseti(L, -(i + 1), i);
    lua_pushinteger(L, nres);
    lua_setfield(L, -2, "n");
    t->res_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    rt->result_refs++;
    thread_recycle(rt, t, 0);
  } else {
    t->traceback = error_traceback(L, co);
    lua_xmove(co, L, 1);
    t->res_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    rt->result_refs++;
    thread_recycle(rt, t, 1);
    if (t->kind == K_HOOK) {
      char prefix[160];
      snprintf(prefix, sizeof prefix, "hook %s failed: ", t->what ? t->what : "");
      report_error(t, prefix);
    } else if (t->kind == K_MAIN) {
      cancel_others(rt, t);
    } else {
      /* listed even with joiners: a joiner cancelled before it resumes never
       * observes the error (report_unobserved skips the observed ones) */
      t->next_unobserved = rt->unobserved;
      rt->unobserved = t;
      t->refs++;
    }
  }
  wake_joiners(t);
  task_release(t); /* the scheduler's reference */
}

/* Cancel a task that has not finished: stop its wait, close its coroutine. */
static void cancel_task(cr_task *t) {
  cr_runtime *rt = t->rt;
  if (t->state == T_DONE || t->state == T_RUNNING) return;
  if (t->wait) { cr_wait *w = t->wait; t->wait = NULL; w->cancel(w); }
  if (t->state == T_READY) dequeue(t);
  t->state = T_DONE;
  t->cancelled = 1;
  t->observed = 1;
  unlink_task(t);
  lua_pushliteral(rt->L, "cancelled");
  t->res_ref = luaL_ref(rt->L, LUA_REGISTRYINDEX);
  rt->result_refs++;
  t->refs++;              /* closing the thread may run __close handlers */
  thread_recycle(rt, t, 1);
  wake_joiners(t);
  task_release(t);        /* the one just taken */
  task_release(t);        /* the scheduler's reference */
}

static void cancel_others(cr_runtime *rt, cr_task *keep) {
  cr_task *t = rt->tasks;
  while (t) {
    cr_task *next = t->next;
    if (t != keep && t->state != T_RUNNING) cancel_task(t);
    t = next;
  }
}

/* ---- resuming ---- */

static void resume_task(cr_runtime *rt, cr_task *t) {
  lua_State *co = t->co;
  int nargs = 0, nres = 0;
  if (!t->started) { t->started = 1; nargs = t->nargs; }
  else if (t->wait) { cr_wait *w = t->wait; t->wait = NULL; nargs = w->deliver(co, w); }
  t->state = T_RUNNING;
  t->woken = 0;
  t->refs++; /* finish() may drop the scheduler's reference */
  int st = lua_resume(co, NULL, nargs, &nres);
  if (st == LUA_YIELD) {
    lua_pop(co, nres);
    if ((t->wait && !t->woken) || rt->exit_requested) t->state = T_WAITING;
    else enqueue(t); /* woken before it yielded, or a bare coroutine.yield() */
  } else {
    finish(t, st, nres);
  }
  task_release(t);
}

/* ---- deferred C work ---- */

void cr_defer(cr_runtime *rt, cr_deferred *d) {
  if (d->queued || rt->closing) return;
  d->queued = 1;
  d->next = NULL;
  if (rt->deferred_tail) rt->deferred_tail->next = d;
  else rt->deferred = d;
  rt->deferred_tail = d;
  if (!uv_is_active((uv_handle_t *)&rt->runner)) uv_idle_start(&rt->runner, runner_cb);
}

void cr_defer_cancel(cr_runtime *rt, cr_deferred *d) {
  if (!d->queued) return;
  cr_deferred **p = &rt->deferred, *prev = NULL;
  while (*p && *p != d) { prev = *p; p = &(*p)->next; }
  if (*p) *p = d->next;
  if (rt->deferred_tail == d) rt->deferred_tail = prev;
  d->queued = 0;
  d->next = NULL;
}

static int deferred_protected(lua_State *L) {
  cr_deferred *d = lua_touserdata(L, 1);
  lua_settop(L, 0);
  d->fn(L, d);
  return 0;
}

static void run_deferred(cr_runtime *rt) {
  lua_State *L = rt->L;
  while (rt->deferred) {
    cr_deferred *d = rt->deferred;
    rt->deferred = d->next;
    if (!rt->deferred) rt->deferred_tail = NULL;
    d->queued = 0;
    d->next = NULL;
    int top = lua_gettop(L);
    lua_pushcfunction(L, deferred_protected);
    lua_pushlightuserdata(L, d);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK)
      cr_logf(CR_LOG_ERROR, "deferred work failed: %s", lua_tostring(L, -1));
    lua_settop(L, top);
  }
}

static void runner_cb(uv_idle_t *h) {
  cr_runtime *rt = h->data;
  if (rt->pending_signal) cr_signals_dispatch(rt);
  if (rt->deferred) run_deferred(rt);
  /* this pass: the queue as it stands; tasks woken meanwhile wait for the next */
  rt->pass_head = rt->ready_head;
  rt->ready_head = rt->ready_tail = NULL;
  while (rt->pass_head && !rt->exit_requested) {
    cr_task *t = rt->pass_head;
    rt->pass_head = t->next_ready;
    t->next_ready = NULL;
    resume_task(rt, t);
  }
  /* exit requested mid-pass: put the rest back, in order, for shutdown to cancel */
  while (rt->pass_head) {
    cr_task *t = rt->pass_head;
    rt->pass_head = t->next_ready;
    enqueue(t);
  }
  if ((!rt->ready_head && !rt->deferred) || rt->exit_requested) uv_idle_stop(&rt->runner);
}

/* ---- spawning ---- */

static lua_State *new_thread(cr_runtime *rt, int *ref) {
  lua_State *L = rt->L;
  if (rt->pool_n > 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, rt->pool_ref);
    lua_rawgeti(L, -1, rt->pool_n);
    lua_pushnil(L);
    lua_rawseti(L, -3, rt->pool_n--);
    lua_remove(L, -2);
  } else {
    lua_newthread(L);
  }
  lua_State *co = lua_tothread(L, -1);
  *ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return co;
}

static cr_task *spawn(cr_runtime *rt, lua_State *L, int nargs, int kind) {
  luaL_checktype(L, -(nargs + 1), LUA_TFUNCTION);
  if (rt->closing) luaL_error(L, "runtime is shutting down");
  cr_task *t = calloc(1, sizeof *t);
  if (!t) luaL_error(L, "out of memory");
  t->rt = rt;
  t->kind = kind;
  t->res_ref = LUA_NOREF;
  t->refs = 1;
  t->co = new_thread(rt, &t->co_ref);
  set_task(rt->L, t->co_ref, t);
  lua_xmove(L, t->co, nargs + 1);
  t->nargs = nargs;
  t->next = rt->tasks;
  if (rt->tasks) rt->tasks->prev = t;
  rt->tasks = t;
  rt->live++;
  enqueue(t);
  return t;
}

static void push_handle(lua_State *L, cr_task *t) {
  task_handle *h = lua_newuserdatauv(L, sizeof *h, 0);
  h->t = t;
  if (t) t->refs++;
  luaL_setmetatable(L, TASK_MT);
}

void cr_spawn(lua_State *L, int nargs) {
  cr_runtime *rt = cr_rt_get(L);
  /* the handle is made before the task so a failed allocation leaks nothing */
  push_handle(L, NULL);
  lua_insert(L, -(nargs + 2));
  cr_task *t = spawn(rt, L, nargs, K_NORMAL);
  task_handle *h = luaL_checkudata(L, -1, TASK_MT);
  h->t = t;
  t->refs++;
}

void cr_spawn_hook(lua_State *L, int nargs, const char *what) {
  cr_runtime *rt = cr_rt_get(L);
  if (rt->closing) { lua_pop(L, nargs + 1); return; }
  cr_task *t = spawn(rt, L, nargs, K_HOOK);
  t->what = what ? strdup(what) : NULL;
}

void cr_spawn_main(cr_runtime *rt, lua_State *L, int nargs) {
  cr_task *t = spawn(rt, L, nargs, K_MAIN);
  push_handle(L, t);
}

/* ---- driving ---- */

static void report_unobserved(cr_runtime *rt) {
  while (rt->unobserved) {
    cr_task *t = rt->unobserved;
    rt->unobserved = t->next_unobserved;
    if (!t->observed) {
      report_error(t, "task failed and was never awaited: ");
      t->observed = 1;
      rt->failed = 1;
    }
    task_release(t);
  }
}

static void report_deadlock(cr_runtime *rt) {
  cr_logf(CR_LOG_ERROR, "deadlock: %d task(s) wait for something that can never happen "
          "(no timer, request or server is active); stopping", rt->live);
  rt->failed = 1;
  rt->deadlocked = 1;
}

int cr_drive(cr_runtime *rt) {
  rt->driving++;
  while (rt->live > 0 && !rt->exit_requested) {
    if (rt->ready_head && !uv_is_active((uv_handle_t *)&rt->runner))
      uv_idle_start(&rt->runner, runner_cb);
    int alive = uv_run(&rt->loop, UV_RUN_DEFAULT);
    if (rt->live == 0 || rt->exit_requested) break;
    if (!alive && !rt->ready_head) {
      report_deadlock(rt);
      cancel_others(rt, NULL);
      break;
    }
  }
  rt->driving--;
  report_unobserved(rt);
  return rt->exit_requested ? rt->exit_code : rt->failed ? 1 : 0;
}

void cr_sched_shutdown(cr_runtime *rt) {
  cancel_others(rt, NULL);
  report_unobserved(rt);
}

void cr_sched_init(cr_runtime *rt) {
  lua_newtable(rt->L);
  lua_rawsetp(rt->L, LUA_REGISTRYINDEX, &tasks_key);
  uv_idle_init(&rt->loop, &rt->runner);
  rt->runner.data = rt;
  rt->runner_cb = runner_cb;
  lua_newtable(rt->L);
  rt->pool_ref = luaL_ref(rt->L, LUA_REGISTRYINDEX);
}

/* ---- Lua API ---- */

static cr_task *check_task(lua_State *L, int idx) {
  task_handle *h = luaL_checkudata(L, idx, TASK_MT);
  if (!h->t) luaL_argerror(L, idx, "task was never started");
  return h->t;
}

/* Push what task:wait() returns for a finished task. */
static int push_outcome(lua_State *L, cr_task *t) {
  t->observed = 1;
  if (t->ok && t->res_ref == LUA_NOREF) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->res_ref);
  if (t->ok) {
    int n = (int)(lua_getfield(L, -1, "n"), lua_tointeger(L, -1));
    lua_pop(L, 1);
    luaL_checkstack(L, n, "too many results");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
    lua_remove(L, -(n + 1));
    return n;
  }
  lua_pushnil(L);
  lua_insert(L, -2);
  if (t->traceback) { lua_pushstring(L, t->traceback); return 3; }
  return 2;
}

static int join_deliver(lua_State *co, cr_wait *w) {
  join_wait *j = (join_wait *)w;
  cr_task *t = j->target;
  if (j->prev) j->prev->next = j->next; else t->joiners = j->next;
  if (j->next) j->next->prev = j->prev;
  int n;
  if (j->flagged) {
    lua_pushboolean(co, t->ok);
    n = push_outcome(co, t) + 1;
  } else n = push_outcome(co, t);
  task_release(t);
  free(j);
  return n;
}

static void join_cancel(cr_wait *w) {
  join_wait *j = (join_wait *)w;
  cr_task *t = j->target;
  if (j->prev) j->prev->next = j->next; else t->joiners = j->next;
  if (j->next) j->next->prev = j->prev;
  task_release(t);
  free(j);
}

static void join(lua_State *L, cr_task *t, int flagged) {
  if (t->co == L) luaL_error(L, "a task cannot wait for itself");
  join_wait *j = calloc(1, sizeof *j);
  if (!j) luaL_error(L, "out of memory");
  if (!cr_can_wait(L)) free(j);
  cr_wait_begin(L, &j->w, join_deliver, join_cancel);
  j->target = t;
  j->flagged = flagged;
  t->refs++;
  j->next = t->joiners;
  if (t->joiners) t->joiners->prev = j;
  t->joiners = j;
}

static int task_wait(lua_State *L) {
  cr_task *t = check_task(L, 1);
  if (t->state == T_DONE) return push_outcome(L, t);
  join(L, t, 0);
  return cr_yield(L);
}

static int task_cancel(lua_State *L) {
  cr_task *t = check_task(L, 1);
  if (t->state == T_DONE) { lua_pushboolean(L, 0); return 1; }
  if (t->co == L) return luaL_error(L, "a task cannot cancel itself (return or error instead)");
  if (t->state == T_RUNNING)
    return luaL_error(L, "cannot cancel a task that is resuming another (it is running)");
  cancel_task(t);
  lua_pushboolean(L, 1);
  return 1;
}

static int task_status(lua_State *L) {
  cr_task *t = check_task(L, 1);
  static const char *names[] = {"ready", "running", "waiting", "done"};
  if (t->state != T_DONE) lua_pushstring(L, names[t->state]);
  else lua_pushstring(L, t->ok ? "done" : t->cancelled ? "cancelled" : "failed");
  return 1;
}

static int task_gc(lua_State *L) {
  task_handle *h = luaL_checkudata(L, 1, TASK_MT);
  cr_task *t = h->t;
  if (!t) return 0;
  h->t = NULL;
  if (t->state == T_DONE && !t->ok && !t->observed && t->kind == K_NORMAL && !t->rt->closing) {
    report_error(t, "task failed and was never awaited: ");
    t->rt->failed = 1;
    t->observed = 1;
  }
  task_release(t);
  return 0;
}

static int task_tostring(lua_State *L) {
  task_handle *h = luaL_checkudata(L, 1, TASK_MT);
  lua_pushfstring(L, "captcha.task (%p)", (void *)h->t);
  return 1;
}

static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  cr_spawn(L, lua_gettop(L) - 1);
  return 1;
}

typedef struct { cr_wait w; uv_timer_t *timer; } sleep_wait;

static void sleep_timer_cb(uv_timer_t *h) { cr_wake(h->data); }

static void sleep_release(sleep_wait *s) {
  cr_timer_free(&s->timer);
  free(s);
}

static int sleep_deliver(lua_State *co, cr_wait *w) {
  (void)co;
  sleep_release((sleep_wait *)w);
  return 0;
}

static void sleep_cancel(cr_wait *w) { sleep_release((sleep_wait *)w); }

static int l_sleep(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  luaL_argcheck(L, s == s, 1, "seconds must be a number, not NaN");
  cr_runtime *rt = cr_rt_get(L);
  if (!cr_can_wait(L)) cr_wait_begin(L, NULL, NULL, NULL); /* raises the usual error */
  sleep_wait *sw = calloc(1, sizeof *sw);
  if (!sw) return luaL_error(L, "out of memory");
  if (s > 0 && !(sw->timer = cr_timer_new(rt, &sw->w))) {
    free(sw);
    return luaL_error(L, "out of memory");
  }
  cr_wait_begin(L, &sw->w, sleep_deliver, sleep_cancel);
  if (s <= 0) {
    cr_wake(&sw->w); /* a plain yield: every ready task runs first */
  } else {
    double ms = s * 1000.0;
    uv_timer_start(sw->timer, sleep_timer_cb, ms > 9.2e15 ? (uint64_t)9.2e15 : (uint64_t)(ms + 0.999), 0);
  }
  return cr_yield(L);
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, cr_now());
  return 1;
}

/* captcha.time(): wall-clock seconds since the epoch, with microseconds (for
 * timestamps people read; durations use captcha.now). */
static int l_time(lua_State *L) {
  uv_timeval64_t tv;
  if (uv_gettimeofday(&tv) != 0) return luaL_error(L, "gettimeofday failed");
  lua_pushnumber(L, (double)tv.tv_sec + tv.tv_usec / 1e6);
  return 1;
}

/* In-task captcha.run resumes here with [handle, true, results...] or
 * [handle, false, nil, err(, traceback)]: a failure re-raises the error value
 * itself (a table stays a table); the caller's own traceback follows it. */
static int run_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status; (void)ctx;
  if (lua_toboolean(L, 2)) return lua_gettop(L) - 2;
  lua_settop(L, 4);
  return lua_error(L);
}

/* captcha.run(fn, ...): from outside a task, drive the loop until fn and every
 * task finish and return fn's results (raising its error). From inside a task
 * (the captcharun host's main chunk), run fn as a task and wait for it. */
static int l_run(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  cr_runtime *rt = cr_rt_get(L);
  int nargs = lua_gettop(L) - 1;
  if (task_of(L)) {
    cr_spawn(L, nargs);
    task_handle *h = luaL_checkudata(L, -1, TASK_MT);
    join(L, h->t, 1);
    return lua_yieldk(L, 0, 0, run_k);
  }
  if (rt->driving) return luaL_error(L, "captcha.run is already driving the loop");
  int base = lua_gettop(L) - nargs - 1;
  cr_spawn_main(rt, L, nargs);
  task_handle *h = luaL_checkudata(L, -1, TASK_MT);
  cr_task *t = h->t;
  int status = cr_drive(rt);
  int failed = rt->failed;
  rt->failed = 0;
  if (rt->exit_requested) { rt->exit_requested = 0; return luaL_error(L, "captcha.exit(%d) called", status); }
  if (t->state != T_DONE || rt->deadlocked) {
    rt->deadlocked = 0;
    cancel_task(t);
    return luaL_error(L, "captcha.run: deadlock: the main task never finished");
  }
  if (!t->ok) {
    t->observed = 1;
    lua_pushstring(L, t->traceback ? t->traceback : "task failed");
    return lua_error(L);
  }
  if (failed) return luaL_error(L, "captcha.run: a spawned task failed and was never awaited (see log)");
  (void)base;
  return push_outcome(L, t);
}

/* captcha.yield(): let every other ready task run (a cooperative yield). */
static int l_yield(lua_State *L) {
  if (!cr_can_wait(L)) return luaL_error(L, "attempt to yield outside a task");
  return lua_yield(L, 0);
}

static int l_tasks(lua_State *L) {
  lua_pushinteger(L, cr_rt_get(L)->live);
  return 1;
}

void cr_sched_open(lua_State *L) {
  static const luaL_Reg task_m[] = {
      {"wait", task_wait}, {"cancel", task_cancel}, {"status", task_status}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"spawn", l_spawn}, {"sleep", l_sleep}, {"now", l_now}, {"time", l_time}, {"run", l_run},
      {"yield", l_yield}, {"tasks", l_tasks}, {NULL, NULL}};
  if (luaL_newmetatable(L, TASK_MT)) {
    luaL_newlib(L, task_m);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, task_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, task_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}

/* After a run: print the main task's error like lua.c does; 1 if it failed. */
int cr_main_failed(cr_runtime *rt, lua_State *L) {
  task_handle *h = luaL_checkudata(L, -1, TASK_MT);
  cr_task *t = h->t;
  if (t->state != T_DONE) return !rt->exit_requested;
  if (t->ok) return 0;
  t->observed = 1;
  if (!t->cancelled && t->traceback) {
    char *msg = strdup(t->traceback);
    if (msg) {
      cr_redact(msg);
      fprintf(stderr, "captcharun: %s\n", msg);
      fflush(stderr);
      free(msg);
    }
  }
  return 1;
}
