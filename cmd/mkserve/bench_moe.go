package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

func init() { benches["moe"] = benchMoE }

// moeBenchOpts are the flags of `mkserve bench moe`.
type moeBenchOpts struct {
	hidden, inter, experts, topk int
	routing                      string // softmax or grouped
	path                         string // fused (default) or grouped
	tokens                       []int
	ranks, shared                int
	ctas, dispatchCTAs           int     // fused path: persistent CTAs and dispatch-role CTAs (0: defaults)
	tile                         int     // fused path: kernels.MoEFusedArgs.Tile (0: picked)
	maxRowsFactor                float64 // fused path: MaxRows as a multiple of a rank's balanced share (tokens·topk); 0: all rows
	tuneOut                      string  // fused path: sweep the launch choices and record the best in this table
	traceOut                     string  // fused path: trace the last launch's tasks per token count into this file (JSON lines)
	sameToken                    bool    // grouped path: all tokens one row (every token routes alike)
	weights                      string  // grouped path: bf16 or fp4 expert weights
	graph                        bool    // time each layer as one CUDA graph replay (ms); eager launches go to eager_ms
	iters, checkRows             int
	seed                         uint64
	scoreBias                    float64 // grouped routing: std of the random e_score_correction_bias (0: zeros)
	json                         bool
	world                        worldFlags    // --world R: one process per rank and GPU (bench_moe_ep.go)
	shapes                       string        // --world: named shapes
	kernelTimeout                time.Duration // --world: the fused kernel's bound on each wait
}

// moeBenchRow is one token count's result. ms is the timed layer: with
// --path fused (the default), per rank router GEMM → routing (→ shared
// expert MLP), then mk_moe_fused over all ranks; separate_ms is the same
// layer with mk_moe_fused_separate (baseline (a): dispatch launch, grouped
// experts per rank, combine launch). With --path grouped (one rank): router
// GEMM → routing and grouped experts → combine (MoERouteExpertsRun, as the
// CUDA backend runs it), no separate_ms.
type moeBenchRow struct {
	Tokens         int                      `json:"tokens"`
	MS             float64                  `json:"ms"`                    // median over iterations, CUDA events, whole layer
	SeparateMS     *float64                 `json:"separate_ms,omitempty"` // fused path: the same layer from separate launches (baseline (a))
	Graph          bool                     `json:"graph"`                 // ms and separate_ms are CUDA graph replays of the layer (--graph)
	EagerMS        *float64                 `json:"eager_ms,omitempty"`    // --graph: the same layer launched op by op from the host
	EagerSepMS     *float64                 `json:"eager_separate_ms,omitempty"`
	ExpertsMS      float64                  `json:"experts_ms"`      // median of the expert part alone (fused: routing + plan + persistent launch, one MoEFused call; grouped: routing + align + GEMM1 + GEMM2 + combine, one MoERouteExpertsRun)
	TFLOPS         float64                  `json:"tflops"`          // 2·3·tokens·topk·hidden·intermediate / ms
	WeightGBps     float64                  `json:"weight_gbps"`     // bytes of touched experts' weights / ms
	ExpertsTouched float64                  `json:"experts_touched"` // mean over iterations
	RelErr         float64                  `json:"rel_err"`         // vs the reference below, on sampled rows
	Reference      string                   `json:"reference"`
	RouteMismatch  int                      `json:"route_mismatch"` // sampled tokens whose ids differ from moe.Route on the GPU's logits
	Path           string                   `json:"path"`
	Weights        string                   `json:"weights"`            // bf16, or fp4 (codes and E8M0 scales: 4.25 bits a value)
	FP4Path        string                   `json:"fp4_path,omitempty"` // fp4: gemv, gemm or dequant (kernels.MoEFP4Path)
	Kernels        string                   `json:"kernels,omitempty"`  // grouped path, bf16: "gemv" where the decode-sized GEMV kernels run the experts (kernels.MoEGemv: by default one token over experts of intermediate ≥ 8192), else the grouped GEMMs
	Ranks          int                      `json:"ranks"`
	MinMS          float64                  `json:"min_ms"`
	Iters          int                      `json:"iters"`
	CTAs           int                      `json:"ctas"`               // fused path: the launch's persistent CTAs (0: every co-resident one)
	DispatchCTAs   int                      `json:"dispatch_ctas"`      // fused path: CTAs that started on the dispatch role (0: all)
	Tile           int                      `json:"tile,omitempty"`     // fused path: the row tile the launch used (128: the wgmma tiles)
	MaxRows        int                      `json:"max_rows,omitempty"` // fused path: the rows a rank's workspace holds (0: all rows)
	Trace          *kernels.MoETraceSummary `json:"trace,omitempty"`    // fused path, --trace: where the last launch's time went
}

