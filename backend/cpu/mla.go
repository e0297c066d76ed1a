package cpu

import (
	"os"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/par"
	"github.com/mkserve/mkserve/linalg"
)

// LatentMLA implements backend.LatentAttender: the latent cache unless
// backend.LatentMLAEnv is 0.
func (be *Backend) LatentMLA() bool { return os.Getenv(backend.LatentMLAEnv) != "0" }

// ValuesInKeys implements backend.ValuesInKeysCache: always (attention.Pool
// reads values inside keys).
func (be *Backend) ValuesInKeys() bool { return true }

// LatentAttention implements backend.LatentAttender. Each token's [c ‖ kPe]
// goes to the layer's KV cache as its key (Lora+Rope values) and c is its
// value: inside the key with p.ValuesInKeys (576 values a token and layer
// for DeepSeek-V3 against 40 960 decompressed), else stored again (1088).
// Then each span attends in whichever form costs fewer multiply-adds
// (mlaDecompress): absorbed (decode) or decompressed (long prefills).
//
// Context-parallel spans attend as ordinary ones (the ring schedule is
// Attention's). It panics on bad shapes, a window or sinks in p, and the
// errors Attention lists.
func (be *Backend) LatentAttention(qNope, qPe, c, kPe backend.Tensor, b *backend.Batch, p *backend.AttnParams,
	w *backend.MLAWeights) backend.Tensor {
	const op = "LatentAttention"
	if b == nil || p == nil || w == nil {
		panicf(op, "nil batch, params or weights")
	}
	if err := b.Validate(); err != nil {
		panicf(op, "%v", err)
	}
	H, L, R, N, V := p.NumHeads, w.Lora, w.Rope, w.Nope, w.V
	if H <= 0 || L <= 0 || R <= 0 || N <= 0 || V <= 0 || p.Layer < 0 || p.NumKVHeads != 1 || p.HeadDim != L+R ||
		p.VHeadDim != L || p.Window != 0 || p.Sinks != nil {
		panicf(op, "layer %d: heads %d, kv heads %d, dims %d/%d, window %d for lora %d rope %d nope %d v %d (want MLAParams, no window or sinks)",
			p.Layer, H, p.NumKVHeads, p.HeadDim, p.VHeadDim, p.Window, L, R, N, V)
	}
	T := len(b.Tokens)
	qn, r1 := matrix(op, "qNope", qNope, H*N) // [T, H*N]
	qp, r2 := matrix(op, "qPe", qPe, H*R)     // [T, H*R]
	ct, r3 := matrix(op, "c", c, L)           // [T, L]
	kp, r4 := matrix(op, "kPe", kPe, R)       // [T, R]
	if r1 != T || r2 != T || r3 != T || r4 != T {
		panicf(op, "qNope %v, qPe %v, c %v, kPe %v for a batch of %d tokens", qn.shape, qp.shape, ct.shape, kp.shape, T)
	}
	ukt, uk, uv := weightOf(op, "UKT", w.UKT), weightOf(op, "UK", w.UK), weightOf(op, "UV", w.UV)
	for _, x := range []struct {
		name       string
		t          *Tensor
		rows, cols int
	}{{"UKT", ukt, H * L, N}, {"UK", uk, H * N, L}, {"UV", uv, H * V, L}} {
		if r, cols := x.t.dims(); r != x.rows || cols != x.cols {
			panicf(op, "%s has shape %v, want [%d %d]", x.name, x.t.shape, x.rows, x.cols)
		}
	}

	keys := concatHeads(T, 1, []colPart{{ct.data, L, L, false}, {kp.data, R, R, false}}) // [T, L+R]: [c ‖ kPe]
	hist := be.appendLayerKV(op, b, p, keys, ct.data)                                    // p's widths: L+R keys, L values (or none)

	out := newTensor(T, H*V)
	// Spans side by side, as Attention runs them (each also spreads its own work).
	par.Each(len(b.Seqs), func(i int) {
		s := b.Seqs[i]
		o := out.data[s.Offset*H*V : (s.Offset+s.Len)*H*V]  // [Len, H*V]
		qnS := qn.data[s.Offset*H*N : (s.Offset+s.Len)*H*N] // [Len, H*N]
		qpS := qp.data[s.Offset*H*R : (s.Offset+s.Len)*H*R] // [Len, H*R]
		if mlaDecompress(s.Len, s.Past, L, R, N, V) {
			// The history's latents [n, L] and rope keys (rows ldr apart): the
			// span's own inputs for a fresh prompt, else a copy out of the cache.
			n := s.Past + s.Len
			hv, kpe, ldr := ct.data[s.Offset*L:(s.Offset+s.Len)*L], kp.data[s.Offset*R:], R
			if s.Past > 0 {
				var hk []float32
				hk, hv = hist[i].Gather(n, L+R, L)
				kpe, ldr = hk[L:], L+R
			}
			kn := linear(hv, uk.weights(), nil, n, H*N, L).data                                    // [n, H*N]
			vv := linear(hv, uv.weights(), nil, n, H*V, L).data                                    // [n, H*V]
			kf := concatHeads(n, H, []colPart{{kn, H * N, N, false}, {kpe, ldr, R, true}})         // [n, H*(N+R)]
			qf := concatHeads(s.Len, H, []colPart{{qnS, H * N, N, false}, {qpS, H * R, R, false}}) // [Len, H*(N+R)]
			attention.Causal(o, qf, kf, vv, s.Len, s.Past, &attention.Params{NumHeads: H, NumKVHeads: H,
				HeadDim: N + R, VHeadDim: V, Scale: p.Scale})
			return
		}
		qLat := headLinear(qnS, ukt.weights(), s.Len, H, L, N)                                  // [Len, H*L]
		qf := concatHeads(s.Len, H, []colPart{{qLat, H * L, L, false}, {qpS, H * R, R, false}}) // [Len, H*(L+R)]
		oLat := make([]float32, s.Len*H*L)                                                      // [Len, H*L]
		// One KV head over the cache in place: keys [c ‖ kPe], values c.
		attention.CausalPaged(oLat, qf, &hist[i], s.Len, s.Past, &attention.Params{NumHeads: H, NumKVHeads: 1,
			HeadDim: L + R, VHeadDim: L, Scale: p.Scale})
		copy(o, headLinear(oLat, uv.weights(), s.Len, H, V, L))
	})
	return out
}

