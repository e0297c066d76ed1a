package kernels

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
)

// MoE routing and the grouped expert GEMMs (moe.cu, mk_moe.h): one MoE
// layer's routed experts run on the GPU with no host synchronisation.

var (
	moeRoute        func(s, ids, weights, logits, scoreBias uint64, t int64, e, k, flags, groups, topkGroups int32, scaling uint32) int32
	moeWorkspace    func(t int64, k, e int32, h, i int64, bytes *uint64, tileM *int32) int32
	moeExperts      func(s, out, x, ids, weights uint64, t int64, k, e int32, h, i int64, gateUp, gateUpBias, down, downBias uint64, act int32, alpha, limit uint32, counts, ws, wsBytes uint64) int32
	moeRouteExperts func(s, out, x, ids, weights, logits, scoreBias uint64, t int64, k, e, flags, groups, topkGroups int32,
		scaling uint32, h, i int64, gateUp, gateUpBias, down, downBias uint64, act int32, alpha, limit uint32, counts, ws,
		wsBytes uint64) int32
	moeCombineAddNorm func(s, sum, out, outBF16, x, weights, ws, wsBytes uint64, t int64, k, e int32, h, i int64,
		normW uint64, eps uint32) int32
	gemmSkinny     func(s, c, a, b, bias uint64, m, n, k int64, work, workBytes uint64) int32
	gemmSkinnyWS   func(m, n, k int64, bytes *uint64) int32
	moeFill        func(s, dst uint64, n int64, seed uint64, scale uint32) int32
	moeLocalize    func(s, ids uint64, n int64, lo, hi int32, counts uint64, e int32) int32
	moeRouterF32   func(s, logits, x, w, bias, xb uint64, t int64, e int32, h int64) int32
	gemvBF16       func(s, c, a, b uint64, m, n, k int64) int32
	gemvMulti      func(s, a uint64, m, k int64, c0, b0, bias0 uint64, n0 int64, c1, b1, bias1 uint64, n1 int64, c2, b2, bias2 uint64, n2 int64) int32
	moeGemvSet     func(on int32) int32
	moeDecodeCheck func(rec *int32) int32
)

func init() {
	registerSymbols(
		symbol{"mk_moe_route", &moeRoute},
		symbol{"mk_moe_workspace", &moeWorkspace},
		symbol{"mk_moe_experts", &moeExperts},
		symbol{"mk_moe_route_experts", &moeRouteExperts},
		symbol{"mk_moe_combine_add_rmsnorm_f32", &moeCombineAddNorm},
		symbol{"mk_gemm_skinny_bf16", &gemmSkinny},
		symbol{"mk_gemm_skinny_workspace", &gemmSkinnyWS},
		symbol{"mk_moe_fill_bf16", &moeFill},
		symbol{"mk_moe_localize", &moeLocalize},
		symbol{"mk_moe_router_f32", &moeRouterF32},
		symbol{"mk_gemv_bf16", &gemvBF16},
		symbol{"mk_gemv_bf16_multi", &gemvMulti},
		symbol{"mk_moe_gemv", &moeGemvSet},
		symbol{"mk_moe_decode_check", &moeDecodeCheck},
	)
}

// Router flags of mk_moe_route.
const (
	moeSigmoid     = 1
	moeSoftmaxTopK = 2
	moeNormTopK    = 4
)

// MoERouter is the routing of one MoE layer, field for field
// moe.RouterConfig (see moe.Route for the exact formula).
type MoERouter struct {
	Experts, TopK int
	Sigmoid       bool // sigmoid scores; else softmax over all experts
	SoftmaxTopK   bool // top-k on the raw logits, softmax over the k
	NormTopK      bool // renormalise the k weights
	Groups        int  // group-limited routing: number of groups (0: off)
	TopKGroups    int  // groups kept
	Scaling       float32
}

