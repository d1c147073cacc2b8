/* The decision on a refused 16-bit convolution, per reason (see refusal.h). */
#include <string.h>

#include "device/refusal.h"

static const char *const names[MGT_LP_REFUSAL_COUNT] = {
    [MGT_LP_REFUSAL_NONE] = "none",           [MGT_LP_REFUSAL_NO_KERNEL] = "no_kernel",
    [MGT_LP_REFUSAL_BAD_PARAM] = "bad_param", [MGT_LP_REFUSAL_NO_MEMORY] = "no_memory",
    [MGT_LP_REFUSAL_BROKEN] = "broken",       [MGT_LP_REFUSAL_FAULT] = "fault",
};

mgt_lp_action mgt_lp_refusal_action(mgt_lp_refusal why)
{
    switch (why) {
    /* The shape has no 16-bit kernel here, and will not have one on the next call: asking
       again costs a failed search per call. */
    case MGT_LP_REFUSAL_NO_KERNEL:
    case MGT_LP_REFUSAL_BAD_PARAM: return MGT_LP_FP32_REMEMBER;
    /* Memory may be there next time (a workspace cut short by another replica's). */
    case MGT_LP_REFUSAL_NO_MEMORY: return MGT_LP_FP32_ONCE;
    /* A broken installation or a failed device would fail the fp32 path too, or hide a
       fault behind slower arithmetic: say so. */
    case MGT_LP_REFUSAL_NONE:
    case MGT_LP_REFUSAL_BROKEN:
    case MGT_LP_REFUSAL_FAULT:
    case MGT_LP_REFUSAL_COUNT: break;
    }
    return MGT_LP_FAIL;
}

const char *mgt_lp_refusal_name(mgt_lp_refusal why)
{
    return (unsigned)why < MGT_LP_REFUSAL_COUNT ? names[why] : "unknown";
}

mgt_lp_refusal mgt_lp_refusal_from_name(const char *name, unsigned long len)
{
    for (int r = MGT_LP_REFUSAL_NO_KERNEL; r < MGT_LP_REFUSAL_COUNT; r++)
        if (strlen(names[r]) == len && strncmp(name, names[r], len) == 0)
            return (mgt_lp_refusal)r;
    return MGT_LP_REFUSAL_COUNT;
}
