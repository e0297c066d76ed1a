package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/dist"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/transport"
)

func init() { benches["model"] = benchModel }

// modelResult is one line of `mkserve bench model`.
type modelResult struct {
	Kind    string `json:"kind"` // "prefill", "decode" or "verify" (--verify-tokens)
	Batch   int    `json:"batch"`
	Context int    `json:"context"` // decode: tokens already cached per sequence
	// Contexts is how many distinct contexts the decode batch's sequences
	// read (--contexts, at most the batch).
	Contexts int     `json:"contexts,omitempty"`
	Tokens   int     `json:"tokens"` // tokens per step
	MS       float64 `json:"ms"`     // median step time (decode: overlapped where it ran)
	// SyncMS is the median decode step time when each step waits for its
	// sampled tokens before the next is launched (engine.sync_steps); set
	// when the overlapped steps were timed too (--overlap), then in MS.
	SyncMS    float64 `json:"sync_ms,omitempty"`
	TokensPS  float64 `json:"tokens_per_s"`
	WeightGB  float64 `json:"weight_gb"`            // weight bytes one step touches (routing counted), GB
	FloorMS   float64 `json:"floor_ms,omitempty"`   // WeightGB ÷ measured bandwidth
	OverFloor float64 `json:"over_floor,omitempty"` // MS ÷ FloorMS
	// Ops is the host-side time per backend op over the timed steps, per
	// step, costliest first (cuda with --profile-ops).
	Ops []opTime `json:"ops,omitempty"`
	// Mallocs is the device allocations a timed prefill run made (cuda).
	Mallocs *float64 `json:"mallocs_per_run,omitempty"`
	// Stamps is the GPU time of each backend op of the last synchronous
	// step's graph, summed by op (µs and calls per step, costliest first),
	// and StampSeq the ops in the order they ran; cuda with
	// MKSERVE_STEP_STAMPS=1 (cuda.StepStampsEnv: a clock stamp after every
	// op, which slows the step a little), or =2 for every kernel instead.
	Stamps   []opTime `json:"stamps,omitempty"`
	StampSeq []opTime `json:"stamp_seq,omitempty"`
	// Graphs is the CUDA backend's graph counters after this batch size's
	// steps (cumulative over the run).
	Graphs *cuda.GraphStats `json:"graphs,omitempty"`
	// ReplayHostMS is the mean host time of this batch size's graph
	// replays (the GPU waits meanwhile): part of MS.
	ReplayHostMS float64 `json:"replay_host_ms,omitempty"`
	// ReplayGPUMS is the mean GPU time of this batch size's graph launches
	// (CUDA events around each launch); MS − ReplayHostMS − ReplayGPUMS is
	// what the step spends elsewhere (sampling, waits, Go).
	ReplayGPUMS float64 `json:"replay_gpu_ms,omitempty"`
	// World is the processes (GPUs) the model ran over (--world; 0: one).
	World int `json:"world,omitempty"`
	// ExpertsPerLayer is the mean over MoE layers of the distinct routed
	// experts a decode step's tokens chose (median over steps; 0 when the
	// backend counts none): how much the batch's tokens share experts.
	ExpertsPerLayer float64 `json:"experts_per_layer,omitempty"`
}

// opTimes is the costliest 12 ops cb's profile gathered over n steps (or
// prefill runs), per step; it turns the profile off.
func opTimes(cb *cuda.Backend, n int) []opTime {
	var ops []opTime
	for i, o := range cb.OpProfile() {
		if i == 12 {
			break
		}
		ops = append(ops, opTime{Op: o.Op, Calls: float64(o.Calls) / float64(n),
			US: float64(o.Total.Microseconds()) / float64(n)})
	}
	cb.ProfileOps(false)
	return ops
}

// opTime is one op's share of a step's host time.
type opTime struct {
	Op    string  `json:"op"`
	Calls float64 `json:"calls_per_step"`
	US    float64 `json:"us_per_step"`
}