// MoERoute routes T tokens on the GPU exactly as moe.Route does: logits
// [T, E] f32, scoreBias [E] f32 or nil (selection only) → ids [T, K] int32
// and weights [T, K] f32, each token's k by descending weight, ties to the
// lower expert. E ≤ 2048.
func (d *Device) MoERoute(s *Stream, ids, weights, logits, scoreBias *Buffer, T int, r MoERouter) error {
	const op = "MoERoute"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	sb, flags, err := routeArgs(op, ids, weights, logits, scoreBias, T, r)
	if err != nil {
		return err
	}
	return d.lib.check("mk_moe_route", moeRoute(s.handle(), ids.ptr, weights.ptr, logits.ptr, sb, int64(T),
		int32(r.Experts), int32(r.TopK), flags, int32(r.Groups), int32(r.TopKGroups), math.Float32bits(r.Scaling)))
}

// routeArgs checks MoERoute's arguments and returns the score bias pointer
// and the router's flags.
func routeArgs(op string, ids, weights, logits, scoreBias *Buffer, T int, r MoERouter) (sb uint64, flags int32, err error) {
	if err := dims(op, "T", T, "experts", r.Experts, "topk", r.TopK); err != nil {
		return 0, 0, err
	}
	if r.Experts > 2048 || r.TopK > r.Experts {
		return 0, 0, fmt.Errorf("kernels: %s: %d experts, top-%d (want E ≤ 2048, K ≤ E)", op, r.Experts, r.TopK)
	}
	n := int64(T) * int64(r.TopK)
	if err := needAll(op, 4, "ids", ids, n, "weights", weights, n, "logits", logits, int64(T)*int64(r.Experts)); err != nil {
		return 0, 0, err
	}
	if scoreBias != nil {
		if err := need(op, "scoreBias", scoreBias, int64(r.Experts), 4); err != nil {
			return 0, 0, err
		}
		sb = scoreBias.ptr
	}
	if r.Sigmoid {
		flags |= moeSigmoid
	}
	if r.SoftmaxTopK {
		flags |= moeSoftmaxTopK
	}
	if r.NormTopK {
		flags |= moeNormTopK
	}
	return sb, flags, nil
}

// MoERouterF32 is the router GEMM of a few tokens: logits [T, E] f32 = x
// [T, H] f32 · w [E, H] bf16ᵀ (+ bias [E] f32, or nil) in float32 (x is
// not rounded to bf16), for 1 ≤ T ≤ GemvMaxRows; xb [T, H] bf16, when not
// nil, receives x rounded to bf16 (the experts' input) from the same
// launch. H must be a multiple of 8. It replaces a split (hi + lo) and two
// GEMMs at decode sizes (gemv.cu).
func (d *Device) MoERouterF32(s *Stream, logits, x, w, bias, xb *Buffer, T, E, H int) error {
	const op = "MoERouterF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "T", T, "E", E, "H", H); err != nil {
		return err
	}
	if H%8 != 0 || T > GemvMaxRows {
		return fmt.Errorf("kernels: %s: T=%d H=%d (want T ≤ %d, H a multiple of 8)", op, T, H, GemvMaxRows)
	}
	if err := needAll(op, 4, "logits", logits, int64(T)*int64(E), "x", x, int64(T)*int64(H)); err != nil {
		return err
	}
	if err := need(op, "w", w, int64(E)*int64(H), 2); err != nil {
		return err
	}
	var bp, xp uint64
	if bias != nil {
		if err := need(op, "bias", bias, int64(E), 4); err != nil {
			return err
		}
		bp = bias.ptr
	}
	if xb != nil {
		if err := need(op, "xb", xb, int64(T)*int64(H), 2); err != nil {
			return err
		}
		xp = xb.ptr
	}
	return d.lib.check("mk_moe_router_f32", moeRouterF32(s.handle(), logits.ptr, x.ptr, w.ptr, bp, xp, int64(T), int32(E), int64(H)))
}

// MoEExperts is one layer's stacked expert weights (backend.MoELayer's layout).
type MoEExperts struct {
	E, H, I    int
	GateUp     *Buffer // [E*2I, H] bf16: per expert gate rows then up rows
	GateUpBias *Buffer // [E, 2I] f32 or nil
	Down       *Buffer // [E*H, I] bf16
	DownBias   *Buffer // [E, H] f32 or nil
	// Clamped selects gpt-oss's clamped SwiGLU with Alpha and Limit; else silu(gate)*up.
	Clamped      bool
	Alpha, Limit float32
	// GateUpFP4 and DownFP4, when set (with GateUp and Down nil), hold the
	// experts as FP4 (fp4.go): [E*2I, H] and [E*H, I], H and I multiples
	// of FP4BlockValues; MoEExpertsRun then runs mk_moe_experts_fp4.
	GateUpFP4, DownFP4 *FP4
}

