#include <criterion/criterion.h>
Test(model, placeholder) { cr_assert(1); }
