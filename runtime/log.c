/*
 * log.c: one line per event on stderr, as text or JSON, with every registered
 * secret replaced by "***" before the line leaves the process.
 *
 * Redaction is a substring scan per secret per line (O(line * secrets)); there
 * are one or two secrets (API keys), and logging is not on a hot path.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "rt.h"

#define MAX_SECRETS 16

static int log_level = CR_LOG_INFO;
static int log_format = CR_LOG_TEXT;
static char *secrets[MAX_SECRETS];
static int nsecrets;
static int status_line; /* a progress line is on the terminal: clear it first */
static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

void cr_log_configure(int level, int format) {
  if (level >= CR_LOG_DEBUG && level <= CR_LOG_OFF) log_level = level;
  log_format = format == CR_LOG_JSON ? CR_LOG_JSON : CR_LOG_TEXT;
}

int cr_log_enabled(int level) { return level >= log_level; }

static void add_secret(const char *secret) {
  for (int i = 0; i < nsecrets; i++)
    if (strcmp(secrets[i], secret) == 0) return;
  if (nsecrets == MAX_SECRETS) { /* oldest goes: keys rotate, the list stays bounded */
    free(secrets[0]);
    memmove(secrets, secrets + 1, sizeof secrets[0] * (MAX_SECRETS - 1));
    nsecrets--;
  }
  char *copy = strdup(secret);
  if (copy) secrets[nsecrets++] = copy;
}

void cr_log_add_secret(const char *secret) {
  if (!secret || strlen(secret) < 4) return;
  add_secret(secret);
  /* JSON lines escape '"', '\\' and control bytes, so a secret holding one
   * is printed in another form: that form is a secret too */
  cJSON *str = cJSON_CreateString(secret);
  char *esc = str ? cJSON_PrintUnformatted(str) : NULL;
  cJSON_Delete(str);
  if (esc) {
    size_t n = strlen(esc);
    esc[n - 1] = '\0'; /* drop the quotes */
    if (strcmp(esc + 1, secret) != 0) add_secret(esc + 1);
    cJSON_free(esc);
  }
}

void cr_redact(char *s) {
  for (int i = 0; i < nsecrets; i++) {
    size_t n = strlen(secrets[i]);
    char *p;
    while ((p = strstr(s, secrets[i])) != NULL) {
      memcpy(p, "***", 3);
      memmove(p + 3, p + n, strlen(p + n) + 1);
    }
  }
}

void cr_push_redacted(lua_State *L, int idx) {
  size_t len;
  const char *s = luaL_tolstring(L, idx, &len);
  if (nsecrets == 0 || memchr(s, '\0', len)) return; /* binary: left as is */
  char *copy = malloc(len + 1);
  if (!copy) return;
  memcpy(copy, s, len + 1);
  cr_redact(copy);
  lua_pop(L, 1);
  lua_pushstring(L, copy);
  free(copy);
}

static void timestamp(char *buf, size_t n) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* fields_json: an encoded JSON object or NULL; fields_text: "k=v k=v" or NULL. */
static void emit(int level, const char *msg, const char *fields_json, const char *fields_text) {
  char ts[40];
  timestamp(ts, sizeof ts);
  char *line;
  if (log_format == CR_LOG_JSON) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", level_names[level]);
    cJSON_AddStringToObject(o, "msg", msg);
    if (fields_json) cJSON_AddItemToObject(o, "fields", cJSON_CreateRaw(fields_json));
    line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
  } else {
    size_t n = strlen(ts) + strlen(msg) + (fields_text ? strlen(fields_text) : 0) + 16;
    line = malloc(n);
    if (line) snprintf(line, n, "%s %-5s %s%s%s", ts, level_names[level], msg,
                       fields_text ? " " : "", fields_text ? fields_text : "");
  }
  if (!line) return;
  cr_redact(line);
  fprintf(stderr, "%s%s\n", status_line ? "\r\033[K" : "", line);
  fflush(stderr);
  free(line);
}

void cr_log(int level, const char *msg) {
  if (cr_log_enabled(level)) emit(level, msg, NULL, NULL);
}

void cr_logf(int level, const char *fmt, ...) {
  if (!cr_log_enabled(level)) return;
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf) {
    vsnprintf(buf, (size_t)n + 1, fmt, ap2);
    emit(level, buf, NULL, NULL);
    free(buf);
  }
  va_end(ap2);
}

/* ---- Lua: captcha.log ---- */