// Block is ex's experts [lo, hi) (a rank's block) as views of its buffers:
// the weights in their form (bf16 or FP4) and the biases.
func (ex *MoEExperts) Block(lo, hi int) (*MoEExperts, error) {
	if lo < 0 || hi > ex.E || hi <= lo {
		return nil, fmt.Errorf("kernels: experts [%d, %d) of %d", lo, hi, ex.E)
	}
	E, H, I := int64(hi-lo), int64(ex.H), int64(ex.I)
	l := *ex
	l.E = hi - lo
	var err error
	// view is experts [lo, hi) of b, each expert bytes long (nil for nil).
	view := func(b *Buffer, bytes int64) *Buffer {
		if b == nil || err != nil {
			return nil
		}
		var v *Buffer
		v, err = b.View(int64(lo)*bytes, E*bytes)
		return v
	}
	if ex.IsFP4() {
		fp4 := func(m *FP4, rows int) *FP4 { // an expert's rows
			if m == nil || err != nil {
				return nil
			}
			var r *FP4
			r, err = m.Rows(lo*rows, hi*rows)
			return r
		}
		l.GateUpFP4, l.DownFP4 = fp4(ex.GateUpFP4, 2*ex.I), fp4(ex.DownFP4, ex.H)
	} else {
		l.GateUp, l.Down = view(ex.GateUp, 2*I*H*2), view(ex.Down, H*I*2)
	}
	l.GateUpBias, l.DownBias = view(ex.GateUpBias, 2*I*4), view(ex.DownBias, H*4)
	return &l, err
}

// IsFP4 reports whether ex holds its experts as FP4.
func (ex *MoEExperts) IsFP4() bool { return ex.GateUpFP4 != nil || ex.DownFP4 != nil }

// MoEWorkspace is the device scratch MoEExpertsRun needs for T tokens of
// top-K over ex, and the row tile it pads each expert's rows to.
func (d *Device) MoEWorkspace(T, K int, ex *MoEExperts) (bytes int64, tileM int, err error) {
	const op = "MoEWorkspace"
	if err := d.ready(op); err != nil {
		return 0, 0, err
	}
	if err := dims(op, "T", T, "K", K, "E", ex.E, "H", ex.H, "I", ex.I); err != nil {
		return 0, 0, err
	}
	if ex.IsFP4() {
		type key4 struct{ T, K, E, H, I int }
		b, err := query(d, op, key4{T, K, ex.E, ex.H, ex.I}, func() (int64, error) {
			var b uint64
			err := d.lib.check("mk_moe_workspace_fp4", moeWorkspaceFP4(int64(T), int32(K), int32(ex.E), int64(ex.H), int64(ex.I), &b))
			return int64(b), err
		})
		return b, 0, err
	}
	type key struct{ T, K, E, H, I int }
	v, err := query(d, op, key{T, K, ex.E, ex.H, ex.I}, func() ([2]int64, error) {
		var b uint64
		var tm int32
		err := d.lib.check("mk_moe_workspace", moeWorkspace(int64(T), int32(K), int32(ex.E), int64(ex.H), int64(ex.I), &b, &tm))
		return [2]int64{int64(b), int64(tm)}, err
	})
	if err != nil {
		return 0, 0, err
	}
	return v[0], int(v[1]), nil
}

// MoEGemvMaxTokens is the most tokens MoEExpertsRun serves with its
// decode-sized GEMV kernels (see MoEGemv).
const MoEGemvMaxTokens = 4

// moeGemvNow mirrors the library's switch: -2 unset (the environment),
// else a MoEGemvMode (SetMoEGemvMode).
var moeGemvNow atomic.Int32

func init() { moeGemvNow.Store(-2) }

var moeGemvEnv = sync.OnceValue(func() int32 {
	switch os.Getenv("MK_MOE_GEMV") {
	case "0":
		return 0
	case "1":
		return 1
	case "2":
		return 2
	case "3":
		return 3
	}
	return int32(MoEGemvAuto)
})

