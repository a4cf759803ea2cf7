#!/usr/bin/env bash
# compute-sanitizer racecheck over every variant of tests/sanitize/racecheck_probe.py (the minimal FP8
# promotion kernels and the real dense/decode GEMMs), one sanitizer process per variant.
#
#   tests/sanitize/racecheck.sh [VARIANT ...]        (default: every variant; run from anywhere)
#
# Environment: SANITIZER (default compute-sanitizer), PY (default python3), SANITIZER_ARGS (extra
# sanitizer options, e.g. "--print-limit 0"), LOG_DIR (full logs, default racecheck-logs).
# Prints one line per variant: the sanitizer's exit status; the error and warning counts of its
# "RACECHECK SUMMARY" line (all hazards) and how many hazards it printed (--print-limit, default 100);
# of the printed ones: the kinds (WAW/WAR/RAW), how many it calls invalid memcpy_async (LDGSTS)
# synchronisation, how many wrote the value already there (Current Value == Incoming Value), and the
# most frequent access sites as kernel offset:file:line (match the offsets with
# `racecheck_probe.py --sass VARIANT [--symbol KERNEL]`); last, the probe's own check against float64.
set -u
cd "$(dirname "$0")/../.." || exit 2
SANITIZER="${SANITIZER:-compute-sanitizer}"
PY="${PY:-python3}"
LOG_DIR="${LOG_DIR:-racecheck-logs}"
PROBE=tests/sanitize/racecheck_probe.py
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export TILEGEMM_PRINT_CONFIGS=1 TILEGEMM_DISABLE_FALLBACK=1
mkdir -p "$LOG_DIR"

if [ "$#" -gt 0 ]; then
    variants="$*"
else
    variants="$("$PY" "$PROBE" --list)" || exit 2
fi

status=0
for v in $variants; do
    log="$LOG_DIR/$v.log"
    # shellcheck disable=SC2086  # SANITIZER_ARGS is a list of options
    "$SANITIZER" --tool racecheck --racecheck-report hazard ${SANITIZER_ARGS:-} "$PY" "$PROBE" "$v" >"$log" 2>&1
    rc=$?
    counts=$(sed -nE 's/.*RACECHECK SUMMARY: ([0-9]+) hazards? displayed \(([0-9]+) errors?, ([0-9]+) warnings?\).*/\1 \2 \3/p' "$log" | tail -n 1)
    read -r shown errors warnings <<<"${counts:-? ? ?}"
    kinds=$(grep -oE 'Potential (WAW|WAR|RAW) hazard' "$log" | awk '{n[$2]++} END {for (k in n) printf "%s%s=%d", s++ ? "," : "", k, n[k]}')
    async=$(grep -c 'memcpy_async' "$log")
    same=$(grep -oE 'Current Value : [^,]+, Incoming Value : [^ ]+' "$log" | awk '{sub(/,$/, "", $4)} $4 == $8 {s++} END {print s + 0}')
    sites=$(sed -nE 's/.*(Read|Write) Thread .* at .*\+(0x[0-9a-f]+) in ([^ ]+).*/\1@\2:\3/p' "$log" | sort | uniq -c | sort -rn | head -n 3 | awk '{printf "%s%s(x%s)", s++ ? "," : "", $2, $1}')
    check=$(grep -oE 'calc_diff vs float64 [^ ]+ \((ok|WRONG)' "$log" | tail -n 1 | sed -E 's/.* \(//')
    printf '%-18s rc=%-3s errors=%-6s warnings=%-4s shown=%-4s shown_kinds=%-9s memcpy_async=%-4s same_value=%-4s check=%-5s sites=%s\n' \
        "$v" "$rc" "$errors" "$warnings" "$shown" "${kinds:--}" "$async" "$same" "${check:-none}" "${sites:--}"
    [ "$rc" -eq 0 ] && [ "${check:-}" = ok ] || status=1
done
echo "full logs: $LOG_DIR/VARIANT.log"
exit "$status"