static int check_level(lua_State *L, int idx) {
  const char *s = luaL_checkstring(L, idx);
  for (int i = 0; i <= CR_LOG_OFF; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  if (strcmp(s, "warning") == 0) return CR_LOG_WARN;
  return luaL_argerror(L, idx, lua_pushfstring(L, "invalid log level '%s' (debug, info, warn, error, off)", s));
}

/* Push "k=v k=v" with keys sorted, so lines are stable for people and tests. */
static void push_fields_text(lua_State *L, int idx) {
  lua_newtable(L);
  int keys = lua_gettop(L), n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
      lua_pushvalue(L, -1);
      lua_rawseti(L, keys, ++n);
    }
  }
  lua_getglobal(L, "table");
  lua_getfield(L, -1, "sort");
  lua_pushvalue(L, keys);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
  lua_newtable(L); /* parts, joined by table.concat */
  int parts = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, keys, i);
    lua_gettable(L, idx);
    size_t len;
    const char *v = luaL_tolstring(L, -1, &len);
    int quote = len == 0 || strpbrk(v, " \t\n\"=") != NULL;
    lua_rawgeti(L, keys, i);
    lua_pushfstring(L, quote ? "%s=\"%s\"" : "%s=%s", lua_tostring(L, -1), v);
    lua_rawseti(L, parts, i);
    lua_pop(L, 3);
  }
  lua_getglobal(L, "table");
  lua_getfield(L, -1, "concat");
  lua_pushvalue(L, parts);
  lua_pushliteral(L, " ");
  lua_call(L, 2, 1);
  lua_replace(L, keys);
  lua_settop(L, keys);
}

static int log_at(lua_State *L, int level) {
  const char *msg = luaL_checkstring(L, 1);
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  if (!cr_log_enabled(level)) return 0;
  lua_settop(L, 2);
  if (lua_isnil(L, 2)) { emit(level, msg, NULL, NULL); return 0; }
  if (log_format == CR_LOG_JSON) {
    luaL_Buffer b;
    char err[128];
    luaL_buffinit(L, &b);
    if (cr_json_encode(L, 2, &b, err, sizeof err) != 0) return luaL_argerror(L, 2, err);
    luaL_pushresult(&b);
    emit(level, msg, lua_tostring(L, -1), NULL);
  } else {
    push_fields_text(L, 2);
    emit(level, msg, NULL, lua_tostring(L, -1));
  }
  return 0;
}

static int l_debug(lua_State *L) { return log_at(L, CR_LOG_DEBUG); }
static int l_info(lua_State *L) { return log_at(L, CR_LOG_INFO); }
static int l_warn(lua_State *L) { return log_at(L, CR_LOG_WARN); }
static int l_error(lua_State *L) { return log_at(L, CR_LOG_ERROR); }

/* captcha.log.level([name]) -> previous level name */
static int l_level(lua_State *L) {
  lua_pushstring(L, level_names[log_level]);
  if (!lua_isnoneornil(L, 1)) log_level = check_level(L, 1);
  return 1;
}

static int l_format(lua_State *L) {
  lua_pushstring(L, log_format == CR_LOG_JSON ? "json" : "text");
  if (!lua_isnoneornil(L, 1)) {
    const char *f = luaL_checkstring(L, 1);
    if (strcmp(f, "json") == 0) log_format = CR_LOG_JSON;
    else if (strcmp(f, "text") == 0) log_format = CR_LOG_TEXT;
    else return luaL_argerror(L, 1, "format must be 'text' or 'json'");
  }
  return 1;
}

/* captcha.log.status_line(on): a progress line owns the terminal's last line;
 * log lines clear it before they print (it is redrawn on its next tick). */
static int l_status_line(lua_State *L) {
  status_line = lua_toboolean(L, 1);
  return 0;
}

/* captcha.log.secret(s): never print s (API keys); returns nothing. */
static int l_secret(lua_State *L) {
  cr_log_add_secret(luaL_checkstring(L, 1));
  return 0;
}

/* captcha.log.redact(s) -> s with every secret replaced by *** */
static int l_redact(lua_State *L) {
  luaL_checkany(L, 1);
  cr_push_redacted(L, 1);
  return 1;
}

int cr_open_log(lua_State *L) {
  static const luaL_Reg f[] = {
      {"debug", l_debug}, {"info", l_info}, {"warn", l_warn}, {"error", l_error},
      {"level", l_level}, {"format", l_format}, {"secret", l_secret}, {"redact", l_redact}, {"status_line", l_status_line},
      {NULL, NULL}};
  luaL_newlib(L, f);
  return 1;
}
