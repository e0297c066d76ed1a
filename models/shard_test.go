package models

import (
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
)

// sharder is the CPU backend keeping experts [lo·E/R, hi·E/R) of each layer
// (only the loading is tested: the CPU backend's MoE does not read
// LocalExperts).
type sharder struct {
	*cpu.Backend
	r, R int
}

func (s sharder) ExpertShard(E int) (int, int) {
	return (s.r*E + s.R - 1) / s.R, ((s.r+1)*E + s.R - 1) / s.R
}

var _ backend.ExpertSharder = sharder{}

// TestLoadExpertShard: with an ExpertSharder backend the loader uploads only
// the rank's block of every MoE layer's experts, per-expert tensors and
// stacked ones alike, says which in MoELayer, and still counts every
// checkpoint tensor as used.
func TestLoadExpertShard(t *testing.T) {
	for _, fam := range []string{"qwen3_moe", "mixtral", "deepseek_v3", "olmoe", "gpt_oss"} {
		for _, rk := range [][2]int{{0, 2}, {1, 2}, {2, 3}} {
			be := sharder{cpu.New(cpu.Options{}), rk[0], rk[1]}
			l, err := Load("testdata/golden/"+fam, be, LoadOptions{})
			if err != nil {
				t.Fatalf("%s rank %v: %v", fam, rk, err)
			}
			d, ok := l.Model.(*decoder)
			if !ok {
				t.Fatalf("%s: model %T", fam, l.Model)
			}
			E, I, H := l.Config.NumExperts, l.Config.MoEIntermediateSize, l.Config.HiddenSize
			lo, hi := be.ExpertShard(E)
			n := 0
			for i, ly := range d.layers {
				f, ok := ly.ffn.(*moeFFN)
				if !ok {
					continue
				}
				n++
				m := &f.l
				if m.ExpertLo != lo || m.LocalExperts != hi-lo {
					t.Errorf("%s rank %v layer %d: experts [%d, +%d), want [%d, %d)", fam, rk, i, m.ExpertLo, m.LocalExperts, lo, hi)
				}
				if s := m.GateUp.Shape(); s[0] != (hi-lo)*2*I || s[1] != H {
					t.Errorf("%s rank %v layer %d: GateUp %v, want [%d, %d]", fam, rk, i, s, (hi-lo)*2*I, H)
				}
				if s := m.Down.Shape(); s[0] != (hi-lo)*H || s[1] != I {
					t.Errorf("%s rank %v layer %d: Down %v, want [%d, %d]", fam, rk, i, s, (hi-lo)*H, I)
				}
				if m.GateUpBias != nil {
					if s := m.GateUpBias.Shape(); s[0]*s[len(s)-1] != (hi-lo)*2*I {
						t.Errorf("%s rank %v layer %d: GateUpBias %v, want %d values", fam, rk, i, s, (hi-lo)*2*I)
					}
				}
			}
			if n == 0 {
				t.Errorf("%s: no MoE layer found", fam)
			}
			l.Close()
		}
	}
}