// MoEGemvMode is how MoEExpertsRun serves decode-sized calls (T ≤
// MoEGemvMaxTokens, T·K ≤ 32).
type MoEGemvMode int32

const (
	MoEGemvAuto      MoEGemvMode = -1 // the default: MoEGemvTwo for one token over experts of at least MoEGemvAutoInter intermediate size, else the grouped GEMMs
	MoEGemvOff       MoEGemvMode = 0  // the grouped GEMMs
	MoEGemvTwo       MoEGemvMode = 1  // two GEMV kernels: each chosen expert's rows streamed once
	MoEGemvOneLaunch MoEGemvMode = 2  // routing (MoERouteExpertsRun, E ≤ 256, K ≤ 32) and both GEMV phases in one launch with a grid barrier; measured slower than both others (docs/PERF.md, eleventh pass)
	MoEGemvResident  MoEGemvMode = 3  // as MoEGemvTwo, but the down kernel's rows of the chosen experts are bulk-copied into shared memory before its wait, under the up kernel, where they fit (else MoEGemvTwo's down kernel); slower than the grouped GEMMs (Qwen3-8l batch 1 ×1.02, batch 2 ×1.25; docs/PERF.md, twenty-fourth pass)
)

// MoEGemvAutoInter is the smallest expert intermediate size for which
// MoEGemvAuto takes the GEMV kernels at one token (the library's
// kGemvAutoI): Mixtral-8x7B's 14336 does, Qwen3-30B-A3B's 768,
// DeepSeek-V3's 2048 and gpt-oss's 2880 do not (docs/PERF.md, forty-first
// pass).
const MoEGemvAutoInter = 8192

// moeGemvMode is the switch now (SetMoEGemvMode, else MK_MOE_GEMV=0, 1, 2
// or 3, else auto).
func moeGemvMode() MoEGemvMode {
	if v := moeGemvNow.Load(); v >= -1 {
		return MoEGemvMode(v)
	}
	return MoEGemvMode(moeGemvEnv())
}

// MoEGemv reports whether MoEExpertsRun runs T tokens of top-K over
// experts of intermediate size I on its decode-sized GEMV kernels rather
// than the grouped GEMMs: never beyond MoEGemvMaxTokens tokens or 32
// assignments; in MoEGemvAuto (the default) for one token with I ≥
// MoEGemvAutoInter; in MoEGemvOff never; in the other modes always.
func MoEGemv(T, K, I int) bool {
	if T > MoEGemvMaxTokens || T*K > 32 {
		return false
	}
	switch m := moeGemvMode(); m {
	case MoEGemvAuto:
		return T == 1 && I >= MoEGemvAutoInter
	default:
		return m != MoEGemvOff
	}
}

// MoEGemvOneLaunchOn reports whether decode-sized calls take the one-launch
// kernel (MoEDecodeCheck then reports its watchdog).
func MoEGemvOneLaunchOn() bool { return moeGemvMode() == MoEGemvOneLaunch }

// SetMoEGemvMode sets how MoEExpertsRun serves decode-sized calls,
// process-wide (tests and comparisons).
func (d *Device) SetMoEGemvMode(m MoEGemvMode) error {
	if err := d.ready("SetMoEGemvMode"); err != nil {
		return err
	}
	if m < MoEGemvAuto || m > MoEGemvResident {
		return fmt.Errorf("kernels: SetMoEGemvMode: mode %d", m)
	}
	if err := d.lib.check("mk_moe_gemv", moeGemvSet(int32(m))); err != nil {
		return err
	}
	moeGemvNow.Store(int32(m))
	return nil
}

// MoEDecodeError is the one-launch GEMV kernel's watchdog report: a CTA
// waited at its grid barrier longer than a second and left, so that
// launch's output is not valid.
type MoEDecodeError struct {
	CTA, Seen, Grid int // the CTA that gave up, the arrivals it saw, the launch's CTAs
}

func (e *MoEDecodeError) Error() string {
	return fmt.Sprintf("kernels: one-launch MoE GEMV watchdog: CTA %d waited at the grid barrier with %d of %d CTAs "+
		"arrived", e.CTA, e.Seen, e.Grid)
}

