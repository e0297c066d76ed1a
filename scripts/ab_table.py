"""scripts/ab_table.py — the table of an A/B run (scripts/ab_moe.sh,
scripts/ab_model.sh): one line per key, each variant's times over the
rounds, its ratio of medians to the first variant (< 1: faster) and the
medians of its extra columns.

    from ab_table import results, table, variant_names
    for parts, rows in results(res_dir): ...  # parts: a file's name split at "."
    table(runs, variant_names(VARIANTS), key_fmt, key_hdr, extras)

runs: {key: {variant: [(ms, {column: value}), ...]}}; extras: [(column,
format[, aggregate])] printed after the ratio, each aggregated over the
rounds (the median unless given, e.g. max; values of 0 left out, a column
with none not printed)."""
import glob
import json
import os
import statistics


def variant_names(variants):
    """The names of $VARIANTS (NAME:ASSIGNMENTS ...), baseline first."""
    return [v.split(":", 1)[0] for v in variants.split()]


def results(res):
    """(the file's name without .json split at ".", its rows) for every
    result file of directory res."""
    for f in sorted(glob.glob(os.path.join(res, "*.json"))):
        yield os.path.basename(f)[:-5].split("."), read_rows(f)


def read_rows(path):
    """The JSON array in a file of stdout (whatever else it holds), or []."""
    text = open(path).read()
    at = 0 if text.startswith("[") else text.find("\n[") + 1
    try:
        return json.JSONDecoder().raw_decode(text[at:])[0]
    except Exception:
        return []


def table(runs, variants, key_fmt, key_hdr, extras, width=30):
    print(key_hdr + "  " + "  ".join("%-*s" % (width, v) for v in variants))
    for key in sorted(runs):
        base = runs[key].get(variants[0])
        bm = statistics.median(m for m, _ in base) if base else None
        cells = []
        for v in variants:
            got = runs[key].get(v)
            if not got:
                cells.append("%-*s" % (width, "-"))
                continue
            med = statistics.median(m for m, _ in got)
            cell = ",".join("%.3f" % m for m, _ in got)
            if bm and v != variants[0]:
                cell += " ×%.3f" % (med / bm)
            for col, fmt, *agg in extras:
                vals = [x[col] for _, x in got if x.get(col)]
                if vals:
                    cell += " " + fmt % (agg[0] if agg else statistics.median)(vals)
            cells.append("%-*s" % (width, cell))
        print(key_fmt % key + "  " + "  ".join(cells))
