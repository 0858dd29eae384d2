/* select.h - link parameters and algorithm selection (placeholder). */
#ifndef LOOMI_SELECT_H
#define LOOMI_SELECT_H
#endif
