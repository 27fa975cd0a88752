/*
 * captcharun.h: embed the captcharun runtime in a C program.
 *
 *   cr_runtime *rt = cr_runtime_new(NULL);
 *   int status = cr_runtime_run_string(rt, "print(require'captcha'.now())", "=chunk");
 *   cr_runtime_close(rt);
 *
 * A runtime owns one libuv loop and one Lua 5.4 state with the `captcha`
 * module preloaded. A run executes the chunk as the main task and drives the
 * loop until that task and every task it spawned are done (or captcha.exit).
 * The return value is a process exit status: 0 success, 1 a script error (the
 * message and traceback were printed to stderr), or what captcha.exit chose.
 */
#ifndef CAPTCHARUN_H
#define CAPTCHARUN_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lua_State lua_State;
typedef struct uv_loop_s uv_loop_t;
typedef struct cr_runtime cr_runtime;

#define CR_VERSION_STRING "captcharun 0.1.0"

enum cr_log_format { CR_LOG_TEXT = 0, CR_LOG_JSON = 1 };

typedef struct cr_options {
  int argc;            /* the `arg` table: argv[script_index] is the script, */
  char **argv;         /* argv[0..script_index-1] go to negative indices     */
  int script_index;
  const char *lua_dir; /* the runtime's Lua library; NULL: next to the executable */
  int log_level;       /* 0 debug, 1 info (default), 2 warn, 3 error */
  int log_format;      /* enum cr_log_format */
  int handle_signals;  /* install SIGINT/SIGTERM handling (captcharun does) */
} cr_options;

/* NULL options mean defaults. Returns NULL only when out of memory. */
cr_runtime *cr_runtime_new(const cr_options *opt);
/* Run a file (NULL or "-" reads standard input); a leading #! line is skipped. */
int cr_runtime_run_file(cr_runtime *rt, const char *path);
/* Run a chunk; name as for lua_load ("=name" or "@file"). */
int cr_runtime_run_string(cr_runtime *rt, const char *code, const char *name);
/* The Lua state and the loop, for embedders that add their own libraries. */
lua_State *cr_runtime_lua(cr_runtime *rt);
uv_loop_t *cr_runtime_loop(cr_runtime *rt);
/* Shut the runtime down (cancel tasks, close handles and the loop), collect
 * garbage, and count what is left: libuv handles nobody closed plus registry
 * references nobody released. Logs what it finds; returns the count (0: clean).
 * Call it instead of nothing before cr_runtime_close, in tests. */
int cr_runtime_check_leaks(cr_runtime *rt);
/* Cancel what is left, close every handle, close the loop and the Lua state. */
void cr_runtime_close(cr_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif
