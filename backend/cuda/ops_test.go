package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// opCase runs the same ops on a backend with data from g; its outputs are
// compared between the CPU reference and the CUDA backend.
type opCase struct {
	name string
	run  func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor
}

func attnBatch(seqs []backend.SeqSpan) *backend.Batch {
	b := &backend.Batch{}
	for _, s := range seqs {
		s.Offset = len(b.Tokens)
		for j := 0; j < s.Len; j++ {
			b.Tokens = append(b.Tokens, 1)
			b.Positions = append(b.Positions, int32(s.Past+j))
		}
		b.Seqs = append(b.Seqs, s)
	}
	return b
}

// attnSteps runs chunked prefill then decode for two paged sequences with
// scattered block tables and one unpaged one (rolled back once). Keys and
// values are bf16-exact (g.kv): the CUDA cache stores them in bf16.
func attnSteps(t testing.TB, be backend.Backend, g *gen, p *backend.AttnParams, withSinks bool) []backend.Tensor {
	if err := be.InitKV(4, 40); err != nil {
		t.Fatal(err)
	}
	if withSinks {
		p.Sinks = W(t, be, g.f32(2, p.NumHeads))
	}
	A := []int32{17, 3, 29, 8, 0, 35, 12, 21}
	B := []int32{5, 38, 2, 14, 27, 9, 30, 1}
	const U = 1 << 40 // unpaged id
	steps := [][]backend.SeqSpan{
		{{ID: 1, Len: 7, Past: 0, Blocks: A[:2]}, {ID: 2, Len: 3, Past: 0, Blocks: B[:1]}, {ID: U, Len: 6}},
		{{ID: 1, Len: 5, Past: 7, Blocks: A[:3]}, {ID: 2, Len: 9, Past: 3, Blocks: B[:3]}, {ID: U, Len: 4, Past: 3}}, // U rolled back to 3
		{{ID: 1, Len: 1, Past: 12, Blocks: A[:4]}, {ID: 2, Len: 1, Past: 12, Blocks: B[:4]}, {ID: U, Len: 1, Past: 7}},
		{{ID: 2, Len: 1, Past: 13, Blocks: B[:4]}, {ID: 1, Len: 1, Past: 13, Blocks: A[:4]}, {ID: U, Len: 1, Past: 8}},
	}
	var out []backend.Tensor
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	for _, s := range steps {
		b := attnBatch(s)
		T := len(b.Tokens)
		q := W(t, be, g.f32(1, T, H*D))
		k := W(t, be, g.kv(1, T, KV*D))
		v := W(t, be, g.kv(1, T, KV*Dv))
		out = append(out, be.Attention(q, k, v, b, p))
	}
	// Copy-on-write: sequence 3 continues from a copy of 1's blocks.
	C := []int32{33, 34, 36, 37}
	be.CopyBlocks(A[:4], C)
	b := attnBatch([]backend.SeqSpan{{ID: 3, Len: 2, Past: 14, Blocks: C}})
	out = append(out, be.Attention(W(t, be, g.f32(1, 2, H*D)), W(t, be, g.kv(1, 2, KV*D)), W(t, be, g.kv(1, 2, KV*Dv)), b, p))
	be.FreeSequence(U)
	b = attnBatch([]backend.SeqSpan{{ID: U, Len: 3}})
	out = append(out, be.Attention(W(t, be, g.f32(1, 3, H*D)), W(t, be, g.kv(1, 3, KV*D)), W(t, be, g.kv(1, 3, KV*Dv)), b, p))
	return out
}

func moeLayer(t testing.TB, be backend.Backend, g *gen, E, H, I int, r moe.RouterConfig, act moe.Activation, biases, shared bool) *backend.MoELayer {
	return moeLayerOf(t, be, g, g.bf16, E, H, I, r, act, biases, shared)
}