// prefillWarmup is how long bench model runs its prefill before timing it.
const prefillWarmup = 200 * time.Millisecond

// benchModel times a model's prefill and decode steps at its real shapes:
// a checkpoint (--model) or a config with random bf16 weights (--config).
func benchModel(args []string, stdout io.Writer) error {
	fs := newFlags("bench model")
	modelDir := fs.String("model", "", "checkpoint directory (config.json + safetensors)")
	cfgDir := fs.String("config", "", "directory holding only a config.json: random bf16 weights in its shapes (see configs/shapes)")
	backendName := fs.String("backend", "cuda", "cpu or cuda")
	precision := fs.String("precision", "fast", "cuda: exact or fast (see mkserve serve --help)")
	cpuWeights := fs.String("cpu-weights", "auto", "cpu: how matrices are held: auto, stored or q8 (see mkserve serve --help)")
	cudaWeights := fs.String("cuda-weights", "auto", "cuda: how an MXFP4 checkpoint's experts are held: auto, stored or fp4 (see mkserve serve --help)")
	kvDtype := fs.String("kv-cache-dtype", "auto", "cpu: the KV cache's element type, auto (float32) or bf16")
	batches := fs.String("batch", "1,32,256", "decode batch sizes, comma-separated")
	ctxLen := fs.Int("context", 1024, "decode: tokens already in each sequence's KV cache")
	contexts := fs.Int("contexts", 32, "decode: distinct prefilled contexts; sequence s reads context s mod N (1: every sequence shares one context, as before the eighth pass: the batch's attention outputs then agree and its tokens route to few experts)")
	prefill := fs.Int("prefill", 8192, "prefill prompt length (0: no prefill run)")
	steps := fs.Int("steps", 10, "timed decode steps (and prefill runs: steps/5, at least 3, after 200 ms of warm-up runs)")
	verify := fs.Int("verify-tokens", 0, "decode: also time speculation's verify steps, each sequence feeding its newest token and this many draft tokens with a logits row after each (kind \"verify\"; engine.speculative_tokens; 0: not)")
	blockSize := fs.Int("block-size", 16, "KV cache block size")
	seed := fs.Uint64("seed", 1, "random weight seed")
	bw := fs.Float64("hbm-gbps", 0, "bandwidth for the floor, GB/s (0: measure a device copy on cuda)")
	asJSON := fs.Bool("json", false, "print one JSON array instead of a table")
	moePath := fs.String("moe-path", "", "cuda: grouped or fused MoE kernels (default: $MKSERVE_MOE_PATH, else grouped)")
	moeTuning := fs.String("moe-tuning", "", "cuda: the fused MoE launch table of `mkserve bench moe --tune` (empty: kernel defaults)")
	ep := fs.Int("ep", 1, "cuda: expert-parallel ranks emulated on the GPU (needs --moe-path fused)")
	graphs := fs.Bool("graphs", true, "cuda: run decode steps as CUDA graphs (captured per batch shape; the fast precision only)")
	profile := fs.Bool("profile-ops", false, "cuda: time every backend op on the host during the timed prefill runs and decode steps (adds a clock read per op)")
	temperature := fs.Float64("temperature", 0, "decode: sampling temperature of every row on a device sampler (0: greedy; > 0 draws with a seeded uniform, over the whole vocabulary unless --top-k or --top-p)")
	topK := fs.Int("top-k", 0, "decode, --temperature > 0: every row's top-k (0: off)")
	topP := fs.Float64("top-p", 1, "decode, --temperature > 0: every row's top-p (1: off)")
	overlap := fs.Bool("overlap", true, "decode: also time steps as the engine runs them by default, each launched with the previous step's tokens still on the device (a backend.AsyncSampler: cuda); ms is then that time and sync_ms the time of steps that wait for their tokens")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the whole run to this file (go tool pprof)")
	var wf worldFlags // --world R: the model over R processes, one GPU each (experts split, the rest replicated)
	wf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := wf.check(kernels.AllReduceMaxRanks); err != nil {
		return err
	}
	if wf.size > 0 && *ep != 1 {
		return fmt.Errorf("--world takes --ep 1 (the world's ranks are the expert-parallel ranks)")
	}
	if *topK < 0 || !(*topP > 0 && *topP <= 1) {
		return fmt.Errorf("--top-k %d --top-p %v: want top-k ≥ 0 and top-p in (0, 1]", *topK, *topP)
	}
	tmpl := backend.SampleRow{Temperature: float32(*temperature), TopK: *topK, TopP: float32(*topP), RepetitionPenalty: 1}
	if !(*temperature >= 0 && *temperature <= 2) {
		return fmt.Errorf("--temperature %v: want 0 (greedy) to 2", *temperature)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if (*modelDir == "") == (*cfgDir == "") {
		return fmt.Errorf("give exactly one of --model DIR and --config DIR")
	}
	bs, err := parsePositiveInts("batch", *batches)
	if err != nil {
		return err
	}
	if *ctxLen < 1 || *steps < 1 || *blockSize < 1 || *prefill < 0 {
		return fmt.Errorf("--context, --steps and --block-size must be positive, --prefill non-negative")
	}

	body := func(ctx context.Context, wd *world) error {
		var comm transport.Comm
		if wd != nil {
			comm = wd.comm
		}
		var be backend.Backend
		switch *backendName {
		case "cpu":
			b, err := newBackend(backendSpec{name: "cpu", cpuWeights: *cpuWeights, kvDtype: *kvDtype, world: comm})
			if err != nil {
				return err
			}
			be = b
		case "cuda":
			b, err := newBackend(backendSpec{name: "cuda", ep: *ep, precision: *precision, moePath: *moePath, moeTuning: *moeTuning, cudaWeights: *cudaWeights, world: comm})
			if err != nil {
				return err
			}
			c := b.(*cuda.Backend)
			be = c
			if *bw == 0 {
				if *bw, err = c.CopyBandwidth(1 << 30); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("backend %q is not available (available: cpu, cuda)", *backendName)
		}

		// Load, remembering every weight's shape for the byte counts.
		var l *models.Loaded
		var shapes map[string][]int
		t0 := time.Now()
		if *cfgDir != "" {
			cfg, err := models.LoadConfig(*cfgDir)
			if err != nil {
				return err
			}
			src := &models.RandomSource{Config: cfg, Seed: *seed}
			m, err := models.Build(cfg, models.NewWeights(src, be), be)
			if err != nil {
				return err
			}
			l, shapes = &models.Loaded{Model: m, Config: cfg, Dir: *cfgDir}, src.Shapes()
		} else {
			if l, err = models.Load(*modelDir, be, models.LoadOptions{Progress: io.Discard}); err != nil {
				return err
			}
			defer l.Close()
			if shapes, err = models.CheckpointShapes(*modelDir); err != nil {
				return err
			}
		}
		loadTime := time.Since(t0)
		cfg := l.Config
		cb, _ := be.(*cuda.Backend)
		// Expert matrices the CUDA backend holds as FP4 read 17/32 of a
		// byte a value (codes and scales) instead of bf16's 2.
		wb := classifyWeights(shapes, cb != nil && cb.FP4Weights() > 0)
		model := l.Model
		if wd != nil {
			// Ranks 1.. mirror rank 0's calls (dist); rank 0 runs the benchmark.
			if wd.rank != 0 {
				return dist.Work(ctx, wd.comm, model, be)
			}
			leader, err := dist.NewLeader(wd.comm)
			if err != nil {
				return err
			}
			defer leader.Stop()
			model, be = leader.Model(model), leader.Backend(be)
		}

		maxB := slices.Max(bs)
		perSeq := (*ctxLen + (*steps+4)*(2+max(0, *verify)) + *blockSize - 1) / *blockSize
		blocks := max(maxB*perSeq, (*prefill+*blockSize-1) / *blockSize + 1)
		if err := be.InitKV(*blockSize, blocks); err != nil {
			return err
		}
		// The whole pool now (as the engine does): a cache that does not
		// fit next to the weights is an error here, not a panic mid-run.
		if alloc, ok := be.(backend.KVAllocator); ok {
			if err := alloc.AllocKV(model.KVWidths()); err != nil {
				return fmt.Errorf("KV cache of %d blocks of %d tokens (batch %d × context %d): %w", blocks, *blockSize,
					maxB, *ctxLen, err)
			}
		}
		ctr, _ := be.(backend.ExpertCounter)
		var out []modelResult

		ids := func(n, off int) []int32 {
			v := make([]int32, n)
			for i := range v {
				v[i] = int32((i*7919 + off*104729 + 13) % cfg.VocabSize)
			}
			return v
		}
		urng := rand.New(rand.NewPCG(1, 2)) // the uniform draws of --temperature
		forward := func(b *backend.Batch) error {
			run := func() (backend.Tensor, error) { return model.Forward(b) }
			var logits backend.Tensor
			var err error
			if *graphs {
				logits, err = backend.RunStep(be, b, run)
			} else {
				logits, err = run()
			}
			if err != nil {
				return err
			}
			// As the engine: greedy picks on the device where the backend
			// samples there (only the ids come back), else the logits to
			// the host. (Until 2026-11-29 the step always copied the whole
			// logits to a fresh Go slice: 19 MB at batch 32 of Qwen3, which
			// ran at 1.1–12 GB/s depending on the process and made the
			// batch-32 step "bimodal"; the engine never does that copy.)
			if ds, ok := be.(backend.Sampler); ok {
				rows := sampleRows(logits.Shape()[0], tmpl, urng)
				if got := ds.Sample(logits, rows); len(got) != len(rows) {
					return fmt.Errorf("sampling returned %d tokens for %d rows", len(got), len(rows))
				}
				return nil
			}
			if v := be.ToHost(logits); len(v) == 0 {
				return fmt.Errorf("forward returned no logits")
			}
			return nil
		}
		seqBlocks := func(seq, n int) []int32 {
			v := make([]int32, n)
			for i := range v {
				v[i] = int32(seq*perSeq + i)
			}
			return v
		}

		if *prefill > 0 {
			nb := (*prefill + *blockSize - 1) / *blockSize
			tbl := make([]int32, nb)
			for i := range tbl {
				tbl[i] = int32(i)
			}
			b := backend.SingleSequence(1, ids(*prefill, 0), 0, false)
			b.Seqs[0].Blocks = tbl
			// Warm-up runs until prefillWarmup has passed (at least one):
			// a 512-token prefill of Qwen3-8l is ~10 ms, and three runs timed
			// after one warm-up gave medians up to 1.45× apart between
			// processes of the same build (docs/PERF.md, twenty-first pass).
			for t0 := time.Now(); ; {
				if err := forward(b); err != nil {
					return err
				}
				if time.Since(t0) >= prefillWarmup {
					break
				}
			}
			runs := max(3, *steps/5)
			if *profile && cb != nil {
				cb.ProfileOps(true)
			}
			var m0 int64
			if cb != nil {
				m0, _ = cb.AllocCounts()
			}
			var ms []float64
			for r := 0; r < runs; r++ {
				t := time.Now()
				if err := forward(b); err != nil {
					return err
				}
				ms = append(ms, float64(time.Since(t).Microseconds())/1e3)
			}
			if ctr != nil {
				ctr.TakeExpertLoad()
			}
			med := median(ms)
			r := modelResult{Kind: "prefill", Batch: 1, Tokens: *prefill, MS: med,
				TokensPS: float64(*prefill) / med * 1e3, WeightGB: float64(wb.total()) / 1e9}
			if cb != nil {
				m1, _ := cb.AllocCounts()
				per := float64(m1-m0) / float64(runs)
				r.Mallocs = &per
				if *profile {
					r.Ops = opTimes(cb, runs)
				}
			}
			out = append(out, r)
		}

		// Decode: nctx distinct contexts are prefilled (several to a forward
		// pass, up to 8192 tokens), and sequence s ≥ nctx gets a copy of
		// context s mod nctx in its own blocks, so each reads its own KV
		// bytes. Distinct contexts give distinct attention outputs, so a
		// batch's tokens spread over the experts as a served batch's do
		// (one shared context: 9.9 of Qwen3's 128 experts a layer at batch
		// 8, where independent tokens would pick ≈ 51).
		ctxBlocks := (*ctxLen + *blockSize - 1) / *blockSize
		nctx := max(1, min(maxB, *contexts))
		per := max(1, 8192 / *ctxLen)
		for c0 := 0; c0 < nctx; c0 += per {
			b := &backend.Batch{}
			for c := c0; c < min(nctx, c0+per); c++ {
				off := len(b.Tokens)
				b.Tokens = append(b.Tokens, ids(*ctxLen, 1+c)...)
				for i := range *ctxLen {
					b.Positions = append(b.Positions, int32(i))
				}
				b.Seqs = append(b.Seqs, backend.SeqSpan{ID: uint64(c), Offset: off, Len: *ctxLen, Blocks: seqBlocks(c, perSeq)})
				b.LogitRows = append(b.LogitRows, off+*ctxLen-1)
			}
			if err := forward(b); err != nil {
				return err
			}
		}
		var src, dst []int32
		for s := nctx; s < maxB; s++ {
			src = append(src, seqBlocks(s%nctx, ctxBlocks)...)
			dst = append(dst, seqBlocks(s, ctxBlocks)...)
		}
		if len(src) > 0 {
			be.CopyBlocks(src, dst)
		}
		// decodeBatch is step's batch of B one-token sequences.
		decodeBatch := func(B, step int) *backend.Batch {
			pos := *ctxLen + step
			b := &backend.Batch{}
			for s := 0; s < B; s++ {
				b.Tokens = append(b.Tokens, int32((s*31+step*17+3)%cfg.VocabSize))
				b.Positions = append(b.Positions, int32(pos))
				b.Seqs = append(b.Seqs, backend.SeqSpan{ID: uint64(s), Offset: s, Len: 1, Past: pos, Blocks: seqBlocks(s, perSeq)})
			}
			return b
		}
		var prevGraphs cuda.GraphStats // the counters after the previous batch size
		for _, B := range bs {
			if *profile && cb != nil {
				cb.ProfileOps(false)
			}
			var ms, gb, epl []float64
			for step := 0; step < *steps+2; step++ { // two warm-up steps
				b := decodeBatch(B, step)
				if ctr != nil {
					ctr.TakeExpertLoad()
				}
				if step == 2 && *profile && cb != nil {
					cb.ProfileOps(true)
				}
				t := time.Now()
				if err := forward(b); err != nil {
					return err
				}
				if step >= 2 {
					ms = append(ms, float64(time.Since(t).Microseconds())/1e3)
					var load map[int][]int64
					if ctr != nil {
						load = ctr.TakeExpertLoad()
					}
					gb = append(gb, float64(wb.touched(load, B))/1e9)
					if n := distinctExperts(load); n > 0 {
						epl = append(epl, n)
					}
				}
			}
			r := modelResult{Kind: "decode", Batch: B, Context: *ctxLen, Contexts: min(B, nctx), Tokens: B, MS: median(ms),
				WeightGB: median(gb)}
			if len(epl) > 0 {
				r.ExpertsPerLayer = median(epl)
			}
			if cb != nil {
				gs := cb.Graphs()
				r.Graphs = &gs
				if n := gs.Replays - prevGraphs.Replays; n > 0 {
					r.ReplayHostMS = float64(gs.ReplayHostNs-prevGraphs.ReplayHostNs) / float64(n) / 1e6
				}
				if n := gs.ReplaysTimed - prevGraphs.ReplaysTimed; n > 0 {
					r.ReplayGPUMS = float64(gs.ReplayGPUNs-prevGraphs.ReplayGPUNs) / float64(n) / 1e6
				}
			}
			if *profile && cb != nil {
				r.Ops = opTimes(cb, *steps)
			}
			if cb != nil && *graphs && cb.Stamping() { // (graph steps only)
				st, err := cb.StepStamps()
				if err != nil {
					return err
				}
				r.Stamps, r.StampSeq = stampTable(st)
			}
			if as, ok := be.(backend.AsyncSampler); ok && *overlap && *graphs {
				oms, err := overlappedSteps(be, as, *steps, func(step int) *backend.Batch { return decodeBatch(B, step) }, model,
					tmpl, urng)
				if err != nil {
					return err
				}
				r.SyncMS, r.MS = r.MS, oms
			}
			if cb != nil {
				prevGraphs = cb.Graphs()
			}
			var vr *modelResult
			if *verify > 0 { // after the decode steps' positions: the same contexts, 1+K tokens a sequence a step
				K := *verify
				var vms []float64
				for step := 0; step < *steps+2; step++ {
					pos := *ctxLen + *steps + 2 + step*(K+1)
					b := &backend.Batch{}
					for s := 0; s < B; s++ { // as the engine's verify steps: one-token spans sharing the sequence's blocks
						blk := seqBlocks(s, perSeq)
						for j := 0; j <= K; j++ {
							b.Seqs = append(b.Seqs, backend.SeqSpan{ID: uint64(s) | uint64(j)<<56, Offset: len(b.Tokens), Len: 1, Past: pos + j, Blocks: blk})
							b.Tokens = append(b.Tokens, int32((s*31+step*17+j*7+3)%cfg.VocabSize))
							b.Positions = append(b.Positions, int32(pos+j))
						}
					}
					t := time.Now()
					if err := forward(b); err != nil {
						return err
					}
					if step >= 2 {
						vms = append(vms, float64(time.Since(t).Microseconds())/1e3)
					}
				}
				vr = &modelResult{Kind: "verify", Batch: B, Context: *ctxLen, Tokens: B * (K + 1), MS: median(vms), WeightGB: r.WeightGB}
				vr.TokensPS = float64(vr.Tokens) / vr.MS * 1e3
			}
			r.TokensPS = float64(B) / r.MS * 1e3
			if *bw > 0 {
				r.FloorMS = r.WeightGB / *bw * 1e3
				r.OverFloor = r.MS / r.FloorMS
			}
			out = append(out, r)
			if vr != nil {
				out = append(out, *vr)
			}
		}

		if wd != nil {
			for i := range out {
				out[i].World = wd.size
			}
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			return enc.Encode(out)
		}
		name := *cfgDir + " (random bf16 weights)"
		if _, ok := cfg.Raw["quantization_config"]; ok {
			name = *cfgDir + " (random weights; the experts MXFP4's values)"
		}
		if *modelDir != "" {
			name = *modelDir
		}
		if wd != nil {
			name += fmt.Sprintf(" over %d processes (floor: one GPU's)", wd.size)
		}
		fmt.Fprintf(stdout, "model %s on %s: %.1f GB of weights, loaded in %.1f s; bandwidth for the floor %.0f GB/s; decode sequences read %d distinct contexts\n",
			name, be.Name(), float64(wb.total())/1e9, loadTime.Seconds(), *bw, max(1, min(slices.Max(bs), *contexts)))
		if cb, ok := be.(*cpu.Backend); ok { // (the columns count weights in bf16; this is what the backend holds)
			h := cb.WeightBytes()
			fmt.Fprintf(stdout, "cpu weights held (--cpu-weights %s): %.2f GB: fp4 %.2f, q8 %.2f, bf16 %.2f, f32 %.2f GB; kv cache %s\n",
				*cpuWeights, float64(h.Total())/1e9, float64(h.FP4)/1e9, float64(h.Q8)/1e9, float64(h.BF16)/1e9, float64(h.F32)/1e9, *kvDtype)
		}
		if cb != nil {
			h := cb.WeightBytes()
			fmt.Fprintf(stdout, "cuda weights held (--cuda-weights %s): %.2f GB: fp4 %.2f, bf16 %.2f, f32 %.2f GB\n",
				*cudaWeights, float64(h.Total())/1e9, float64(h.FP4)/1e9, float64(h.BF16)/1e9, float64(h.F32)/1e9)
		}
		fmt.Fprintf(stdout, "%-8s %6s %8s %8s %10s %12s %10s %10s %8s %12s %12s %14s %10s\n", "kind", "batch", "context", "tokens", "ms", "tokens/s", "weight GB", "floor ms", "×floor", "replay host", "replay GPU", "experts/layer", "sync ms")
		for _, r := range out {
			fmt.Fprintf(stdout, "%-8s %6d %8d %8d %10.2f %12.1f %10.3f %10.3f %8.2f %12.2f %12.2f %14.1f %10.2f\n", r.Kind, r.Batch, r.Context, r.Tokens, r.MS, r.TokensPS, r.WeightGB, r.FloorMS, r.OverFloor, r.ReplayHostMS, r.ReplayGPUMS, r.ExpertsPerLayer, r.SyncMS)
			for _, o := range r.Ops {
				fmt.Fprintf(stdout, "    %-22s %8.1f calls %10.1f us per step\n", o.Op, o.Calls, o.US)
			}
		}
		return nil
	}
	if wf.size == 0 {
		return body(context.Background(), nil)
	}
	if wf.rank == 0 && *backendName == "cuda" { // fail before starting any process
		if n, err := kernels.DeviceCount(); err != nil || n < 1 {
			return fmt.Errorf("bench model --world needs a GPU (%d devices): %v", n, err)
		}
	}
	return runWorld(context.Background(), wf, append([]string{"bench", "model"}, args...), body)
}

// sampleRows is n device-sampler rows like tmpl (temperature 0: greedy),
// each with a uniform draw from urng when it draws.
func sampleRows(n int, tmpl backend.SampleRow, urng *rand.Rand) []backend.SampleRow {
	rows := make([]backend.SampleRow, n)
	for i := range rows {
		rows[i] = tmpl
		if tmpl.Temperature > 0 {
			rows[i].U = urng.Float64()
		}
	}
	return rows
}

// overlappedSteps times decode steps as the engine runs them by default:
// step n+1 is launched with step n's greedy tokens still on the device (its
// batch's rows fed from the picks), then step n's picks are waited for. It
// returns the median interval between consecutive steps' waits (steps
// after two warm-up ones), the rate the engine would sustain.
func overlappedSteps(be backend.Backend, as backend.AsyncSampler, steps int, batch func(step int) *backend.Batch, model models.Model,
	tmpl backend.SampleRow, urng *rand.Rand) (float64, error) {
	var prev backend.Pending
	var at []time.Time
	for step := 0; step < steps+3; step++ {
		b := batch(step)
		if prev != nil {
			b.Feed = make([]int32, len(b.Tokens))
			for i := range b.Feed {
				b.Feed[i] = int32(i) // row i's token is the previous step's pick for row i
				b.Tokens[i] = 0
			}
		}
		logits, err := backend.RunStep(be, b, func() (backend.Tensor, error) { return model.Forward(b) })
		if err != nil {
			return 0, err
		}
		rows := sampleRows(len(b.Seqs), tmpl, urng)
		p, err := as.SampleAsync(logits, rows)
		if err != nil {
			return 0, err
		}
		if prev != nil {
			if got, err := prev.Wait(); err != nil || len(got) != len(rows) {
				return 0, fmt.Errorf("overlapped step %d: %d picks, %v", step, len(got), err)
			}
			at = append(at, time.Now())
		}
		prev = p
	}
	if _, err := prev.Wait(); err != nil {
		return 0, err
	}
	var ms []float64
	for i := 2; i < len(at); i++ {
		ms = append(ms, float64(at[i].Sub(at[i-1]).Microseconds())/1e3)
	}
	return median(ms), nil
}

// weightBytes splits a model's weights into what every step reads and the
// routed experts, which a step reads only where tokens went.
type weightBytes struct {
	dense    int64         // attention, norms, routers, shared experts, LM head: read every step
	embed    int64         // the embedding table's row size (one row per token is read)
	perLayer map[int]int64 // layer → bytes of one routed expert (gate_up + down + biases)
	experts  map[int]int   // layer → routed experts
}

func (w weightBytes) total() int64 {
	t := w.dense
	for l, e := range w.perLayer {
		t += e * int64(w.experts[l])
	}
	return t
}

// distinctExperts is the mean over the layers of load (MoE layer → tokens
// per expert) of the experts that received tokens; 0 for no layers.
func distinctExperts(load map[int][]int64) float64 {
	if len(load) == 0 {
		return 0
	}
	n := 0
	for _, cnt := range load {
		for _, c := range cnt {
			if c > 0 {
				n++
			}
		}
	}
	return float64(n) / float64(len(load))
}

// touched is the bytes one decode step of B tokens reads: dense weights,
// B embedding rows, and the experts that received tokens (load, from the
// backend's expert counters; all experts when it is unknown).
func (w weightBytes) touched(load map[int][]int64, B int) int64 {
	t := w.dense + int64(B)*w.embed
	for layer, per := range w.perLayer {
		cnt, ok := load[layer]
		if !ok {
			t += per * int64(w.experts[layer])
			continue
		}
		for _, c := range cnt {
			if c > 0 {
				t += per
			}
		}
	}
	return t
}

// classifyWeights sorts bf16 weights by name: "….layers.N.….experts.…"
// tensors are routed experts (stacked [E, …]), "embed_tokens" the table.
// With fp4 the routed experts' matrices count as FP4 (17/32 of a byte a
// value: kernels.FP4Sizes).
func classifyWeights(shapes map[string][]int, fp4 bool) weightBytes {
	w := weightBytes{perLayer: map[int]int64{}, experts: map[int]int{}}
	for name, shape := range shapes {
		n := int64(2)
		for _, d := range shape {
			n *= int64(d)
		}
		if fp4 && (strings.HasSuffix(name, "experts.gate_up_proj") || strings.HasSuffix(name, "experts.down_proj")) {
			n = n / 2 * 17 / 32
		}
		switch {
		case strings.Contains(name, "embed_tokens"):
			w.embed = n / int64(shape[0])
		case strings.Contains(name, ".experts.") && !strings.Contains(name, "shared"):
			layer := layerOf(name) // fused [E, …] tensors
			w.perLayer[layer] += n / int64(shape[0])
			w.experts[layer] = shape[0]
		default:
			w.dense += n
		}
	}
	return w
}

// layerOf returns N of "model.layers.N.…" (-1 if absent).
func layerOf(name string) int {
	const key = "layers."
	i := strings.Index(name, key)
	if i < 0 {
		return -1
	}
	rest := name[i+len(key):]
	if j := strings.IndexByte(rest, '.'); j >= 0 {
		rest = rest[:j]
	}
	n, err := strconv.Atoi(rest)
	if err != nil {
		return -1
	}
	return n
}

// parsePositiveInts parses a comma-separated list of positive integers.
func parsePositiveInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--%s: %q is not a positive integer", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// median of a non-empty slice (which it sorts).
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// stampTable sums a stamped step's op times by op (costliest first) and
// lists them in order (µs).
func stampTable(st []cuda.OpStamp) (byOp, seq []opTime) {
	at := map[string]int{}
	for _, o := range st {
		us := float64(o.NS) / 1e3
		seq = append(seq, opTime{Op: o.Op, Calls: 1, US: us})
		i, ok := at[o.Op]
		if !ok {
			i = len(byOp)
			at[o.Op] = i
			byOp = append(byOp, opTime{Op: o.Op})
		}
		byOp[i].Calls++
		byOp[i].US += us
	}
	sort.SliceStable(byOp, func(i, j int) bool { return byOp[i].US > byOp[j].US })
	return byOp, seq
}