// MoEDecodeCheck waits for all work on the device, then returns a
// *MoEDecodeError when a one-launch GEMV kernel's barrier timed out since
// the last check (and clears the record), else nil.
func (d *Device) MoEDecodeCheck() error {
	const op = "MoEDecodeCheck"
	if err := d.ready(op); err != nil {
		return err
	}
	rec := make([]int32, 4)
	rc := moeDecodeCheck(&rec[0])
	runtime.KeepAlive(rec)
	if err := d.lib.check("mk_moe_decode_check", rc); err != nil {
		return err
	}
	if rec[0] == 0 {
		return nil
	}
	return &MoEDecodeError{CTA: int(rec[1]), Seen: int(rec[2]), Grid: int(rec[3])}
}

// MoEExpertsRun runs the routed experts of one layer: out [T, H] f32 =
// Σ_k weights[t,k] · expert_{ids[t,k]}(x[t]) with x [T, H] bf16, ids [T, K]
// int32, weights [T, K] f32; bf16 operands, float32 accumulation, the
// activation rounded to bf16 between the two GEMMs. counts ([E] int64, or
// nil) accumulates the tokens each expert received. ws holds at least
// MoEWorkspace bytes. H and I must be multiples of 8. Decode-sized calls
// (MoEGemv, off by default) run as two GEMV kernels (each chosen expert's rows streamed
// once, the combine folded into the second), the others as align →
// grouped GEMMs → combine. Asynchronous on s.
func (d *Device) MoEExpertsRun(s *Stream, out, x, ids, weights *Buffer, T, K int, ex *MoEExperts, counts, ws *Buffer) error {
	const op = "MoEExpertsRun"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if out == nil {
		return fmt.Errorf("kernels: %s: nil out", op)
	}
	a, err := expertsArgs(op, out, x, ids, weights, T, K, ex, counts, ws)
	if err != nil {
		return err
	}
	if ex.IsFP4() {
		gu, dn := ex.GateUpFP4, ex.DownFP4
		return d.lib.check("mk_moe_experts_fp4", moeExpertsFP4(s.handle(), out.ptr, x.ptr, ids.ptr, weights.ptr, int64(T),
			int32(K), int32(ex.E), int64(ex.H), int64(ex.I), gu.Codes.ptr, gu.Scales.ptr, a.gub, dn.Codes.ptr,
			dn.Scales.ptr, a.db, a.act, math.Float32bits(ex.Alpha), math.Float32bits(ex.Limit), a.cnt, ws.ptr,
			uint64(ws.bytes)))
	}
	return d.lib.check("mk_moe_experts", moeExperts(s.handle(), out.ptr, x.ptr, ids.ptr, weights.ptr, int64(T),
		int32(K), int32(ex.E), int64(ex.H), int64(ex.I), ex.GateUp.ptr, a.gub, ex.Down.ptr, a.db, a.act,
		math.Float32bits(ex.Alpha), math.Float32bits(ex.Limit), a.cnt, ws.ptr, uint64(ws.bytes)))
}

