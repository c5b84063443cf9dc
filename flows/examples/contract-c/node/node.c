/* A C node for the contract's behaviours: what it does is chosen by
 * `vars.mode` (tests/cli.rs runs each and checks the host's typed outcome),
 * as flows/examples/contract-js does in JavaScript. */
#include <stdlib.h>
#include <string.h>

#include "stepwell.h"

static sw_buf text(const char *s) {
  sw_buf b = sw_buf_new();
  sw_buf_add(&b, s);
  return b;
}

static void act(const sw_input *in, sw_plan *plan) {
  char mode[32];
  if (!sw_var_string(in, "mode", mode, sizeof mode)) mode[0] = 0;
  char *value = sw_var_json(in, "value");
  if (strcmp(mode, "complete") == 0) {
    char now[32];
    sw_now_rfc3339(in, now);
    sw_buf out = text("{\"echo\":");
    sw_buf_add(&out, value ? value : "null");
    sw_buf_add(&out, ",\"node\":");
    sw_buf_json_string(&out, in->node_id);
    sw_buf_add(&out, ",\"attempt\":");
    sw_buf_int(&out, in->attempt);
    sw_buf_add(&out, ",\"now\":");
    sw_buf_json_string(&out, now);
    sw_buf_add(&out, "}");
    sw_complete(plan, &out);
  } else if (strcmp(mode, "next") == 0) {
    sw_buf vars = text("{\"seen\":");
    sw_buf_add(&vars, value ? value : "true");
    sw_buf_add(&vars, "}");
    sw_set_vars(plan, &vars);
    sw_goto(plan, "end");
  } else if (strcmp(mode, "follow") == 0) {
    sw_buf vars = text("{\"seen\":\"followed\"}");
    sw_set_vars(plan, &vars);
  } else if (strcmp(mode, "ask") == 0) {
    sw_buf payload = text("{\"prompt\":\"Your name?\"}");
    sw_effect(plan, "ask_user", &payload, "answer");
  } else if (strcmp(mode, "wait") == 0) {
    sw_buf payload = text("{\"seconds\":60}");
    sw_effect(plan, "wait_until", &payload, NULL);
  } else if (strcmp(mode, "invalid") == 0) {
    sw_invalid_input(plan, "mode invalid: asked to refuse");
  } else if (strcmp(mode, "throw") == 0) {
    sw_failed(plan, "boom");
  } else if (strcmp(mode, "trap") == 0) {
    __builtin_trap();
  } else if (strcmp(mode, "spin") == 0) {
    for (volatile int i = 0;; i++) {
    }
  } else if (strcmp(mode, "oom") == 0) {
    for (;;) {
      char *block = malloc(16 << 20);
      if (!block) {
        sw_failed(plan, "out of memory");
        break;
      }
      /* Growing is what the host limits: touching one byte keeps it. */
      *(volatile char *)block = 1;
    }
  } else if (strcmp(mode, "bad") == 0) {
    sw_buf vars = text("{\"_runtime\":{}}");
    sw_set_vars(plan, &vars);
  } else {
    sw_invalid_input(plan, "unknown mode");
  }
  free(value);
}

STEPWELL_NODE(act)
