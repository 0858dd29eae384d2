/* probe.c - placeholder */
#include "topo/select.h"