// MoERouteExpertsRun is MoERoute (logits [T, E] f32 → ids and weights [T,
// K]) then MoEExpertsRun on them, in one call with the same results (with
// MK_MOE_ROUTE_ALIGN=1 a decode step's routing and the experts' align run
// as one launch: T ≤ 32, E ≤ 256, K ≤ 32, the grouped GEMMs; off by
// default, slower in whole steps). K is r.TopK. With a nil out no
// combine runs: MoECombineAddRMSNormF32 must follow with the same ws (not
// on the decode-sized GEMV path, MoEGemv, which combines itself).
func (d *Device) MoERouteExpertsRun(s *Stream, out, x, ids, weights, logits, scoreBias *Buffer, T int, r MoERouter,
	ex *MoEExperts, counts, ws *Buffer) error {
	const op = "MoERouteExpertsRun"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	sb, flags, err := routeArgs(op, ids, weights, logits, scoreBias, T, r)
	if err != nil {
		return err
	}
	if ex != nil && r.Experts != ex.E {
		return fmt.Errorf("kernels: %s: the router has %d experts, the weights %d", op, r.Experts, ex.E)
	}
	if ex != nil && ex.IsFP4() {
		// FP4 experts: routing, then the FP4 run (which always combines).
		if out == nil {
			return fmt.Errorf("kernels: %s: FP4 experts need an out (their GEMV kernels combine)", op)
		}
		if err := d.MoERoute(s, ids, weights, logits, scoreBias, T, r); err != nil {
			return err
		}
		return d.MoEExpertsRun(s, out, x, ids, weights, T, r.TopK, ex, counts, ws)
	}
	a, err := expertsArgs(op, out, x, ids, weights, T, r.TopK, ex, counts, ws)
	if err != nil {
		return err
	}
	var op0 uint64
	if out != nil {
		op0 = out.ptr
	}
	return d.lib.check("mk_moe_route_experts", moeRouteExperts(s.handle(), op0, x.ptr, ids.ptr, weights.ptr,
		logits.ptr, sb, int64(T), int32(r.TopK), int32(ex.E), flags, int32(r.Groups), int32(r.TopKGroups),
		math.Float32bits(r.Scaling), int64(ex.H), int64(ex.I), ex.GateUp.ptr, a.gub, ex.Down.ptr, a.db, a.act,
		math.Float32bits(ex.Alpha), math.Float32bits(ex.Limit), a.cnt, ws.ptr, uint64(ws.bytes)))
}

// MoECombineAddRMSNormF32 is the combine of a MoERouteExpertsRun call made
// with a nil out, folded into the residual add and RMSNorm after the layer:
// sum [T, H] = x + Σ_k weights[t,k]·(the expert row of (t,k) in ws), summed
// as the experts' combine sums it, out = RMSNorm(sum)·normW [H] (as
// AddRMSNormF32), outBF16 (may be nil) = out rounded to bf16. ws, T, K and
// ex are the experts call's; H a multiple of 4 up to 8192.
func (d *Device) MoECombineAddRMSNormF32(s *Stream, sum, out, outBF16, x, weights, ws *Buffer, T, K int, ex *MoEExperts,
	normW *Buffer, eps float32) error {
	const op = "MoECombineAddRMSNormF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if ex == nil {
		return fmt.Errorf("kernels: %s: nil experts", op)
	}
	if err := dims(op, "T", T, "K", K, "E", ex.E, "H", ex.H, "I", ex.I); err != nil {
		return err
	}
	TH := int64(T) * int64(ex.H)
	if err := needAll(op, 4, "sum", sum, TH, "out", out, TH, "x", x, TH, "weights", weights, int64(T)*int64(K),
		"normW", normW, int64(ex.H)); err != nil {
		return err
	}
	var ob uint64
	if outBF16 != nil {
		if err := need(op, "outBF16", outBF16, TH, 2); err != nil {
			return err
		}
		ob = outBF16.ptr
	}
	if ws == nil || ws.ptr == 0 {
		return fmt.Errorf("kernels: %s: nil or freed workspace", op)
	}
	return d.lib.check("mk_moe_combine_add_rmsnorm_f32", moeCombineAddNorm(s.handle(), sum.ptr, out.ptr, ob, x.ptr,
		weights.ptr, ws.ptr, uint64(ws.bytes), int64(T), int32(K), int32(ex.E), int64(ex.H), int64(ex.I), normW.ptr,
		math.Float32bits(eps)))
}

// expertsIn are MoEExpertsRun's checked optional pointers and activation.
type expertsIn struct {
	gub, db, cnt uint64
	act          int32
}

