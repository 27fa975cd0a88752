/*
 * json.c: captcha.json on cJSON.
 *
 * Lua -> JSON: integers print as integers and floats keep a fraction or an
 * exponent ("1.0"), so a round trip keeps the number's subtype; numbers are
 * emitted as cJSON raw items because cJSON itself stores only doubles (it would
 * round integers above 2^53). A table is an array when it carries the
 * json.array metatable or its keys are exactly 1..n (n > 0); an empty table is
 * an object unless marked. json.null stands for null in both directions.
 *
 * Strings are emitted as valid UTF-8 (JSON text must be): a byte that starts
 * no valid sequence becomes U+FFFD, so a result line is never invalid JSON.
 * A marked array encodes its holes as null (up to a sparseness bound).
 *
 * JSON -> Lua: integer literals that fit 64 bits become exact integers (ids
 * beyond 2^53 included); literals with a fraction or an exponent become
 * floats ("1.0" stays 1.0, so a round trip keeps the subtype); longer integer
 * literals become floats. Arrays get the json.array metatable so they encode
 * back as arrays.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cr.h"

#define ARRAY_MT "captcha.json.array"
#define MAX_DEPTH 128

static void *null_sentinel(void) {
  static const char null_tag = 0;
  return (void *)&null_tag;
}

/* ---- encode ---- */

typedef struct { char *err; size_t errlen; } enc_ctx;

static cJSON *encode_value(lua_State *L, int idx, int depth, enc_ctx *c);

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if none starts
 * there (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  size_t len;
  unsigned long cp, min;
  if (s[0] < 0x80) return 1;
  if ((s[0] & 0xE0) == 0xC0) { len = 2; cp = s[0] & 0x1F; min = 0x80; }
  else if ((s[0] & 0xF0) == 0xE0) { len = 3; cp = s[0] & 0x0F; min = 0x800; }
  else if ((s[0] & 0xF8) == 0xF0) { len = 4; cp = s[0] & 0x07; min = 0x10000; }
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

/* s itself when it is valid UTF-8 (one scan, the common case), else a copy
 * in *owned with U+FFFD for each bad byte; NULL when out of memory. */
static const char *utf8_valid(const char *s, size_t n, char **owned) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, k;
  *owned = NULL;
  while (i < n && (k = utf8_seq(u + i, n - i)) > 0) i += k;
  if (i >= n) return s;
  char *out = malloc(n * 3 + 1), *o = out;
  if (!out) return NULL;
  for (i = 0; i < n;) {
    if ((k = utf8_seq(u + i, n - i)) > 0) { memcpy(o, s + i, k); o += k; i += k; }
    else { memcpy(o, "\xEF\xBF\xBD", 3); o += 3; i++; }
  }
  *o = '\0';
  return *owned = out;
}

static cJSON *string(lua_State *L, int idx, enc_ctx *c) {
  size_t n;
  char *owned;
  const char *raw = lua_tolstring(L, idx, &n);
  const char *s = utf8_valid(raw, n, &owned);
  if (!s) { snprintf(c->err, c->errlen, "out of memory"); return NULL; }
  cJSON *v = cJSON_CreateString(s);
  free(owned);
  return v;
}

static int is_marked_array(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;
  luaL_getmetatable(L, ARRAY_MT);
  int r = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return r;
}

/* Length of a marked array: its largest key, holes encoded as null. -1 (with
 * the error) for a key that is not a positive integer, or for an array so
 * sparse that its nulls would dwarf its values (a stray huge index). O(n). */
static lua_Integer marked_length(lua_State *L, int idx, enc_ctx *c) {
  lua_Integer n = 0, max = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
      snprintf(c->err, c->errlen, "cannot encode an array with a %s key", luaL_typename(L, -1));
      lua_pop(L, 1);
      return -1;
    }
    if (lua_tointeger(L, -1) > max) max = lua_tointeger(L, -1);
    n++;
  }
  if (max > 2 * n + 16) {
    snprintf(c->err, c->errlen, "cannot encode an excessively sparse array");
    return -1;
  }
  return max;
}

/* n > 0 when the keys are exactly 1..n; 0 otherwise. O(n) per table. */
static lua_Integer array_length(lua_State *L, int idx) {
  lua_Integer n = 0, max = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1)) { lua_pop(L, 1); return 0; }
    lua_Integer k = lua_tointeger(L, -1);
    if (k < 1) { lua_pop(L, 1); return 0; }
    if (k > max) max = k;
    n++;
  }
  return n == max ? n : 0;
}

