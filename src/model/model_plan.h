/* model_plan.h — what the planner needs to know of a model: its shapes and, from its
 * quantization config, the weight format of each group. The planner takes these (struct
 * plan_shapes, struct plan_weights), never a model description, so plan/ stays below model/.
 *
 * defines: model_plan_shapes(), model_plan_weights()
 */
#ifndef MOESERVE_MODEL_MODEL_PLAN_H
#define MOESERVE_MODEL_MODEL_PLAN_H

#include "base/status.h"
#include "format/quant_config.h"
#include "model/model_desc.h"
#include "plan/plan.h"

/* s from d; source names the model (a directory) in the plan, or NULL. STATUS_INVALID when d
 * lacks what a plan needs (heads, widths, the experts' sizes, MLA dims). */
enum status model_plan_shapes(const struct model_desc *d, const char *source, struct plan_shapes *s,
                              struct err *err);
/* What a checkpoint's quantization config promises for each group (d picks the module names). */
void model_plan_weights(const struct model_desc *d, const struct quant_config *q, struct plan_weights *w);

#endif