// moeLayerOf is moeLayer with the router, expert and shared-expert weights
// made by wt (g.bf16 or g.f32).
func moeLayerOf(t testing.TB, be backend.Backend, g *gen, wt func(float32, ...int) *tensor.Host, E, H, I int, r moe.RouterConfig, act moe.Activation, biases, shared bool) *backend.MoELayer {
	l := &backend.MoELayer{Layer: 3, Router: r, Act: act,
		Gate:   W(t, be, wt(1, E, H)),
		GateUp: W(t, be, wt(0.5, E, 2*I, H)),
		Down:   W(t, be, wt(0.5, E, H, I)),
	}
	if biases {
		l.GateBias = W(t, be, g.f32(0.3, E))
		l.GateUpBias = W(t, be, g.f32(0.3, E, 2*I))
		l.DownBias = W(t, be, g.f32(0.3, E, H))
		if r.Scoring == moe.Sigmoid {
			l.ScoreBias = W(t, be, g.f32(0.1, E))
		}
	}
	if shared {
		l.Shared = &backend.MLP{GateUp: W(t, be, wt(0.5, 2*I+2, H)), Down: W(t, be, wt(0.5, H, I+1))}
		l.SharedGate = W(t, be, g.f32(0.5, 1, H))
	}
	return l
}

