#!/usr/bin/env bash
# scripts/walk_ab.sh — the persistent walking grid of the decode tiles'
# expert GEMMs (moe_gemm_walk_kernel, MK_MOE_WALK) against one CTA per item
# (thirty-sixth pass): its tests (bit-exact against one CTA per item; the
# MoE kernel tests with the walk on, against the CPU), ncu of one-token
# layers with it on, grouped layers at 1–256 tokens on the issue's three
# shapes and batch-1 / 8 decode steps, alternating. Carry
# .dev/device.tar.xz (make device-bins) and this script.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -iE "error" "$OUT/build.log" | head -30; exit 1; }
echo "built t=${SECONDS}s"
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1 PATH="$PATH:/usr/local/cuda/bin"
(cd kernels && timeout 200 ../.dev/kernels.test -test.v -test.count=1 -test.run '^TestMoEWalk$' >"$OUT/walk_test.log" 2>&1)
echo "TestMoEWalk rc=$? t=${SECONDS}s"; grep -E "^\s*(--- |FAIL|ok)|identical|differ|panic" "$OUT/walk_test.log" | head -12
(cd kernels && MK_MOE_WALK=1 MK_MOE_WALK_PER_SM=1 timeout 200 ../.dev/kernels.test -test.count=1 -test.run '^Test(MoEExperts|MoERouteExperts|MoEExpertsFP4)$' >"$OUT/moe_walk_on.log" 2>&1)
echo "MoE tests with MK_MOE_WALK=1 rc=$? t=${SECONDS}s"; grep -E "^(--- FAIL|FAIL|ok)|panic" "$OUT/moe_walk_on.log" | head -12
q='import csv,sys
h=None; ks={}
for r in csv.reader(open(sys.argv[1])):
  if r and r[0]=="ID": h=r; continue
  if not h or len(r)!=len(h): continue
  d=dict(zip(h,r)); k=(int(d["ID"]),d["Kernel Name"][:48],d["Grid Size"])
  ks.setdefault(k,{})[d["Metric Name"]]=d["Metric Value"].replace(",","")
for (i,n,gs),m in sorted(ks.items())[-6:]:
  t=float(m.get("gpu__time_duration.sum",0)); b=float(m.get("dram__bytes_read.sum",0))
  print("%4d %-48s %-14s %7.1f us %7.1f MB %5.2f TB/s" % (i,n,gs,t/1e3,b/1e6,b/t/1e3 if t else 0))'
declare -A F
F[deepseek_v3]="--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped"
F[mixtral_8x7b]="--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax"
F[qwen3_30b_a3b]="--hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax"
for s in deepseek_v3 mixtral_8x7b; do
	# shellcheck disable=SC2086
	MK_MOE_WALK=1 MK_MOE_WALK_PER_SM=2 timeout 100 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum \
		.dev/mkserve bench moe --path grouped ${F[$s]} --tokens 1 --iters 1 --graph=false --check-rows 0 >"$OUT/ncu_$s.csv" 2>"$OUT/ncu_$s.err"
	echo "== ncu walk $s 1 token rc=$?"; python3 -c "$q" "$OUT/ncu_$s.csv" || tail -3 "$OUT/ncu_$s.err"
done
echo "== grouped layers t=${SECONDS}s"
VARIANTS="base:MK_MOE_WALK=0 walk:MK_MOE_WALK=1 w2:MK_MOE_WALK=1,MK_MOE_WALK_PER_SM=2 w1:MK_MOE_WALK=1,MK_MOE_WALK_PER_SM=1" PATHS=grouped TOKENS=1,16,256 ROUNDS=2 ITERS=20 timeout 250 bash scripts/ab_moe.sh 2>&1 | tail -20
echo "== decode steps t=${SECONDS}s"
VARIANTS="base:MK_MOE_WALK=0 w2:MK_MOE_WALK=1,MK_MOE_WALK_PER_SM=2 w1:MK_MOE_WALK=1,MK_MOE_WALK_PER_SM=1" CONFIGS="mixtral-8x7b-4l deepseek-v3-4l" BATCH=1,8 STEPS=30 ROUNDS=2 timeout 200 bash scripts/ab_model.sh 2>&1 | tail -10
echo "done t=${SECONDS}s"
