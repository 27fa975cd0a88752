/* test_sched.c: the await idiom's contract, seen from a C primitive: exactly
 * one of deliver/cancel per wait, stale wakes ignored, wakes from callbacks
 * resume the task later, and the leak check notices an unclosed handle. */
#include <stdlib.h>

#include "check.h"
#include "cr.h"

typedef struct {
  cr_wait w;
  int delivered, cancelled;
  int value;
} probe;

static probe p1;
static cr_wait stale;       /* a copy of an earlier wait, woken late on purpose */
static uv_timer_t timer;

static int probe_deliver(lua_State *co, cr_wait *w) {
  probe *p = (probe *)w;
  p->delivered++;
  lua_pushinteger(co, p->value);
  return 1;
}

static void probe_cancel(cr_wait *w) { ((probe *)w)->cancelled++; }

/* cwait(): the running task waits on p1 until the timer wakes it. */
static int l_cwait(lua_State *L) {
  cr_wait_begin(L, &p1.w, probe_deliver, probe_cancel);
  return cr_yield(L);
}

/* cwait_raise(): begins a wait, then fails before yielding (an error after
 * the wait was registered): the wait must be released, the task go on. */
static int l_cwait_raise(lua_State *L) {
  cr_wait_begin(L, &p1.w, probe_deliver, probe_cancel);
  return luaL_error(L, "failed after the wait began");
}

static void timer_cb(uv_timer_t *h) {
  (void)h;
  p1.value++;
  cr_wake(&stale);  /* an old generation: must be ignored */
  cr_wake(&p1.w);
  cr_wake(&p1.w);   /* twice: only one resume */
  stale = p1.w;
}

static int l_arm(lua_State *L) {
  uv_timer_start(&timer, timer_cb, (uint64_t)luaL_checkinteger(L, 1), 0);
  return 0;
}

static void timer_closed(uv_handle_t *h) { (void)h; }
static void timer_close(cr_resource *r) { (void)r; uv_close((uv_handle_t *)&timer, timer_closed); }

static cr_runtime *new_rt(void) {
  cr_runtime *rt = cr_runtime_new(NULL);
  lua_State *L = cr_runtime_lua(rt);
  lua_register(L, "cwait", l_cwait);
  lua_register(L, "arm", l_arm);
  lua_register(L, "cwait_raise", l_cwait_raise);
  return rt;
}

static void test_wake_and_deliver(void) {
  static cr_resource res = {timer_close, NULL, NULL};
  cr_runtime *rt = new_rt();
  uv_timer_init(cr_runtime_loop(rt), &timer);
  lua_State *L = cr_runtime_lua(rt);
  cr_resource_add(cr_rt_get(L), &res);
  int st = cr_runtime_run_string(rt,
      "arm(5) local a = cwait()\n"
      "arm(5) local b = cwait()\n"
      "assert(a == 1 and b == 2, 'got ' .. tostring(a) .. ',' .. tostring(b))\n", "=t1");
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_INT(p1.delivered, 2);
  CHECK_EQ_INT(p1.cancelled, 0);
  CHECK_EQ_INT(cr_runtime_check_leaks(rt), 0);
  cr_runtime_close(rt);
}

static void test_cancel(void) {
  p1.delivered = p1.cancelled = 0;
  cr_runtime *rt = new_rt();
  int st = cr_runtime_run_string(rt,
      "local c = require 'captcha'\n"
      "local t = c.spawn(function() cwait() error('resumed after cancel') end)\n"
      "c.sleep(0.001)\n"
      "assert(t:status() == 'waiting')\n"
      "assert(t:cancel())\n"
      "local ok, err = t:wait()\n"
      "assert(ok == nil and err == 'cancelled')\n", "=t2");
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_INT(p1.delivered, 0);
  CHECK_EQ_INT(p1.cancelled, 1);
  CHECK_EQ_INT(cr_runtime_check_leaks(rt), 0);
  cr_runtime_close(rt);
}