var opCases = []opCase{
	{"latent_attention_big", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return latentSteps(t, be, g, backend.ValuesInKeysOn(be)) // the latent once a token where the backend can
	}},
	{"latent_attention_big_vcached", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return latentSteps(t, be, g, false) // the latent again as values
	}},
	{"embed_bf16", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return []backend.Tensor{be.Embed(W(t, be, g.bf16(1, 37, 24)), []int32{3, 36, 0, 3, 17})}
	}},
	{"embed_f32", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return []backend.Tensor{be.Embed(W(t, be, g.f32(1, 11, 7)), []int32{10, 2})}
	}},
	{"linear_bias", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x, w, b := W(t, be, g.f32(1, 5, 33)), W(t, be, g.bf16(1, 19, 33)), W(t, be, g.f32(1, 19))
		return []backend.Tensor{be.Linear(x, w, b), be.Linear(x, W(t, be, g.f32(1, 3, 33)), nil)}
	}},
	{"rmsnorm_grouped", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x := W(t, be, g.f32(3, 7, 36))
		return []backend.Tensor{be.RMSNorm(x, W(t, be, g.f32(1, 12)), 1e-6), be.RMSNorm(x, W(t, be, g.bf16(1, 36)), 1e-5)}
	}},
	{"add_rmsnorm", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		// The CPU runs Add then RMSNorm (backend.AddRMSNorm's fallback); the
		// GPU one fused launch, bf16 and f32 norm weights, 1 and 37 rows.
		var out []backend.Tensor
		for _, rows := range []int{1, 37} {
			x, r := W(t, be, g.f32(1, rows, 200)), W(t, be, g.f32(1, rows, 200))
			for _, w := range []backend.Tensor{W(t, be, g.bf16(1, 200)), W(t, be, g.f32(1, 200))} {
				sum, n := backend.AddRMSNorm(be, x, r, w, 1e-6)
				out = append(out, sum, n)
			}
		}
		return out
	}},
	{"add_clamp_swiglu", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		a, b := W(t, be, g.f32(4, 6, 26)), W(t, be, g.f32(4, 6, 26))
		return []backend.Tensor{be.Add(a, b), be.Clamp(a, 1.5), be.SwiGLU(a)}
	}},
	{"split_concat", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x := W(t, be, g.f32(1, 5, 3*10))
		p := be.SplitCols(x, 3, 4, 6)
		one := W(t, be, g.f32(1, 5, 2))
		return append(p, be.ConcatCols(3, []backend.Tensor{p[1], one, p[0]}, []int{6, 2, 4}))
	}},
	{"rope", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x := W(t, be, g.f32(1, 6, 3*10))
		pos := []int32{0, 1, 77, 4095, 5000, 123456}
		yarn := &attention.RoPE{Dim: 8, Theta: 50000, Style: attention.Interleaved,
			Scaling: attention.RoPEScaling{Type: "yarn", Factor: 4, OriginalMaxPos: 4096, MScale: 1, MScaleAllDim: 0.5}}
		return []backend.Tensor{
			be.RoPE(x, 3, 10, &attention.RoPE{Dim: 10, Theta: 10000}, pos),
			be.RoPE(x, 3, 10, &attention.RoPE{Dim: 6, Theta: 1e6}, pos),
			be.RoPE(x, 3, 10, yarn, pos),
		}
	}},
	// backend.NormRoPE: q and k fused on cuda for per-head norms or none
	// (the CPU backend runs RMSNorm then RoPE), the ops one by one for
	// norms over all heads.
	{"norm_rope", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		q, k := W(t, be, g.f32(2, 6, 4*16)), W(t, be, g.f32(2, 6, 2*16))
		pos := []int32{0, 3, 77, 4095, 5000, 123456}
		yarn := &attention.RoPE{Dim: 8, Theta: 50000, Style: attention.Interleaved,
			Scaling: attention.RoPEScaling{Type: "yarn", Factor: 4, OriginalMaxPos: 4096, MScale: 1, MScaleAllDim: 0.5}}
		qHead, kHead := W(t, be, g.f32(0.5, 16)), W(t, be, g.f32(0.5, 16))
		qAll, kAll := W(t, be, g.f32(0.5, 4*16)), W(t, be, g.f32(0.5, 2*16))
		var out []backend.Tensor
		for _, c := range []struct {
			qw, kw backend.Tensor
			eps    float32
			rope   *attention.RoPE
		}{
			{qHead, kHead, 1e-6, &attention.RoPE{Dim: 16, Theta: 1e6}},
			{qHead, kHead, 1e-5, yarn},
			{nil, nil, 0, &attention.RoPE{Dim: 10, Theta: 10000}},
			{qAll, kAll, 1e-6, &attention.RoPE{Dim: 16, Theta: 1e6}},
		} {
			qo, ko := backend.NormRoPE(be, q, k, c.qw, c.kw, c.eps, 4, 2, 16, c.rope, pos)
			out = append(out, qo, ko)
		}
		return out
	}},
	// backend.LinearMulti: q, k and v of one activation (one launch on cuda
	// for decode-sized rows in the fast profile; with and without biases).
	{"linear_multi", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		var out []backend.Tensor
		for _, rows := range []int{1, 2, 9} {
			x := W(t, be, g.f32(1, rows, 64))
			ws := []backend.Tensor{W(t, be, g.bf16(0.5, 96, 64)), W(t, be, g.bf16(0.5, 32, 64)), W(t, be, g.bf16(0.5, 32, 64))}
			out = append(out, backend.LinearMulti(be, x, ws, nil)...)
			bs := []backend.Tensor{W(t, be, g.f32(1, 96)), nil, W(t, be, g.f32(1, 32))}
			out = append(out, backend.LinearMulti(be, x, ws, bs)...)
		}
		return out
	}},
	{"mlp_rows", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x := W(t, be, g.f32(1, 9, 16))
		y := be.MLP(x, &backend.MLP{GateUp: W(t, be, g.bf16(0.5, 2*11, 16)), Down: W(t, be, g.bf16(0.5, 16, 11))})
		return []backend.Tensor{y, be.Rows(y, []int{8, 0, 4})}
	}},
	{"mlp_f32_weights", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		x := W(t, be, g.f32(1, 7, 40))
		return []backend.Tensor{be.MLP(x, &backend.MLP{GateUp: W(t, be, g.f32(0.5, 2*24, 40)), Down: W(t, be, g.f32(0.5, 40, 24))})}
	}},
	{"attention_gqa", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return attnSteps(t, be, g, &backend.AttnParams{Layer: 0, NumHeads: 6, NumKVHeads: 2, HeadDim: 16, VHeadDim: 16, Scale: 0.25}, false)
	}},
	{"attention_window_sinks_dv", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return attnSteps(t, be, g, &backend.AttnParams{Layer: 2, NumHeads: 4, NumKVHeads: 4, HeadDim: 24, VHeadDim: 8, Scale: 0.2, Window: 5}, true)
	}},
	// Head dims of real checkpoints (the fast profile's paged kernel is then
	// the warp-split one: PagedWarp).
	{"attention_d128_g4", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return attnSteps(t, be, g, &backend.AttnParams{Layer: 3, NumHeads: 8, NumKVHeads: 2, HeadDim: 128, VHeadDim: 128, Scale: 0.088}, false)
	}},
	{"attention_d64_g8_window_sinks", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		return attnSteps(t, be, g, &backend.AttnParams{Layer: 4, NumHeads: 16, NumKVHeads: 2, HeadDim: 64, VHeadDim: 64, Scale: 0.125, Window: 6}, true)
	}},
	{"moe_softmax_shared", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		l := moeLayer(t, be, g, 8, 16, 12, moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true},
			moe.Activation{Kind: moe.SwiGLU}, false, true)
		// 13 rows: router GEMM then routing; 3 rows (fast profile): one launch (MoERouterRoute).
		return []backend.Tensor{be.MoE(W(t, be, g.f32(1, 13, 16)), l), be.MoE(W(t, be, g.f32(1, 3, 16)), l)}
	}},
	{"moe_sigmoid_bias_clamped", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		l := moeLayer(t, be, g, 10, 12, 8, moe.RouterConfig{NumExperts: 10, TopK: 4, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2.5, NumGroups: 5, TopKGroups: 2},
			moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 0.6}, true, false)
		return []backend.Tensor{be.MoE(W(t, be, g.f32(2, 21, 12)), l), be.MoE(W(t, be, g.f32(2, 2, 12)), l)}
	}},
	{"moe_f32_weights_shared", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		l := moeLayerOf(t, be, g, g.f32, 6, 24, 10, moe.RouterConfig{NumExperts: 6, TopK: 2, Scoring: moe.Softmax},
			moe.Activation{Kind: moe.SwiGLU}, true, true)
		return []backend.Tensor{be.MoE(W(t, be, g.f32(1, 17, 24)), l)}
	}},
	{"moe_softmax_topk_biases", func(t testing.TB, be backend.Backend, g *gen) []backend.Tensor {
		l := moeLayer(t, be, g, 4, 20, 6, moe.RouterConfig{NumExperts: 4, TopK: 2, Scoring: moe.Softmax, SoftmaxTopK: true},
			moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 7}, true, true)
		return []backend.Tensor{be.MoE(W(t, be, g.f32(1, 1, 20)), l), be.MoE(W(t, be, g.f32(1, 40, 20)), l)}
	}},
}

