/* The stepwell `hello` node, written in C: greets `vars.name` (or "World")
 * by completing the run with
 * `{"message": "Hello, <name>!", "language": "c"}`.
 *
 * Built into flows/examples/hello-c/greet.wasm by scripts/build-c-guest. */
#include <stdlib.h>

#include "stepwell.h"

STEPWELL_DESCRIBE("{\"description\":\"Greets vars.name.\","
                  "\"vars\":{\"name\":\"who to greet (text, default World)\"}}")

static void greet(const sw_input *in, sw_plan *plan) {
  char *name = sw_var_str(in, "name");
  sw_buf out = sw_buf_new();
  sw_buf_add(&out, "{\"message\":\"Hello, ");
  sw_buf_json_chars(&out, name ? name : "World");
  sw_buf_add(&out, "!\",\"language\":\"c\"}");
  sw_complete(plan, &out);
  free(name);
}

STEPWELL_NODE(greet)
