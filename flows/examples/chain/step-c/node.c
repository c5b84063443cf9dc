/* One link of the benchmark's chain, written in C: counts the step in
 * `vars.i` and follows the node's `next` route; a node whose config says
 * `{"last": true}` completes the run with `{"steps": i}`. The same node as
 * flows/examples/chain/step (Rust), step-js and step-py.
 *
 * Built into flows/examples/chain/step-c.wasm by scripts/build-c-guest. */
#include "stepwell.h"

STEPWELL_DESCRIBE("{\"description\":\"One link of a chain: counts itself in vars.i.\","
                  "\"vars\":{\"i\":\"the steps taken so far (a number, default 0)\"},"
                  "\"config\":{\"last\":\"true on the chain's last node: complete the run\"}}")

static void step(const sw_input *in, sw_plan *plan) {
  /* vars.i when it is a whole number from 0 to 2^53, else 0 (as the others). */
  double i = 0;
  if (!sw_var_number(in, "i", &i) || !(i >= 0 && i <= 9007199254740991.0) || i != (double)(long long)i) i = 0;
  bool last = false;
  sw_config_bool(in, "last", &last);
  sw_buf out = sw_buf_new();
  sw_buf_add(&out, last ? "{\"steps\":" : "{\"i\":");
  sw_buf_int(&out, (long long)i + 1);
  sw_buf_add(&out, "}");
  if (last) {
    sw_complete(plan, &out);
  } else {
    sw_set_vars(plan, &out);
  }
}

STEPWELL_NODE(step)
