/* select.c - placeholder */
#include "topo/select.h"