static cJSON *number(lua_State *L, int idx, enc_ctx *c) {
  char buf[64];
  if (lua_isinteger(L, idx)) {
    snprintf(buf, sizeof buf, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
  } else {
    double d = lua_tonumber(L, idx);
    if (!isfinite(d)) {
      snprintf(c->err, c->errlen, "cannot encode %s", isnan(d) ? "NaN" : "infinity");
      return NULL;
    }
    snprintf(buf, sizeof buf, "%.17g", d);
    char shorter[64]; /* the shortest form that reads back the same */
    for (int prec = 1; prec < 17; prec++) {
      snprintf(shorter, sizeof shorter, "%.*g", prec, d);
      if (strtod(shorter, NULL) == d) { memcpy(buf, shorter, sizeof buf); break; }
    }
    if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
  }
  return cJSON_CreateRaw(buf);
}

static cJSON *encode_table(lua_State *L, int idx, int depth, enc_ctx *c) {
  lua_Integer n = array_length(L, idx);
  if (n == 0 && is_marked_array(L, idx) && (n = marked_length(L, idx, c)) < 0) return NULL;
  if (n > 0 || is_marked_array(L, idx)) {
    cJSON *a = cJSON_CreateArray();
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, idx, i);
      cJSON *v = encode_value(L, lua_gettop(L), depth + 1, c);
      lua_pop(L, 1);
      if (!v) { cJSON_Delete(a); return NULL; }
      cJSON_AddItemToArray(a, v);
    }
    return a;
  }
  cJSON *o = cJSON_CreateObject();
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    char kbuf[32], *owned = NULL;
    const char *key;
    if (lua_type(L, -2) == LUA_TSTRING) {
      size_t klen;
      const char *k = lua_tolstring(L, -2, &klen);
      if (!(key = utf8_valid(k, klen, &owned))) {
        snprintf(c->err, c->errlen, "out of memory");
        lua_pop(L, 2);
        cJSON_Delete(o);
        return NULL;
      }
    }
    else if (lua_isinteger(L, -2)) {
      snprintf(kbuf, sizeof kbuf, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, -2));
      key = kbuf;
    } else {
      snprintf(c->err, c->errlen, "cannot encode a table key of type %s", luaL_typename(L, -2));
      lua_pop(L, 2);
      cJSON_Delete(o);
      return NULL;
    }
    cJSON *v = encode_value(L, lua_gettop(L), depth + 1, c);
    lua_pop(L, 1);
    if (!v) { free(owned); lua_pop(L, 1); cJSON_Delete(o); return NULL; }
    cJSON_AddItemToObject(o, key, v);
    free(owned);
  }
  return o;
}

static cJSON *encode_value(lua_State *L, int idx, int depth, enc_ctx *c) {
  if (depth > MAX_DEPTH) {
    snprintf(c->err, c->errlen, "nesting deeper than %d (a cycle?)", MAX_DEPTH);
    return NULL;
  }
  switch (lua_type(L, idx)) {
  case LUA_TNIL: return cJSON_CreateNull();
  case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
  case LUA_TNUMBER: return number(L, idx, c);
  case LUA_TSTRING: return string(L, idx, c);
  case LUA_TTABLE:
    luaL_checkstack(L, 4, "json nesting");
    return encode_table(L, idx, depth, c);
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == null_sentinel()) return cJSON_CreateNull();
    /* fall through */
  default:
    snprintf(c->err, c->errlen, "cannot encode a value of type %s", luaL_typename(L, idx));
    return NULL;
  }
}

int cr_json_encode(lua_State *L, int idx, luaL_Buffer *out, char *err, size_t errlen) {
  enc_ctx c = {err, errlen};
  idx = lua_absindex(L, idx);
  cJSON *root = encode_value(L, idx, 0, &c);
  if (!root) return -1;
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
  luaL_addstring(out, s);
  cJSON_free(s);
  return 0;
}

/* ---- decode ---- */

/* cJSON keeps only a double per number, which rounds ids beyond 2^53. The
 * number tokens of the text come in document order, the order push_item
 * visits the numbers, so each is read again from its own token. */
typedef struct { const char *p, *end; } num_scan;

/* 1: an integer literal, read exactly into *out; 0: a literal with a fraction
 * or an exponent ("1.0", "1e3": a float in Lua too); -1: unreadable here (too
 * long, out of range): the caller falls back to cJSON's double. */
