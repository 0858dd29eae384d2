#!/bin/bash
# The shared-memory transport on 2, 3 and 4 forked processes (see mp_shm.c
# for what each run checks: exchanges at many sizes with and without
# single copy, the no-CMA fallback, early messages, cancel, the shared
# arena, length mismatch, a killed peer, nothing left in /dev/shm), then
# large messages through the cells with the whole library.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_shm
if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    echo "SKIP: /dev/shm is not writable here"
    exit 77
fi
for n in 2 3 4; do
    out=$(timeout 300 "$prog" "$n" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "shm transport on $n ranks: $(echo "$out" | grep 'mp_shm on')"
    else bad "shm transport on $n ranks: exit $rc"; echo "$out" | tail -30; fi
    # The figures the benchmarks compare against (noisy on small machines).
    echo "$out" | grep '^timing' | sed 's/^/     /'
done
# Through the library: 64 MiB exchanges streamed through the cells (no
# single copy), each side sending before the other posts its receive, so
# most arrive early.  A wait that napped on the sockets while the FIFO
# moved left it full for a nap at a time (151 ms an exchange), and each
# early message took a fresh buffer to fault in (160 ms on a VM); now
# about 10 ms.  The napping wait cost that every exchange, so the limit
# sits well under that but far above a quiet host: 100 ms for
# a plain build (CI's distcheck once took 70 ms on both of two tries
# while its host was busy), 130 ms for a sanitized one (whose copies are
# checked: 66 ms once in CI's ASan build); three tries, for a host whose
# other work takes the cores for a while, where the napping wait would
# miss all three.
limit=100000
[ "${LOOM_TEST_SANITIZERS:-no}" = yes ] && limit=130000
for try in 1 2 3; do
    out=$(LOOM_SHM_CMA=0 timeout 120 "$LOOMRUN" -n 2 --timeout 110 "$BUILDDIR/sendrecv_perf" \
        -b 64M -e 64M -n 6 -w 2 -c 1 2>&1)
    rc=$?
    us=$(awk '!/^#/ && NF >= 13 && $9 == 0 && $13 == 0 {print int($6); exit}' <<<"$out")
    [ $rc -eq 0 ] && [ -n "$us" ] && [ "$us" -lt $limit ] && break
done
if [ $rc -eq 0 ] && [ -n "$us" ] && [ "$us" -lt $limit ]; then
    ok "64 MiB through the cells, early: $us us an exchange"
else
    bad "64 MiB through the cells, early: exit $rc, ${us:-no} us (limit $limit)"
    echo "$out" | tail -8
fi
# More ranks than cores: messages that fit a FIFO go through the cells
# (mp_shm's "crowded" job checks the path itself); through the library,
# the ring's allreduce stays right, and a set LOOM_SHM_CMA is kept.
n=$(($(nproc) + 1))
if [ "$n" -le 8 ]; then
    for cma in "" 128K; do
        out=$(LOOM_SHM_CMA=$cma LOOM_DEBUG=info LOOM_ALGO=allreduce:ring timeout 120 "$LOOMRUN" \
            -n $n --timeout 110 "$BUILDDIR/all_reduce_perf" -b 256K -e 4M -f 4 -n 5 -w 1 -c 1 2>&1)
        rc=$?
        right=$(awk '!/^#/ && NF >= 13 && $9 == 0 && $13 == 0' <<<"$out" | wc -l)
        said=$(grep -c "ranks share this machine's .* cores: shared-memory messages that fit a FIFO go through its cells" <<<"$out")
        want=$n
        [ -n "$cma" ] && want=0
        check "$n ranks on $(nproc) CPUs, LOOM_SHM_CMA ${cma:-unset}: cells up to a FIFO on $said of $n ranks (want $want), 3 of 3 ring allreduces right ($right)" \
            [ $rc -eq 0 -a "$right" = 3 -a "$said" = "$want" ]
    done
else
    echo "skip - more ranks than cores: $(nproc) CPUs would need more than 8 ranks"
fi
finish
