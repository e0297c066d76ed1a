package cuda

import (
	"os"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// LatentMLA implements backend.LatentAttender: on this backend only when
// backend.LatentMLAEnv is 1. The path was written in session 13 without a
// GPU left to run it on (TestLatentAttentionMatchesCPU and
// TestGoldenLatentMLA wait for one); it becomes the default once they pass.
func (be *Backend) LatentMLA() bool { return os.Getenv(backend.LatentMLAEnv) == "1" }

// LatentAttention implements backend.LatentAttender in the absorbed form for
// every row: q_nope through each head's W_UK (kernels.GemmHeads), attention
// with one KV head over [c ‖ kPe] (values c) through Attention — the paged
// kernels read the latent cache (head dims 576 / 512 for DeepSeek-V3:
// kernels' paged_attn_big), prefill rows included — and each head's latent
// output through W_UV. Prefill in the decompressed form (cheaper for long
// prompts, as the CPU backend does) is not here yet.
func (be *Backend) LatentAttention(qNope, qPe, c, kPe backend.Tensor, b *backend.Batch, p *backend.AttnParams,
	w *backend.MLAWeights) backend.Tensor {
	const op = "LatentAttention"
	if p == nil || w == nil {
		panicf(op, "nil params or weights")
	}
	H, L, R := p.NumHeads, w.Lora, w.Rope
	if H <= 0 || L <= 0 || R <= 0 || w.Nope <= 0 || w.V <= 0 || p.NumKVHeads != 1 || p.HeadDim != L+R ||
		p.VHeadDim != L || p.Window != 0 || p.Sinks != nil {
		panicf(op, "layer %d: heads %d, kv heads %d, dims %d/%d, window %d for lora %d rope %d nope %d v %d (want MLAParams, no window or sinks)",
			p.Layer, H, p.NumKVHeads, p.HeadDim, p.VHeadDim, p.Window, L, R, w.Nope, w.V)
	}
	sizes := []int{L, R}
	qLat := be.headLinear(op, qNope, w.UKT, H)                    // [T, H*L]
	qFull := be.ConcatCols(H, []backend.Tensor{qLat, qPe}, sizes) // [T, H*(L+R)]
	kFull := be.ConcatCols(1, []backend.Tensor{c, kPe}, sizes)    // [T, L+R]
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
