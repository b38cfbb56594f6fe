/* Shared internals: error reporting and small helpers. */
#ifndef EI_COMMON_H
#define EI_COMMON_H
#include "edgeinfer.h"

/* Records a message for ei_last_error() and returns the status, so callers can
 * write `return ei_fail(EI_ERR_INVALID_ARG, "n=%d", n);`. */
ei_status ei_fail(ei_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define EI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EI_MAX(a, b) ((a) > (b) ? (a) : (b))
#endif
