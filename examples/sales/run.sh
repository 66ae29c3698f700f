#!/bin/sh
# run.sh - the demo: generate the workbook, analyse it inside a runcell sandbox, and copy the
# chart out. usage: examples/sales/run.sh [RUNCELL_BINARY]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
runcell=${1:-runcell}
out="$here/out"
mkdir -p "$out"

/usr/bin/python3 "$here/make_workbook.py" "$out/sales.xlsx"
echo "--- running analysis.py in a sandbox (no network, 1 GiB memory, 60 s) ---"
"$runcell" run --file "$out/sales.xlsx:sales.xlsx" --out "$out" "$here/analysis.py"
echo "---"
echo "chart: $out/monthly_trend.png"