// TestOpsMatchCPU runs every op on the CPU reference and on the GPU with the
// same fresh random data and compares, in both GEMM modes:
//   - split (the default): float32 inputs are not bf16-exact, bf16-weight
//     GEMMs run on hi + lo halves, float32-weight GEMMs in FP32: relative
//     L2 ≤ 5e-5 (worst seen on the H200: 4.3e-6);
//   - fast (SplitActivations false): float32 inputs are bf16-exact (so the
//     router sees the CPU's inputs), intermediate activations are rounded
//     to bf16 before bf16-weight GEMMs: relative L2 ≤ 1e-2 (worst seen:
//     1.6e-3).
//
// NaN never passes.
func TestOpsMatchCPU(t *testing.T) {
	split := gpuBackend(t)
	off := false
	fast, err := New(Options{SplitActivations: &off})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name  string
		be    *Backend
		round bool
		tol   float64
	}{{"split", split, false, 5e-5}, {"fast", fast, true, 1e-2}} {
		for i, c := range opCases {
			t.Run(mode.name+"/"+c.name, func(t *testing.T) {
				gb := mode.be
				seed := uint64(i*7919) + 0x1234
				t.Logf("seed %#x", seed)
				cb := cpu.New(cpu.Options{})
				gb.TakeExpertLoad() // what earlier tests in this process left on the shared backend
				want := c.run(t, cb, newGen(seed, mode.round))
				got := c.run(t, gb, newGen(seed, mode.round))
				if len(got) != len(want) {
					t.Fatalf("%d outputs, want %d", len(got), len(want))
				}
				worst := 0.0
				for j := range want {
					if fmt.Sprint(got[j].Shape()) != fmt.Sprint(want[j].Shape()) {
						t.Fatalf("output %d: shape %v, want %v", j, got[j].Shape(), want[j].Shape())
					}
					e := relL2(gb.ToHost(got[j]), cb.ToHost(want[j]))
					worst = max(worst, e)
					if !(e <= mode.tol) {
						t.Errorf("output %d %v: relative L2 %.3g > %.0e", j, want[j].Shape(), e, mode.tol)
					}
				}
				t.Logf("OPS %s %s: worst relative L2 %.3g over %d outputs", mode.name, c.name, worst, len(want))
				if c.name[:3] == "moe" {
					if gl, cl := gb.TakeExpertLoad(), cb.TakeExpertLoad(); fmt.Sprint(gl) != fmt.Sprint(cl) {
						t.Errorf("expert load %v, CPU %v", gl, cl)
					}
				}
			})
		}
	}
}