static int next_integer(num_scan *ns, lua_Integer *out) {
  const char *p = ns->p, *end = ns->end;
  while (p < end && *p != '-' && !(*p >= '0' && *p <= '9')) {
    if (*p == '"') { /* skip the string: its digits are not numbers */
      for (p++; p < end && *p != '"'; p++) if (*p == '\\') p++;
    }
    p++;
  }
  const char *q = p;
  int integral = 1;
  while (q < end && *q && strchr("0123456789+-.eE", *q)) {
    if (*q == '.' || *q == 'e' || *q == 'E') integral = 0;
    q++;
  }
  ns->p = q;
  char buf[32];
  if (q == p) return -1;
  if (!integral) return 0;
  if ((size_t)(q - p) >= sizeof buf) return -1;
  memcpy(buf, p, (size_t)(q - p));
  buf[q - p] = '\0';
  errno = 0;
  char *e;
  long long v = strtoll(buf, &e, 10);
  if (errno || *e) return -1;
  *out = (lua_Integer)v;
  return 1;
}

static void push_item(lua_State *L, const cJSON *it, int depth, num_scan *ns) {
  luaL_checkstack(L, 3, "json nesting");
  lua_Integer i;
  if (cJSON_IsNull(it)) lua_pushlightuserdata(L, null_sentinel());
  else if (cJSON_IsFalse(it)) lua_pushboolean(L, 0);
  else if (cJSON_IsTrue(it)) lua_pushboolean(L, 1);
  else if (cJSON_IsNumber(it)) {
    double d = it->valuedouble;
    int kind = next_integer(ns, &i);
    if (kind == 1) lua_pushinteger(L, i);
    else if (kind == -1 && d == floor(d) && fabs(d) <= 9007199254740992.0) lua_pushinteger(L, (lua_Integer)d);
    else lua_pushnumber(L, d);
  } else if (cJSON_IsString(it)) lua_pushstring(L, it->valuestring);
  else if (cJSON_IsArray(it)) {
    lua_createtable(L, cJSON_GetArraySize(it), 0);
    int i = 0;
    for (const cJSON *e = it->child; e; e = e->next) {
      push_item(L, e, depth + 1, ns);
      lua_rawseti(L, -2, ++i);
    }
    luaL_setmetatable(L, ARRAY_MT);
  } else {
    lua_createtable(L, 0, 4);
    for (const cJSON *e = it->child; e; e = e->next) {
      push_item(L, e, depth + 1, ns);
      lua_setfield(L, -2, e->string);
    }
  }
}

int cr_json_decode(lua_State *L, const char *s, size_t len, char *err, size_t errlen) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(s, len, &end, 0);
  if (!root) {
    size_t at = end && end >= s ? (size_t)(end - s) : 0;
    if (!end) {
      const char *p = cJSON_GetErrorPtr();
      at = p && p >= s && p <= s + len ? (size_t)(p - s) : 0;
    }
    snprintf(err, errlen, "error at byte %zu", at + 1);
    return -1;
  }
  /* trailing garbage after the value is an error too */
  while (end && end < s + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
  if (end && end < s + len) {
    cJSON_Delete(root);
    snprintf(err, errlen, "error at byte %zu", (size_t)(end - s) + 1);
    return -1;
  }
  num_scan ns = {s, s + len};
  push_item(L, root, 0, &ns);
  cJSON_Delete(root);
  return 0;
}

/* ---- Lua API ---- */

static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  char err[160];
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  if (cr_json_encode(L, 1, &b, err, sizeof err) != 0) {
    luaL_pushresult(&b);
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  luaL_pushresult(&b);
  return 1;
}

static int l_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  char err[64];
  if (cr_json_decode(L, s, len, err, sizeof err) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return 1;
}

/* json.array(t) marks t (default: a new table) as an array; returns it. */
static int l_array(lua_State *L) {
  if (lua_isnoneornil(L, 1)) { lua_settop(L, 0); lua_newtable(L); }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_setmetatable(L, ARRAY_MT);
  return 1;
}

int cr_open_json(lua_State *L) {
  static const luaL_Reg f[] = {
      {"encode", l_encode}, {"decode", l_decode}, {"array", l_array}, {NULL, NULL}};
  luaL_newmetatable(L, ARRAY_MT);
  lua_pop(L, 1);
  luaL_newlib(L, f);
  lua_pushlightuserdata(L, null_sentinel());
  lua_setfield(L, -2, "null");
  return 1;
}
