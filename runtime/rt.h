/* rt.h: the runtime object, private to the scheduler, module and host files. */
#ifndef CR_RT_H
#define CR_RT_H

#include "cr.h"

struct cr_runtime {
  uv_loop_t loop;
  lua_State *L;              /* scratch thread: never runs, safe to push on from the scheduler */
  uv_idle_t runner;          /* resumes ready tasks outside any callback */
  cr_task *ready_head, *ready_tail;
  cr_task *pass_head;        /* the runner's current pass, still to resume */
  cr_deferred *deferred, *deferred_tail; /* C work queued by callbacks */
  cr_task *tasks;            /* every unfinished task, for cancel and deadlock reports */
  int live;                  /* unfinished tasks */
  int driving;               /* inside cr_drive */
  int exit_requested, exit_code;
  int failed;                /* an unobserved task error was reported */
  int deadlocked;
  int closing;
  cr_resource *resources;
  uv_signal_t sig[2];
  int signals_on, signal_count;
  int pool_n;                /* finished threads kept for reuse */
  int pool_ref;              /* registry ref of the pool table */
  cr_task *unobserved;       /* failed tasks nobody waited for (yet) */
  lua_State *main;           /* the host's main thread */
  int scratch_ref;
  uv_idle_cb runner_cb;
  int pending_signal;        /* caught by signal_cb, dispatched by the runner */
  int signal_handlers;
  int baseline_refs;         /* registry refs right after start (leak check) */
  int result_refs;           /* refs holding results of tasks whose handles live on */
  int leaked_handles;
};

/* sched.c */
void cr_sched_init(cr_runtime *rt);
/* Spawn the function at -(nargs+1) as the main task of a run: its error is
 * printed with a traceback and ends the run with status 1. */
void cr_spawn_main(cr_runtime *rt, lua_State *L, int nargs);
/* Drive the loop until no task is left or exit is requested; returns the exit status. */
int cr_drive(cr_runtime *rt);
void cr_sched_shutdown(cr_runtime *rt);   /* cancel every task */
void cr_sched_open(lua_State *L);         /* task functions into the table at -1 */

int cr_main_failed(cr_runtime *rt, lua_State *L); /* handle of the main task at -1 */

/* rt.c */
int cr_rt_shutdown(cr_runtime *rt);       /* returns the number of leaked handles */
void cr_signals_dispatch(cr_runtime *rt);

/* log.c */
void cr_log_configure(int level, int format);
cr_runtime *cr_rt_create(lua_State *L);
cr_runtime *cr_rt_find(lua_State *L);      /* NULL if none */
void cr_rt_destroy(cr_runtime *rt);
void cr_rt_request_exit(cr_runtime *rt, int code);
void cr_signals_open(lua_State *L);       /* captcha.on_signal */

/* module.c */
int cr_open_module(lua_State *L);

#endif
