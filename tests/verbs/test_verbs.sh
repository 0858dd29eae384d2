#!/bin/bash
# make check: the verbs transport against the real soft-RoCE driver, in a
# small VM (run_in_vm.sh boots it, vm_suite.sh runs inside).  Exit 77
# (skipped, not passed) where qemu, busybox, the rxe provider or a kernel
# package cannot be had.  LOOM_TEST_QUICK=1 runs the quick suite.
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILDDIR:=$(cd "$here/../.." && pwd)}"
export BUILDDIR
# LOOM_TEST_VM=0: not here (CI runs the full VM suite in the plain build
# and the quick one in the sanitizer build, not again in distcheck).
if [ "${LOOM_TEST_VM:-1}" = 0 ]; then
    echo "LOOM_TEST_VM=0: verbs VM suite skipped"
    exit 77
fi
[ -n "${LOOM_TEST_QUICK:-}" ] && export LOOM_VM_QUICK=1
"$here/run_in_vm.sh" -t "${LOOM_VM_TIMEOUT:-1500}"
rc=$?
case $rc in
0) echo "verbs suite in the VM: passed" ;;
77) echo "verbs suite in the VM: skipped" ;;
*) echo "verbs suite in the VM: failed (exit $rc)" ;;
esac
exit $rc
