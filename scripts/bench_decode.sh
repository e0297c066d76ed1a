#!/usr/bin/env bash
# scripts/bench_decode.sh — paged decode attention (kernels' BenchmarkPagedAttn:
# batch 1/32/256 × context 1k–32k, K/V GB/s) with the device copy rate in the
# same run, then its PyTorch baseline (scripts/decode_torch.py: block gather +
# SDPA, and SDPA on a contiguous cache). Run by scripts/device.sh.
set -uo pipefail
rc=0
.dev/kernels.test -test.run '^$' -test.bench 'PagedAttn|CopyD2D' -test.benchtime 20x -test.count 3 \
	-test.timeout=150s || rc=1
PYTHONUNBUFFERED=1 timeout 90 python3 scripts/decode_torch.py || rc=1
exit $rc