// parseMoEBench reads the flags; it needs no GPU.
func parseMoEBench(args []string) (*moeBenchOpts, error) {
	fs := newFlags("bench moe")
	o := &moeBenchOpts{}
	fs.IntVar(&o.hidden, "hidden", 7168, "hidden size H")
	fs.IntVar(&o.inter, "intermediate", 2048, "expert intermediate size I")
	fs.IntVar(&o.experts, "experts", 256, "routed experts E")
	fs.IntVar(&o.topk, "topk", 8, "experts per token K")
	fs.StringVar(&o.routing, "routing", "grouped", "softmax (softmax over experts, renormalised top-k) or grouped (DeepSeek-V3: sigmoid, score bias, 8 groups, top-4 groups, scaling 2.5)")
	tok := fs.String("tokens", "1,16,64,256,1024,4096,16384", "token counts, comma-separated")
	fs.IntVar(&o.ranks, "ranks", 1, "emulated expert-parallel ranks, 1..8 (tokens are per rank; fused path only above 1)")
	fs.StringVar(&o.path, "path", "fused", "fused (one persistent launch per layer, mk_moe_fused) or grouped (separate align/GEMM/combine launches, one rank)")
	fs.IntVar(&o.ctas, "ctas", 0, "fused path: CTAs of the persistent launch (0: every co-resident one)")
	fs.IntVar(&o.dispatchCTAs, "dispatch-ctas", 0, "fused path: CTAs that start on the dispatch role (0: all)")
	fs.Float64Var(&o.maxRowsFactor, "max-rows-factor", 0, "fused path: size each rank's receive side for this multiple of its balanced share of rows (tokens·topk; ≥ 1), not for every row of every rank; a layer over it fails with a capacity error (0: every row)")
	fs.IntVar(&o.tile, "tile", 0, "fused path: row tile, 16 or 64 (mma.sync tiles) or 128 (sm_90a wgmma tiles, TMA); 0 picks by rows per expert")
	fs.StringVar(&o.tuneOut, "tune", "", "fused path: try the launch choices (--ctas × --dispatch-ctas candidates) per token count, report the fastest and record it in this JSON table (package tuning; the CUDA backend reads it through moe_tuning)")
	fs.StringVar(&o.traceOut, "trace", "", "fused path: record when each task of the last launch per token count was taken, ready, started and finished; write the records and a summary per count to this file (JSON lines) and the summary into the result")
	fs.IntVar(&o.shared, "shared-experts", 0, "shared experts (one dense MLP of N*intermediate), timed with the layer")
	fs.IntVar(&o.iters, "iters", 10, "timed iterations per token count (the median is reported)")
	fs.BoolVar(&o.graph, "graph", true, "time the layer as one CUDA graph replay per iteration, as decode steps run (vLLM's benchmark_moe times graphs too); the op-by-op launches are reported as eager_ms")
	fs.StringVar(&o.weights, "weights", "bf16", "grouped path: expert weights in bf16 or fp4 (MXFP4's values: E2M1 codes with a power-of-two scale per 32, random codes; the CUDA backend holds gpt-oss's experts so)")
	fs.BoolVar(&o.sameToken, "same-token", false, "grouped path: every token of an iteration is the same random row, so all route to the same top-k experts (the worst skew; random-weight models come close to it)")
	fs.IntVar(&o.checkRows, "check-rows", 2, "tokens per count checked against the CPU reference")
	seed := fs.Uint64("seed", 1, "random seed")
	fs.Float64Var(&o.scoreBias, "score-bias", 0, "grouped routing: standard deviation of the random e_score_correction_bias added to the scores for selection. 0 (zeros) routes random logits evenly, as a trained bias balances a real router and as vLLM's benchmark routes; 0.1, the fixed value up to the fifty-fifth pass, concentrates them (DeepSeek-V3's shape: ~200 of 256 experts touched at 1024 tokens, the hottest with ~8× the mean rows)")
	fs.BoolVar(&o.json, "json", false, "print one JSON array instead of a table (--world: one JSON object per line)")
	o.world.register(fs)
	fs.StringVar(&o.shapes, "shapes", moeEPDefaultShapes, "--world: layer shapes (deepseek_v3, qwen3_30b_a3b, mixtral_8x7b, tiny; custom: the --hidden, --intermediate, --experts, --topk, --routing flags)")
	fs.DurationVar(&o.kernelTimeout, "kernel-timeout", 10*time.Second, "--world: the fused kernel's bound on each wait for a peer (its watchdog)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.seed = *seed
	var err error
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := o.world.check(kernels.MoEFusedMaxRanks); err != nil {
		return nil, err
	}
	if o.world.size > 0 {
		switch {
		case o.path != "fused":
			return nil, fmt.Errorf("--world needs --path fused")
		case set["ranks"] || set["tune"] || set["shared-experts"] || set["same-token"]:
			return nil, fmt.Errorf("--world takes none of --ranks, --tune, --shared-experts, --same-token (one rank per process, no shared experts)")
		case o.kernelTimeout <= 0:
			return nil, fmt.Errorf("--kernel-timeout must be positive")
		}
		if !set["tokens"] {
			*tok = moeEPDefaultTokens
		}
		if !set["check-rows"] {
			o.checkRows = 4
		}
	} else if set["shapes"] || set["kernel-timeout"] {
		return nil, fmt.Errorf("--shapes and --kernel-timeout are for --world")
	}
	if o.tokens, err = parsePositiveInts("tokens", *tok); err != nil {
		return nil, err
	}
	switch {
	case o.ranks < 1 || o.ranks > kernels.MoEFusedMaxRanks:
		return nil, fmt.Errorf("--ranks %d: want 1..%d emulated ranks", o.ranks, kernels.MoEFusedMaxRanks)
	case o.path != "fused" && o.path != "grouped":
		return nil, fmt.Errorf("--path must be fused or grouped, got %q", o.path)
	case o.weights != "bf16" && o.weights != "fp4":
		return nil, fmt.Errorf("--weights must be bf16 or fp4, got %q", o.weights)
	case o.weights == "fp4" && (o.path != "grouped" || o.hidden%kernels.FP4BlockValues != 0 || o.inter%kernels.FP4BlockValues != 0):
		return nil, fmt.Errorf("--weights fp4 needs --path grouped and --hidden, --intermediate multiples of %d", kernels.FP4BlockValues)
	case o.sameToken && o.path != "grouped":
		return nil, fmt.Errorf("--same-token needs --path grouped")
	case o.path == "grouped" && o.ranks != 1:
		return nil, fmt.Errorf("--path grouped runs one rank; --ranks %d needs --path fused", o.ranks)
	case o.experts < o.ranks:
		return nil, fmt.Errorf("--experts %d: fewer experts than --ranks %d", o.experts, o.ranks)
	case o.routing != "softmax" && o.routing != "grouped":
		return nil, fmt.Errorf("--routing must be softmax or grouped, got %q", o.routing)
	case !(o.scoreBias >= 0 && o.scoreBias <= 1):
		return nil, fmt.Errorf("--score-bias %v: want a standard deviation in [0, 1]", o.scoreBias)
	case o.hidden <= 0 || o.hidden%8 != 0 || o.inter <= 0 || o.inter%8 != 0:
		return nil, fmt.Errorf("--hidden %d and --intermediate %d must be positive multiples of 8", o.hidden, o.inter)
	case o.experts <= 0 || o.experts > 2048 || o.topk <= 0 || o.topk > o.experts:
		return nil, fmt.Errorf("--experts %d, --topk %d: want 1 ≤ topk ≤ experts ≤ 2048", o.experts, o.topk)
	case o.routing == "grouped" && (o.experts%8 != 0 || o.experts/8 < 2 || o.topk > o.experts/2):
		return nil, fmt.Errorf("--routing grouped needs experts divisible by 8 groups and topk ≤ experts/2 (4 of 8 groups)")
	case o.tuneOut != "" && o.path != "fused":
		return nil, fmt.Errorf("--tune needs --path fused")
	case o.maxRowsFactor != 0 && (o.maxRowsFactor < 1 || math.IsNaN(o.maxRowsFactor) || o.maxRowsFactor > 64):
		return nil, fmt.Errorf("--max-rows-factor %v: want 0 or 1..64", o.maxRowsFactor)
	case o.tile != 0 && !slices.Contains(kernels.MoEFusedTiles, o.tile):
		return nil, fmt.Errorf("--tile %d: want 0, 16, 64 or 128", o.tile)
	case o.shared < 0 || o.iters <= 0 || o.checkRows < 0 || o.ctas < 0 || o.dispatchCTAs < 0:
		return nil, fmt.Errorf("--shared-experts, --iters, --check-rows, --ctas, --dispatch-ctas must be non-negative (iters positive)")
	}
	if o.world.size > 0 {
		if _, err := parseMoEShapes(o.shapes, o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (o *moeBenchOpts) router() moe.RouterConfig {
	if o.routing == "grouped" {
		return moe.RouterConfig{NumExperts: o.experts, TopK: o.topk, Scoring: moe.Sigmoid, NormTopK: true,
			NumGroups: 8, TopKGroups: 4, ScalingFactor: 2.5}
	}
	return moe.RouterConfig{NumExperts: o.experts, TopK: o.topk, Scoring: moe.Softmax, NormTopK: true}
}

// scoreBiases draws the grouped routing's e_score_correction_bias [E]:
// normal values of standard deviation o.scoreBias (seeded by o.seed), all
// zeros by default. The bias is uploaded and added either way, so the
// routing kernels' bias path is what is timed.
func (o *moeBenchOpts) scoreBiases(E int) []float32 {
	b := make([]float32, E)
	if o.scoreBias == 0 {
		return b
	}
	rng := rand.New(rand.NewPCG(o.seed, 99))
	for i := range b {
		b[i] = float32(rng.NormFloat64() * o.scoreBias)
	}
	return b
}

// benchMoE times one MoE layer on the GPU per token count.
func benchMoE(args []string, stdout io.Writer) error {
	o, err := parseMoEBench(args)
	if err != nil {
		return err
	}
	if o.world.size > 0 {
		return benchMoEWorld(o, args, stdout)
	}
	g, err := kernels.Open(0)
	if err != nil {
		return fmt.Errorf("bench moe needs a GPU: %w", err)
	}
	defer g.Close()
	var rows []moeBenchRow
	runErr := g.Do(func(d *kernels.Device) error {
		var err error
		if o.path == "fused" {
			rows, err = runMoEFusedBench(d, o)
			if err == nil && o.tuneOut != "" {
				err = recordMoETuning(o, d.Info().Name, rows)
			}
		} else {
			rows, err = runMoEBench(d, o)
		}
		return err
	})
	// A token count that fails (one that does not fit in device memory at
	// R emulated ranks, say) still prints the counts measured before it;
	// the command then fails with that count's error.
	if runErr != nil && len(rows) == 0 {
		return runErr
	}
	if o.json {
		b, err := json.Marshal(rows)
		if err != nil {
			return err
		}
		if _, err = fmt.Fprintf(stdout, "%s\n", b); err != nil {
			return err
		}
		return runErr
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "tokens\tms\tmin ms\teager ms\texperts ms\tseparate ms\tTFLOP/s\tweight GB/s\texperts\trel err\troute diff\tpath\tranks\t\n")
	for _, r := range rows {
		sep, eager := "-", "-"
		if r.SeparateMS != nil {
			sep = fmt.Sprintf("%.4f", *r.SeparateMS)
		}
		if r.EagerMS != nil {
			eager = fmt.Sprintf("%.4f", *r.EagerMS)
		}
		path := r.Path
		if r.FP4Path != "" {
			path += " (fp4 " + r.FP4Path + ")"
		}
		if r.Kernels != "" {
			path += " (" + r.Kernels + ")"
		}
		fmt.Fprintf(tw, "%d\t%.4f\t%.4f\t%s\t%.4f\t%s\t%.1f\t%.0f\t%.1f\t%.2g\t%d\t%s\t%d\t\n", r.Tokens, r.MS, r.MinMS, eager, r.ExpertsMS, sep, r.TFLOPS,
			r.WeightGBps, r.ExpertsTouched, r.RelErr, r.RouteMismatch, path, r.Ranks)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) > 0 {
		_, err = fmt.Fprintf(stdout, "H=%d I=%d E=%d K=%d routing=%s shared=%d; ms: median of %d, whole layer (router GEMM + routing + experts + combine), %s; rel err: %s\n",
			o.hidden, o.inter, o.experts, o.topk, o.routing, o.shared, o.iters, timingNote(rows[0].Graph), rows[0].Reference)
	}
	return errors.Join(err, runErr)
}

// moeBenchBufs are the layer's device buffers.
type moeBenchBufs struct {
	gate, gateUp, down, shGU, shDown *kernels.Buffer // bf16 weights
	flush                            *graphFlush     // --graph: run before each replay
	scoreBias                        *kernels.Buffer // f32 [E] or nil
	all                              []*kernels.Buffer
}

func (b *moeBenchBufs) alloc(d *kernels.Device, bytes int64) (*kernels.Buffer, error) {
	buf, err := d.Malloc(bytes)
	if err == nil {
		b.all = append(b.all, buf)
	}
	return buf, err
}

func (b *moeBenchBufs) free() {
	for _, x := range b.all {
		_ = x.Free()
	}
	b.all = nil
}

func runMoEBench(d *kernels.Device, o *moeBenchOpts) ([]moeBenchRow, error) {
	E, H, I := o.experts, o.hidden, o.inter
	ex := &kernels.MoEExperts{E: E, H: H, I: I}
	w := &moeBenchBufs{}
	defer w.free()
	var err error
	fill := func(b *kernels.Buffer, n int64, seed uint64, scale float64) error {
		return d.FillRandomBF16(nil, b, n, seed, float32(scale))
	}
	if w.gate, err = w.alloc(d, int64(E*H)*2); err != nil {
		return nil, err
	}
	if ex.GateUp, err = w.alloc(d, int64(E)*int64(2*I)*int64(H)*2); err != nil {
		return nil, fmt.Errorf("expert weights (%d GB): %w", int64(E)*3*int64(I)*int64(H)*2>>30, err)
	}
	if ex.Down, err = w.alloc(d, int64(E)*int64(H)*int64(I)*2); err != nil {
		return nil, err
	}
	if o.weights == "fp4" {
		// Random codes (the bytes of random bf16s), a scale of 2^-7 per
		// group; GateUp and Down keep the values in bf16 for the check.
		if ex.GateUpFP4, err = benchFP4(d, w, E*2*I, H, o.seed+101); err != nil {
			return nil, err
		}
		if ex.DownFP4, err = benchFP4(d, w, E*H, I, o.seed+102); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		b     *kernels.Buffer
		n     int64
		scale float64
	}{{w.gate, int64(E * H), 1 / math.Sqrt(float64(H))}, {ex.GateUp, int64(E) * int64(2*I) * int64(H), 1 / math.Sqrt(float64(H))},
		{ex.Down, int64(E) * int64(H) * int64(I), 1 / math.Sqrt(float64(I))}} {
		if o.weights == "fp4" && f.b != w.gate {
			continue
		}
		if err := fill(f.b, f.n, o.seed+uint64(len(w.all))*7919, f.scale); err != nil {
			return nil, err
		}
	}
	if o.weights == "fp4" {
		if err := d.FP4DequantBF16(nil, ex.GateUp, ex.GateUpFP4); err != nil {
			return nil, err
		}
		if err := d.FP4DequantBF16(nil, ex.Down, ex.DownFP4); err != nil {
			return nil, err
		}
	}
	bf16GU, bf16Down := ex.GateUp, ex.Down
	if o.weights == "fp4" {
		ex.GateUp, ex.Down = nil, nil // the layer reads the FP4 codes only
	}
	SI := o.shared * I
	if SI > 0 {
		if w.shGU, err = w.alloc(d, int64(2*SI*H)*2); err != nil {
			return nil, err
		}
		if w.shDown, err = w.alloc(d, int64(H*SI)*2); err != nil {
			return nil, err
		}
		if err := fill(w.shGU, int64(2*SI*H), o.seed+11, 1/math.Sqrt(float64(H))); err != nil {
			return nil, err
		}
		if err := fill(w.shDown, int64(H*SI), o.seed+12, 1/math.Sqrt(float64(SI))); err != nil {
			return nil, err
		}
	}
	if o.graph {
		if w.flush, err = newGraphFlush(d, w, o.seed+13); err != nil {
			return nil, err
		}
	}
	cfg := o.router()
	var sbias []float32
	if cfg.Scoring == moe.Sigmoid {
		sbias = o.scoreBiases(E)
		if w.scoreBias, err = w.alloc(d, int64(E)*4); err != nil {
			return nil, err
		}
		if err := kernels.Upload(d, w.scoreBias, sbias); err != nil {
			return nil, err
		}
	}
	var ev [4]*kernels.Event // start, routed, experts done, end
	for i := range ev {
		if ev[i], err = d.NewEvent(); err != nil {
			return nil, err
		}
		defer ev[i].Destroy()
	}

	var rows []moeBenchRow
	for _, T := range o.tokens {
		r, err := benchMoETokens(d, o, w, ex, bf16GU, bf16Down, cfg, sbias, T, ev)
		if err != nil {
			return rows, fmt.Errorf("tokens %d: %w", T, err) // the counts measured before it, too
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// benchFP4 allocates an FP4 matrix [n, k] in w with random codes and
// every group's scale 2^-7.
func benchFP4(d *kernels.Device, w *moeBenchBufs, n, k int, seed uint64) (*kernels.FP4, error) {
	cb, sb := kernels.FP4Sizes(n, k)
	m := &kernels.FP4{N: n, K: k}
	var err error
	if m.Codes, err = w.alloc(d, cb); err != nil {
		return nil, err
	}
	if m.Scales, err = w.alloc(d, sb); err != nil {
		return nil, err
	}
	if err := d.FillRandomBF16(nil, m.Codes, cb/2, seed, 1); err != nil {
		return nil, err
	}
	return m, kernels.Upload(d, m.Scales, slices.Repeat([]byte{127 - 7}, int(sb)))
}

// benchMoETokens times one token count; gu and dn are the experts' bf16
// values (ex's own, or those of its FP4 codes) for the check.
func benchMoETokens(d *kernels.Device, o *moeBenchOpts, w *moeBenchBufs, ex *kernels.MoEExperts, gu, dn *kernels.Buffer,
	cfg moe.RouterConfig, sbias []float32, T int, ev [4]*kernels.Event) (moeBenchRow, error) {
	E, K, H, I := o.experts, o.topk, o.hidden, o.inter
	SI := o.shared * I
	row := moeBenchRow{Tokens: T, Path: "grouped", Ranks: 1, Iters: o.iters, Weights: o.weights}
	if ex.IsFP4() {
		p, err := d.MoEFP4Path(T, K, E)
		if err != nil {
			return row, err
		}
		row.FP4Path = p.String()
	} else if kernels.MoEGemv(T, K, ex.I) {
		row.Kernels = "gemv"
	}
	b := &moeBenchBufs{}
	defer b.free()
	x, err := b.alloc(d, int64(T*H)*2)
	if err != nil {
		return row, err
	}
	logits, err := b.alloc(d, int64(T*E)*4)
	if err != nil {
		return row, err
	}
	ids, err := b.alloc(d, int64(T*K)*4)
	if err != nil {
		return row, err
	}
	wts, err := b.alloc(d, int64(T*K)*4)
	if err != nil {
		return row, err
	}
	out, err := b.alloc(d, int64(T*H)*4)
	if err != nil {
		return row, err
	}
	wsBytes, _, err := d.MoEWorkspace(T, K, ex)
	if err != nil {
		return row, err
	}
	ws, err := b.alloc(d, wsBytes)
	if err != nil {
		return row, fmt.Errorf("workspace of %d MB: %w", wsBytes>>20, err)
	}
	var sh, sa *kernels.Buffer
	if SI > 0 {
		if sh, err = b.alloc(d, int64(T*2*SI)*2); err != nil {
			return row, err
		}
		if sa, err = b.alloc(d, int64(T*SI)*2); err != nil {
			return row, err
		}
	}
	// layer queues the layer; timed records ev[1] and ev[2] around the
	// routing and experts (not inside a graph capture). Routing and experts
	// are one MoERouteExpertsRun, as the CUDA backend runs a layer on one
	// GPU (at a decode step's few tokens the routing lays out the GEMMs'
	// rows itself, with no align launch between it and GEMM1).
	layer := func(timed bool) error {
		if err := benchRouter(d, logits, x, w.gate, T, E, H); err != nil {
			return err
		}
		if timed {
			if err := ev[1].Record(nil); err != nil {
				return err
			}
		}
		if err := d.MoERouteExpertsRun(nil, out, x, ids, wts, logits, w.scoreBias, T, moeRouterKernels(cfg), ex, nil, ws); err != nil {
			return err
		}
		if timed {
			if err := ev[2].Record(nil); err != nil {
				return err
			}
		}
		if SI > 0 {
			if err := d.Gemm(nil, sh, kernels.BF16, x, w.shGU, T, 2*SI, H); err != nil {
				return err
			}
			if err := d.SwiGLU(nil, sa, sh, T, SI); err != nil {
				return err
			}
			if err := d.GemmAdd(nil, out, kernels.F32, sa, w.shDown, T, H, SI); err != nil {
				return err
			}
		}
		return nil
	}
	var sg *kernels.StepGraph
	if o.graph {
		if sg, err = captureLayer(d, func() error { return layer(false) }); err != nil {
			return row, err
		}
		defer func() { _ = sg.Destroy(d) }()
		row.Graph = true
	}
	// fresh gives x new tokens, so the touched experts change and the L2
	// does not keep the previous run's weights.
	fresh := func(seed uint64) error {
		if err := d.FillRandomBF16(nil, x, int64(T*H), seed, 1); err != nil {
			return err
		}
		if o.sameToken { // row 0 everywhere
			r0, err := downloadRow[uint16](d, x, 0, int64(H), 2)
			if err != nil {
				return err
			}
			return kernels.Upload(d, x, slices.Repeat(r0, T))
		}
		return nil
	}
	hostIDs := make([]int32, T*K)
	var times, etimes, gtimes []float64
	touched := 0.0
	for it := -2; it < o.iters; it++ {
		seed := o.seed*1000003 + uint64(T)*31 + uint64(it+2)
		if sg != nil {
			if err := fresh(seed ^ 0x5bd1e995); err != nil {
				return row, err
			}
			ms, err := replayMS(d, sg, w.flush)
			if err != nil {
				return row, err
			}
			if it >= 0 {
				gtimes = append(gtimes, ms)
			}
		}
		// The eager run last: the check reads its output.
		if err := fresh(seed); err != nil {
			return row, err
		}
		if err := ev[0].Record(nil); err != nil {
			return row, err
		}
		if err := layer(true); err != nil {
			return row, err
		}
		if err := ev[3].Record(nil); err != nil {
			return row, err
		}
		if err := ev[3].Sync(); err != nil {
			return row, err
		}
		ms, err := kernels.Elapsed(ev[0], ev[3])
		if err != nil {
			return row, err
		}
		ems, err := kernels.Elapsed(ev[1], ev[2])
		if err != nil {
			return row, err
		}
		if it < 0 {
			continue
		}
		times = append(times, float64(ms))
		etimes = append(etimes, float64(ems))
		if err := kernels.Download(d, hostIDs, ids); err != nil {
			return row, err
		}
		seen := make([]bool, E)
		n := 0
		for _, e := range hostIDs {
			if e >= 0 && int(e) < E && !seen[e] {
				seen[e] = true
				n++
			}
		}
		touched += float64(n)
	}
	sort.Float64s(times)
	sort.Float64s(etimes)
	row.MS = times[len(times)/2]
	row.ExpertsMS = etimes[len(etimes)/2]
	row.MinMS = times[0]
	if sg != nil {
		eager := row.MS
		row.EagerMS = &eager
		sort.Float64s(gtimes)
		row.MS, row.MinMS = gtimes[len(gtimes)/2], gtimes[0]
	}
	row.ExpertsTouched = touched / float64(o.iters)
	sec := row.MS / 1e3
	row.TFLOPS = 2 * 3 * float64(T) * float64(K) * float64(H) * float64(I) / sec / 1e12
	perValue := 2.0
	if ex.IsFP4() {
		perValue = 0.5 + 1.0/32 // codes and scales
	}
	wbytes := row.ExpertsTouched*3*float64(H)*float64(I)*perValue + float64(2*3*SI*H)
	row.WeightGBps = wbytes / sec / 1e9

	// Reference on sampled tokens of the last iteration.
	row.Reference = fmt.Sprintf("CPU float64 on %d sampled tokens (bf16 x and weights, activation rounded to bf16), routing vs moe.Route on the GPU's logits", min(o.checkRows, T))
	if o.checkRows > 0 {
		num, den, mism, err := moeCheckRows(d, o, cfg, sbias, T, moeCheckIn{x: x, logits: logits, ids: ids, wts: wts,
			out: out, shGU: w.shGU, shDown: w.shDown,
			expert: func(e int) (*kernels.Buffer, int64, *kernels.Buffer, int64) {
				return gu, int64(e) * int64(2*I*H), dn, int64(e) * int64(H*I)
			}})
		if err != nil {
			return row, err
		}
		row.RelErr, row.RouteMismatch = math.Sqrt(num/math.Max(den, 1e-300)), mism
	}
	return row, nil
}

// benchRouter is the layer's router GEMM, logits [T, E] f32 = x [T, H] ·
// gate [E, H]ᵀ: at decode sizes (T ≤ kernels.GemvMaxRows) one GEMV launch,
// as the CUDA backend's decode steps route (there in float32,
// MoERouterF32), else cuBLASLt (Gemm), which at one token took a split-K
// GEMM and its reduction (5–6 + 3 µs under ncu, eighteenth pass).
func benchRouter(d *kernels.Device, logits, x, gate *kernels.Buffer, T, E, H int) error {
	if T <= kernels.GemvMaxRows {
		return d.GemvBF16(nil, logits, x, gate, T, E, H)
	}
	return d.Gemm(nil, logits, kernels.F32, x, gate, T, E, H)
}

// timingNote says how ms was timed.
func timingNote(graph bool) string {
	if graph {
		return "one CUDA graph replay each (eager ms: the same launched op by op; experts ms from the eager run)"
	}
	return "launched op by op"
}

// captureLayer records what f queues on stream 0 into a CUDA graph (not
// run yet).
func captureLayer(d *kernels.Device, f func() error) (*kernels.StepGraph, error) {
	sg, err := d.BeginCapture()
	if err != nil {
		return nil, err
	}
	if err = f(); err != nil {
		d.AbortCapture(sg)
	} else {
		err = d.EndCapture(sg)
	}
	if err != nil {
		return nil, fmt.Errorf("capturing the layer in a CUDA graph (--graph=false times it without one): %w", err)
	}
	return sg, nil
}

// graphFlush is what runs before each timed replay: a GEMV that reads
// graphFlushBytes of bf16 (more than the H200's 50 MB L2), so
// that the graph is queued before its start event runs (the host's launch
// is not timed) and the replay finds none of an earlier run's weights in
// L2; it only reads, so no dirty lines are left for the replay to write
// back.
type graphFlush struct {
	w, out *kernels.Buffer // [graphFlushRows, graphFlushCols] bf16, [graphFlushRows] f32
}

const (
	graphFlushCols  = 4096
	graphFlushRows  = 16384
	graphFlushBytes = graphFlushRows * graphFlushCols * 2
)

// newGraphFlush allocates and fills the flush buffers into b.
func newGraphFlush(d *kernels.Device, b *moeBenchBufs, seed uint64) (*graphFlush, error) {
	f := &graphFlush{}
	var err error
	if f.w, err = b.alloc(d, graphFlushBytes); err != nil {
		return nil, err
	}
	if f.out, err = b.alloc(d, graphFlushRows*4); err != nil {
		return nil, err
	}
	return f, d.FillRandomBF16(nil, f.w, graphFlushBytes/2, seed, 1)
}

// replayMS runs the flush, then launches sg once and returns the graph's
// GPU time in ms (events around the graph launch).
func replayMS(d *kernels.Device, sg *kernels.StepGraph, f *graphFlush) (float64, error) {
	// x = the buffer's first row: out = W · W[0].
	if err := d.Gemm(nil, f.out, kernels.F32, f.w, f.w, 1, graphFlushRows, graphFlushCols); err != nil {
		return 0, err
	}
	before, _ := sg.GPUNs()
	if err := sg.Launch(d); err != nil {
		return 0, err
	}
	if err := sg.Wait(d); err != nil {
		return 0, err
	}
	after, _ := sg.GPUNs()
	return float64(after-before) / 1e6, nil
}

func moeRouterKernels(c moe.RouterConfig) kernels.MoERouter {
	return kernels.MoERouter{Experts: c.NumExperts, TopK: c.TopK, Sigmoid: c.Scoring == moe.Sigmoid,
		SoftmaxTopK: c.SoftmaxTopK, NormTopK: c.NormTopK, Groups: c.NumGroups, TopKGroups: c.TopKGroups,
		Scaling: c.ScalingFactor}
}

// downloadRow copies n elements at element offset off of b (element size size).
func downloadRow[T kernels.Elem](d *kernels.Device, b *kernels.Buffer, off, n, size int64) ([]T, error) {
	v, err := b.View(off*size, n*size)
	if err != nil {
		return nil, err
	}
	out := make([]T, n)
	return out, kernels.Download(d, out, v)
}

func bf16s(b []uint16) []float32 {
	f := make([]float32, len(b))
	for i, v := range b {
		f[i] = tensor.BF16ToF32(v)
	}
	return f
}

// mlpRef is act(x·GUᵀ) (rounded to bf16) · Downᵀ in float64, gu [2n, h], dn [h, n].
func mlpRef(x, gu, dn []float32, h, n int) []float64 {
	a := make([]float64, n)
	par := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for p := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := p; j < n; j += par {
				var gs, us float64
				gr, ur := gu[j*h:j*h+h], gu[(n+j)*h:(n+j)*h+h]
				for c := range h {
					gs += float64(x[c]) * float64(gr[c])
					us += float64(x[c]) * float64(ur[c])
				}
				gv, uv := float32(gs), float32(us)
				v := float64(gv) / (1 + math.Exp(-float64(gv))) * float64(uv)
				a[j] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v))))
			}
		}()
	}
	wg.Wait()
	y := make([]float64, h)
	for p := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := p; c < h; c += par {
				r := dn[c*n : c*n+n]
				s := 0.0
				for j := range n {
					s += a[j] * float64(r[j])
				}
				y[c] = s
			}
		}()
	}
	wg.Wait()
	return y
}

