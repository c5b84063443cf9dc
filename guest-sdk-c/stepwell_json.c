/* The JSON the C SDK reads and writes: top-level fields of an object,
 * strings unescaped to UTF-8, and text escaped for JSON strings. The host
 * checks every JSON text a node returns. */
#include <stdlib.h>
#include <string.h>

#include "stepwell.h"

sw_buf sw_buf_new(void) {
  sw_buf b = {0, 0, 0};
  return b;
}

static void reserve(sw_buf *b, size_t more) {
  if (b->len + more + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + more + 1) cap *= 2;
  char *p = realloc(b->ptr, cap);
  if (!p) abort();
  b->ptr = p;
  b->cap = cap;
}

static void put(sw_buf *b, const char *s, size_t n) {
  reserve(b, n);
  memcpy(b->ptr + b->len, s, n);
  b->len += n;
  b->ptr[b->len] = 0;
}

void sw_buf_add(sw_buf *b, const char *text) {
  put(b, text, strlen(text));
}

void sw_buf_int(sw_buf *b, long long n) {
  char digits[24];
  int i = sizeof digits;
  unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
  do {
    digits[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (n < 0) digits[--i] = '-';
  put(b, digits + i, sizeof digits - (size_t)i);
}

void sw_buf_json_chars(sw_buf *b, const char *text) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
    char esc[8];
    switch (*p) {
      case '"': put(b, "\\\"", 2); break;
      case '\\': put(b, "\\\\", 2); break;
      case '\n': put(b, "\\n", 2); break;
      case '\r': put(b, "\\r", 2); break;
      case '\t': put(b, "\\t", 2); break;
      default:
        if (*p < 0x20) {
          const char *hexd = "0123456789abcdef";
          esc[0] = '\\', esc[1] = 'u', esc[2] = '0', esc[3] = '0';
          esc[4] = hexd[*p >> 4], esc[5] = hexd[*p & 15];
          put(b, esc, 6);
        } else {
          put(b, (const char *)p, 1);
        }
    }
  }
}

void sw_buf_json_string(sw_buf *b, const char *text) {
  put(b, "\"", 1);
  sw_buf_json_chars(b, text);
  put(b, "\"", 1);
}

static const char *ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* Past the JSON string at `p` (its opening quote), or NULL. */
static const char *skip_string(const char *p) {
  for (p++; *p; p++) {
    if (*p == '\\') {
      if (!*++p) return NULL;
    } else if (*p == '"') {
      return p + 1;
    }
  }
  return NULL;
}

/* Past the JSON value at `p`, or NULL. */
static const char *skip_value(const char *p) {
  p = ws(p);
  if (*p == '"') return skip_string(p);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (*p) {
      if (*p == '"') {
        p = skip_string(p);
        if (!p) return NULL;
        continue;
      }
      if (*p == '{' || *p == '[') depth++;
      if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
      p++;
    }
    return NULL;
  }
  const char *start = p;
  while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') p++;
  return p == start ? NULL : p;
}

/* Whether the JSON string at `p` equals `key` (escapes are not matched). */
static bool key_is(const char *p, const char *end, const char *key) {
  size_t n = strlen(key);
  return (size_t)(end - p) == n + 2 && memcmp(p + 1, key, n) == 0;
}

/* The value of top-level field `key` of the object `json`: [*start, *end). */
static bool field(const char *json, const char *key, const char **start, const char **end) {
  if (!json) return false;
  const char *p = ws(json);
  if (*p != '{') return false;
  p = ws(p + 1);
  while (*p == '"') {
    const char *k = p;
    p = skip_string(p);
    if (!p) return false;
    const char *kend = p;
    p = ws(p);
    if (*p != ':') return false;
    const char *v = ws(p + 1);
    p = skip_value(v);
    if (!p) return false;
    if (key_is(k, kend, key)) {
      *start = v;
      *end = p;
      return true;
    }
    p = ws(p);
    if (*p != ',') return false;
    p = ws(p + 1);
  }
  return false;
}

