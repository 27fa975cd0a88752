/*
 * main.c: the captcharun command, modelled on lua.c, on the public API only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "captcharun.h"

static const char usage_text[] =
    "usage: captcharun [options] [script [args...]]\n"
    "       captcharun mock [--listen 127.0.0.1:PORT] [mock options]  (see captcharun mock --help)\n"
    "\n"
    "Runs a Lua 5.4 pipeline script on one event loop, with the `captcha` module\n"
    "(token bucket, error budget, dedup cache, async CaptchaAI client) preloaded.\n"
    "\n"
    "options:\n"
    "  -e CODE              run CODE (before the script; may be repeated)\n"
    "  -                    read the script from standard input\n"
    "  --                   stop handling options; the next argument is the script\n"
    "  --log-level LEVEL    debug, info (default), warn, error or off\n"
    "  --log-format FORMAT  text (default) or json (one object per line on stderr)\n"
    "  -v, --version        print the version and exit\n"
    "  -h, --help           print this help and exit\n"
    "\n"
    "The script gets its arguments in the global `arg` (arg[0] is the script) and\n"
    "as `...`. A first line starting with # is ignored.\n"
    "\n"
    "exit status:\n"
    "  0    done\n"
    "  1    script error (message and traceback on stderr), or a task failed\n"
    "       and nobody waited for it\n"
    "  2    usage error\n"
    "  3    an error budget ended exhausted (pipelines)\n"
    "  4    halted by a fatal provider error (pipelines)\n"
    "  130  interrupted by SIGINT, 143 by SIGTERM (a second signal exits at once;\n"
    "       the first one runs the handlers given to captcha.on_signal)\n"
    "\n"
    "environment:\n"
    "  CAPTCHAAI_API_KEY    the API key pipelines use (never printed)\n"
    "  NO_COLOR             no colours in progress output\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "captcharun: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'captcharun --help' for more information.\n");
  return 2;
}

static int parse_level(const char *s) {
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

typedef struct {
  cr_options opt;
  const char *exprs[64];
  int nexprs;
  const char *script; /* NULL: none; "-": stdin */
  int mock;
} cli;

/* Returns -1 to go on, or an exit status. */
static int parse_args(int argc, char **argv, cli *c) {
  c->opt.log_level = 1;
  c->opt.handle_signals = 1;
  int i = 1;
  if (argc > 1 && strcmp(argv[1], "mock") == 0) {
    c->mock = 1;
    c->opt.argc = argc;
    c->opt.argv = argv;
    c->opt.script_index = 1;
    return -1;
  }
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) { i++; break; }
    if (strcmp(a, "-") == 0) break;
    if (a[0] != '-') break;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { fputs(usage_text, stdout); return 0; }
    if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) { puts(CR_VERSION_STRING); return 0; }
    if (strcmp(a, "-e") == 0 || strcmp(a, "--log-level") == 0 || strcmp(a, "--log-format") == 0) {
      if (i + 1 >= argc) return usage_error("option '%s' needs an argument", a);
      const char *v = argv[++i];
      if (a[1] == 'e') {
        if (c->nexprs == 64) return usage_error("too many -e options%s", "");
        c->exprs[c->nexprs++] = v;
      } else if (strcmp(a, "--log-level") == 0) {
        if ((c->opt.log_level = parse_level(v)) < 0) return usage_error("invalid log level '%s'", v);
      } else if (strcmp(v, "json") == 0) c->opt.log_format = CR_LOG_JSON;
      else if (strcmp(v, "text") == 0) c->opt.log_format = CR_LOG_TEXT;
      else return usage_error("invalid log format '%s' (text or json)", v);
      continue;
    }
    return usage_error("unrecognized option '%s'", a);
  }
  if (i < argc) c->script = argv[i];
  else if (c->nexprs == 0) return usage_error("no script given%s", "");
  c->opt.argc = argc;
  c->opt.argv = argv;
  c->opt.script_index = i < argc ? i : argc;
  return -1;
}

static int finish(cr_runtime *rt, int status) {
  const char *check = getenv("CAPTCHARUN_CHECK_LEAKS");
  if (check && *check && strcmp(check, "0") != 0 && cr_runtime_check_leaks(rt) && status == 0)
    status = 1;
  cr_runtime_close(rt);
  return status;
}

int main(int argc, char **argv) {
  cli c;
  memset(&c, 0, sizeof c);
  int st = parse_args(argc, argv, &c);
  if (st >= 0) return st;
  cr_runtime *rt = cr_runtime_new(&c.opt);
  if (!rt) {
    fprintf(stderr, "captcharun: cannot create the runtime (out of memory)\n");
    return 1;
  }
  if (c.mock)
    return finish(rt, cr_runtime_run_string(rt,
        "local code = require('captcha.mock_cli').main({table.unpack(arg, 1)})\n"
        "if code and code ~= 0 then require('captcha').exit(code) end", "=mock"));
  for (int i = 0; i < c.nexprs; i++) {
    st = cr_runtime_run_string(rt, c.exprs[i], "=(command line)");
    if (st != 0) return finish(rt, st);
  }
  st = c.script ? cr_runtime_run_file(rt, c.script) : 0;
  return finish(rt, st);
}
