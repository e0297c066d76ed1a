# scripts/sass_kloops.py SASS.txt [FUNC_RE [MMA_RE]] — for each function matching FUNC_RE
# (default fused_kernel) in a `cuobjdump -sass` dump, the loops that hold MMA_RE (default
# HMMA; ring_wg / flash_wg: HGMMA) (a branch back to a loop head) and the spill instructions (STL/LDL)
# inside each: the device compiler's spills in the k-loops, which the ptxas proxy
# (scripts/ptxas_check.sh) does not predict. On the GPU machine:
#   cuobjdump -sass .dev/libmkernel.so | awk '/Function :/ {on = ($0 ~ /fused_kernel/)} on' >/tmp/s.txt && python3 scripts/sass_kloops.py /tmp/s.txt
import re, sys
L = open(sys.argv[1]).read().split('\n')
FUNC = sys.argv[2] if len(sys.argv) > 2 else 'fused_kernel'
MMA = sys.argv[3] if len(sys.argv) > 3 else 'HMMA'
funcs = []
for i, l in enumerate(L):
    if 'Function :' in l:
        funcs.append(i)
funcs.append(len(L))
for fi in range(len(funcs) - 1):
    a0, b0 = funcs[fi], funcs[fi + 1]
    name = L[a0].split('Function :')[1].strip()
    if not re.search(FUNC, name):
        continue
    addr, at = {}, {}
    for i in range(a0, b0):
        m = re.search(r'/\*([0-9a-f]{4,6})\*/\s', L[i])
        if m:
            a = int(m.group(1), 16); addr[i] = a; at[a] = i
    h = [i for i in range(a0, b0) if re.search(MMA, L[i])]
    sp = [i for i in range(a0, b0) if re.search(r'\b(STL|LDL)', L[i])]
    print(name[:90], 'spill instrs', len(sp))
    for i in range(a0, b0):
        m = re.search(r'BRA (0x[0-9a-f]+)', L[i])
        if m and i in addr:
            t = int(m.group(1), 16)
            if t < addr[i] and t in at:
                a, b = at[t], i
                nh = sum(1 for x in h if a <= x <= b)
                if nh and nh <= 64:
                    print('  loop %x-%x MMA %d spill instrs inside %d' % (t, addr[i], nh, sum(1 for x in sp if a <= x <= b)))
