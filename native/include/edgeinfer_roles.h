/* Tensor roles: where each weight of a model goes, shared by the CPU runtime
 * (native/src) and the CUDA backend (native/cuda). Global roles take layer = -1.
 * The list is edgeinfer_layout.def; cffi cannot expand it, so edgeinfer/backends/cdefs.py
 * writes this enum's declaration for cffi from the same file.
 */
#ifndef EDGEINFER_ROLES_H
#define EDGEINFER_ROLES_H

typedef enum {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence) EI_T_##NAME = id,
#include "edgeinfer_layout.def"
#undef EI_ROLE
} ei_tensor_role;

#endif