// TestAddRMSNormExact: the fused add + norm gives bit for bit what Add then
// RMSNorm give on the GPU (the model's forward pass now uses the fused one).
func TestAddRMSNormExact(t *testing.T) {
	be := gpuBackend(t)
	g := newGen(0x5eed, false)
	for _, shape := range [][2]int{{1, 2048}, {3, 4096}, {64, 7168}, {5, 8}} {
		x, r := W(t, be, g.f32(1, shape[0], shape[1])), W(t, be, g.f32(1, shape[0], shape[1]))
		w := W(t, be, g.bf16(1, shape[1]))
		sum, n := be.AddRMSNorm(x, r, w, 1e-5)
		wantSum := be.Add(x, r)
		wantN := be.RMSNorm(wantSum, w, 1e-5)
		for i, p := range [][2]backend.Tensor{{sum, wantSum}, {n, wantN}} {
			got, want := be.ToHost(p[0]), be.ToHost(p[1])
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("%v output %d element %d: %g, separate ops %g", shape, i, j, got[j], want[j])
				}
			}
		}
	}
}

// TestWeightErrors: bad host tensors give errors, not panics.
func TestWeightErrors(t *testing.T) {
	be := gpuBackend(t)
	for _, h := range []*tensor.Host{nil, {Name: "i", DType: tensor.I32, Shape: []int{2}, Data: make([]byte, 8)},
		{Name: "short", DType: tensor.F32, Shape: []int{3}, Data: make([]byte, 8)}} {
		if _, err := be.Weight(h); err == nil {
			t.Errorf("Weight(%v) gave no error", h)
		}
	}
}

// TestNewEPUnsupported: expert parallelism is refused clearly.
func TestNewEPUnsupported(t *testing.T) {
	if _, err := New(Options{EPRanks: 2}); err == nil {
		t.Fatal("New with EPRanks 2 gave no error")
	}
}

// latentSteps runs MLA's LatentAttention (backend.LatentAttender) with head
// dims past 256 (latent 256 ‖ rope 32: the CUDA backend's paged_attn_big)
// through a prefill step (a 40-token prompt, which the CPU backend attends
// decompressed, and a 3-token one), then a decode step, on paged and unpaged
// sequences. The latent and rope keys are bf16-exact (the CUDA cache
// stores them in bf16), and so are the weights.
func latentSteps(t testing.TB, be backend.Backend, g *gen, valuesInKeys bool) []backend.Tensor {
	la, ok := be.(backend.LatentAttender)
	if !ok {
		t.Fatalf("%T is not a backend.LatentAttender", be)
	}
	const H, L, R, N, V = 4, 256, 32, 16, 24
	if err := be.InitKV(16, 12); err != nil {
		t.Fatal(err)
	}
	kvb := g.vals(H*(N+V)*L, 0.2, true) // kv_b_proj [H*(N+V), L]
	ukt, uk, uv := make([]float32, H*L*N), make([]float32, 0, H*N*L), make([]float32, 0, H*V*L)
	for h := range H {
		for a := range N {
			for x := range L {
				ukt[(h*L+x)*N+a] = kvb[(h*(N+V)+a)*L+x]
			}
		}
		uk = append(uk, kvb[h*(N+V)*L:(h*(N+V)+N)*L]...)
		uv = append(uv, kvb[(h*(N+V)+N)*L:(h+1)*(N+V)*L]...)
	}
	bf := func(v []float32, rows, cols int) backend.Tensor {
		return W(t, be, tensor.ToBF16(tensor.FromFloat32("w", []int{rows, cols}, v)))
	}
	w := &backend.MLAWeights{Lora: L, Nope: N, Rope: R, V: V, UKT: bf(ukt, H*L, N), UK: bf(uk, H*N, L), UV: bf(uv, H*V, L)}
	p := backend.MLAParams(5, H, w, 0.2, valuesInKeys)
	const U = 1<<40 + 7 // unpaged id
	A := []int32{9, 2, 11}
	steps := [][]backend.SeqSpan{
		{{ID: 1, Len: 40, Blocks: A}, {ID: U, Len: 3}},
		{{ID: U, Len: 1, Past: 3}, {ID: 1, Len: 1, Past: 40, Blocks: A}},
	}
	var out []backend.Tensor
	for _, s := range steps {
		b := attnBatch(s)
		T := len(b.Tokens)
		qn, qp := W(t, be, g.f32(1, T, H*N)), W(t, be, g.f32(1, T, H*R))
		c, kp := W(t, be, g.kv(1, T, L)), W(t, be, g.kv(1, T, R))
		out = append(out, la.LatentAttention(qn, qp, c, kp, b, &p, w))
	}
	be.FreeSequence(U)
	return out
}
