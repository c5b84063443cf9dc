/* The C SDK's side of the `node` world's export: the host's input as C
 * strings, the handler's plan as the WIT step-plan (wit-bindgen's types,
 * target/c-bindings/node.h). */
#include <stdlib.h>
#include <string.h>

#include "node.h"
#include "stepwell.h"

struct sw_plan {
  node_step_plan_t *ret;
  node_node_error_t *err;
  bool failed;
};

/* A NUL-terminated copy of `s`. */
static char *cstr(const node_string_t *s) {
  char *out = malloc(s->len + 1);
  if (!out) abort();
  memcpy(out, s->ptr, s->len);
  out[s->len] = 0;
  return out;
}

/* Moves `b`'s text into `out` (the host frees it after the call). */
static void take(node_string_t *out, const sw_buf *b) {
  if (b->ptr) {
    out->ptr = (uint8_t *)b->ptr;
    out->len = b->len;
  } else {
    node_string_dup(out, "");
  }
}

void sw_complete(sw_plan *plan, const sw_buf *output) {
  plan->ret->complete_output.is_some = true;
  take(&plan->ret->complete_output.val, output);
}

void sw_goto(sw_plan *plan, const char *node) {
  plan->ret->next_node.is_some = true;
  node_string_dup(&plan->ret->next_node.val, node);
}

void sw_set_vars(sw_plan *plan, const sw_buf *object) {
  plan->ret->vars.is_some = true;
  take(&plan->ret->vars.val, object);
}

void sw_effect(sw_plan *plan, const char *kind, const sw_buf *payload, const char *result_key) {
  stepwell_flow_types_effect_t *e = &plan->ret->effect.val;
  plan->ret->effect.is_some = true;
  node_string_dup(&e->kind, kind);
  take(&e->payload, payload);
  e->result_key.is_some = result_key != NULL;
  if (result_key) node_string_dup(&e->result_key.val, result_key);
}

static void fail(sw_plan *plan, uint8_t tag, const char *message) {
  plan->failed = true;
  plan->err->tag = tag;
  node_string_dup(tag == STEPWELL_FLOW_TYPES_NODE_ERROR_INVALID_INPUT ? &plan->err->val.invalid_input
                                                                     : &plan->err->val.failed,
                  message);
}

void sw_invalid_input(sw_plan *plan, const char *message) {
  fail(plan, STEPWELL_FLOW_TYPES_NODE_ERROR_INVALID_INPUT, message);
}

void sw_failed(sw_plan *plan, const char *message) {
  fail(plan, STEPWELL_FLOW_TYPES_NODE_ERROR_FAILED, message);
}

bool exports_node_handle(node_node_input_t *input, node_step_plan_t *ret, node_node_error_t *err) {
  memset(ret, 0, sizeof *ret);
  char *run_id = cstr(&input->run_id), *workflow_id = cstr(&input->workflow_id);
  char *node_id = cstr(&input->node_id), *vars = cstr(&input->vars);
  char *config = input->config.is_some ? cstr(&input->config.val) : NULL;
  sw_input in = {run_id, workflow_id, node_id, config, vars, input->now.seconds, input->now.nanoseconds,
                 input->attempt};
  node_node_input_free(input);
  struct sw_plan plan = {ret, err, false};
  sw_node_handler(&in, &plan);
  if (plan.failed) {
    /* Whatever the plan held before the failure goes. */
    node_step_plan_free(ret);
  }
  free(run_id), free(workflow_id), free(node_id), free(vars), free(config);
  return !plan.failed;
}