// mlaDecompress reports whether a span of rows new tokens after past cached
// ones costs fewer multiply-adds decompressed (the whole history's latent
// through W_UK and W_UV, then attention of head dims nope+rope / v) than
// absorbed (queries through W_UK, attention of head dims lora+rope / lora,
// outputs through W_UV). Per head, with s = the (query, key) pairs the
// causal mask keeps: decompressed (past+rows)·lora·(nope+v) +
// s·(nope+rope+v), absorbed rows·lora·(nope+v) + s·(2·lora+rope). So a
// fresh prompt always decompresses (the same projection work, cheaper
// attention), decode stays absorbed, and a chunk after a long history
// decompresses from about lora·(nope+v) / (2·lora−nope−v) rows on: 171 for
// DeepSeek-V3's dims.
func mlaDecompress(rows, past, lora, rope, nope, v int) bool {
	n := int64(past + rows)
	s := int64(rows)*int64(past) + int64(rows)*int64(rows+1)/2
	lv := int64(lora) * int64(nope+v)
	dec := n*lv + s*int64(nope+rope+v)
	abs := int64(rows)*lv + s*int64(2*lora+rope)
	return dec < abs
}

// headLinear is a Linear per head: x [T, heads*K], w [heads*N, K] → [T,
// heads*N], head h being x's head h · (w's rows h*N..h*N+N-1)ᵀ. Heads run
// side by side, each through linalg's MulT (bf16 weights stay bf16).
func headLinear(x []float32, w linalg.Weights, T, heads, N, K int) []float32 {
	out := make([]float32, T*heads*N)
	par.Each(heads, func(h int) {
		xh, oh := make([]float32, T*K), make([]float32, T*N) // [T, K], [T, N]
		for t := range T {
			copy(xh[t*K:(t+1)*K], x[(t*heads+h)*K:])
		}
		w.Block(h, N*K).MulT(oh, xh, T, N, K)
		for t := range T {
			copy(out[(t*heads+h)*N:(t*heads+h+1)*N], oh[t*N:(t+1)*N])
		}
	})
	return out
}