// moeCheckIn is what moeCheckRows compares: a layer's tokens x [T, H]
// bf16, router logits [T, E], routing (ids, wts [T, K]) and output out
// [T, H] f32 on the device, the shared expert's weights (when the bench
// has one) and where expert e's weights lie (buffer and element offset of
// its gate/up [2I, H] and down [H, I] rows).
type moeCheckIn struct {
	x, logits, ids, wts, out *kernels.Buffer
	shGU, shDown             *kernels.Buffer
	expert                   func(e int) (gu *kernels.Buffer, guOff int64, dn *kernels.Buffer, dnOff int64)
}

// moeCheckRows compares up to o.checkRows sampled output rows with a CPU
// reference, and the GPU's routing of those tokens with moe.Route on the
// GPU's logits: the squared error and squared reference summed over the
// rows (num +Inf, den 1 at a NaN or infinite output) and the tokens routed
// otherwise.
func moeCheckRows(d *kernels.Device, o *moeBenchOpts, cfg moe.RouterConfig, sbias []float32, T int,
	in moeCheckIn) (num, den float64, mism int, err error) {
	E, K, H, I := o.experts, o.topk, o.hidden, o.inter
	SI := o.shared * I
	if err := d.Sync(); err != nil {
		return 0, 0, 0, err
	}
	n := min(o.checkRows, T)
	samples := []int{0}
	for i := 1; i < n; i++ {
		samples = append(samples, (T-1)*i/(n-1))
	}
	var shGU, shDn []float32
	if SI > 0 {
		a, err := downloadRow[uint16](d, in.shGU, 0, int64(2*SI*H), 2)
		if err != nil {
			return 0, 0, 0, err
		}
		b, err := downloadRow[uint16](d, in.shDown, 0, int64(H*SI), 2)
		if err != nil {
			return 0, 0, 0, err
		}
		shGU, shDn = bf16s(a), bf16s(b)
	}
	for _, t := range samples {
		xb, err := downloadRow[uint16](d, in.x, int64(t*H), int64(H), 2)
		if err != nil {
			return 0, 0, 0, err
		}
		xr := bf16s(xb)
		lg, err := downloadRow[float32](d, in.logits, int64(t*E), int64(E), 4)
		if err != nil {
			return 0, 0, 0, err
		}
		id, err := downloadRow[int32](d, in.ids, int64(t*K), int64(K), 4)
		if err != nil {
			return 0, 0, 0, err
		}
		wt, err := downloadRow[float32](d, in.wts, int64(t*K), int64(K), 4)
		if err != nil {
			return 0, 0, 0, err
		}
		got, err := downloadRow[float32](d, in.out, int64(t*H), int64(H), 4)
		if err != nil {
			return 0, 0, 0, err
		}
		wantIDs, _ := moe.Route(&cfg, lg, sbias, 1)
		for k := range K {
			if wantIDs[k] != id[k] {
				mism++
				break
			}
		}
		want := make([]float64, H)
		for k := range K {
			e := int(id[k])
			if e < 0 || e >= E {
				return 0, 0, 0, fmt.Errorf("token %d: expert id %d out of range", t, e)
			}
			gb, goff, db, doff := in.expert(e)
			gu, err := downloadRow[uint16](d, gb, goff, int64(2*I*H), 2)
			if err != nil {
				return 0, 0, 0, err
			}
			dn, err := downloadRow[uint16](d, db, doff, int64(H*I), 2)
			if err != nil {
				return 0, 0, 0, err
			}
			y := mlpRef(xr, bf16s(gu), bf16s(dn), H, I)
			for c := range H {
				want[c] += float64(wt[k]) * y[c]
			}
		}
		if SI > 0 {
			y := mlpRef(xr, shGU, shDn, H, SI)
			for c := range H {
				want[c] += y[c]
			}
		}
		for c := range H {
			g := float64(got[c])
			if math.IsNaN(g) || math.IsInf(g, 0) {
				return math.Inf(1), 1, mism, nil
			}
			num += (g - want[c]) * (g - want[c])
			den += want[c] * want[c]
		}
	}
	return num, den, mism, nil
}