// expertsArgs checks MoEExpertsRun's arguments; a nil out (no combine,
// MoERouteExpertsRun) is not checked.
func expertsArgs(op string, out, x, ids, weights *Buffer, T, K int, ex *MoEExperts, counts, ws *Buffer) (expertsIn, error) {
	var a expertsIn
	if ex == nil {
		return a, fmt.Errorf("kernels: %s: nil experts", op)
	}
	if err := dims(op, "T", T, "K", K, "E", ex.E, "H", ex.H, "I", ex.I); err != nil {
		return a, err
	}
	if ex.H%8 != 0 || ex.I%8 != 0 || K > ex.E {
		return a, fmt.Errorf("kernels: %s: H=%d and I=%d must be multiples of 8, K=%d ≤ E=%d", op, ex.H, ex.I, K, ex.E)
	}
	E, H, I := int64(ex.E), int64(ex.H), int64(ex.I)
	n := int64(T) * int64(K)
	if err := needAll(op, 4, "ids", ids, n, "weights", weights, n); err != nil {
		return a, err
	}
	if out != nil {
		if err := need(op, "out", out, int64(T)*H, 4); err != nil {
			return a, err
		}
	}
	if ex.IsFP4() {
		if ex.GateUp != nil || ex.Down != nil {
			return a, fmt.Errorf("kernels: %s: experts in both bf16 and FP4", op)
		}
		if err := ex.GateUpFP4.check(op, "GateUpFP4", ex.E*2*ex.I, ex.H); err != nil {
			return a, err
		}
		if err := ex.DownFP4.check(op, "DownFP4", ex.E*ex.H, ex.I); err != nil {
			return a, err
		}
		if err := need(op, "x", x, int64(T)*H, 2); err != nil {
			return a, err
		}
	} else if err := needAll(op, 2, "x", x, int64(T)*H, "GateUp", ex.GateUp, E*2*I*H, "Down", ex.Down, E*H*I); err != nil {
		return a, err
	}
	opt := func(name string, b *Buffer, elems, size int64) (uint64, error) {
		if b == nil {
			return 0, nil
		}
		return b.ptr, need(op, name, b, elems, size)
	}
	var err error
	if a.gub, err = opt("GateUpBias", ex.GateUpBias, E*2*I, 4); err != nil {
		return a, err
	}
	if a.db, err = opt("DownBias", ex.DownBias, E*H, 4); err != nil {
		return a, err
	}
	if a.cnt, err = opt("counts", counts, E, 8); err != nil {
		return a, err
	}
	if ws == nil || ws.ptr == 0 {
		return a, fmt.Errorf("kernels: %s: nil or freed workspace", op)
	}
	if ex.Clamped {
		a.act = 1
	}
	return a, nil
}

// FillRandomBF16 fills the first n bf16 values of b with deterministic
// pseudo-random values of mean 0 and standard deviation scale (for
// benchmarks whose weights are too large to draw on the host).
func (d *Device) FillRandomBF16(s *Stream, b *Buffer, n int64, seed uint64, scale float32) error {
	const op = "FillRandomBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("kernels: %s: n=%d", op, n)
	}
	if err := need(op, "b", b, n, 2); err != nil {
		return err
	}
	return d.lib.check("mk_moe_fill_bf16", moeFill(s.handle(), b.ptr, n, seed, math.Float32bits(scale)))
}

// MoELocalize rewrites n routed expert ids [n] int32 in place for a rank
// holding experts [lo, hi): an id in the range becomes id − lo, any other
// −1, which MoEExpertsRun skips (the row adds nothing). counts ([E] int64,
// or nil) += every id's expert before the rewrite (all ranks' experts:
// every rank routes every token, so one rank's counters are the world's).
// Asynchronous on s.
func (d *Device) MoELocalize(s *Stream, ids *Buffer, n, lo, hi int, counts *Buffer, E int) error {
	const op = "MoELocalize"
	if err := d.ready(op); err != nil {
		return err
	}
	if n < 0 || lo < 0 || hi < lo || hi > math.MaxInt32 || (counts != nil && (E < 1 || E > math.MaxInt32)) {
		return fmt.Errorf("kernels: %s: n %d, experts [%d, %d), counts of %d experts", op, n, lo, hi, E)
	}
	if n == 0 {
		return nil
	}
	if err := ids.fits(op+" ids", 4*int64(n)); err != nil {
		return err
	}
	var cp uint64
	if counts != nil {
		if err := counts.fits(op+" counts", 8*int64(E)); err != nil {
			return err
		}
		cp = counts.ptr
	}
	if d.muted() {
		return nil
	}
	return d.lib.check("mk_moe_localize", moeLocalize(s.handle(), ids.ptr, int64(n), int32(lo), int32(hi), cp, int32(E)))
}