static void test_shutdown_cancels(void) {
  p1.delivered = p1.cancelled = 0;
  cr_runtime *rt = new_rt();
  /* exit while a task waits on p1: shutdown must call cancel, once */
  int st = cr_runtime_run_string(rt,
      "local c = require 'captcha'\n"
      "c.spawn(function() cwait() end)\n"
      "c.sleep(0.001) c.exit(7)\n", "=t3");
  CHECK_EQ_INT(st, 7);
  CHECK_EQ_INT(cr_runtime_check_leaks(rt), 0);
  CHECK_EQ_INT(p1.cancelled, 1);
  CHECK_EQ_INT(p1.delivered, 0);
  cr_runtime_close(rt);
}

static void test_deadlock(void) {
  p1.delivered = p1.cancelled = 0;
  cr_runtime *rt = new_rt();
  /* nothing will ever wake p1: the run ends with status 1 instead of hanging */
  int st = cr_runtime_run_string(rt, "cwait()", "=t4");
  CHECK_EQ_INT(st, 1);
  CHECK_EQ_INT(p1.cancelled, 1);
  cr_runtime_close(rt);
}

static void test_wait_then_raise(void) {
  p1.delivered = p1.cancelled = 0;
  cr_runtime *rt = new_rt();
  int st = cr_runtime_run_string(rt,
      "local c = require 'captcha'\n"
      "local ok, err = pcall(cwait_raise)\n"
      "assert(not ok and err:find('after the wait'))\n"
      "c.sleep(0.001)\n"
      "local t = c.spawn(function() return 'fine' end)\n"
      "assert(t:wait() == 'fine')\n", "=t5");
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_INT(p1.cancelled, 1);
  CHECK_EQ_INT(p1.delivered, 0);
  CHECK_EQ_INT(cr_runtime_check_leaks(rt), 0);
  cr_runtime_close(rt);
}

/* cr_defer: a callback queues Lua work; it runs once, later, from the runner. */
static int deferred_runs, in_callback;
static cr_deferred dfr, dfr_cancelled;
static uv_timer_t dtimer;

static void deferred_fn(lua_State *L, cr_deferred *d) {
  (void)d;
  CHECK(!in_callback);
  deferred_runs++;
  lua_pushinteger(L, deferred_runs);
  lua_setglobal(L, "deferred_runs");
}

static void dtimer_cb(uv_timer_t *h) {
  cr_runtime *rt = h->data;
  in_callback = 1;
  cr_defer(rt, &dfr);
  cr_defer(rt, &dfr);          /* already queued: no second run */
  cr_defer(rt, &dfr_cancelled);
  cr_defer_cancel(rt, &dfr_cancelled);
  in_callback = 0;
  uv_close((uv_handle_t *)h, NULL);
}

static void test_defer(void) {
  cr_runtime *rt = new_rt();
  lua_State *L = cr_runtime_lua(rt);
  dfr.fn = deferred_fn;
  dfr_cancelled.fn = deferred_fn;
  uv_timer_init(cr_runtime_loop(rt), &dtimer);
  dtimer.data = cr_rt_get(L);
  uv_timer_start(&dtimer, dtimer_cb, 1, 0);
  int st = cr_runtime_run_string(rt,
      "local c = require 'captcha'\n"
      "while not deferred_runs do c.sleep(0.002) end\n"
      "c.sleep(0.01)\n"
      "assert(deferred_runs == 1, 'ran ' .. deferred_runs .. ' times')\n", "=t6");
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_INT(deferred_runs, 1);
  CHECK_EQ_INT(cr_runtime_check_leaks(rt), 0);
  cr_runtime_close(rt);
}

static void test_leak_check_fails(void) {
  cr_runtime *rt = new_rt();
  uv_timer_t *leaked = malloc(sizeof *leaked);
  uv_timer_init(cr_runtime_loop(rt), leaked);
  uv_timer_start(leaked, (uv_timer_cb)free, 100000, 0);
  CHECK(cr_runtime_check_leaks(rt) > 0);
  cr_runtime_close(rt);
  free(leaked);
}

int main(void) {
  test_wake_and_deliver();
  test_cancel();
  test_shutdown_cancels();
  test_deadlock();
  test_wait_then_raise();
  test_defer();
  test_leak_check_fails();
  return CHECK_DONE();
}
