package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/linalg"
	"github.com/mkserve/mkserve/models"
)

// inspectReport is what `mkserve inspect` prints: a checkpoint's size in
// parameters and the memory it takes served, read from its config and
// safetensors headers alone.
type inspectReport struct {
	Architecture string `json:"architecture"`
	Layers       int    `json:"layers"`
	Experts      int    `json:"experts"`
	TopK         int    `json:"experts_per_token"`
	Tensors      int    `json:"tensors"`
	// Parameters counts every value bound; ExpertParameters those of the
	// routed experts; ActiveParameters what a token's forward pass reads
	// (everything but the experts it is not routed to).
	Parameters       int64 `json:"parameters"`
	ExpertParameters int64 `json:"expert_parameters"`
	ActiveParameters int64 `json:"active_parameters"`
	// DerivedParameters are values the backend holds beside the
	// checkpoint's: MLA's W_UK transposed for absorbed decode.
	DerivedParameters int64 `json:"derived_parameters"`
	FileBytes         int64 `json:"file_bytes"`
	// CPUBytes is the weights' memory on the cpu backend by cpu_weights
	// (stored, auto, q8).
	CPUBytes map[string]int64 `json:"cpu_bytes"`
	// CUDABytes is the weights' device memory on the cuda backend by
	// cuda_weights (stored: bf16 matrices, float32 vectors; fp4: an MXFP4
	// checkpoint's experts as FP4, 17/32 of a byte a value).
	CUDABytes map[string]int64 `json:"cuda_bytes"`
	// KVBytesPerToken is the paged KV cache's bytes a token, all layers,
	// by element type (float32, bf16).
	KVBytesPerToken map[string]int64 `json:"kv_bytes_per_token"`
	MaxModelLen     int              `json:"max_model_len"`
}

// cmdInspect prints what a checkpoint holds and the memory it takes served
// (`mkserve inspect --model DIR [--json]`), without loading its weights.
func cmdInspect(args []string, _ io.Reader, stdout io.Writer) error {
	fs := newFlags("inspect")
	dir := fs.String("model", "", "Hugging Face checkpoint directory")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("--model is required")
	}
	inv, err := models.Inspect(*dir)
	if err != nil {
		return err
	}
	r := inspect(inv)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	gb := func(n int64) string { // bytes
		if n < 1e9 {
			return fmt.Sprintf("%.1f MB", float64(n)/1e6)
		}
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	}
	count := func(n int64) string { // parameters
		if n < 1e9 {
			return fmt.Sprintf("%.2fM", float64(n)/1e6)
		}
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	}
	fmt.Fprintf(stdout, "%s: %s, %d layers", *dir, r.Architecture, r.Layers)
	if r.Experts > 0 {
		fmt.Fprintf(stdout, ", %d experts (top %d)", r.Experts, r.TopK)
	}
	fmt.Fprintf(stdout, ", context %d\n", r.MaxModelLen)
	fmt.Fprintf(stdout, "parameters   %s (experts %s; read per token %s) in %d tensors, %s on disk\n",
		count(r.Parameters), count(r.ExpertParameters), count(r.ActiveParameters), r.Tensors, gb(r.FileBytes))
	if r.DerivedParameters > 0 {
		fmt.Fprintf(stdout, "             + %s held beside them (MLA's W_UK transposed, for absorbed decode)\n", count(r.DerivedParameters))
	}
	fmt.Fprintf(stdout, "cpu weights  stored %s, auto %s, q8 %s (--cpu-weights)\n", gb(r.CPUBytes["stored"]), gb(r.CPUBytes["auto"]), gb(r.CPUBytes["q8"]))
	fmt.Fprintf(stdout, "cuda weights stored %s, fp4 %s (--cuda-weights; auto takes fp4 where the bf16 experts would fill over 60%% of the GPU)\n",
		gb(r.CUDABytes["stored"]), gb(r.CUDABytes["fp4"]))
	fmt.Fprintf(stdout, "kv cache     %d bytes a token in float32, %d in bf16 (--kv-cache-dtype); %s for one sequence of %d tokens in bf16\n",
		r.KVBytesPerToken["float32"], r.KVBytesPerToken["bf16"], gb(r.KVBytesPerToken["bf16"]*int64(r.MaxModelLen)), r.MaxModelLen)
	return nil
}

