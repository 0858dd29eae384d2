/* model.c - placeholder, being written. */
#include "core/internal.h"
typedef int loomi_placeholder_model;
