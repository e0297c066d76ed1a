// Package backend defines the narrow interface that model families are
// written against, and the batch layout handed to it each step.
//
// Data flow of one step:
//
//	engine (scheduling data) ─► Batch (tokens, positions, sequence spans)
//	  ─► models.Model.Forward(batch) calls Backend ops on opaque Tensors
//	  ─► logits [rows, vocab] copied back with ToHost.
//
// A Backend owns its tensors' memory and the KV cache of every sequence it
// has seen; the model never looks inside a Tensor. The CPU backend
// (backend/cpu) is the reference; the CUDA backend implements the same ops
// with kernels from kernels/.
package backend

import (
	"errors"
	"fmt"
	"slices"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// Tensor is an opaque, backend-owned 2-D (or 1-D) array of float32-compatible
// values. Activations are row-major [rows, cols].
type Tensor interface {
	Shape() []int
}

// SeqSpan is one sequence's run of consecutive rows in a Batch.
type SeqSpan struct {
	ID     uint64 // KV-cache key; stable across steps
	Offset int    // first row of this sequence in the batch
	Len    int    // number of rows (new tokens) of this sequence
	Past   int    // tokens of this sequence already in the KV cache
	// Blocks is the paged KV cache's block table: the ids of the blocks that
	// hold positions [0, Past+Len) in order (block i holds positions
	// [i*blockSize, (i+1)*blockSize)). Nil uses the backend's unpaged
	// per-sequence cache keyed by ID instead.
	Blocks []int32
	// ContextParallel > 1 asks for this span's rows to be attended the way R
	// context-parallel ranks do it (ring attention: zigzag split of the
	// rows, key/value slices passed around the ring, partial results merged
	// by log-sum-exp); the result equals plain attention up to rounding. 0
	// or 1: plain attention.
	ContextParallel int
}

// Batch is the input of one forward step: the new tokens of several
// sequences laid end to end.
type Batch struct {
	Tokens    []int32   // [T] token ids
	Positions []int32   // [T] position of each token in its sequence
	Seqs      []SeqSpan // spans covering [0, T) in order
	// LogitRows lists the rows whose logits are wanted, in output order.
	// Nil means every row.
	LogitRows []int
	// Feed, when not nil ([T]), marks the rows whose token id is still on
	// the device (overlapped decode): Feed[i] ≥ 0 takes row i's id from row
	// Feed[i] of the picks of the backend's latest AsyncSampler.SampleAsync,
	// and Tokens[i] is then a placeholder (0) the backend may overwrite with
	// the id; -1 takes Tokens[i]. Only for an AsyncSampler, through RunStep.
	Feed []int32
}

// Validate checks that spans tile the batch and positions follow Past.
func (b *Batch) Validate() error { return validateBatch(b) }

// AttnParams describes one attention layer.
type AttnParams struct {
	Layer      int     // layer index (KV-cache slot)
	NumHeads   int     // query heads
	NumKVHeads int     // key/value heads (GQA: NumHeads % NumKVHeads == 0)
	HeadDim    int     // q/k head dimension
	VHeadDim   int     // v head dimension (MLA: differs from HeadDim)
	Scale      float32 // softmax scale applied to q·k
	Window     int     // sliding window in tokens (0: full causal attention)
	Sinks      Tensor  // [NumHeads] per-head sink logits (gpt-oss), or nil
	// ValuesInKeys: the layer's cache keeps keys only, each value being the
	// first VHeadDim columns of its key (one KV head, VHeadDim ≤ HeadDim;
	// MLA's latent cache, where the latent is the value and the first part
	// of the key). Attention's v must hold those columns; it is not cached.
	// Only on a backend whose ValuesInKeysCache says yes.
	ValuesInKeys bool
}

// ValuesInKeysCache is implemented by backends whose KV caches can keep a
// layer's values inside its keys (AttnParams.ValuesInKeys).
type ValuesInKeysCache interface {
	// ValuesInKeys reports whether layers loaded now may ask for it.
	ValuesInKeys() bool
}

// ValuesInKeysOn reports whether be keeps values inside keys where a layer
// asks: a ValuesInKeysCache that says yes.
func ValuesInKeysOn(be Backend) bool {
	v, ok := be.(ValuesInKeysCache)
	return ok && v.ValuesInKeys()
}

// CheckValuesInKeys returns an error when p asks for values inside keys
// with shapes that cannot hold them (more than one KV head, values wider
// than keys).
func (p *AttnParams) CheckValuesInKeys() error {
	if p.ValuesInKeys && (p.NumKVHeads != 1 || p.VHeadDim > p.HeadDim) {
		return fmt.Errorf("layer %d: values in keys need one KV head and VHeadDim ≤ HeadDim, not %d heads of %d/%d",
			p.Layer, p.NumKVHeads, p.HeadDim, p.VHeadDim)
	}
	return nil
}

// MLP is a gated feed-forward block: down(act(gate(x)) * up(x)).
type MLP struct {
	GateUp Tensor // [2*I, H]: rows [0,I) gate, rows [I,2I) up
	Down   Tensor // [H, I]
}

// MoELayer is a sparse expert layer with its router. Expert weights are
// stacked over experts so that a backend can run them as a grouped GEMM.
type MoELayer struct {
	Layer      int // decoder layer index (for expert-load statistics)
	Router     moe.RouterConfig
	Gate       Tensor // [E, H] router weight
	GateBias   Tensor // [E] router bias (gpt-oss) or nil
	ScoreBias  Tensor // [E] e_score_correction_bias (DeepSeek-V3) or nil; used for selection only
	GateUp     Tensor // [E, 2*I, H] (flattened [E*2*I, H]): per expert, gate rows then up rows
	GateUpBias Tensor // [E, 2*I] or nil
	Down       Tensor // [E, H, I] (flattened [E*H, I])
	DownBias   Tensor // [E, H] or nil
	Act        moe.Activation
	// LocalExperts > 0: GateUp, Down and their biases hold only experts
	// [ExpertLo, ExpertLo+LocalExperts) of the router's NumExperts, the block
	// an ExpertSharder backend keeps (one rank of a world of processes);
	// 0: every expert.
	ExpertLo, LocalExperts int
	// Shared experts, always applied, added to the routed output.
	Shared     *MLP   // or nil
	SharedGate Tensor // [1, H]: out += sigmoid(x·g) * shared(x) (Qwen2-MoE); nil: ungated
}

// SampleRow is one row's sampling request for a device Sampler, with the
// semantics of the engine's host sampler (engine/sampler.go): penalties
// first (repetition over Seen, then presence and frequency over Output
// with its Counts), then greedy at Temperature 0, else softmax(w / T)
// restricted by top-k, then min-p (relative to the most likely token), then
// top-p (over the top-k distribution), and the token where the cumulative
// kept mass first exceeds U · (kept mass), in descending probability order
// (ties: lower id first).
type SampleRow struct {
	Temperature       float32 // 0: greedy (argmax of the penalised logits; lowest id on ties)
	TopK              int     // 0: off
	TopP              float32 // (0, 1]; 1: off
	MinP              float32 // [0, 1]; 0: off
	RepetitionPenalty float32 // 1: off; a positive logit is divided by it, a negative one multiplied
	PresencePenalty   float32
	FrequencyPenalty  float32
	Seen              []int32 // distinct prompt and output tokens (repetition penalty)
	Output            []int32 // distinct output tokens (presence and frequency penalties) …
	Counts            []int32 // … and how often each occurred
	// U is the uniform draw in [0, 1) that picks the token; the engine
	// draws it from the request's seeded generator on the host, so a seed
	// means the same on every backend.
	U float64
	// TopLogprobs > 0 returns that many alternatives (at most 20); the
	// chosen token's log-probability is always returned. Log-probabilities
	// are log-softmax of the raw logits (before penalties and temperature;
	// after Allowed and the bias).
	TopLogprobs int
	// Allowed, when not nil, is a mask over the vocabulary (token t at bit
	// t%64 of word t/64; ⌈V/64⌉ words): the tokens it clears are never
	// picked (constrained decoding: the grammar's acceptable tokens). It
	// allows at least one token.
	Allowed []uint64
	// BiasIDs and BiasVals add BiasVals[i] to the logit of token
	// BiasIDs[i] (distinct ids; −Inf bans the token): OpenAI's logit_bias.
	// Bias and Allowed apply first, before penalties and temperature; a row
	// with either returns log-probabilities of the logits after them.
	BiasIDs  []int32
	BiasVals []float32
}

// Processed reports whether r changes logits before sampling (Allowed or
// a bias).
func (r *SampleRow) Processed() bool { return r.Allowed != nil || len(r.BiasIDs) > 0 }

// SampleResult is the token a Sampler picked for one row.
type SampleResult struct {
	Token   int32
	Logprob float32   // log-softmax of the raw logits at Token
	TopIDs  []int32   // the TopLogprobs most likely tokens, most likely first
	TopLogp []float32 // their log-probabilities
}

// Sampler is implemented by backends that sample on the device, so that
// only a few bytes per row come back instead of the logits.
type Sampler interface {
	// Sample picks one token per row of logits [B, V], len(rows) == B.
	Sample(logits Tensor, rows []SampleRow) []SampleResult
}

// AsyncSampler is a Sampler whose picks can stay on the device, so that
// the engine launches the next step before they reach the host (overlapped
// decode, as vLLM's async scheduling): the next step's Batch.Feed names the
// rows whose token is a pick, and Pending.Wait brings the picks back.
type AsyncSampler interface {
	Sampler
	// SampleAsync queues the sampling of logits' rows [B, V] and returns
	// without waiting for it. The Pending of a call must be waited for
	// before the second call after it.
	SampleAsync(logits Tensor, rows []SampleRow) (Pending, error)
}

// Pending is a SampleAsync's result on its way to the host.
type Pending interface {
	// Wait blocks until the picks are on the host and returns them, one
	// per row (the same as Sample's); a second call returns an error.
	Wait() ([]SampleResult, error)
}

// KVWidth is one attention layer's cached elements per token: K for the
// keys (kv heads × head dim) and V for the values (0 when they live inside
// the keys: AttnParams.ValuesInKeys).
type KVWidth struct{ Layer, K, V int }

// KVAllocator is implemented by backends that allocate the whole paged KV
// cache when it is sized (so that a budget that does not fit fails at
// start, not in the middle of serving), instead of layer by layer at first
// use.
type KVAllocator interface {
	// KVElemBytes is the bytes of one cached key or value element.
	KVElemBytes() int
	// AllocKV allocates InitKV's pool for every layer of widths now. On an
	// error (out of memory) no layer of the pool stays allocated.
	AllocKV(widths []KVWidth) error
}

// LatentAttender is a Backend that caches multi-head latent attention
// (DeepSeek-V3's MLA) in compressed form: per token and layer the
// normalised latent c (Lora values) and the rotated rope key (Rope values)
// — 576 values for DeepSeek-V3 — instead of every head's decompressed key
// and value (128 × (192 + 128)). The backend picks per span how to attend:
// absorbed (queries q_nope·W_UK per head against [c ‖ rope key] with one KV
// head, values c, each head's output through W_UV: cheap for decode), or
// decompressed (the span's whole history of c through W_UK and W_UV, then
// ordinary attention: cheaper for long prefills). A model without it caches
// decompressed keys and values through Attention.
type LatentAttender interface {
	// LatentMLA reports whether MLA layers loaded now should cache the
	// latent (LatentMLAEnv can say no; a backend may also want it asked
	// for while its path is new).
	LatentMLA() bool
	// LatentAttention appends [c ‖ kPe] to layer p.Layer's KV cache for every
	// sequence of the batch and attends causally: qNope [T, H*Nope], qPe
	// [T, H*Rope] and kPe [T, Rope] rotated, c [T, Lora] normalised → [T,
	// H*V]. p gives the heads (NumHeads), the scale, and the cache widths
	// (NumKVHeads 1, HeadDim Lora+Rope, VHeadDim Lora: MLAParams).
	LatentAttention(qNope, qPe, c, kPe Tensor, b *Batch, p *AttnParams, w *MLAWeights) Tensor
}

// LatentMLAEnv names the environment variable that chooses the MLA cache
// of a backend.LatentAttender: 0 keeps the decompressed keys and values
// (comparisons); anything else, the latent (both backends' default).
const LatentMLAEnv = "MKSERVE_MLA_LATENT"

// MLAWeights are one MLA layer's kv_b_proj split for LatentAttention; per
// head h, kv_b_proj's rows h*(Nope+V).. are W_UK_h [Nope, Lora] then W_UV_h
// [V, Lora].
type MLAWeights struct {
	Lora, Nope, Rope, V int
	UKT                 Tensor // [H*Lora, Nope]: each head's W_UK transposed (absorbs queries)
	UK                  Tensor // [H*Nope, Lora]: each head's W_UK (decompresses keys)
	UV                  Tensor // [H*V, Lora]: each head's W_UV (decompresses values, maps outputs back)
}

// MLAParams are the AttnParams of a LatentAttention layer: the cache widths
// of one KV head of [c ‖ rope key] keys and c values — the values kept
// inside the keys (the latent once a token) when valuesInKeys.
func MLAParams(layer, heads int, w *MLAWeights, scale float32, valuesInKeys bool) AttnParams {
	return AttnParams{Layer: layer, NumHeads: heads, NumKVHeads: 1, HeadDim: w.Lora + w.Rope, VHeadDim: w.Lora,
		Scale: scale, ValuesInKeys: valuesInKeys}
}

// ExpertPlacer is implemented by backends with expert parallelism whose
// placement (which rank holds which expert, hot experts replicated) can
// change between steps.
type ExpertPlacer interface {
	// ExpertRanks is the number of expert-parallel ranks (1: none).
	ExpertRanks() int
	// PlaceExperts installs p for the MoE layer with index layer from the
	// next step on; p must place that layer's experts on ExpertRanks ranks.
	// An error wrapping ErrNotPlaceable means no placement of that layer
	// can ever be installed (callers stop trying); other errors may pass.
	PlaceExperts(layer int, p *moe.Placement) error
}

// ExpertSharder is a backend that keeps only a block of each MoE layer's
// routed experts (a rank of an expert-parallel world of processes): model
// loaders upload only experts [lo, hi) of a layer of E, and say so in
// MoELayer.ExpertLo and LocalExperts.
type ExpertSharder interface {
	ExpertShard(E int) (lo, hi int)
}

// ExpertPlan is what a model's loader knows about its routed experts before
// it uploads any: their quantization in the checkpoint ("mxfp4", "fp8" or
// "") and their bytes in bf16 over every layer and expert (before a
// sharder's split), E experts a layer.
type ExpertPlan struct {
	Quant     string
	BF16Bytes int64
	E         int
}

// WeightBytes is the memory of the weights a backend holds, by form.
type WeightBytes struct {
	F32, BF16, Q8, FP4 int64
	// FP4Group is the bytes of an FP4 group of 32 values in this backend's
	// form (the cpu's: 20, codes and a float32 scale; cuda's: 17, codes and
	// an E8M0 byte).
	FP4Group int64
}

// Total is the bytes of all forms.
func (w WeightBytes) Total() int64 { return w.F32 + w.BF16 + w.Q8 + w.FP4 }

// Values is the number of values the weights hold (4 bytes a float32, 2 a
// bf16, 36 a group of 32 in Q8, FP4Group in FP4).
func (w WeightBytes) Values() int64 {
	v := w.F32/4 + w.BF16/2 + w.Q8/36*32
	if w.FP4Group > 0 {
		v += w.FP4 / w.FP4Group * 32
	}
	return v
}

// Forms is the bytes by form, keyed as /metrics labels them: "f32",
// "bf16", "q8" and "fp4".
func (w WeightBytes) Forms() map[string]int64 {
	return map[string]int64{"f32": w.F32, "bf16": w.BF16, "q8": w.Q8, "fp4": w.FP4}
}

// Dominant names the form that holds the most bytes: "F32", "BF16", "Q8"
// or "FP4" ("" for none).
func (w WeightBytes) Dominant() string {
	best, name := int64(0), ""
	for _, f := range []struct {
		n    int64
		name string
	}{{w.F32, "F32"}, {w.BF16, "BF16"}, {w.Q8, "Q8"}, {w.FP4, "FP4"}} {
		if f.n > best {
			best, name = f.n, f.name
		}
	}
	return name
}

// FP4Loader is implemented by backends that can take an MXFP4 checkpoint's
// expert matrices as they are stored, with no bf16 copy on the way: model
// loaders ask WantFP4 (after ExpertPlanner.PlanExperts, if implemented) and
// then hand each expert matrix [n, k] to WeightMXFP4 as MXFP4 — blocks
// (n·k/32 groups of 16 bytes along each row, element 2i of a group in the
// low nibble of byte i, an E2M1 code with the sign in bit 3) and scales
// (n·k/32 E8M0 bytes, 2^(s−127)) — where a row is one output of the
// matrix (Weight's row), k its inputs (a multiple of 32).
type FP4Loader interface {
	WantFP4() bool
	WeightMXFP4(name string, blocks, scales []byte, n, k int) (Tensor, error)
}

// ExpertPlanner is implemented by backends that choose how to hold expert
// weights from the whole model's size (the CUDA backend holds an MXFP4
// checkpoint's experts as FP4 when their bf16 form would not leave room):
// models.Build calls PlanExperts once, before the first upload.
type ExpertPlanner interface {
	PlanExperts(p ExpertPlan)
}

// ErrNotPlaceable is wrapped by PlaceExperts errors for a layer whose
// experts the backend cannot move at all (on the CUDA backend: a layer
// outside the fused MoE path).
var ErrNotPlaceable = errors.New("the layer's experts cannot be placed")

// ExpertCounter is implemented by backends that count how many tokens each
// expert of each MoE layer received.
type ExpertCounter interface {
	// TakeExpertLoad returns the counts since the previous call, per layer
	// index: tokens routed to each expert.
	TakeExpertLoad() map[int][]int64
}

// Backend is the set of operations model families are written against.
// Every op returns a new tensor; inputs are never modified.
type Backend interface {
	// Name is "cpu", "cuda", ...
	Name() string
	// Weight converts a host tensor (F32/F16/BF16) once into the backend's
	// compute form. Tensors of more than 2 dims are flattened to
	// [shape[0]*...*shape[n-2], shape[n-1]].
	Weight(h *tensor.Host) (Tensor, error)
	// ToHost copies a tensor back as float32, row-major.
	ToHost(x Tensor) []float32

	// Embed gathers rows of table [V, H] → [len(ids), H].
	Embed(table Tensor, ids []int32) Tensor
	// Linear is x·wᵀ (+ bias): x [T, K], w [N, K], bias [N] or nil → [T, N].
	Linear(x, w, bias Tensor) Tensor
	// RMSNorm normalises each group of len(w) columns of x [T, G*len(w)] and scales by w.
	RMSNorm(x, w Tensor, eps float32) Tensor
	// Add is a + b, same shapes.
	Add(a, b Tensor) Tensor
	// Clamp limits every element to [-limit, limit].
	Clamp(x Tensor, limit float32) Tensor
	// SwiGLU is silu(gate)*up on x [T, 2*I] laid out as [gate | up] → [T, I].
	SwiGLU(x Tensor) Tensor
	// SplitCols splits x [T, heads*Σsizes] by head: part i is [T, heads*sizes[i]]
	// taking, from every head's block, the columns of the i-th size.
	SplitCols(x Tensor, heads int, sizes ...int) []Tensor
	// ConcatCols is the inverse of SplitCols: parts[i] is [T, h_i*sizes[i]]
	// where h_i is heads or 1 (a single head broadcast to every head).
	ConcatCols(heads int, parts []Tensor, sizes []int) Tensor
	// RoPE rotates the first rope.Dim columns of every head of x [T, heads*headDim]
	// at the batch's positions.
	RoPE(x Tensor, heads, headDim int, rope *attention.RoPE, pos []int32) Tensor
	// Attention appends k, v to the layer's KV cache for every sequence of the
	// batch and attends causally: q [T, H*D], k [T, KVH*D], v [T, KVH*Dv] → [T, H*Dv].
	Attention(q, k, v Tensor, b *Batch, p *AttnParams) Tensor
	// MLP runs a dense gated MLP with SwiGLU.
	MLP(x Tensor, m *MLP) Tensor
	// MoE routes every row of x [T, H] to its experts and returns the combined
	// output [T, H], shared experts included.
	MoE(x Tensor, l *MoELayer) Tensor
	// Rows selects rows of x (for logits of the last token of each sequence).
	Rows(x Tensor, rows []int) Tensor

	// FreeSequence drops a sequence's unpaged KV cache.
	FreeSequence(id uint64)
	// InitKV allocates the paged KV cache: numBlocks blocks of blockSize
	// tokens for every attention layer. Calling it again discards the old pool.
	InitKV(blockSize, numBlocks int) error
	// CopyBlocks copies the contents of block src[i] to dst[i] in every layer
	// (copy-on-write when sequences that shared a block diverge).
	CopyBlocks(src, dst []int32)
}

// StepGrapher is a Backend that can record the work of a step once and
// replay it (CUDA graphs). GraphStep runs f, which must be the model's
// forward pass over b and nothing else, and returns its result; the
// backend decides whether the step runs eagerly, is captured or is
// replayed, and falls back to running f eagerly whenever a graph cannot
// stand for it. The result may live in memory the graph reuses: it is valid
// until the next step. No other goroutine may use the backend meanwhile.
type StepGrapher interface {
	GraphStep(b *Batch, f func() (Tensor, error)) (Tensor, error)
}

// Releaser is a Backend that can reuse a tensor's memory before the garbage
// collector finds the tensor dead (the CUDA backend: an 8k prefill's
// activations are 64–600 MB each, and a forward pass would otherwise hold
// every one of them until a collection and allocate afresh for each).
type Releaser interface {
	// Release says that the caller will not use ts again: work queued
	// before still reads their values, later work may reuse their memory.
	// Nil entries are skipped, and so are tensors the backend does not own
	// alone (weights, views of other tensors).
	Release(ts ...Tensor)
}

// Release passes dead to be's Releaser, if it has one, leaving out any of
// them that is also in live (an op may return its input as its output).
func Release(be Backend, live []Tensor, dead ...Tensor) {
	r, ok := be.(Releaser)
	if !ok {
		return
	}
	out := dead[:0:0]
	for _, t := range dead {
		if t != nil && !slices.Contains(live, t) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if len(out) > 0 {
		r.Release(out...)
	}
}

// AddNormer is a Backend that fuses a residual add with the RMSNorm that
// follows it (on the GPU one launch instead of two per pair).
type AddNormer interface {
	// AddRMSNorm returns x + r and that sum normalised by RMSNorm and
	// scaled by w [cols] (one group per row): the values of Add then
	// RMSNorm.
	AddRMSNorm(x, r, w Tensor, eps float32) (sum, normed Tensor)
}

// AddRMSNorm is be's AddRMSNorm when be is an AddNormer, else Add then
// RMSNorm.
func AddRMSNorm(be Backend, x, r, w Tensor, eps float32) (sum, normed Tensor) {
	if a, ok := be.(AddNormer); ok {
		return a.AddRMSNorm(x, r, w, eps)
	}
	sum = be.Add(x, r)
	return sum, be.RMSNorm(sum, w, eps)
}

// MoEAddNormer is a Backend that folds a MoE layer's combine (the weighted
// sum of each token's expert outputs) into the residual add and RMSNorm
// after the layer (on the GPU: one launch and one round trip of the
// combined rows fewer per layer).
type MoEAddNormer interface {
	// MoEAddRMSNorm returns x + MoE(h, l) and that sum normalised by
	// RMSNorm and scaled by w [cols]: the values of AddRMSNorm(x, MoE(h,
	// l), w, eps).
	MoEAddRMSNorm(x, h Tensor, l *MoELayer, w Tensor, eps float32) (sum, normed Tensor)
}

// MoEAddRMSNorm is be's MoEAddRMSNorm when be is a MoEAddNormer, else
// AddRMSNorm(be, x, be.MoE(h, l), w, eps).
func MoEAddRMSNorm(be Backend, x, h Tensor, l *MoELayer, w Tensor, eps float32) (sum, normed Tensor) {
	if a, ok := be.(MoEAddNormer); ok {
		return a.MoEAddRMSNorm(x, h, l, w, eps)
	}
	return AddRMSNorm(be, x, be.MoE(h, l), w, eps)
}

// NormRoPEr is implemented by backends that fuse the per-head RMSNorm of
// q and k with RoPE (Qwen3-style attention: one launch instead of six on
// the CUDA backend).
type NormRoPEr interface {
	// NormRoPE returns RoPE(RMSNorm(q, qw, eps)) over heads heads and the
	// same of k with kw over kvHeads heads, with the values of those ops
	// (within the backend's precision profile); a nil weight skips that
	// norm. ok is false when the backend does not fuse these shapes (then
	// nothing was done).
	NormRoPE(q, k, qw, kw Tensor, eps float32, heads, kvHeads, headDim int, rope *attention.RoPE,
		pos []int32) (qo, ko Tensor, ok bool)
}

// NormRoPE is RoPE(RMSNorm(q, qw, eps)) over q [T, heads*headDim] and the
// same of k [T, kvHeads*headDim] with kw (weights [headDim] or covering
// all heads; nil: RoPE alone) through be's NormRoPEr when it fuses the
// shapes, else RMSNorm and RoPE op by op.
func NormRoPE(be Backend, q, k, qw, kw Tensor, eps float32, heads, kvHeads, headDim int, rope *attention.RoPE,
	pos []int32) (Tensor, Tensor) {
	if f, ok := be.(NormRoPEr); ok {
		if qo, ko, ok := f.NormRoPE(q, k, qw, kw, eps, heads, kvHeads, headDim, rope, pos); ok {
			return qo, ko
		}
	}
	one := func(x, w Tensor, h int) Tensor {
		if w != nil {
			x = be.RMSNorm(x, w, eps)
		}
		return be.RoPE(x, h, headDim, rope, pos)
	}
	return one(q, qw, heads), one(k, kw, kvHeads)
}

// NormRoPEAttender is implemented by backends that run a decode step's
// q/k norms, RoPE, KV-cache write and attention as one kernel.
type NormRoPEAttender interface {
	// NormRoPEAttention is Attention(NormRoPE(q, k, …), v) for a batch
	// whose every span is one new token with a block table, with the
	// values of those ops within the backend's precision profile. ok is
	// false when the backend does not fuse this batch or these shapes
	// (then nothing was done: the caller runs the ops one by one).
	NormRoPEAttention(q, k, v, qw, kw Tensor, eps float32, rope *attention.RoPE, b *Batch,
		p *AttnParams) (out Tensor, ok bool)
}

// NormRoPEAttention is be.Attention of NormRoPE's q and k (and v) over
// batch b: through be's NormRoPEAttender when it fuses the batch, else op
// by op.
func NormRoPEAttention(be Backend, q, k, v, qw, kw Tensor, eps float32, rope *attention.RoPE, b *Batch,
	p *AttnParams) Tensor {
	if f, ok := be.(NormRoPEAttender); ok {
		if o, ok := f.NormRoPEAttention(q, k, v, qw, kw, eps, rope, b, p); ok {
			return o
		}
	}
	qr, kr := NormRoPE(be, q, k, qw, kw, eps, p.NumHeads, p.NumKVHeads, p.HeadDim, rope, b.Positions)
	o := be.Attention(qr, kr, v, b, p)
	Release(be, []Tensor{o, q, k, v}, qr, kr) // q, k and v stay the caller's
	return o
}

// MultiLinear is implemented by backends that run several projections of
// one input in one launch (q, k and v of a decode step).
type MultiLinear interface {
	// LinearMulti returns Linear(x, ws[i], biases[i]) for every i (biases
	// nil or as long as ws, entries may be nil). ok is false when the
	// backend does not fuse these shapes (then nothing was done).
	LinearMulti(x Tensor, ws, biases []Tensor) (out []Tensor, ok bool)
}

// LinearMulti is Linear(x, ws[i], biases[i]) for every i, through be's
// MultiLinear when it fuses the shapes, else one Linear each.
func LinearMulti(be Backend, x Tensor, ws, biases []Tensor) []Tensor {
	if m, ok := be.(MultiLinear); ok {
		if out, ok := m.LinearMulti(x, ws, biases); ok {
			return out
		}
	}
	out := make([]Tensor, len(ws))
	for i, w := range ws {
		var b Tensor
		if biases != nil {
			b = biases[i]
		}
		out[i] = be.Linear(x, w, b)
	}
	return out
}

// DecodeLayer is a pre-norm decoder layer in the form a LayerDecoder runs
// whole: grouped-query attention without biases (per-head q/k norms or
// none, RoPE) and routed experts (MoE.Shared nil).
type DecodeLayer struct {
	InNorm, PostNorm Tensor // [H]
	Eps              float32
	Q, K, V, O       Tensor // [HQ*D, H], [KVH*D, H], [KVH*D, H], [H, HQ*D]
	QNorm, KNorm     Tensor // [D] per-head RMSNorm weights, or nil
	RoPE             *attention.RoPE
	Attn             *AttnParams
	MoE              *MoELayer
}

// LayerDecoder is a Backend that runs a whole decoder layer of a decode
// step in one launch (the CUDA backend's persistent layer kernel at one
// token).
type LayerDecoder interface {
	// DecodesLayers reports whether DecodeLayer may take batch b.
	DecodesLayers(b *Batch) bool
	// DecodeLayer returns x + a + f for a = attention(RMSNorm(x)·InNorm)
	// over b and f = MoE(RMSNorm(x + a)·PostNorm): the layer's residual
	// sum, with the values of those ops within the backend's precision
	// profile (the KV cache written as Attention writes it). ok is false
	// when it does not take this layer (then nothing was done).
	DecodeLayer(x Tensor, l *DecodeLayer, b *Batch) (sum Tensor, ok bool)
}

// GraphWarmer is a StepGrapher that can say which decode batch shapes are
// worth capturing before serving starts (as vLLM captures its batch sizes
// at start-up), so that no request waits for a first eager step and a
// capture of its batch size.
type GraphWarmer interface {
	StepGrapher
	// GraphWarmupRows lists the decode row counts (one token per sequence,
	// short contexts) whose graphs a warm-up should capture, for batches of
	// at most maxRows sequences; empty when graphs are off.
	GraphWarmupRows(maxRows int) []int
}

// RunStep runs f, the model's forward pass over b, through be's GraphStep
// when be is a StepGrapher, else directly.
//
// A batch with fed rows (Batch.Feed) needs a StepGrapher (which resolves
// them, on the device or by waiting for the picks).
func RunStep(be Backend, b *Batch, f func() (Tensor, error)) (Tensor, error) {
	if g, ok := be.(StepGrapher); ok {
		return g.GraphStep(b, f)
	}
	if b.Fed() {
		return nil, fmt.Errorf("backend: a batch with fed rows on %T, which cannot resolve them", be)
	}
	return f()
}
