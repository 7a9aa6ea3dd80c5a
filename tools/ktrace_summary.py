#!/usr/bin/env python3
"""ktrace_summary.py — reads the per-block phase records of a -DMOESERVE_KERNEL_TRACE=ON build
(written at exit to $MOESERVE_TRACE_OUT, see src/backend/cuda/common/cuda_ktrace.cuh) and prints

  1. per kernel: blocks recorded, launches, the median launch span in the graph (first block's
     start to last block's end, globaltimer ns) and the median cycles of each phase of a block
     (mark i-1 -> mark i; phase 0 starts at the kernel's first instruction);
  2. a timeline of the last LAUNCHES launches (all kernels, by start): start offset, span, the
     overlap with / gap after the launch before it, and what the launch adds to the critical
     path (its end minus the latest end before it: the column sums to the timeline's end to end,
     so a layer's "adds" are where its time goes with PDL overlap counted once).

    python3 tools/ktrace_summary.py TRACE_FILE [LAUNCHES]

A mark is where thread 0 of a block reached it: a load's wait shows in the phase where its
value is first used, not where it was issued. The phases of each kernel are named in the kernel
(KT_MARK comments); e.g. moe_gate_up_mma: 0 PDL wait, 1 ids/table + x staging + weight issue,
2 the dot, 3 epilogue.
"""
import statistics
import sys


def median(v):
    return statistics.median(v) if v else 0


def phase_medians(rs):
    """'i:cycles' for each phase of these records: the median over blocks of mark i-1 -> mark i."""
    nph = max(len(r[5]) for r in rs)
    out = []
    for i in range(nph):
        v = [(r[5][i] - (r[5][i - 1] if i else 0)) for r in rs if len(r[5]) > i]
        out.append("%d:%.0f" % (i, median(v)))
    return " ".join(out)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    recs = []
    for line in open(sys.argv[1]):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        name = f[0] + "/" + f[1]
        t0, t1, smid, block = int(f[2]), int(f[3]), int(f[4]), int(f[5])
        cyc = [int(c) for c in f[6:]]
        recs.append((name, t0, t1, smid, block, cyc))
    if not recs:
        print("ktrace_summary: no records (a build without MOESERVE_KERNEL_TRACE, or no traced kernel ran)")
        return 1
    # launches: per kernel, records sorted by start, split where starts are > 2 us apart
    launches = []
    by_kernel = {}
    for r in recs:
        by_kernel.setdefault(r[0], []).append(r)
    for name, rs in by_kernel.items():
        rs.sort(key=lambda r: r[1])
        cur = [rs[0]]
        for r in rs[1:]:
            if r[1] - cur[-1][1] > 2000:
                launches.append((name, cur))
                cur = [r]
            else:
                cur.append(r)
        launches.append((name, cur))
    print("%-28s %7s %8s %10s  %s" % ("kernel", "blocks", "launches", "span us", "phase cycles (median per block)"))
    for name in sorted(by_kernel):
        rs = by_kernel[name]
        spans = [(max(r[2] for r in ls) - min(r[1] for r in ls)) / 1000.0 for n, ls in launches if n == name]
        print("%-28s %7d %8d %10.2f  %s" % (name, len(rs), len(spans), median(spans), phase_medians(rs)))
    spans = sorted(((min(r[1] for r in ls), max(r[2] for r in ls), n, len(ls), phase_medians(ls)) for n, ls in launches))
    spans = spans[-last:]
    print("\ntimeline of the last %d launches (us; overlap < 0: the launch began before the previous ended)" %
          len(spans))
    print("%-28s %6s %9s %8s %9s %7s  %s" % ("kernel", "blocks", "start", "span", "gap", "adds",
                                              "phase cycles (median)"))
    base = spans[0][0]
    prev_end = None
    for s, e, n, nb, ph in spans:
        gap = "" if prev_end is None else "%9.2f" % ((s - prev_end) / 1000.0)
        adds = (e - (s if prev_end is None else prev_end)) / 1000.0
        print("%-28s %6d %9.2f %8.2f %9s %7.2f  %s" % (n, nb, (s - base) / 1000.0, (e - s) / 1000.0, gap,
                                                     max(adds, 0.0), ph))
        prev_end = e if prev_end is None else max(prev_end, e)
    print("end to end: %.2f us over %d launches" % ((prev_end - base) / 1000.0, len(spans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