static int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static long hex4(const char *p) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hex(p[i]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

/* Writes code point `c` as UTF-8 to `out` (room for `left` bytes). */
static size_t utf8(unsigned long c, char *out, size_t left) {
  char b[4];
  size_t n;
  if (c < 0x80) {
    b[0] = (char)c, n = 1;
  } else if (c < 0x800) {
    b[0] = (char)(0xC0 | c >> 6), b[1] = (char)(0x80 | (c & 0x3F)), n = 2;
  } else if (c < 0x10000) {
    b[0] = (char)(0xE0 | c >> 12), b[1] = (char)(0x80 | (c >> 6 & 0x3F)), b[2] = (char)(0x80 | (c & 0x3F)), n = 3;
  } else {
    b[0] = (char)(0xF0 | c >> 18), b[1] = (char)(0x80 | (c >> 12 & 0x3F)), b[2] = (char)(0x80 | (c >> 6 & 0x3F)),
    b[3] = (char)(0x80 | (c & 0x3F)), n = 4;
  }
  if (n > left) return 0;
  memcpy(out, b, n);
  return n;
}

/* The JSON string [p, end) unescaped into `out` (room for `size` bytes with
 * the NUL): false if it is not a string, does not fit whole, or holds a NUL
 * (`\u0000`, which a C string cannot). Never cuts a character in half. */
static bool unescape(const char *p, const char *end, char *out, size_t size) {
  if (size == 0 || *p != '"') return false;
  size_t o = 0;
  for (p++; p < end - 1; p++) {
    unsigned long c = (unsigned char)*p;
    bool escaped = c == '\\';
    if (escaped) {
      p++;
      switch (*p) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u': {
          long u = hex4(p + 1);
          if (u < 0) return false;
          p += 4;
          if (u >= 0xD800 && u < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
            long lo = hex4(p + 3);
            if (lo >= 0xDC00 && lo < 0xE000) {
              u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
              p += 6;
            }
          }
          c = (unsigned long)u;
          break;
        }
        default: c = (unsigned char)*p;
      }
    }
    if (c == 0) return false;
    /* Raw bytes (UTF-8 already) are copied; an escape is encoded. */
    size_t n = (!escaped || c < 0x80) ? (o + 1 < size ? (out[o] = (char)c, 1) : 0) : utf8(c, out + o, size - 1 - o);
    if (n == 0) return false; /* it does not fit */
    o += n;
  }
  out[o] = 0;
  return true;
}

bool sw_var_string(const sw_input *in, const char *key, char *out, size_t size) {
  const char *s, *e;
  return field(in->vars, key, &s, &e) && unescape(s, e, out, size);
}

char *sw_var_str(const sw_input *in, const char *key) {
  const char *s, *e;
  if (!field(in->vars, key, &s, &e) || *s != '"') return NULL;
  /* Unescaping never lengthens: the JSON text's length is room enough. */
  size_t size = (size_t)(e - s) + 1;
  char *out = malloc(size);
  if (!out) abort();
  if (!unescape(s, e, out, size)) {
    free(out);
    return NULL;
  }
  return out;
}

static bool number_in(const char *json, const char *key, double *out) {
  const char *s, *e;
  if (!field(json, key, &s, &e) || !(*s == '-' || (*s >= '0' && *s <= '9'))) return false;
  char text[64];
  size_t n = (size_t)(e - s) < sizeof text - 1 ? (size_t)(e - s) : sizeof text - 1;
  memcpy(text, s, n);
  text[n] = 0;
  *out = strtod(text, NULL);
  return true;
}

bool sw_var_number(const sw_input *in, const char *key, double *out) {
  return number_in(in->vars, key, out);
}

bool sw_config_number(const sw_input *in, const char *key, double *out) {
  return number_in(in->config, key, out);
}

bool sw_config_bool(const sw_input *in, const char *key, bool *out) {
  const char *s, *e;
  if (!field(in->config, key, &s, &e)) return false;
  if (e - s == 4 && memcmp(s, "true", 4) == 0) {
    *out = true;
    return true;
  }
  if (e - s == 5 && memcmp(s, "false", 5) == 0) {
    *out = false;
    return true;
  }
  return false;
}

char *sw_var_json(const sw_input *in, const char *key) {
  const char *s, *e;
  if (!field(in->vars, key, &s, &e)) return NULL;
  char *copy = malloc((size_t)(e - s) + 1);
  if (!copy) abort();
  memcpy(copy, s, (size_t)(e - s));
  copy[e - s] = 0;
  return copy;
}

void sw_now_rfc3339(const sw_input *in, char out[32]) {
  /* Days since the epoch to a civil date (Howard Hinnant's civil_from_days). */
  uint64_t days = in->now_seconds / 86400, secs = in->now_seconds % 86400;
  uint64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
  uint64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  uint64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
  uint64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
  uint64_t year = yoe + era * 400 + (month <= 2);
  uint64_t parts[7] = {year, month, day, secs / 3600, secs / 60 % 60, secs % 60, in->now_nanoseconds / 1000};
  int widths[7] = {4, 2, 2, 2, 2, 2, 6};
  const char *after = "--T::.Z";
  char *o = out;
  for (int i = 0; i < 7; i++) {
    uint64_t v = parts[i];
    for (int w = widths[i] - 1; w >= 0; w--) {
      o[w] = (char)('0' + v % 10);
      v /= 10;
    }
    o += widths[i];
    *o++ = after[i];
  }
  *o = 0;
}
