package cuda

import (
	"fmt"

	"github.com/mkserve/mkserve/kernels"
)

// ringPreferGather picks the ring's receive buffers (a variable so that
// tests run both kinds).
var ringPreferGather = kernels.RingPreferGather

// ringGatherMaxBytes caps the gather buffers of one ring call (all ranks'
// K and V; (R−1)/2 times the two receive buffers' bytes): above it the
// call takes the two receive buffers even where gather measured faster
// (R = 8 at 128k positions of 8 kv heads × 128 would hold 3.5 GiB).
const ringGatherMaxBytes = 2 << 30

// ringAttention attends the rows of a context-parallel span (SeqSpan.
// ContextParallel = R) with the ring kernel over R ranks emulated on this
// GPU (kernels.RingAttention), after its k/v were written to the pool pl:
//
//   - queries: the span's rows [Past, Past+Len) split zigzag over the ranks
//     (each rank gets chunks R−1−r and R+r, so causal work is balanced);
//   - keys/values: every position [0, Past+Len) of the sequence, split
//     zigzag the same way, gathered from the pool into each rank's shard —
//     the chunks then travel around the ring (into gather buffers or the
//     two receive buffers, kernels.RingPreferGather) while each rank
//     attends the ones that have arrived (causal by global position;
//     window and sinks as a);
//   - outputs: every rank's rows scattered back to the span's rows of out.
//
// Watchdog: the launch's waits are bounded; RingCheck (a device sync) turns
// a timeout into an error naming rank, role and tile, which fails the step.
func (be *Backend) ringAttention(d *kernels.Device, out, q *kernels.Buffer, pl *kvLayer, rs ringSpan,
	a kernels.AttnArgs, sinks *kernels.Buffer) error {
	s := rs.span
	R, L, P := s.ContextParallel, s.Len, s.Past
	N := P + L
	H, KV, D, Dv := a.Heads, a.KVHeads, a.HeadDim, a.VHeadDim
	kw, vw := KV*D, KV*Dv
	qsp := kernels.RingZigzag(L, R)
	for r := range qsp {
		for i := range qsp[r] {
			qsp[r][i].Lo += P
			qsp[r][i].Hi += P
		}
	}
	ksp := kernels.RingZigzag(N, R)
	args := kernels.RingArgs{QSpans: qsp, KVSpans: ksp, Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: Dv,
		Scale: a.Scale, Window: a.Window, Causal: true, Out: kernels.F32}

	// Row indices: queries by batch row, keys by pool row, both in rank order.
	bs := a.BlockSize
	var qIdx, kIdx []int32
	qOff, kOff := make([]int, R+1), make([]int, R+1)
	maxLk := 0
	for r := range R {
		for _, sp := range qsp[r] {
			for p := sp.Lo; p < sp.Hi; p++ {
				qIdx = append(qIdx, int32(s.Offset+p-P))
			}
		}
		lk := 0
		for _, sp := range ksp[r] {
			for p := sp.Lo; p < sp.Hi; p++ {
				kIdx = append(kIdx, rs.blocks[p/bs]*int32(bs)+int32(p%bs))
			}
			lk += sp.Len()
		}
		qOff[r+1], kOff[r+1] = len(qIdx), len(kIdx)
		maxLk = max(maxLk, lk)
	}
	// back[i] is the rank-ordered row holding span row i.
	back := make([]int32, L)
	for c, row := range qIdx {
		back[int(row)-s.Offset] = int32(c)
	}

	al := be.alloc
	var tmp []*kernels.Buffer
	get := func(n int64) *kernels.Buffer {
		b := al.get(d, n)
		tmp = append(tmp, b)
		return b
	}
	defer func() {
		for _, b := range tmp {
			al.put(b)
		}
	}()
	up := func(v []int32) *kernels.Buffer {
		b := get(int64(len(v)) * 4)
		must("ring indices", kernels.Upload(d, b, v))
		return b
	}
	// gather16 gathers rows idx of src (type st) into a fresh bf16 [n, cols].
	gather16 := func(src *kernels.Buffer, st kernels.DType, idx *kernels.Buffer, n, cols, srcRows int) (*kernels.Buffer, error) {
		f := get(int64(n*cols) * 4)
		if err := d.GatherRowsF32(nil, f, src, st, idx, n, cols, srcRows); err != nil {
			return nil, err
		}
		b := get(int64(n*cols) * 2)
		return b, d.ConvertF32ToBF16(nil, b, f, n*cols)
	}
	qAll, err := gather16(q, kernels.F32, up(qIdx), L, H*D, s.Offset+L)
	if err != nil {
		return err
	}
	kb := up(kIdx)
	poolRows := pl.blocks * bs
	kAll, err := gather16(pl.k, kernels.BF16, kb, N, kw, poolRows)
	if err != nil {
		return err
	}
	vAll, err := gather16(pl.v, kernels.BF16, kb, N, vw, poolRows)
	if err != nil {
		return err
	}
	outAll := get(int64(L*H*Dv) * 4)
	// Receive buffers: gather buffers (every rank receives the other R−1
	// chunks into their own rows, so the kernel keeps each query tile's
	// state in registers across the steps) where they measured faster,
	// else the two receive buffers (kernels.RingPreferGather).
	gather := ringPreferGather(N, R) && int64(R*(R-1)*maxLk)*int64(kw+vw)*2 <= ringGatherMaxBytes
	g := int64(2 * maxLk) // rows per rank
	if gather {
		g = int64((R - 1) * maxLk)
	}
	recvK, recvV := get(int64(R)*g*int64(kw)*2), get(int64(R)*g*int64(vw)*2)
	ranks := make([]kernels.RingRank, R)
	for r := range R {
		lq, lk := int64(qOff[r+1]-qOff[r]), int64(kOff[r+1]-kOff[r])
		v := func(b *kernels.Buffer, row0, rows, width, elem int64) *kernels.Buffer {
			return view(b, row0*width*elem, max(rows, 1)*width*elem)
		}
		rk := &ranks[r]
		rk.Q = v(qAll, int64(qOff[r]), lq, int64(H*D), 2)
		rk.K = v(kAll, int64(kOff[r]), lk, int64(kw), 2)
		rk.V = v(vAll, int64(kOff[r]), lk, int64(vw), 2)
		rk.Out = v(outAll, int64(qOff[r]), lq, int64(H*Dv), 4)
		switch {
		case R > 1 && gather:
			rk.KGather = v(recvK, int64(r)*g, g, int64(kw), 2)
			rk.VGather = v(recvV, int64(r)*g, g, int64(vw), 2)
		case R > 1:
			for j := range 2 {
				rk.KBuf[j] = v(recvK, int64(r)*g+int64(j*maxLk), int64(maxLk), int64(kw), 2)
				rk.VBuf[j] = v(recvV, int64(r)*g+int64(j*maxLk), int64(maxLk), int64(vw), 2)
			}
		}
	}
	ws, err := d.NewRingWorkspace(args)
	if err != nil {
		return err
	}
	defer ws.Free()
	if err := d.RingAttention(nil, ranks, sinks, ws, args); err != nil {
		return err
	}
	if err := d.RingCheck(ws); err != nil {
		return fmt.Errorf("context-parallel span %d (%d ranks, %d rows at position %d): %w", s.ID, R, L, P, err)
	}
	dst := view(out, int64(s.Offset*H*Dv)*4, int64(L*H*Dv)*4)
	return d.GatherRowsF32(nil, dst, outAll, kernels.F32, up(back), L, H*Dv, L)
}
