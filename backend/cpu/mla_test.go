package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/backend"
)

// mlaRef is one MLA layer's reference: kv_b [H*(N+V), L] and, per
// sequence, every token's latent c [L] and rotated rope key [R].
type mlaRef struct {
	H, L, R, N, V int
	kvb           []float32
	c, kpe        map[uint64][][]float32
}

// attend is the decompressed attention of one query row in float64: keys
// [W_UK_h·c ‖ kpe], values W_UV_h·c over the sequence's first n tokens.
func (m *mlaRef) attend(id uint64, n int, qn, qp []float32, scale float64) []float64 {
	H, L, R, N, V := m.H, m.L, m.R, m.N, m.V
	out := make([]float64, H*V)
	for h := range H {
		row := func(r int) []float32 { return m.kvb[(h*(N+V)+r)*L : (h*(N+V)+r+1)*L] }
		s := make([]float64, n)
		mx := math.Inf(-1)
		for j := range n {
			var d float64
			for a := range N {
				var k float64
				for x, cv := range m.c[id][j] {
					k += float64(row(a)[x]) * float64(cv)
				}
				d += float64(qn[h*N+a]) * k
			}
			for a := range R {
				d += float64(qp[h*R+a]) * float64(m.kpe[id][j][a])
			}
			s[j] = d * scale
			mx = max(mx, s[j])
		}
		var sum float64
		for j := range n {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		for a := range V {
			var o float64
			for j := range n {
				var v float64
				for x, cv := range m.c[id][j] {
					v += float64(row(N + a)[x]) * float64(cv)
				}
				o += s[j] / sum * v
			}
			out[h*V+a] = o
		}
	}
	return out
}

// TestLatentAttention runs two sequences through a long fresh prompt
// (decompressed), chunks and decode steps (absorbed), on the unpaged and the
// paged cache, with the latent stored again as values and kept inside the
// keys (AttnParams.ValuesInKeys), against the decompressed attention in
// float64; it checks the cache widths and that both forms ran.
func TestLatentAttention(t *testing.T) {
	const H, L, R, N, V = 4, 32, 8, 16, 24
	type span = backend.SeqSpan
	steps := [][]span{
		{{ID: 1, Len: 60}, {ID: 2, Len: 3}},                   // fresh prompts (decompressed)
		{{ID: 1, Len: 1, Past: 60}, {ID: 2, Len: 5, Past: 3}}, // decode and a short chunk (absorbed)
		{{ID: 1, Len: 1, Past: 61}, {ID: 2, Len: 1, Past: 8}},
		{{ID: 2, Len: 40, Past: 9}}, // a long chunk after a history
	}
	if !mlaDecompress(60, 0, L, R, N, V) || mlaDecompress(1, 60, L, R, N, V) || mlaDecompress(5, 3, L, R, N, V) {
		t.Fatal("the steps no longer run both forms: adjust them to mlaDecompress")
	}
	for _, mode := range []struct{ paged, vk bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		paged := mode.paged
		t.Run(fmt.Sprintf("paged=%v/vk=%v", paged, mode.vk), func(t *testing.T) {
			r := newRand(t)
			be := New(Options{F32Weights: true})
			ref := &mlaRef{H: H, L: L, R: R, N: N, V: V, kvb: randVec(r, H*(N+V)*L, 0.3),
				c: map[uint64][][]float32{}, kpe: map[uint64][][]float32{}}
			w := &backend.MLAWeights{Lora: L, Nope: N, Rope: R, V: V}
			ukt, uk, uv := make([]float32, H*L*N), make([]float32, 0, H*N*L), make([]float32, 0, H*V*L)
			for h := range H {
				for a := range N {
					for x := range L {
						ukt[(h*L+x)*N+a] = ref.kvb[(h*(N+V)+a)*L+x]
					}
				}
				uk = append(uk, ref.kvb[h*(N+V)*L:(h*(N+V)+N)*L]...)
				uv = append(uv, ref.kvb[(h*(N+V)+N)*L:(h+1)*(N+V)*L]...)
			}
			w.UKT, w.UK, w.UV = FromFloat32([]int{H * L, N}, ukt), FromFloat32([]int{H * N, L}, uk), FromFloat32([]int{H * V, L}, uv)
			scale := float32(1 / math.Sqrt(N+R))
			p := backend.MLAParams(3, H, w, scale, mode.vk)
			tables := map[uint64][]int32{}
			if paged {
				if err := be.InitKV(16, 32); err != nil {
					t.Fatal(err)
				}
				next := int32(31)
				for _, s := range []uint64{1, 2} {
					for range 8 {
						tables[s] = append(tables[s], next)
						next--
					}
				}
			}
			for si, st := range steps {
				for i := range st {
					st[i].Blocks = tables[st[i].ID] // nil unpaged
				}
				b := batchOf(r, st...)
				T := len(b.Tokens)
				qn, qp := randVec(r, T*H*N, 1), randVec(r, T*H*R, 1)
				c, kpe := randVec(r, T*L, 1), randVec(r, T*R, 1)
				for _, s := range b.Seqs {
					for j := range s.Len {
						t0 := s.Offset + j
						ref.c[s.ID] = append(ref.c[s.ID], c[t0*L:(t0+1)*L])
						ref.kpe[s.ID] = append(ref.kpe[s.ID], kpe[t0*R:(t0+1)*R])
					}
				}
				got := data(t, be.LatentAttention(FromFloat32([]int{T, H * N}, qn), FromFloat32([]int{T, H * R}, qp),
					FromFloat32([]int{T, L}, c), FromFloat32([]int{T, R}, kpe), b, &p, w))
				for _, s := range b.Seqs {
					for j := range s.Len {
						t0 := s.Offset + j
						want := ref.attend(s.ID, s.Past+j+1, qn[t0*H*N:(t0+1)*H*N], qp[t0*H*R:(t0+1)*H*R], float64(scale))
						checkClose(t, fmt.Sprintf("step %d seq %d row %d", si, s.ID, j), got[t0*H*V:(t0+1)*H*V], want, 1e-4)
					}
				}
			}
			if !paged {
				if n := be.cachedTokens(2, 3); n != 49 {
					t.Fatalf("sequence 2 has %d tokens cached, want 49", n)
				}
				c := be.kv[2].layer(3)
				if wantV := map[bool]int{false: 49 * L, true: 0}[mode.vk]; c.kw != L+R || len(c.v) != wantV {
					t.Fatalf("cache widths %d/%d holding %d values, want %d/… holding %d", c.kw, c.vw, len(c.v), L+R, wantV)
				}
			} else if pl := be.paged.layers[3]; pl.kw != L+R || (len(pl.v) == 0) != mode.vk {
				t.Fatalf("paged cache widths %d/%d (%d values), values in keys %v", pl.kw, pl.vw, len(pl.v), mode.vk)
			}
		})
	}
	be := New(Options{})
	w := &backend.MLAWeights{Lora: L, Nope: N, Rope: R, V: V}
	bad := backend.AttnParams{Layer: 0, NumHeads: H, NumKVHeads: H, HeadDim: N + R, VHeadDim: V}
	mustPanic(t, "want MLAParams", func() {
		be.LatentAttention(nil, nil, nil, nil, batchOf(newRand(t), backend.SeqSpan{ID: 1, Len: 1}), &bad, w)
	})
}
