package main

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tuning"
)

// TestBenchMoEFlags: bad flags are one-line errors before any GPU work.
func TestBenchMoEFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ranks", "9"}, "--ranks"},
		{[]string{"--ranks", "0"}, "--ranks"},
		{[]string{"--ranks", "2", "--path", "grouped"}, "--path fused"},
		{[]string{"--path", "cublas"}, "--path"},
		{[]string{"--routing", "topk"}, "--routing"},
		{[]string{"--tokens", "1,x"}, "--tokens"},
		{[]string{"--tokens", "0"}, "--tokens"},
		{[]string{"--hidden", "100"}, "multiples of 8"},
		{[]string{"--experts", "8", "--topk", "9"}, "topk"},
		{[]string{"--experts", "12", "--topk", "2"}, "grouped"},
		{[]string{"--score-bias", "-0.1"}, "--score-bias"},
		{[]string{"--score-bias", "NaN"}, "--score-bias"},
		{[]string{"--score-bias", "2"}, "--score-bias"},
	} {
		_, err := parseMoEBench(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
	o, err := parseMoEBench([]string{"--routing", "softmax", "--experts", "8", "--topk", "2", "--tokens", "1,16", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	if r := o.router(); r.NumExperts != 8 || r.TopK != 2 || len(o.tokens) != 2 || !o.json || !o.graph {
		t.Errorf("parsed %+v, router %+v (graph timing is the default)", o, r)
	}
	if o, err := parseMoEBench([]string{"--graph=false"}); err != nil || o.graph {
		t.Errorf("--graph=false: %+v, %v", o, err)
	}
	if r := (&moeBenchOpts{experts: 256, topk: 8, routing: "grouped"}).router(); r.Validate() != nil || r.NumGroups != 8 || r.TopKGroups != 4 {
		t.Errorf("grouped router %+v: %v", r, r.Validate())
	}
}

// TestBenchMoEScoreBias: the grouped routing's bias is zeros by default,
// so DeepSeek-V3's shape routes random logits evenly (every expert touched
// at 1024 tokens, as vLLM's benchmark routes); --score-bias 0.1, the fixed
// value before, concentrates them (docs/PERF.md, fifty-fifth pass).
func TestBenchMoEScoreBias(t *testing.T) {
	const E, T = 256, 1024
	route := func(args ...string) (touched, hottest int, bias []float32) {
		t.Helper()
		o, err := parseMoEBench(args)
		if err != nil {
			t.Fatal(err)
		}
		cfg := o.router()
		bias = o.scoreBiases(E)
		rng := rand.New(rand.NewPCG(7, 7))
		logits := make([]float32, T*E) // std 1: x of std 1 against gate rows of std 1/sqrt(H)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64())
		}
		ids, _ := moe.Route(&cfg, logits, bias, T)
		rows := make([]int, E)
		for _, e := range ids {
			rows[e]++
		}
		for _, n := range rows {
			if n > 0 {
				touched++
			}
			hottest = max(hottest, n)
		}
		return touched, hottest, bias
	}
	mean := T * 8 / E
	touched, hottest, bias := route()
	for i, b := range bias {
		if b != 0 {
			t.Fatalf("default bias[%d] = %v, want zeros", i, b)
		}
	}
	if touched != E || hottest > 3*mean {
		t.Errorf("default: %d of %d experts touched, hottest %d rows (mean %d): want every expert, none over 3× the mean", touched, E, hottest, mean)
	}
	touched, hottest, bias = route("--score-bias", "0.1")
	var ss float64
	for _, b := range bias {
		ss += float64(b) * float64(b)
	}
	if sd := math.Sqrt(ss / E); sd < 0.08 || sd > 0.12 {
		t.Errorf("--score-bias 0.1: sample std %.3f", sd)
	}
	if touched > 230 || hottest < 4*mean {
		t.Errorf("--score-bias 0.1: %d experts touched, hottest %d rows: the concentration PERF.md describes is gone", touched, hottest)
	}
}

// TestBenchMoENoGPU: without libmkernel.so the benchmark fails with one
// line and a non-zero exit, no panic. Skipped where a library is present.
func TestBenchMoENoGPU(t *testing.T) {
	if _, err := kernels.LibraryPath(); err == nil {
		t.Skip("a libmkernel.so is present; this checks the machine without one")
	}
	var out, errb bytes.Buffer
	rc := run([]string{"bench", "moe", "--tokens", "1", "--json"}, strings.NewReader(""), &out, &errb)
	if rc == 0 {
		t.Fatalf("exit 0 without a GPU; stdout %q", out.String())
	}
	msg := errb.String()
	if strings.Count(strings.TrimSpace(msg), "\n") != 0 || !strings.Contains(msg, "GPU") {
		t.Errorf("stderr %q, want one line naming the GPU", msg)
	}
	if out.Len() != 0 {
		t.Errorf("stdout %q, want nothing", out.String())
	}
}

// TestBenchMoEFusedGPU runs the fused path over 2 emulated ranks on a small
// shape and checks the JSON contract and the reference error. Skipped
// without libmkernel.so.
func TestBenchMoEFusedGPU(t *testing.T) {
	rows := runBenchMoEGPU(t, "--hidden", "256", "--intermediate", "128", "--experts", "16", "--topk", "4",
		"--routing", "softmax", "--tokens", "1,70", "--ranks", "2", "--iters", "2", "--shared-experts", "1")
	for _, r := range rows {
		t.Logf("%v", r)
		for _, k := range []string{"tokens", "ms", "tflops", "weight_gbps", "rel_err", "separate_ms"} {
			if _, ok := r[k]; !ok {
				t.Errorf("row lacks %q", k)
			}
		}
		for _, k := range []string{"eager_ms", "eager_separate_ms"} {
			if v, ok := r[k].(float64); !ok || !(v > 0) {
				t.Errorf("%s = %v, want a positive time (graph timing is the default)", k, r[k])
			}
		}
		if r["graph"] != true {
			t.Errorf("graph = %v, want true", r["graph"])
		}
		if r["path"] != "fused" || r["ranks"] != 2.0 {
			t.Errorf("path %v ranks %v, want fused and 2", r["path"], r["ranks"])
		}
		if e, ok := r["rel_err"].(float64); !ok || !(e <= 1e-2) {
			t.Errorf("rel_err %v > 1e-2", r["rel_err"])
		}
		if m, _ := r["route_mismatch"].(float64); m != 0 {
			t.Errorf("route_mismatch %v", m)
		}
	}
}

// TestBenchMoEPartialGPU: a token count that cannot run (here one whose
// buffers exceed any GPU's memory) fails the command, naming the count, but
// the counts measured before it are still printed. Skipped without
// libmkernel.so.
func TestBenchMoEPartialGPU(t *testing.T) {
	if _, err := kernels.LibraryPath(); err != nil {
		t.Skipf("no libmkernel.so: %v", err)
	}
	var out, errb bytes.Buffer
	rc := run([]string{"bench", "moe", "--path", "grouped", "--hidden", "8192", "--intermediate", "64", "--experts", "8",
		"--topk", "2", "--routing", "softmax", "--tokens", "1,3000000", "--iters", "2", "--json"},
		strings.NewReader(""), &out, &errb)
	if strings.Contains(errb.String(), "needs a GPU") && os.Getenv("MKSERVE_REQUIRE_GPU") != "1" {
		t.Skipf("a library but no GPU: %s", errb.String())
	}
	if rc == 0 {
		t.Fatalf("exit 0 with a token count of 3000000 × 8192 (stdout %q)", out.String())
	}
	if !strings.Contains(errb.String(), "tokens 3000000") {
		t.Errorf("stderr %q does not name the failing count", errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 1 || rows[0]["tokens"] != 1.0 {
		t.Fatalf("stdout %q (%v), want the 1-token row alone", out.String(), err)
	}
	if ms, ok := rows[0]["ms"].(float64); !ok || !(ms > 0) {
		t.Errorf("ms = %v", rows[0]["ms"])
	}
}

// TestRecordMoETuning: --tune's table gets each token count's fastest
// launch under the device and shape, merged with what the file held.
func TestRecordMoETuning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "moe.json")
	o, err := parseMoEBench([]string{"--hidden", "2048", "--intermediate", "768", "--experts", "128", "--topk", "8",
		"--routing", "softmax", "--ranks", "8", "--tune", path})
	if err != nil {
		t.Fatal(err)
	}
	if err := recordMoETuning(o, "GPU-X", []moeBenchRow{{Tokens: 16, MS: 0.7, CTAs: 132, DispatchCTAs: 8}}); err != nil {
		t.Fatal(err)
	}
	if err := recordMoETuning(o, "GPU-X", []moeBenchRow{{Tokens: 256, MS: 1.2, DispatchCTAs: 32, Tile: 128}}); err != nil {
		t.Fatal(err)
	}
	tb, err := tuning.LoadMoE(path)
	if err != nil {
		t.Fatal(err)
	}
	key := tuning.MoEKey{Device: "GPU-X", Hidden: 2048, Intermediate: 768, Experts: 128, TopK: 8, Ranks: 8}
	if c, ok := tb.Lookup(key, 10); !ok || c.CTAs != 132 || c.DispatchCTAs != 8 {
		t.Errorf("16-token choice: %+v %v", c, ok)
	}
	if c, ok := tb.Lookup(key, 200); !ok || c.DispatchCTAs != 32 || c.Tile != 128 {
		t.Errorf("256-token choice: %+v %v", c, ok)
	}
	for _, c := range []struct{ tile, want int }{{0, 25}, {16, 10}, {64, 10}, {128, 5}} {
		ch := tuneChoices(132, c.tile)
		if len(ch) != c.want {
			t.Errorf("--tile %d: %d tune choices, want %d", c.tile, len(ch), c.want)
		}
		for _, x := range ch {
			if (c.tile != 0 && x.tile != c.tile) || (x.tile == 128 && x.ctas != 0) {
				t.Errorf("--tile %d: choice %+v", c.tile, x)
			}
		}
	}
	if _, err := parseMoEBench([]string{"--tile", "32"}); err == nil {
		t.Error("--tile 32 accepted")
	}
	for _, f := range []string{"0.5", "-1", "NaN", "100"} {
		if _, err := parseMoEBench([]string{"--max-rows-factor", f}); err == nil {
			t.Errorf("--max-rows-factor %s accepted", f)
		}
	}
	if o, err := parseMoEBench([]string{"--max-rows-factor", "2"}); err != nil || o.maxRowsFactor != 2 {
		t.Errorf("--max-rows-factor 2: %v, %+v", err, o)
	}
	if _, err := parseMoEBench([]string{"--path", "grouped", "--tune", path}); err == nil {
		t.Error("--tune with --path grouped accepted")
	}
}

// TestBenchMoEGroupedGPU runs the grouped path on a small shape, timed as
// graph replays and op by op, and checks the JSON and the reference error.
// (One GPU run per process: the library binds the GPU to one thread.)
// Skipped without libmkernel.so.
func TestBenchMoEGroupedGPU(t *testing.T) {
	rows := runBenchMoEGPU(t, "--path", "grouped", "--hidden", "256", "--intermediate", "128", "--experts", "16",
		"--topk", "4", "--routing", "softmax", "--tokens", "1,70", "--iters", "3", "--shared-experts", "1")
	for _, r := range rows {
		t.Logf("%v", r)
		for _, k := range []string{"ms", "eager_ms", "experts_ms"} {
			if v, ok := r[k].(float64); !ok || !(v > 0) {
				t.Errorf("%s = %v, want a positive time", k, r[k])
			}
		}
		if r["graph"] != true || r["path"] != "grouped" {
			t.Errorf("graph %v path %v, want true and grouped", r["graph"], r["path"])
		}
		if e, ok := r["rel_err"].(float64); !ok || !(e <= 1e-2) {
			t.Errorf("rel_err %v > 1e-2", r["rel_err"])
		}
	}
}

// runBenchMoEGPU runs `bench moe ARGS --json` in this process and returns
// its two rows (the tests ask for two token counts). It skips without
// libmkernel.so, or without a GPU unless MKSERVE_REQUIRE_GPU=1.
func runBenchMoEGPU(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	if _, err := kernels.LibraryPath(); err != nil {
		t.Skipf("no libmkernel.so: %v", err)
	}
	var out, errb bytes.Buffer
	rc := run(append(append([]string{"bench", "moe"}, args...), "--json"), strings.NewReader(""), &out, &errb)
	if rc != 0 && strings.Contains(errb.String(), "needs a GPU") && os.Getenv("MKSERVE_REQUIRE_GPU") != "1" {
		t.Skipf("a library but no GPU: %s", errb.String())
	}
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("stdout %q: %v", out.String(), err)
	}
	return rows
}
