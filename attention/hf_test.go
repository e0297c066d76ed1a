package attention

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// hfGolden is testdata/hf_golden.json, written by testdata/gen_hf.py with
// transformers 5.17 / torch 2.11 on CPU in float32.
type hfGolden struct {
	Transformers    string   `json:"transformers"`
	DeepseekScaling float64  `json:"deepseek_scaling"`
	DeepseekQKDim   int      `json:"deepseek_qk_head_dim"`
	Rope            []hfRope `json:"rope"`
	Attn            []hfAttn `json:"attn"`
}

// hfRope is one rotary case: x [pos, heads*head_dim] rotated into out.
type hfRope struct {
	Name    string         `json:"name"`
	Style   string         `json:"style"`
	Layout  string         `json:"layout"` // "neox", or "halves": DeepSeek's [evens | odds] output
	Params  map[string]any `json:"rope_parameters"`
	InvFreq []float64      `json:"inv_freq"`
	AttnScl float64        `json:"attention_scaling"`
	Heads   int            `json:"heads"`
	HeadDim int            `json:"head_dim"`
	Pos     []int32        `json:"pos"`
	X       []float32      `json:"x"`
	Out     []float32      `json:"out"`
}

// hfAttn is one eager-attention case in the layout of Causal.
type hfAttn struct {
	Name   string    `json:"name"`
	H      int       `json:"heads"`
	KV     int       `json:"kv_heads"`
	D      int       `json:"head_dim"`
	Dv     int       `json:"v_head_dim"`
	Tq     int       `json:"tq"`
	Past   int       `json:"past"`
	Window int       `json:"window"`
	Scale  float32   `json:"scale"`
	Sinks  []float32 `json:"sinks"`
	Q      []float32 `json:"q"`
	K      []float32 `json:"k"`
	V      []float32 `json:"v"`
	Out    []float32 `json:"out"`
}

func loadGolden(t *testing.T) *hfGolden {
	t.Helper()
	b, err := os.ReadFile("testdata/hf_golden.json")
	if err != nil {
		t.Fatalf("read golden data: %v", err)
	}
	var g hfGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("parse testdata/hf_golden.json: %v", err)
	}
	if len(g.Rope) == 0 || len(g.Attn) == 0 {
		t.Fatalf("testdata/hf_golden.json has %d rope and %d attention cases", len(g.Rope), len(g.Attn))
	}
	return &g
}

// ropeFromHF builds a RoPE from a transformers rope_parameters dict.
func ropeFromHF(t *testing.T, p map[string]any, dim int, style string) RoPE {
	t.Helper()
	num := func(k string) float64 {
		v, _ := p[k].(float64)
		return v
	}
	r := RoPE{Dim: dim, Theta: num("rope_theta"), Scaling: RoPEScaling{
		Type: p["rope_type"].(string), Factor: num("factor"), OriginalMaxPos: int(num("original_max_position_embeddings")),
		BetaFast: num("beta_fast"), BetaSlow: num("beta_slow"), MScale: num("mscale"), MScaleAllDim: num("mscale_all_dim"),
		AttentionFactor: num("attention_factor"), LowFreqFactor: num("low_freq_factor"), HighFreqFactor: num("high_freq_factor"),
	}}
	if tr, ok := p["truncate"].(bool); ok {
		r.Scaling.Truncate = &tr
	}
	if style == "interleaved" {
		r.Style = Interleaved
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("rope_parameters %v: %v", p, err)
	}
	return r
}

func TestRoPEMatchesTransformers(t *testing.T) {
	g := loadGolden(t)
	for _, c := range g.Rope {
		t.Run(c.Name, func(t *testing.T) {
			r := ropeFromHF(t, c.Params, 2*len(c.InvFreq), c.Style)
			inv, attn := r.Freqs()
			if float32(attn) != float32(c.AttnScl) {
				t.Errorf("attention factor %v, transformers %v", attn, c.AttnScl)
			}
			for i := range inv {
				// float32 pow may differ by an ulp between libms.
				got, want := float32(inv[i]), float32(c.InvFreq[i])
				if got != want && math.Nextafter32(got, want) != want {
					t.Errorf("inv_freq[%d] = %v, transformers %v", i, got, want)
				}
			}
			rows, hd := len(c.Pos), c.HeadDim
			x := append([]float32(nil), c.X...)
			r.Apply(x, rows, c.Heads, hd, c.Pos)
			for row := range rows {
				for h := range c.Heads {
					for i := range hd {
						j := i // index in transformers' output
						if c.Layout == "halves" {
							j = i/2 + (i%2)*hd/2
						}
						got := x[(row*c.Heads+h)*hd+i]
						want := c.Out[(row*c.Heads+h)*hd+j]
						// An ulp of inv_freq moves the angle by pos·2^-24 rad.
						tol := 2e-6*(1+math.Abs(float64(want))) + 1.5e-7*float64(c.Pos[row])
						if math.Abs(float64(got-want)) > tol {
							t.Fatalf("pos %d head %d dim %d: %v, transformers %v", c.Pos[row], h, i, got, want)
						}
					}
				}
			}
		})
	}
}

func TestCausalMatchesTransformers(t *testing.T) {
	g := loadGolden(t)
	// DeepSeek-V3's softmax scale: qk_head_dim^-0.5 · YaRNMScale(40, 1)².
	ms := YaRNMScale(40, 1)
	if want := math.Pow(float64(g.DeepseekQKDim), -0.5) * ms * ms; math.Abs(want-g.DeepseekScaling) > 1e-12 {
		t.Errorf("DeepSeek scaling %v, transformers %v", want, g.DeepseekScaling)
	}
	for _, c := range g.Attn {
		t.Run(c.Name, func(t *testing.T) {
			p := &Params{NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.Dv,
				Scale: c.Scale, Window: c.Window, Sinks: c.Sinks}
			out := make([]float32, c.Tq*c.H*c.Dv)
			Causal(out, c.Q, c.K, c.V, c.Tq, c.Past, p)
			for i := range out {
				if d := math.Abs(float64(out[i] - c.Out[i])); d > 2e-6*(1+math.Abs(float64(c.Out[i]))) {
					t.Fatalf("out[%d] = %v, transformers %v", i, out[i], c.Out[i])
				}
			}
		})
	}
}
