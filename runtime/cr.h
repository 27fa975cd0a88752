/*
 * cr.h: the runtime's internal API, shared by every binding file.
 *
 * One libuv loop, one Lua state, coroutines as tasks. C code that needs a Lua
 * task to wait follows the await idiom (STYLE.md):
 *
 *   struct my_wait { cr_wait w; uv_timer_t timer; int result; };
 *
 *   static int my_deliver(lua_State *co, cr_wait *w) {   // on the scheduler
 *       struct my_wait *m = (struct my_wait *)w;          // (never in a callback)
 *       lua_pushinteger(co, m->result);                    // push the results,
 *       ... release m ...                                 // release the wait,
 *       return 1;                                         // return how many.
 *   }
 *   static void my_cancel(cr_wait *w) { ... stop and release, no Lua ... }
 *
 *   static int l_thing(lua_State *L) {
 *       struct my_wait *m = calloc(1, sizeof *m);
 *       cr_wait_begin(L, &m->w, my_deliver, my_cancel);   // raises outside a task
 *       ... start the timer / request, whose callback stores m->result and calls
 *       cr_wake(&m->w) ...
 *       return cr_yield(L);                                // results = deliver's
 *   }
 *
 * Exactly one of deliver and cancel is called for each cr_wait_begin, and after
 * it the runtime never touches the cr_wait again. cancel is called when the task
 * is cancelled (task:cancel(), shutdown) while it waits — possibly after cr_wake
 * was called but before deliver ran (a grant racing a cancel: give it back if
 * it matters). It must stop whatever would call cr_wake, synchronously, and
 * release the wait. cr_wake may be called any number of times; only the first
 * one for the current wait counts (generation check).
 *
 * Memory that a libuv handle lives in is freed only in its close callback: never
 * embed a uv handle in a Lua userdata (its __gc may free it first).
 *
 * Callbacks (libuv, curl) never run Lua: they store results in C and cr_wake.
 */
#ifndef CR_H
#define CR_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <lua.h>
#include <lauxlib.h>

#include "captcharun.h"

typedef struct cr_task cr_task;
typedef struct cr_wait cr_wait;

typedef int (*cr_deliver_fn)(lua_State *co, cr_wait *w);
typedef void (*cr_cancel_fn)(cr_wait *w);

struct cr_wait {
  cr_task *task;       /* set by cr_wait_begin */
  uint64_t gen;        /* the task's wait generation when it began */
  cr_deliver_fn deliver;
  cr_cancel_fn cancel;
};

/* The runtime owning this Lua state (any thread of it). Raises if none. */
cr_runtime *cr_rt_get(lua_State *L);
uv_loop_t *cr_rt_loop(cr_runtime *rt);
lua_State *cr_rt_main(cr_runtime *rt); /* the scheduler's scratch thread: for refs and
                                         pushes outside any task; never run or yield it */

/* Monotonic time in seconds, sub-millisecond (uv_hrtime based). */
double cr_now(void);

/* Begin a wait for the running task of L. Raises a Lua error when L is not a
 * task that can yield (the main state outside captcha.run, or inside a
 * non-yieldable C call such as a metamethod). */
void cr_wait_begin(lua_State *L, cr_wait *w, cr_deliver_fn deliver, cr_cancel_fn cancel);
/* Yield the task: `return cr_yield(L);` from the lua_CFunction. */
int cr_yield(lua_State *L);
/* Mark the task ready; it is resumed from the loop's idle phase with the values
 * that deliver pushes. Safe from any libuv/curl callback. */
void cr_wake(cr_wait *w);
/* True when L is a task that may call cr_wait_begin right now. */
int cr_can_wait(lua_State *L);

/* Spawn the function at stack index -(nargs+1) with the nargs values above it as
 * a new task; pops them and pushes the task handle (userdata "captcha.task"). */
void cr_spawn(lua_State *L, int nargs);
/* Like cr_spawn, but for user hooks: the task is detached (no handle pushed),
 * and an error is logged with its traceback, prefixed by `what`, without
 * failing the process. */
void cr_spawn_hook(lua_State *L, int nargs, const char *what);

/* Deferred C work: a libuv callback that has Lua work to do (fire hooks, build
 * reports) queues it here; the runner calls fn from its idle phase, under a
 * protected call, on the scheduler's scratch thread, never inside the callback.
 * Queuing a queued item is a no-op; an owner that goes away first cancels it. */
typedef struct cr_deferred cr_deferred;
struct cr_deferred {
  void (*fn)(lua_State *L, cr_deferred *d);
  cr_deferred *next;
  int queued;
};
void cr_defer(cr_runtime *rt, cr_deferred *d);
void cr_defer_cancel(cr_runtime *rt, cr_deferred *d);

/* Resources with OS handles (timers, servers, curl) register here so that
 * shutdown can close them before the loop is closed. close() must uv_close its
 * handles (freeing memory in the close callbacks or later) and is called at most
 * once; a resource closed by the user calls cr_resource_remove itself. */
typedef struct cr_resource cr_resource;
struct cr_resource {
  void (*close)(cr_resource *r);
  cr_resource *prev, *next;
};
void cr_resource_add(cr_runtime *rt, cr_resource *r);
void cr_resource_remove(cr_runtime *rt, cr_resource *r);
/* True once shutdown has begun: bindings must not start new handles. */
int cr_rt_closing(cr_runtime *rt);

/* Logging to stderr, text or JSON lines. Every registered secret is replaced
 * by "***" in every line (message and fields). */
enum { CR_LOG_DEBUG = 0, CR_LOG_INFO, CR_LOG_WARN, CR_LOG_ERROR, CR_LOG_OFF };
void cr_log(int level, const char *msg);
void cr_logf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cr_log_enabled(int level);
void cr_log_add_secret(const char *secret);  /* ignored if shorter than 4 bytes */
/* Replace every registered secret in s (in place; the result is never longer). */
void cr_redact(char *s);
/* Push a redacted copy of the string at idx. */
void cr_push_redacted(lua_State *L, int idx);

/* JSON glue (cJSON): push a Lua value decoded from text, or encode the value at
 * idx. Both return 0 or push nothing and return -1 with *err set. */
int cr_json_decode(lua_State *L, const char *s, size_t len, char *err, size_t errlen);
int cr_json_encode(lua_State *L, int idx, luaL_Buffer *out, char *err, size_t errlen);

/* A heap-allocated timer on the runtime's loop (NULL when out of memory), and
 * its release: stop, forget data, close; the memory goes in the close callback. */
uv_timer_t *cr_timer_new(cr_runtime *rt, void *data);
void cr_timer_free(uv_timer_t **t);
/* t[k] = v for the table at the top of the stack. */
void cr_setfield_num(lua_State *L, const char *k, double v);
void cr_setfield_int(lua_State *L, const char *k, lua_Integer v);

/* Library openers, called by cr_open_module; each leaves one table/value. */
int cr_open_json(lua_State *L);
int cr_open_log(lua_State *L);

/* A binding registers its constructor in the `captcha` table through this list
 * (see module.c). Each opener receives the captcha table at index -1 and must
 * leave the stack as it found it. */
typedef void (*cr_register_fn)(lua_State *L);

#endif
