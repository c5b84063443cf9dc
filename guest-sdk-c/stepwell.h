/*
 * stepwell's C guest SDK: write a node handler as one function from an
 * input to a plan, over the bindings wit-bindgen generates for the `node`
 * world (scripts/build-c-guest makes them and builds the component).
 *
 *     #include <string.h>
 *
 *     #include "stepwell.h"
 *
 *     static void greet(const sw_input *in, sw_plan *plan) {
 *         char name[64];
 *         if (!sw_var_string(in, "name", name, sizeof name)) strcpy(name, "World");
 *         sw_buf out = sw_buf_new();
 *         sw_buf_add(&out, "{\"message\":\"Hello, ");
 *         sw_buf_json_chars(&out, name);
 *         sw_buf_add(&out, "!\"}");
 *         sw_complete(plan, &out);
 *     }
 *
 *     STEPWELL_NODE(greet)
 *
 * JSON crosses the boundary as text: the SDK reads top-level fields of the
 * vars and config, and builds text with `sw_buf`; the host parses and
 * checks everything a node returns. Memory comes from wasi-libc's malloc,
 * within the host's memory limit. A buffer handed to the plan (sw_complete,
 * sw_set_vars, sw_effect) is the host's: the call empties it, and the host
 * frees the text after the call. Free (`free(b.ptr)`) a buffer you do not
 * hand over, and what sw_var_json and sw_var_str return: the host may call
 * the node again on the same instance.
 *
 * The SDK uses no stdio (printf would make the module import WASI's file
 * calls, which the component then needs an adapter for): build text with
 * sw_buf_add, sw_buf_int and the JSON escapers.
 */
#ifndef STEPWELL_H
#define STEPWELL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the host passes for one step of a run (NUL-terminated copies). */
typedef struct {
  const char *run_id;
  const char *workflow_id;
  const char *node_id;
  /* The node's config as JSON text, or NULL when it has none. */
  const char *config;
  /* The run's vars: a JSON object, as text. */
  const char *vars;
  /* The current time (UTC), chosen by the host. */
  uint64_t now_seconds;
  uint32_t now_nanoseconds;
  /* 1 for the first attempt of this step. */
  uint32_t attempt;
} sw_input;

/* A growing text buffer (JSON being written). */
typedef struct {
  char *ptr;
  size_t len;
  size_t cap;
} sw_buf;

/* What the handler decides (fill it with the sw_* calls below). */
typedef struct sw_plan sw_plan;

/* An empty buffer. */
sw_buf sw_buf_new(void);
/* Appends `text` as it is (JSON punctuation, keys you know are plain). */
void sw_buf_add(sw_buf *b, const char *text);
/* Appends `n` in decimal. */
void sw_buf_int(sw_buf *b, long long n);
/* Appends `text` as a JSON string (quoted and escaped). */
void sw_buf_json_string(sw_buf *b, const char *text);
/* Appends `text` escaped for the inside of a JSON string (no quotes). */
void sw_buf_json_chars(sw_buf *b, const char *text);

/* Top-level field `key` of the vars as a string: copies it, unescaped to
 * UTF-8 and NUL-terminated, to `out` and returns true if it is one and fits
 * whole in `size` bytes (false, and `out` unspecified, if it is longer or
 * holds a NUL, `\u0000`, which a C string cannot). */
bool sw_var_string(const sw_input *in, const char *key, char *out, size_t size);
/* The same as a copy of any length (to `free`), or NULL if it is not a
 * string or holds a NUL. */
char *sw_var_str(const sw_input *in, const char *key);
/* Top-level field `key` of the vars as a number: true if it is one. */
bool sw_var_number(const sw_input *in, const char *key, double *out);
/* Top-level field `key` of the config as a number: true if it is one. */
bool sw_config_number(const sw_input *in, const char *key, double *out);
/* Top-level field `key` of the config as a boolean: true if it is one. */
bool sw_config_bool(const sw_input *in, const char *key, bool *out);
/* The JSON text of top-level field `key` of the vars (a copy, NUL-terminated),
 * or NULL if there is none. */
char *sw_var_json(const sw_input *in, const char *key);
/* The time as RFC 3339 with microseconds (`2026-12-06T10:00:00.123456Z`);
 * `out` holds at least 32 bytes. */
void sw_now_rfc3339(const sw_input *in, char out[32]);

/* The plan's setters below that take an `sw_buf` take its text over: the
 * buffer is emptied (the host frees the text after the call). Setting a
 * field again replaces what it held. */

/* Finishes the run with `output` (JSON text). */
void sw_complete(sw_plan *plan, sw_buf *output);
/* Goes to `node` next (a node id or a route label of this node); NULL
 * follows the node's `next` again. */
void sw_goto(sw_plan *plan, const char *node);
/* Sets the vars patch (a JSON object: each key replaces the run's). */
void sw_set_vars(sw_plan *plan, sw_buf *object);
/* Asks for effect `kind` with `payload` (a JSON object), its result written
 * to `result_key` (NULL: none). */
void sw_effect(sw_plan *plan, const char *kind, sw_buf *payload, const char *result_key);
/* Refuses the input: `node_invalid_input` (retrying will not help). */
void sw_invalid_input(sw_plan *plan, const char *message);
/* Fails the step: `node_failed`. */
void sw_failed(sw_plan *plan, const char *message);

/* The handler STEPWELL_NODE names (the SDK's export calls it). */
void sw_node_handler(const sw_input *in, sw_plan *plan);

/* Makes `handler` this component's node handler. Use it once. */
#define STEPWELL_NODE(handler)                                   \
  void sw_node_handler(const sw_input *in, sw_plan *plan) {      \
    handler(in, plan);                                           \
  }

/* Declares what this node expects, for `stepwell inspect` and for flow
 * loading: one JSON object as a string literal (or adjacent literals, or a
 * macro that expands to them) with keys, all optional: "description",
 * "vars" and "config" (name -> what it holds), "routes" (the route labels
 * the node may return). It becomes the component's `stepwell:node` custom
 * section: the assembler makes a custom section of a `.custom_section.NAME`
 * section (a C `section` attribute would make a data segment). The
 * assembler reads the literal, so write non-ASCII text as UTF-8 and use no
 * escape but \" and \\ (no \u, no \n). Use it once, at file scope: a
 * second use is a duplicate symbol. scripts/build-c-guest checks what the
 * component declares as the host will read it.
 *
 *     STEPWELL_DESCRIBE("{\"vars\":{\"name\":\"who to greet\"}}")
 */
#define STEPWELL_DESCRIBE(json) SW_DESCRIBE_TEXT_(json)
#define SW_DESCRIBE_TEXT_(json)                                                 \
  __asm__(".section \".custom_section.stepwell:node\",\"\",@\n.ascii " #json \
          "\n.text\n");                                                         \
  const int sw_node_described_once = 1;

#endif
