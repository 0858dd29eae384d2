#!/bin/bash
# plot.sh - plot the CSVs of diloco runs with gnuplot: eval loss against
# inner steps (left) and against the bytes each rank sent (right, log
# scale), one line per CSV, titled by its mode and codec column.
#
#   plot.sh OUT.png RUN.csv...
set -eu
[ $# -ge 2 ] || { sed -n '2,6p' "$0"; exit 2; }
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found" >&2; exit 2; }
png=$1; shift
left= right=
for f in "$@"; do
    [ -f "$f" ] || { echo "plot.sh: $f: no such file" >&2; exit 2; }
    # The title: mode and codec of the first data row.
    t=$(awk -F, 'NR == 2 { print ($6 == "ddp" && $7 == "none") ? "ddp" : $6 " " $7; exit }' "$f")
    f=${f//\'/\'\'} t=${t//\'/\'\'}
    left+="${left:+, }'$f' using 1:4 with linespoints title '$t'"
    # Rows with no bytes yet cannot go on a log scale.
    right+="${right:+, }'$f' using (\$5 > 0 ? \$5 : 1/0):4 with linespoints title '$t'"
done
gnuplot <<EOF
set terminal pngcairo size 1400,560 noenhanced
set output '${png//\'/\'\'}'
set datafile separator ','
set key autotitle columnhead
set grid
set multiplot layout 1,2 title 'DiLoCo against data-parallel training: eval loss'
set xlabel 'inner steps'
set ylabel 'eval loss'
plot $left
set xlabel 'bytes sent per rank'
set logscale x
set format x '%.0s %cB'
plot $right
unset multiplot
EOF
