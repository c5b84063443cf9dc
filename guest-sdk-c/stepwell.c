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

/* Moves `b`'s text into `out`, freeing what `out` held when `had` (a
 * field set twice), and empties `b`: the host frees the text after the
 * call, so the caller can no longer touch it. */
static void take(node_string_t *out, bool had, sw_buf *b) {
  if (had) node_string_free(out);
  if (!b) {
    node_string_dup(out, "");
    return;
  }
  if (b->ptr && b->len > 0) {
    out->ptr = (uint8_t *)b->ptr;
    out->len = b->len;
  } else {
    /* An empty text has no block the host would free: free it here. */
    free(b->ptr);
    node_string_dup(out, "");
  }
  *b = sw_buf_new();
}

/* Sets `out` to a copy of `text` ("" for NULL), freeing what it held when `had`. */
static void set_text(node_string_t *out, bool had, const char *text) {
  if (had) node_string_free(out);
  node_string_dup(out, text ? text : "");
}

void sw_complete(sw_plan *plan, sw_buf *output) {
  take(&plan->ret->complete_output.val, plan->ret->complete_output.is_some, output);
  plan->ret->complete_output.is_some = true;
}

void sw_goto(sw_plan *plan, const char *node) {
  if (plan->ret->next_node.is_some) node_string_free(&plan->ret->next_node.val);
  plan->ret->next_node.is_some = node != NULL;
  if (node) node_string_dup(&plan->ret->next_node.val, node);
}

void sw_set_vars(sw_plan *plan, sw_buf *object) {
  take(&plan->ret->vars.val, plan->ret->vars.is_some, object);
  plan->ret->vars.is_some = true;
}

void sw_effect(sw_plan *plan, const char *kind, sw_buf *payload, const char *result_key) {
  stepwell_flow_types_effect_t *e = &plan->ret->effect.val;
  bool had = plan->ret->effect.is_some;
  if (had && e->result_key.is_some) node_string_free(&e->result_key.val);
  set_text(&e->kind, had, kind);
  take(&e->payload, had, payload);
  e->result_key.is_some = result_key != NULL;
  if (result_key) node_string_dup(&e->result_key.val, result_key);
  plan->ret->effect.is_some = true;
}

static void fail(sw_plan *plan, uint8_t tag, const char *message) {
  /* Both variants hold one string at the same place: a second failure
   * replaces the first's message. */
  bool had = plan->failed;
  plan->failed = true;
  plan->err->tag = tag;
  set_text(tag == STEPWELL_FLOW_TYPES_NODE_ERROR_INVALID_INPUT ? &plan->err->val.invalid_input
                                                               : &plan->err->val.failed,
           had, message);
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
