package cuda

import (
	"os"
	"sync"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// LatentMLA implements backend.LatentAttender: on unless
// backend.LatentMLAEnv is 0. Against the decompressed cache on the H200
// (DeepSeek-V3, 4 layers, docs/PERF.md): decode level at batch 1 and 1k
// context, 1.2x faster at batch 32, prefill 1.8x faster, 37x fewer cache
// bytes a token.
func (be *Backend) LatentMLA() bool { return os.Getenv(backend.LatentMLAEnv) != "0" }

// ValuesInKeys implements backend.ValuesInKeysCache: on the bf16 cache (the
// paged kernels read the values inside the keys: the latent once a token),
// not on the float32 one (Options.KVCacheF32) whose kernels have no such
// stride.
func (be *Backend) ValuesInKeys() bool { return !be.kvF32 }

// LatentAttention implements backend.LatentAttender. Every row's [c ‖ kPe]
// goes to the layer's cache (one KV head: 576 / 512 values for DeepSeek-V3).
// A batch of fresh prompts (every span at Past 0, one longer than a row,
// the bf16 cache) then attends decompressed: its own latents through W_UK
// and W_UV (two GEMMs), ordinary causal flash attention over each span's
// rows (head dims nope+rope / v). Any other batch attends absorbed: q_nope
// through each head's W_UK (kernels.GemmHeads), attention with one KV head
// over the cached [c ‖ kPe] (values c) through Attention — the paged kernels,
// kernels' paged_attn_big at DeepSeek-V3's dims — and each head's latent
// output through W_UV. (Decode batches are all one-row spans, so a
// captured graph always holds the absorbed form.) Chunks after a history
// attend absorbed, one CTA set per row: correct, slow for long chunks.
func (be *Backend) LatentAttention(qNope, qPe, c, kPe backend.Tensor, b *backend.Batch, p *backend.AttnParams,
	w *backend.MLAWeights) backend.Tensor {
	const op = "LatentAttention"
	if b == nil || p == nil || w == nil {
		panicf(op, "nil batch, params or weights")
	}
	H, L, R := p.NumHeads, w.Lora, w.Rope
	if H <= 0 || L <= 0 || R <= 0 || w.Nope <= 0 || w.V <= 0 || p.NumKVHeads != 1 || p.HeadDim != L+R ||
		p.VHeadDim != L || p.Window != 0 || p.Sinks != nil {
		panicf(op, "layer %d: heads %d, kv heads %d, dims %d/%d, window %d for lora %d rope %d nope %d v %d (want MLAParams, no window or sinks)",
			p.Layer, H, p.NumKVHeads, p.HeadDim, p.VHeadDim, p.Window, L, R, w.Nope, w.V)
	}
	sizes := []int{L, R}
	kFull := be.ConcatCols(1, []backend.Tensor{c, kPe}, sizes) // [T, L+R]: the cached keys
	if be.freshPrefill(b) && !be.kvF32 && flashOn() && flashFits(w.Nope+R, w.V) {
		be.attention(nil, kFull, c, b, p, true, nil) // the cache only
		kn := be.Linear(c, w.UK, nil)                // [T, H*nope]
		vv := be.Linear(c, w.UV, nil)                // [T, H*v]
		dsz := []int{w.Nope, R}
		// q and k straight into bf16 (mlaConcatBF16), or float32 then
		// rounded in flashSpans.
		bf := mlaConcatBF16()
		kf := be.concatCols(H, []backend.Tensor{kn, kPe}, dsz, bf)    // [T, H*(nope+rope)]
		qf := be.concatCols(H, []backend.Tensor{qNope, qPe}, dsz, bf) // [T, H*(nope+rope)]
		return be.flashSpans(op, qf, kf, vv, b, H, w.Nope+R, w.V, p.Scale)
	}
	qLat := be.headLinear(op, qNope, w.UKT, H)                    // [T, H*L]
	qFull := be.ConcatCols(H, []backend.Tensor{qLat, qPe}, sizes) // [T, H*(L+R)]
	oLat := be.Attention(qFull, kFull, c, b, p)                   // [T, H*L]
	return be.headLinear(op, oLat, w.UV, H)                       // [T, H*V]
}

// headLinear is a Linear per head without bias: x [T, heads*K] and w
// [heads*N, K] → [T, heads*N] (kernels.GemmHeads), x in bf16 against bf16
// weights (split into two halves, two GEMMs, in the exact profile) or
// float32 against float32 weights.
func (be *Backend) headLinear(op string, x, w backend.Tensor, heads int) *Tensor {
	wt, rows := matrix(op, "w", w, -1)
	_, K := wt.dims()
	if heads <= 0 || rows%heads != 0 {
		panicf(op, "w has shape %v, not a multiple of %d heads of rows", wt.shape, heads)
	}
	N := rows / heads
	xt, T := matrix(op, "x", x, heads*K)
	var out *Tensor
	be.do(op, func(d *kernels.Device) error {
		out = be.newF32(d, T, heads*N)
		if T == 0 {
			return nil
		}
		wb, wF32 := weightMem(wt)
		in := be.prepare(d, be.f32(d, xt), T*heads*K, wF32)
		defer be.release(in)
		if in.f32 != nil {
			return d.GemmHeads(nil, out.st.f32, kernels.F32, in.f32, wb, T, N, K, heads, false)
		}
		if err := d.GemmHeads(nil, out.st.f32, kernels.BF16, in.hi, wb, T, N, K, heads, false); err != nil {
			return err
		}
		if in.lo != nil {
			return d.GemmHeads(nil, out.st.f32, kernels.BF16, in.lo, wb, T, N, K, heads, true)
		}
		return nil
	}, xt, wt)
	return out
}

// freshPrefill reports whether every span of b starts a sequence (Past 0)
// and one has more than a row (graph steps never do: all their spans are
// one row).
func (be *Backend) freshPrefill(b *backend.Batch) bool {
	long := false
	for _, s := range b.Seqs {
		if s.Past != 0 {
			return false
		}
		long = long || s.Len > 1
	}
	return long
}

// MLAConcatBF16Env set to 0 builds DeepSeek-V3's fresh-prefill q and k
// [T, heads*(nope+rope)] in float32 then rounds them for the tensor cores;
// by default they are concatenated into bf16 directly
// (kernels.CopyColsBF16): the same bits, ~3.2 GB less memory traffic a
// layer at 8k tokens, DeepSeek-V3-4l 8k prefill 119–121 → 115–116 ms
// (docs/PERF.md, twenty-ninth pass).
const MLAConcatBF16Env = "MKSERVE_MLA_BF16_CONCAT"

// mlaConcatBF16 reports MLAConcatBF16Env.
var mlaConcatBF16 = sync.OnceValue(func() bool { return os.Getenv(MLAConcatBF16Env) != "0" })

// flashSpans is causal flash attention of each span of b over its own rows:
// q and k [T, heads*d], v [T, heads*dv] float32 or held in bf16 only (those
// in float32 rounded to bf16 for the tensor cores here), keys contiguous in
// the batch's row order → [T, heads*dv].
func (be *Backend) flashSpans(op string, q, k, v backend.Tensor, b *backend.Batch, heads, hd, dv int,
	scale float32) *Tensor {
	qt, T := matrix(op, "q", q, heads*hd)
	kt, kr := matrix(op, "k", k, heads*hd)
	vt, vr := matrix(op, "v", v, heads*dv)
	if kr != T || vr != T || len(b.Tokens) != T {
		panicf(op, "q %v, k %v, v %v for a batch of %d tokens", qt.shape, kt.shape, vt.shape, len(b.Tokens))
	}
	// meta is [start (B+1) | past (B, zeros) | table (B)], one upload a
	// step through be.stepArrays: every MLA layer of the step sends the same,
	// and a synchronous upload waits for all the GPU work queued before it.
	B := len(b.Seqs)
	meta := make([]int32, 3*B+1)
	maxLen := 0
	for i, s := range b.Seqs {
		meta[i], meta[2*B+1+i] = int32(s.Offset), int32(s.Offset) // kv_start: the span's first row
		maxLen = max(maxLen, s.Len)
	}
	meta[B] = int32(T)
	var out *Tensor
	be.do(op, func(d *kernels.Device) error {
		out = be.newF32(d, T, heads*dv)
		var temps []*kernels.Buffer
		defer func() {
			for _, x := range temps {
				be.alloc.put(x)
			}
		}()
		bf := func(t *Tensor, n int) *kernels.Buffer {
			if t.st.bf16 != nil { // held in bf16, or its rounding kept (bf16Of): the values the kernel reads
				return t.st.bf16
			}
			x := be.alloc.get(d, int64(n)*2)
			temps = append(temps, x)
			must("convert", d.ConvertF32ToBF16(nil, x, be.f32(d, t), n))
			return x
		}
		qb, kb, vb := bf(qt, T*heads*hd), bf(kt, T*heads*hd), bf(vt, T*heads*dv)
		mb := be.stepArrays.get(be, d, meta)
		sb, pb, tb := view(mb, 0, int64(B+1)*4), view(mb, int64(B+1)*4, int64(B)*4), view(mb, int64(2*B+1)*4, int64(B)*4)
		return d.FlashAttention(nil, out.st.f32, qb, kb, vb, sb, pb, tb, nil, nil, kernels.FlashArgs{
			Batch: B, MaxQLen: maxLen, Tokens: T, Heads: heads, KVHeads: heads, HeadDim: hd, VHeadDim: dv,
			PoolRows: T, Scale: scale, Causal: true, Out: kernels.F32})
	}, qt, kt, vt)
	return out
}
