/* Inside the allocator, every floor (see space.h): what its top, the entry points (alloc.c,
 * stats.c), sees. Private to allocator/ and its tests. */
#ifndef PSSHIM_ALLOCATOR_INTERNAL_H
#define PSSHIM_ALLOCATOR_INTERNAL_H

#include "allocator/sharing.h"

#endif