// inspect sums an inventory into a report: the cpu backend's forms as
// cpu.Options.Weights chooses them (a quantized checkpoint dequantized to
// bf16 first; vectors in float32; MXFP4 experts back to FP4 under auto —
// a bf16 matrix that happens to be exact in Q8 or FP4 is not foreseen;
// every matrix with rows a multiple of 32 long but the routers in Q8
// under q8).
func inspect(inv *models.Inventory) inspectReport {
	c := inv.Config
	r := inspectReport{Architecture: c.Architecture, Layers: c.NumLayers, Experts: c.NumExperts, TopK: c.NumExpertsPerTok,
		Tensors: len(inv.Tensors), FileBytes: inv.FileBytes, MaxModelLen: c.MaxPositions,
		CPUBytes: map[string]int64{}, CUDABytes: map[string]int64{}, KVBytesPerToken: map[string]int64{}}
	// add counts n values held as stored bytes each, or as FP4 (mxfp4) or
	// Q8 (grouped) where auto or q8 takes them so.
	add := func(name string, n, stored int64, grouped, mxfp4 bool) {
		r.CPUBytes["stored"] += n * stored
		if mxfp4 && grouped {
			r.CPUBytes["auto"] += n / linalg.Q8Group * int64(linalg.FP4RowBytes(linalg.Q8Group))
		} else {
			r.CPUBytes["auto"] += n * stored
		}
		if grouped && !cpu.IsRouter(name) {
			r.CPUBytes["q8"] += n / linalg.Q8Group * int64(linalg.Q8RowBytes(linalg.Q8Group))
		} else {
			r.CPUBytes["q8"] += n * stored
		}
	}
	for _, t := range inv.Tensors {
		n := int64(1)
		for _, d := range t.Shape {
			n *= int64(d)
		}
		r.Parameters += n
		if strings.Contains(t.Name, ".experts.") { // (routed experts, per-expert or fused; not shared_experts)
			r.ExpertParameters += n
		}
		// The cpu backend's bytes a value: bf16 matrices stay bf16 (so do
		// FP8 and MXFP4 ones, dequantized to bf16), all else is float32.
		matrix := len(t.Shape) >= 2
		stored := int64(4)
		if matrix && t.Stored != "F32" && t.Stored != "F16" {
			stored = 2
		}
		grouped := matrix && t.Shape[len(t.Shape)-1]%linalg.Q8Group == 0
		add(t.Name, n, stored, grouped, t.Stored == "MXFP4")
		// The cuda backend holds bf16 matrices as bf16, everything else in
		// float32; under fp4 an MXFP4 expert matrix whose rows and columns
		// are whole FP4 blocks is packed (kernels.FP4Sizes).
		cudaStored := int64(4)
		if matrix && t.Stored != "F32" && t.Stored != "F16" {
			cudaStored = 2
		}
		r.CUDABytes["stored"] += n * cudaStored
		if t.Stored == "MXFP4" && matrix && t.Shape[len(t.Shape)-1]%kernels.FP4BlockValues == 0 &&
			t.Shape[len(t.Shape)-2]%kernels.FP4BlockValues == 0 {
			codes, scales := kernels.FP4Sizes(int(n/int64(t.Shape[len(t.Shape)-1])), t.Shape[len(t.Shape)-1])
			r.CUDABytes["fp4"] += codes + scales
		} else {
			r.CUDABytes["fp4"] += n * cudaStored
		}
		if strings.HasSuffix(t.Name, ".kv_b_proj.weight") && c.KVLoraRank > 0 {
			// MLA: the backend also holds W_UK transposed, [heads·L, N].
			d := int64(c.NumHeads * c.QKNopeHeadDim * c.KVLoraRank)
			r.DerivedParameters += d
			add(t.Name, d, stored, c.QKNopeHeadDim%linalg.Q8Group == 0, false)
		}
	}
	r.ActiveParameters = r.Parameters
	if c.NumExperts > 0 {
		r.ActiveParameters -= r.ExpertParameters * int64(c.NumExperts-c.NumExpertsPerTok) / int64(c.NumExperts)
	}
	// A token's cache, all layers: MLA caches its latent and rope key
	// (values read inside the keys); the others every kv head's key and
	// value.
	perLayer := int64(2 * c.NumKVHeads * c.HeadDim)
	if c.KVLoraRank > 0 {
		perLayer = int64(c.KVLoraRank + c.QKRopeHeadDim)
	}
	r.KVBytesPerToken["float32"] = 4 * perLayer * int64(c.NumLayers)
	r.KVBytesPerToken["bf16"] = 2 * perLayer * int64(c.NumLayers)
	return r
}
