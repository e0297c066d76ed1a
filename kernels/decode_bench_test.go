package kernels

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// BenchmarkPagedAttn times paged decode attention (one query row per
// sequence), every kernel (mma: tensor cores with the ring depth picked per
// shape, simt: CUDA cores, warp: the warp-split kernel), at batch 1/32/256 × context 1k-32k: 32 query
// heads, 8 kv heads,
// head dim 128, 16-token blocks with random ids from one pool that holds
// the largest case (256 × 32k tokens: 34 GB of bf16 K/V). GB/s counts the
// K/V bytes the kernel must read once (batch·ctx·kvHeads·(D+Dv)·2), the
// read-only figure to set against BenchmarkCopyD2D's read+write rate. Small
// cases rotate through enough block tables (disjoint blocks) that ≥ 256 MiB
// of K/V is touched between repeats, so the 60 MB L2 does not hold them.
// Each case also reports graph-us/op and graph-GB/s: the same calls replayed
// from a CUDA graph, as decode steps run them (no host issue time).
// Then A/B rows: the tensor-core kernel with its ring forced to 2 stages
// (mma_s2: the double-buffered pipeline of before) and 4 (mma_s4) at 32k,
// and both kernels at groups of 1 and 2 (the choice of PagedAuto).
func BenchmarkPagedAttn(b *testing.B) {
	g := testGPU(b)
	const H, KV, D, bs = 32, 8, 128, 16
	maxTokens := 256 * 32768
	if v, err := strconv.Atoi(os.Getenv("MK_DECODE_POOL_TOKENS")); err == nil && v > 0 {
		maxTokens = v // a smaller pool (profiling); larger cases skip
	}
	poolBlocks := maxTokens / bs
	kw := KV * D
	a := AttnArgs{Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: D, BlockSize: bs, Scale: 0.088}
	var pk, pv *Buffer
	pool := &arena{}
	err := g.Do(func(d *Device) error {
		pool.d = d
		rowBytes := int64(bs) * int64(kw) * 2 // one block of K (or V)
		pk, pv = pool.alloc(int64(poolBlocks)*rowBytes), pool.alloc(int64(poolBlocks)*rowBytes)
		// Fill the pools with random bf16 by device copies of one 64 MiB chunk.
		const chunk = 64 << 20
		src := put(pool, randomBF16(chunk/2))
		for _, p := range []*Buffer{pk, pv} {
			for off := int64(0); pool.err == nil && off < p.bytes; off += chunk {
				dst, err := p.View(off, min(chunk, p.bytes-off))
				pool.check(err)
				if pool.err == nil {
					pool.check(d.CopyAsync(nil, dst, src, dst.bytes))
				}
			}
		}
		if pool.err == nil {
			pool.check(d.Sync())
		}
		return pool.err
	})
	defer g.Do(func(d *Device) error { pool.d = d; return pool.free() })
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	hint := 0   // maxKeys past ctx (a decode graph plans for its bucket), 0: ctx
	vk := false // values inside the keys (no V pool)
	run := func(name string, batch, ctx int, a AttnArgs, v PagedVariant, stages int) {
		b.Run(name, func(b *testing.B) {
			if batch*ctx > maxTokens {
				b.Skipf("%d tokens, the pool holds %d", batch*ctx, maxTokens)
			}
			err := g.Do(func(d *Device) error {
				if err := errors.Join(d.SetPagedVariant(v), d.SetPagedStages(stages)); err != nil {
					return err
				}
				defer d.SetPagedStages(0)
				defer d.SetPagedVariant(PagedAuto)
				v := pv
				if vk {
					v = nil
				}
				return benchPaged(b, d, r, pk, v, batch, ctx, max(ctx, hint), poolBlocks, a)
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
	for _, v := range []struct {
		name string
		v    PagedVariant
	}{{"mma", PagedMMA}, {"simt", PagedSIMT}, {"warp", PagedWarp}} {
		for _, batch := range []int{1, 32, 256} {
			for _, ctx := range []int{1024, 4096, 16384, 32768} {
				run(fmt.Sprintf("%s/B=%d_ctx=%d", v.name, batch, ctx), batch, ctx, a, v.v, 0)
			}
		}
	}
	for _, stages := range []int{2, 4} {
		for _, batch := range []int{1, 32, 256} {
			run(fmt.Sprintf("mma_s%d/B=%d_ctx=32768", stages, batch), batch, 32768, a, PagedMMA, stages)
		}
	}
	for _, h := range []int{8, 16} {
		a2 := a
		a2.Heads = h
		run(fmt.Sprintf("mma/B=32_ctx=32768_H=%d_KV=8", h), 32, 32768, a2, PagedMMA, 0)
		run(fmt.Sprintf("simt/B=32_ctx=32768_H=%d_KV=8", h), 32, 32768, a2, PagedSIMT, 0)
		run(fmt.Sprintf("warp/B=32_ctx=32768_H=%d_KV=8", h), 32, 32768, a2, PagedWarp, 0)
	}
	// The same bytes per query head group (G = 8) with 8 kv heads (a K row
	// of 2 KiB, one kv head's slice 256 B) and with 1 (rows of 256 B, a
	// block's slice contiguous): how much the pool layout costs.
	for _, v := range []struct{ h, kv int }{{64, 8}, {8, 1}} {
		a2 := a
		a2.Heads, a2.KVHeads = v.h, v.kv
		run(fmt.Sprintf("mma/B=32_ctx=32768_H=%d_KV=%d", v.h, v.kv), 32, 32768, a2, PagedMMA, 0)
		run(fmt.Sprintf("warp/B=32_ctx=32768_H=%d_KV=%d", v.h, v.kv), 32, 32768, a2, PagedWarp, 0)
	}
	// MLA's absorbed decode at DeepSeek-V3's dims (128 query heads on one
	// KV head of 576, values the 512-wide latent): the tensor-core kernel
	// (auto) against the CUDA-core one (simt: paged_attn_big).
	amla := AttnArgs{Heads: 128, KVHeads: 1, HeadDim: 576, VHeadDim: 512, BlockSize: bs, Scale: 0.0723}
	for _, batch := range []int{1, 32, 128} {
		for _, ctx := range []int{1024, 4096, 16384} {
			run(fmt.Sprintf("mla/B=%d_ctx=%d", batch, ctx), batch, ctx, amla, PagedAuto, 0)
			if batch*ctx <= 32*4096 {
				run(fmt.Sprintf("big/B=%d_ctx=%d", batch, ctx), batch, ctx, amla, PagedSIMT, 0)
			}
		}
	}
	// The latent once a token (values inside the keys): half the bytes.
	vk = true
	for _, batch := range []int{1, 32, 128} {
		run(fmt.Sprintf("mla_vk/B=%d_ctx=4096", batch), batch, 4096, amla, PagedAuto, 0)
	}
	vk = false
	// A decode graph's plan: keys planned for 4x the context (its bucket).
	for _, ctx := range []int{1024, 4096} {
		hint = 4 * ctx
		run(fmt.Sprintf("mla_hint4x/B=1_ctx=%d", ctx), 1, ctx, amla, PagedAuto, 0)
		run(fmt.Sprintf("warp_hint4x/B=1_ctx=%d", ctx), 1, ctx, a, PagedWarp, 0)
		hint = 0
	}
	// gpt-oss's shape (64 q / 8 kv heads, d 64) on the warp-split kernel
	// against the tensor-core one (the CUDA-core one's G = 8 is far behind).
	a64 := a
	a64.Heads, a64.HeadDim, a64.VHeadDim = 64, 64, 64
	for _, v := range []struct {
		name string
		v    PagedVariant
	}{{"mma", PagedMMA}, {"warp", PagedWarp}} {
		run(fmt.Sprintf("%s/B=32_ctx=32768_H=64_KV=8_D=64", v.name), 32, 32768, a64, v.v, 0)
	}
}

func benchPaged(b *testing.B, d *Device, r *rand.Rand, pk, pv *Buffer, batch, ctx, maxKeys, poolBlocks int, a AttnArgs) error {
	ar := &arena{d: d}
	defer ar.free()
	nb := ctx / a.BlockSize
	kvBytes := int64(batch) * int64(ctx) * int64(a.KVHeads) * int64(a.HeadDim+a.VHeadDim) * 2
	if pv == nil { // values inside the keys
		kvBytes = int64(batch) * int64(ctx) * int64(a.KVHeads) * int64(a.HeadDim) * 2
	}
	rot := int(min(64, max(1, (256<<20)/kvBytes)))
	if rot*batch*nb > poolBlocks {
		rot = max(1, poolBlocks/(batch*nb))
	}
	perm := r.Perm(poolBlocks)
	type set struct{ rows, pos, table, blocks *Buffer }
	sets := make([]set, rot)
	q := make([]float32, batch*a.Heads*a.HeadDim)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	rows, pos, table := make([]int32, batch), make([]int32, batch), make([]int32, batch)
	for i := range batch {
		rows[i], pos[i], table[i] = int32(i), int32(ctx-1), int32(i*nb)
	}
	rb, pb, tb := put(ar, rows), put(ar, pos), put(ar, table)
	for s := range sets {
		ids := make([]int32, batch*nb)
		for i := range ids {
			ids[i] = int32(perm[(s*batch*nb+i)%poolBlocks])
		}
		sets[s] = set{rb, pb, tb, put(ar, ids)}
	}
	qb, out := put(ar, q), ar.alloc(int64(batch*a.Heads*a.VHeadDim)*4)
	if ar.err != nil {
		return ar.err
	}
	ws, err := d.PagedAttnWorkspace(batch, maxKeys, a)
	if err != nil {
		return err
	}
	var wb *Buffer
	if ws > 0 {
		wb = ar.alloc(ws)
	}
	if ar.err != nil {
		return ar.err
	}
	ms, err := timeLaunches(b, d, nil, 3, func(i int) error {
		st := sets[i%rot]
		return d.PagedAttnBF16(nil, out, nil, qb, pk, pv, st.rows, st.pos, st.table, st.blocks, nil, wb, batch, maxKeys, a)
	})
	if err != nil {
		return err
	}
	b.ReportMetric(ms*1e3, "us/op")
	b.ReportMetric(float64(kvBytes)/(ms*1e-3)/1e9, "GB/s")
	b.ReportMetric(float64(ws), "work-bytes")
	b.ReportMetric(2*float64(batch)*float64(a.Heads)*float64(ctx)*float64(a.HeadDim+a.VHeadDim)/(ms*1e-3)/1e12, "TFLOP/s")
	// The same calls as a decode step runs them: reps of them (every block
	// table set, at least 8) captured into one CUDA graph, whose kernels
	// launch programmatically after one another, timed over b.N replays.
	// The eager loop above pays the host's issue time per call wherever that
	// exceeds the GPU's (issue-us/op); a replay does not.
	reps := max(rot, 8)
	sg, err := d.BeginCapture()
	if err != nil {
		return err
	}
	for i := range reps {
		st := sets[i%rot]
		if err := d.PagedAttnBF16(nil, out, nil, qb, pk, pv, st.rows, st.pos, st.table, st.blocks, nil, wb, batch, maxKeys, a); err != nil {
			d.AbortCapture(sg)
			return err
		}
	}
	if err := d.EndCapture(sg); err != nil {
		return err
	}
	defer sg.Destroy(d)
	gms, _, err := timeCalls(d, nil, 2, b.N, func(int) error { return sg.Launch(d) })
	if err != nil {
		return err
	}
	gms /= float64(reps)
	b.ReportMetric(gms*1e3, "graph-us/op")
	b.ReportMetric(float64(kvBytes)/(gms*1e-3)/1e9, "graph-GB/s")
	return ar.free()
}
